"""Partition speed: fedbalance's ``label_dirichlet`` against FedLab 1.3.0's ``hetero_dir_partition``.

Both run in the same process on the same labels, alternating, so machine noise hits both;
the result is the ratio of median times. FedLab's function returns only the client dict,
ours a full ``Partition`` (local splits and class counts included) — the comparison favours
FedLab. The second case (beta 0.1, min size 10) is where FedLab's unbounded redraw loop does
not return; it is run for FedLab in a child process with a time limit.

    python -m fedbalance_benchmarks.perf_partition [--repeats 5] [--hang-limit 60]
    fedbalance bench perf-partition
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


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


def run(
    num_labels: int = 1_000_000,
    clients: int = 1000,
    repeats: int = 5,
    hang_limit: float = 60.0,
    out_dir: Path = RESULTS,
) -> list[dict[str, Any]]:
    from fl_partitions import LabelDirichlet

    labels = np.random.default_rng(0).integers(0, 10, num_labels)
    records: list[dict[str, Any]] = []
    ours = LabelDirichlet(beta=0.5, min_size=10)
    times: dict[str, list[float]] = {"fedbalance": [], "fedlab": []}
    for r in range(repeats):
        start = time.perf_counter()
        ours.partition(labels, clients, seed=r)
        times["fedbalance"].append(time.perf_counter() - start)
        start = time.perf_counter()
        _fedlab_hetero(labels, clients, 10, 0.5, 10, r)
        times["fedlab"].append(time.perf_counter() - start)
    for impl, ts in times.items():
        records.append(
            {
                "impl": impl,
                "operation": "label_dirichlet",
                "labels": num_labels,
                "clients": clients,
                "beta": 0.5,
                "min_size": 10,
                "seconds": statistics.median(ts),
                "seconds_all": ts,
            }
        )

    # beta 0.1, min size 10: ours must finish; FedLab gets hang_limit seconds in a child.
    ours01 = LabelDirichlet(beta=0.1, min_size=10)
    ts = []
    for r in range(repeats):
        start = time.perf_counter()
        p = ours01.partition(labels, clients, seed=r)
        ts.append(time.perf_counter() - start)
        assert p.sizes.min() >= 10
    records.append(
        {
            "impl": "fedbalance",
            "operation": "label_dirichlet",
            "labels": num_labels,
            "clients": clients,
            "beta": 0.1,
            "min_size": 10,
            "seconds": statistics.median(ts),
            "seconds_all": ts,
        }
    )
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
                "impl": "fedlab",
                "operation": "label_dirichlet",
                "labels": num_labels,
                "clients": clients,
                "beta": 0.1,
                "min_size": 10,
                "seconds": q.get() if finished else None,
                "note": None if finished else f"did not return within {hang_limit:.0f} s",
            }
        )
    write(records, out_dir, repeats)
    return records


def write(records: list[dict[str, Any]], out_dir: Path, repeats: int) -> None:
    from fl_adapters._table import markdown_table

    out_dir.mkdir(parents=True, exist_ok=True)
    ref = {(r["beta"]): r["seconds"] for r in records if r["impl"] == "fedlab"}
    rows = []
    for r in records:
        fl = ref.get(r["beta"])
        ratio = (r["seconds"] / fl) if (fl and r["seconds"]) else None
        secs = r["seconds"] if r["seconds"] is not None else r.get("note")
        rows.append(
            [
                r["impl"],
                r["labels"],
                r["clients"],
                r["beta"],
                r["min_size"],
                secs,
                "-" if ratio is None else f"{ratio:.2f}x",
            ]
        )
    table = markdown_table(
        ["impl", "labels", "clients", "beta", "min_size", "median s", "vs FedLab"], rows
    )
    header = (
        f"# Partition speed (label_dirichlet vs FedLab 1.3.0 hetero_dir_partition)\n\n"
        f"Median of {repeats} runs, same process, same labels; {platform.processor() or platform.machine()}, "
        f"{mp.cpu_count()} cores.\nRegenerate: `fedbalance bench perf-partition`.\n\n"
    )
    (out_dir / "perf_partition.md").write_text(header + table + "\n")
    (out_dir / "perf_partition.json").write_text(json.dumps(records, indent=1) + "\n")
    print(header + table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labels", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--hang-limit",
        type=float,
        default=60.0,
        help="seconds FedLab gets for the beta 0.1 case (0 skips it)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    run(a.labels, a.clients, a.repeats, a.hang_limit, a.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
