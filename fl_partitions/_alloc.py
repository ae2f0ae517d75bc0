"""Small vectorised building blocks shared by the split schemes."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]
#: A client id per sample: any integer type (the built-ins use the narrowest, see ``owners``).
OwnerArray = NDArray[np.integer[Any]]


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


def key_dtype(num_keys: int) -> type[np.integer[Any]]:
    """The narrowest unsigned type for keys ``0 .. num_keys - 1`` (int64 above 16 bits)."""
    if num_keys <= 1 << 8:
        return np.uint8
    if num_keys <= 1 << 16:
        return np.uint16
    return np.int64


def owners(n: int, num_clients: int) -> OwnerArray:
    """An uninitialised client-id-per-sample array, in the narrowest type for the ids.

    At 10^7 samples a uint16 array is 20 MB instead of 80: the random writes that fill it
    stay in cache, and grouping by client sorts it without a cast.
    """
    return np.empty(n, dtype=key_dtype(num_clients))


def group_order(keys: NDArray[np.integer[Any]], num_keys: int) -> IntArray:
    """Stable argsort of small non-negative integer keys.

    Casting to the narrowest unsigned type lets numpy use its O(n) radix sort (it does for
    types of 16 bits or less): ~10x faster than a comparison sort on a million keys.
    """
    return np.argsort(keys.astype(key_dtype(num_keys), copy=False), kind="stable")


def class_positions(labels: IntArray, num_classes: int) -> list[IntArray]:
    """Positions of each class in ``labels``, from one stable sort (no per-class scan)."""
    bounds = np.cumsum(np.bincount(labels, minlength=num_classes))[:-1]
    return np.split(group_order(labels, num_classes), bounds)


def assign_counts(
    owner: OwnerArray,
    positions: IntArray,
    clients: IntArray,
    counts: IntArray,
    rng: np.random.Generator,
) -> None:
    """Give ``counts[j]`` randomly chosen ``positions`` to ``clients[j]``, in place.

    ``positions`` is shuffled in place (callers pass arrays of their own). Shuffling it draws
    exactly what ``rng.permutation(len(positions))`` draws, so this equals
    ``owner[positions[rng.permutation(len(positions))]] = ...`` without the permutation array
    and its gather.
    """
    rng.shuffle(positions)
    owner[positions] = np.repeat(clients, counts)


def top_up(owner: OwnerArray, num_clients: int, min_size: int, rng: np.random.Generator) -> None:
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
