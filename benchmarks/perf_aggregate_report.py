"""The aggregation-speed report (:mod:`fedbalance_benchmarks.perf_aggregate`): the machine it
ran on (CPU, load, free memory, versions), how fedbalance's kernels reach their times, and the
table of median times with per-repeat ratios against FedML's FedAvg and the read-once floor.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedbalance_benchmarks._flower_agg import Layout, numel
from fl_adapters._table import markdown_table


def mem_available() -> int | None:
    """Bytes the kernel says can be allocated without swapping (Linux), else ``None``."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine_load() -> str:
    """1-minute load average: other work on the machine skews every timing here."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from fl_aggregators import _kernels

    parts = [f"torch {torch.__version__}", f"numpy {np.__version__}"]
    for dist in ("numba", "fedml", "fedlab"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    kernels = "compiled kernels (numba)" if _kernels.available() else "torch fallback"
    return ", ".join(parts) + f"; fedbalance aggregates with its {kernels}"


def kernels_how() -> str:
    """How fedbalance's times come about: what its kernels do, for the reader of the ratios."""
    from fl_aggregators import _kernels

    if not _kernels.available():
        return (
            "How fedbalance gets there: numba is missing or turned off, so these are its torch "
            "fallback's times (blocked torch ops per tensor)."
        )
    g = _kernels.REGISTER_CLIENTS
    return (
        "How fedbalance gets there (`fl_aggregators/_kernels.py`, numba): one compiled call "
        "per round over every float tensor of every client, split in equal shares over as "
        "many threads as torch has (the floor's threads). FedAvg/FedLoss: up to "
        f"{g} clients, each 64-byte cache line of coordinates (16 float32) is read from every "
        "client, weighted and added in float64 registers and written once, so the memory "
        "traffic is the floor's reads plus one write of the model; more clients: a float64 "
        f"block of {_kernels.BLOCK} values in L1 takes four clients per pass. Median: "
        "Batcher's odd-even merge sort pruned to the comparators that reach the two middle "
        f"values ({len(_kernels.median_network(10))} for 10 clients, "
        f"{len(_kernels.median_network(100))} for 100), one min and one max instruction per "
        f"comparator on a register of coordinates; up to {g} clients the whole network runs "
        "in registers (each value read once, the median written once); more clients: groups "
        f"of {g} are sorted in registers into a block buffer (up to "
        f"{_kernels.MEDIAN_BLOCK} coordinates x clients, {_kernels.MEDIAN_BYTES >> 10} KiB, "
        "in L2) and only the comparators that merge the groups run on its rows. Results are "
        "`numpy.median`'s (NaN anywhere gives NaN; the two middle values' mean in their dtype)."
    )


def write(
    records: list[dict[str, Any]],
    checks: list[tuple[str, bool]],
    flower_info: dict[str, Any],
    layout: Layout,
    out_dir: Path,
    repeats: int,
    load: str,
    command: str,
) -> None:
    """The report (``perf_aggregate.md``, printed too) and the records (``.json``) in
    ``out_dir``; ``command`` regenerates them."""
    out_dir.mkdir(parents=True, exist_ok=True)

    def ref(impl: str, op: str, k: int) -> dict[str, Any] | None:
        for r in records:
            if (r["impl"], r["operation"], r["clients"]) == (impl, op, k):
                return r
        return None

    rows = []
    for r in records:
        fedml, floor = ref("fedml", "fedavg", r["clients"]), ref("floor", "read", r["clients"])
        s = r["seconds"]
        rows.append(
            [
                r["impl"],
                r["operation"],
                r["clients"],
                r["params"],
                s if s is not None else r.get("note"),
                ratio_text(r, fedml),
                ratio_text(r, floor),
            ]
        )
    table = markdown_table(
        ["impl", "operation", "clients", "params", "median s", "vs FedML fedavg", "vs floor"], rows
    )
    mem = mem_available()
    flower_line = (
        f"Flower: flwr {flower_info['flwr']}, numpy {flower_info['numpy']}, in its own "
        f"virtual environment and process, numpy single-threaded."
        if flower_info
        else "Flower: not measured."
    )
    header = (
        f"# Aggregation speed (ResNet-18 state dict: {len(layout)} tensors, "
        f"{numel(layout):,} values)\n\n"
        f"Median of {repeats} runs after one warm-up, implementations alternating inside each "
        f"repeat. A ratio is the median over repeats of the time against the reference's time "
        f"in the same repeat (this machine's speed drifts between repeats), with the lowest and "
        f"highest of those ratios in brackets; {cpu_name()}, {mp.cpu_count()} cores, "
        f"{(mem or 0) / 1e9:.0f} GB free at the end, torch {torch.get_num_threads()} threads, "
        f"{load}.\n"
        f"{versions()}. {flower_line}\n"
        f"Regenerate: `{command}`.\n\n"
        f"`params`: values aggregated per client (flat vectors carry the float tensors only, "
        f"not the int64 BatchNorm counters). `floor`: `torch.sum` over each client's flat "
        f"vector, i.e. reading every value once. torch-stacked median is `torch.median`, the "
        f"lower middle value for an even client count.\n\n"
        f"{kernels_how()}\n\n"
    )
    notes = [
        f"- {r['impl']} {r['operation']}, {r['clients']} clients: {r['note']}"
        for r in records
        if r.get("note") and r["seconds"] is not None
    ]
    sanity = "Sanity checks (warm-up results):\n\n" + "\n".join(
        f"- {'ok' if ok else 'MISMATCH'}: {text}" for text, ok in checks
    )
    text = header + table + "\n\n" + ("\n".join(notes) + "\n\n" if notes else "") + sanity + "\n"
    (out_dir / "perf_aggregate.md").write_text(text)
    (out_dir / "perf_aggregate.json").write_text(json.dumps(records, indent=1) + "\n")
    print(text)


def repeat_ratios(r: dict[str, Any], ref: dict[str, Any]) -> list[float]:
    """``r``'s time over ``ref``'s in each repeat (both timed in every repeat), else ``[]``."""
    times, refs = r.get("seconds_all") or [], ref.get("seconds_all") or []
    if len(times) != len(refs) or not all(refs):
        return []
    return [t / t_ref for t, t_ref in zip(times, refs, strict=True)]


def ratio_text(r: dict[str, Any], ref: dict[str, Any] | None) -> str:
    """The median per-repeat ratio with its range; the ratio of medians where unpaired."""
    if ref is None or not r["seconds"] or not ref["seconds"]:
        return "-"
    ratios = repeat_ratios(r, ref)
    if not ratios:
        return f"{r['seconds'] / ref['seconds']:.2f}x"
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
