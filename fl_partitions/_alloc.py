"""Small vectorised building blocks shared by the split schemes."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]


def even_counts(total: int, parts: int) -> IntArray:
    """``parts`` sizes that differ by at most one and sum to ``total`` (larger first)."""
    counts = np.full(parts, total // parts, dtype=np.int64)
    counts[: total % parts] += 1
    return counts


def counts_from_proportions(proportions: NDArray[np.float64], total: int) -> IntArray:
    """Integer sizes from proportions by cutting ``total`` at the cumulative proportions.

    This is NIID-Bench's ``np.split(idx, (cumsum(p) * n).astype(int)[:-1])`` rule, kept so
    our size statistics match FedLab's and NIID-Bench's for the same proportions.
    """
    cuts = (np.cumsum(proportions) * total).astype(np.int64)[:-1]
    cuts = np.clip(cuts, 0, total)
    return np.diff(np.concatenate(([0], cuts, [total])))


def group_order(keys: IntArray, num_keys: int) -> IntArray:
    """Stable argsort of small non-negative integer keys.

    Casting to the narrowest unsigned type lets numpy use its O(n) radix sort (it does for
    types of 16 bits or less): ~10x faster than a comparison sort on a million keys.
    """
    if num_keys <= 1 << 8:
        keys = keys.astype(np.uint8)
    elif num_keys <= 1 << 16:
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")


def class_positions(labels: IntArray, num_classes: int) -> list[IntArray]:
    """Positions of each class in ``labels``, from one stable sort (no per-class scan)."""
    bounds = np.cumsum(np.bincount(labels, minlength=num_classes))[:-1]
    return np.split(group_order(labels, num_classes), bounds)


def assign_counts(
    owner: IntArray,
    positions: IntArray,
    clients: IntArray,
    counts: IntArray,
    rng: np.random.Generator,
) -> None:
    """Give ``counts[j]`` randomly chosen ``positions`` to ``clients[j]``, in place."""
    owner[positions[rng.permutation(len(positions))]] = np.repeat(clients, counts)


def top_up(owner: IntArray, num_clients: int, min_size: int, rng: np.random.Generator) -> None:
    """Move samples so every client holds at least ``min_size``, in place.

    Deficits are filled with samples drawn uniformly from the surplus of the other clients
    (samples beyond their own first ``min_size``), so no donor drops below ``min_size`` and
    larger clients give proportionally more. Requires ``len(owner) >= num_clients * min_size``.
    """
    sizes = np.bincount(owner, minlength=num_clients)
    deficit = np.maximum(min_size - sizes, 0)
    need = int(deficit.sum())
    if need == 0:
        return
    perm = rng.permutation(len(owner))
    order = perm[group_order(owner[perm], num_clients)]
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    rank = np.arange(len(owner)) - np.repeat(starts, sizes)
    spare = order[rank >= min_size]
    taken = rng.choice(spare, size=need, replace=False)
    owner[taken] = np.repeat(np.arange(num_clients), deficit)
