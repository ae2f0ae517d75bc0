"""Plain-text tables for the command line (GitHub-flavoured markdown, so they paste well)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Render rows as a markdown table with aligned columns."""
    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]

    def line(vals: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in cells)])


PARTITION_HEADER = (
    "scheme",
    "clients",
    "samples",
    "size mean±std",
    "min",
    "max",
    "classes/client",
    "KL uniform",
    "KL global",
    "EMD",
    "seconds",
)


def partition_row(label: str, partition: Any, elapsed: float) -> list[Any]:
    """One summary row of a partition (see ``PARTITION_HEADER``)."""
    s = partition.stats()
    return [
        label,
        partition.num_clients,
        int(partition.sizes.sum()),
        f"{s['size_mean']:.1f}±{s['size_std']:.1f}",
        s["size_min"],
        s["size_max"],
        round(s["classes_per_client_mean"], 2),
        s["kl_uniform_mean"],
        s["kl_global_mean"],
        s["emd_mean"],
        round(elapsed, 3),
    ]
