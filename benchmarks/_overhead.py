"""Shared parts of the per-round overhead benchmarks (FedLab and FedML hosts)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def report(
    *,
    host: str,
    stem: str,
    stock_label: str,
    t_stock: float,
    t_ours: dict[str, float],
    round_s: float,
    record: dict[str, Any],
    header: str,
    out_dir: Path,
) -> str:
    """Table of stock vs fedbalance server times and their share of a round; writes md + json."""
    from fl_adapters._table import markdown_table

    rows = [[stock_label, f"{1e3 * t_stock:.3f}", "1.00x", "-"]]
    record.update(stock_seconds=t_stock, round_seconds=round_s, fedbalance={})
    for name, t in t_ours.items():
        overhead = (t - t_stock) / round_s
        rows.append(
            [
                f"fedbalance {name}",
                f"{1e3 * t:.3f}",
                f"{t / t_stock:.2f}x",
                f"{100 * overhead:.3f} %",
            ]
        )
        record["fedbalance"][name] = {"seconds": t, "overhead_of_round": overhead}
    table = markdown_table(
        ["server update", "median ms", f"vs {host}", "extra time per round"], rows
    )
    text = f"{header}\nRegenerate: `fedbalance bench {stem.replace('perf_', '').replace('_', '-')}`.\n\n{table}\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.md").write_text(text)
    (out_dir / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(text)
    return text


def main(
    prog: str, doc: str, run: Callable[[int, int, int, Path], Any], argv: list[str] | None
) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    run(a.repeats, a.rounds, a.local_epochs, a.out)
    return 0
