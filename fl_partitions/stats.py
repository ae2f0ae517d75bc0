"""Partition statistics: pure functions over a clients x classes count matrix.

Definitions
-----------
* KL to uniform: ``sum_c p_c log(p_c C)`` (Astraea's imbalance measure, Duan et al. 2021).
* KL to global: ``sum_c p_c log(p_c / q_c)`` with ``q`` the pooled label distribution.
* Earth mover's distance: ``sum_c |p_c - q_c|``, the label-distribution distance that Zhao et
  al. ("Federated Learning with Non-IID Data", 2018) call EMD for unordered classes.
* Label noise (:func:`flip_summary`): the noisy clients, the flipped labels per client, the
  share of all clients' train + validation labels that are flipped (the labels clients learn
  and validate on; test labels stay true), and that share over the noisy clients alone.

Clients without samples get ``nan`` and are left out of the means.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def class_count_matrix(
    labels: NDArray[Any], client_indices: list[IntArray], num_classes: int
) -> IntArray:
    """Counts of each class (columns) held by each client (rows)."""
    sizes = np.fromiter(
        (len(ix) for ix in client_indices), dtype=np.int64, count=len(client_indices)
    )
    if sizes.sum() == 0:
        return np.zeros((len(client_indices), num_classes), dtype=np.int64)
    owner = np.repeat(np.arange(len(client_indices)), sizes)
    flat = labels[np.concatenate(client_indices)].astype(np.int64)
    counts = np.bincount(owner * num_classes + flat, minlength=len(client_indices) * num_classes)
    return counts.reshape(len(client_indices), num_classes)


def distributions(counts: NDArray[Any]) -> FloatArray:
    """Row-normalised label distributions; rows of empty clients are ``nan``."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts / totals


def kl_divergence(p: NDArray[Any], q: NDArray[Any]) -> FloatArray:
    """``KL(p || q)`` along the last axis, with ``0 log 0 = 0``."""
    p = np.asarray(p, dtype=np.float64)
    q = np.broadcast_to(np.asarray(q, dtype=np.float64), p.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        terms = np.where(p > 0, p * np.log(p / q), 0.0)
    out = terms.sum(axis=-1)
    return np.where(np.isnan(p).any(axis=-1), np.nan, out)


def kl_to_uniform(counts: NDArray[Any]) -> FloatArray:
    """Per-client KL divergence of the label distribution to the uniform one."""
    counts = np.asarray(counts)
    return kl_divergence(distributions(counts), np.full(counts.shape[-1], 1.0 / counts.shape[-1]))


def kl_to_global(counts: NDArray[Any]) -> FloatArray:
    """Per-client KL divergence to the pooled label distribution of all clients."""
    counts = np.asarray(counts)
    return kl_divergence(distributions(counts), distributions(counts.sum(axis=0)))


def emd_to_global(counts: NDArray[Any]) -> FloatArray:
    """Per-client earth mover's distance (L1) to the pooled label distribution."""
    counts = np.asarray(counts)
    p = distributions(counts)
    return np.abs(p - distributions(counts.sum(axis=0))).sum(axis=-1) * np.where(
        np.isnan(p).any(axis=-1), np.nan, 1.0
    )


def summarize(counts: NDArray[Any]) -> dict[str, Any]:
    """Every statistic of a partition as JSON-ready Python values."""
    counts = np.asarray(counts, dtype=np.int64)
    sizes = counts.sum(axis=1)
    per_client = {
        "kl_uniform": kl_to_uniform(counts),
        "kl_global": kl_to_global(counts),
        "emd": emd_to_global(counts),
    }

    def clean(a: FloatArray) -> list[float | None]:
        return [None if np.isnan(v) else round(float(v), 6) for v in a]

    out: dict[str, Any] = {
        "sizes": sizes.tolist(),
        "size_mean": round(float(sizes.mean()), 6) if len(sizes) else 0.0,
        "size_std": round(float(sizes.std()), 6) if len(sizes) else 0.0,
        "size_min": int(sizes.min()) if len(sizes) else 0,
        "size_max": int(sizes.max()) if len(sizes) else 0,
        "classes_per_client_mean": round(float((counts > 0).sum(axis=1).mean()), 6),
    }
    for key, values in per_client.items():
        out[key] = clean(values)
        finite = values[~np.isnan(values)]
        out[f"{key}_mean"] = round(float(finite.mean()), 6) if len(finite) else None
    return out


def flip_summary(flipped: IntArray, noisy: IntArray, exposed: IntArray) -> dict[str, Any]:
    """Label-noise statistics as JSON-ready values.

    ``flipped``: flipped labels per client; ``noisy``: the noisy clients' ids; ``exposed``: per
    client, how many of its samples label noise may flip (train + validation). The flipped
    share is over every client's such samples, ``noisy_flip_rate`` over the noisy clients'
    (``None`` when they have none).
    """
    flipped, noisy, exposed = (np.asarray(a, dtype=np.int64) for a in (flipped, noisy, exposed))
    held = int(exposed[noisy].sum()) if len(noisy) else 0
    return {
        "noisy_clients": noisy.tolist(),
        "flipped": flipped.tolist(),
        "flipped_share": round(float(flipped.sum() / max(int(exposed.sum()), 1)), 6),
        "noisy_flip_rate": round(float(flipped[noisy].sum() / held), 6) if held else None,
    }
