"""Partition speed: fedbalance's ``label_dirichlet`` against FedLab 1.3.0's ``hetero_dir_partition``.

Both run in the same process on the same labels, interleaved, so machine noise hits both,
with a settling step between runs (see ``_settle``); the result is the ratio of median times. FedLab's function returns
only the client dict, ours a full ``Partition`` (local splits and class counts included) —
the comparison favours FedLab. Two sizes by default, 10^6 labels / 10^3 clients and 10^7 labels / 10^4 clients, so a
step that grows faster than the labels shows up as a worse ratio at the larger one. Each
size also times ``mixed`` (the thesis's label Dirichlet + feature noise) and ``label_dirichlet``
at beta 0.1, min size 10: that is where FedLab's unbounded redraw loop does not return, shown
once, at the first size, in a child process with a time limit.

    python -m fedbalance_benchmarks.perf_partition [--sizes 1000000x1000 10000000x10000]
        [--repeats 5] [--hang-limit 60]
    fedbalance bench perf-partition
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
SIZES: tuple[tuple[int, int], ...] = ((1_000_000, 1000), (10_000_000, 10_000))
COMMAND = "fedbalance bench perf-partition"


def _fedlab_hetero(
    labels: np.ndarray, clients: int, classes: int, beta: float, min_size: int, seed: int
) -> Any:
    from fedlab.utils.dataset.functional import hetero_dir_partition

    np.random.seed(seed)  # noqa: NPY002 - FedLab draws from numpy's global RNG
    return hetero_dir_partition(labels, clients, classes, beta, min_size)


def _child(labels: np.ndarray, clients: int, beta: float, min_size: int, q: Any) -> None:
    start = time.perf_counter()
    _fedlab_hetero(labels, clients, 10, beta, min_size, 0)
    q.put(time.perf_counter() - start)


def _settle() -> None:
    """Touch and free 256 MB between timed runs, outside the timer.

    The first memory a process touches after FedLab's run costs the kernel about a second of
    page reclaim at 10^7 labels (its lists leave memory fragmented; numpy asks for huge
    pages); without this, whichever run came next paid for it (measured: ours 1.2 s alone,
    2.1 s right after FedLab). Settling after every run charges no run for the one before.
    """
    block = np.ones(1 << 25)
    del block


def _record(
    impl: str, operation: str, size: tuple[int, int], beta: float, ts: list[float]
) -> dict[str, Any]:
    return {
        "impl": impl,
        "operation": operation,
        "labels": size[0],
        "clients": size[1],
        "beta": beta,
        "min_size": 10,
        "seconds": statistics.median(ts),
        "seconds_all": ts,
    }


def time_size(
    num_labels: int, clients: int, repeats: int, hang_limit: float
) -> list[dict[str, Any]]:
    """Every row of one size: beta 0.5 (ours, FedLab, mixed), then beta 0.1."""
    from fl_partitions import LabelDirichlet, Mixed

    size = (num_labels, clients)
    labels = np.random.default_rng(0).integers(0, 10, num_labels)
    runs: dict[str, Callable[[int], Any]] = {
        "fedbalance": lambda r: LabelDirichlet(beta=0.5, min_size=10).partition(
            labels, clients, seed=r
        ),
        "fedlab": lambda r: _fedlab_hetero(labels, clients, 10, 0.5, 10, r),
        "fedbalance mixed": lambda r: Mixed().partition(labels, clients, seed=r),
    }
    times: dict[str, list[float]] = {impl: [] for impl in runs}
    for r in range(repeats):
        for impl, run_one in runs.items():  # interleaved: noise hits every implementation
            start = time.perf_counter()
            run_one(r)
            times[impl].append(time.perf_counter() - start)
            _settle()
    records = [
        _record(impl.split()[0], "mixed" if "mixed" in impl else "label_dirichlet", size, 0.5, ts)
        for impl, ts in times.items()
    ]

    # beta 0.1, min size 10: ours must finish; FedLab gets hang_limit seconds in a child.
    ours01 = LabelDirichlet(beta=0.1, min_size=10)
    ts = []
    for r in range(repeats):
        start = time.perf_counter()
        p = ours01.partition(labels, clients, seed=r)
        ts.append(time.perf_counter() - start)
        assert p.sizes.min() >= 10
        _settle()
    records.append(_record("fedbalance", "label_dirichlet", size, 0.1, ts))
    if hang_limit > 0:
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        proc = ctx.Process(target=_child, args=(labels, clients, 0.1, 10, q))
        proc.start()
        proc.join(hang_limit)
        finished = not proc.is_alive()
        if not finished:
            proc.terminate()
            proc.join()
        records.append(
            {
                **_record("fedlab", "label_dirichlet", size, 0.1, [0.0]),
                "seconds": q.get() if finished else None,
                "seconds_all": None,
                "note": None if finished else f"did not return within {hang_limit:.0f} s",
            }
        )
    return records


def run(
    sizes: Sequence[tuple[int, int]] = SIZES,
    repeats: int = 5,
    hang_limit: float = 60.0,
    out_dir: Path = RESULTS,
) -> list[dict[str, Any]]:
    # Import FedLab (and torch behind it) before timing, or its first run pays seconds for it.
    import fedlab.utils.dataset.functional  # noqa: F401

    records: list[dict[str, Any]] = []
    for i, (num_labels, clients) in enumerate(sizes):
        # FedLab's beta-0.1 hang is shown once: at a larger size it only waits longer.
        records += time_size(num_labels, clients, repeats, hang_limit if i == 0 else 0)
    write(records, out_dir, repeats)
    return records


def write(records: list[dict[str, Any]], out_dir: Path, repeats: int) -> None:
    from fl_adapters._table import markdown_table

    out_dir.mkdir(parents=True, exist_ok=True)
    ref = {
        (r["labels"], r["clients"], r["beta"]): r["seconds"]
        for r in records
        if r["impl"] == "fedlab"
    }
    rows = []
    for r in records:
        fl = ref.get((r["labels"], r["clients"], r["beta"]))
        same = r["operation"] == "label_dirichlet"  # mixed adds feature noise: no FedLab twin
        ratio = (r["seconds"] / fl) if (same and fl and r["seconds"]) else None
        secs = r["seconds"] if r["seconds"] is not None else r.get("note")
        rows.append(
            [
                r["impl"],
                r["operation"],
                r["labels"],
                r["clients"],
                r["beta"],
                r["min_size"],
                secs,
                "-" if ratio is None else f"{ratio:.2f}x",
            ]
        )
    table = markdown_table(
        ["impl", "scheme", "labels", "clients", "beta", "min_size", "median s", "vs FedLab"], rows
    )
    header = (
        f"# Partition speed (label_dirichlet vs FedLab 1.3.0 hetero_dir_partition)\n\n"
        f"Median of {repeats} runs, same process, same labels; {platform.processor() or platform.machine()}, "
        f"{mp.cpu_count()} cores.\nRegenerate: `{COMMAND}`.\n\n"
    )
    (out_dir / "perf_partition.md").write_text(header + table + "\n")
    (out_dir / "perf_partition.json").write_text(json.dumps(records, indent=1) + "\n")
    print(header + table)


def _size(text: str) -> tuple[int, int]:
    try:
        labels, clients = (int(v) for v in text.lower().split("x"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"a size is LABELSxCLIENTS, got {text!r}") from e
    return labels, clients


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes",
        type=_size,
        nargs="+",
        default=list(SIZES),
        metavar="LABELSxCLIENTS",
        help="labels x clients of each case (default 1000000x1000 10000000x10000)",
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--hang-limit",
        type=float,
        default=60.0,
        help="seconds FedLab gets for the beta 0.1 case at the first size (0 skips it)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    run(a.sizes, a.repeats, a.hang_limit, a.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
