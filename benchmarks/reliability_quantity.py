"""What ``sample_clip`` costs where clients' sample counts honestly differ most.

The quantity section of the reliability report (:mod:`fedbalance_benchmarks.reliability`): the
thesis grid's ``quantity`` scenario, every count-weighted aggregator run trusting the reported
counts and with each bound in :data:`SAMPLE_CLIPS`, on the same seeds, so the accuracy and the
weight a bound moves are compared per seed at equal work.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from fedbalance_benchmarks._runs import mean_std, path_slug, read_metrics, run_jobs
from fedbalance_benchmarks.thesis import FULL as THESIS_FULL
from fedbalance_benchmarks.thesis import QUICK as THESIS_QUICK
from fedbalance_benchmarks.thesis import run_config as thesis_run_config

#: The sample_clip values measured: no margin, and a margin honest quantity skew rarely reaches.
SAMPLE_CLIPS = (1.0, 20.0)


def quantity_cost(opts: dict[str, Any]) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """What ``sample_clip`` costs where sample counts honestly differ most: the thesis grid's
    ``quantity`` scenario (quantity Dirichlet 0.5; thesis setting, 1 local epoch), every
    count-weighted aggregator trusting the counts and with each of :data:`SAMPLE_CLIPS`, same
    seeds."""
    base = dict(THESIS_QUICK if opts["quick"] else THESIS_FULL, local_epochs=1)
    base.update(dataset=opts["dataset"], quick=opts["quick"])
    runs_dir = Path(opts["runs_dir"]) / "quantity"
    jobs, meta = [], []
    for agg in ("fedavg", "fedavgm", "fedloss_n"):
        for clip in (None, *SAMPLE_CLIPS):
            for seed in range(opts["seeds"]):
                cfg = thesis_run_config("quantity", agg, seed, base)
                cfg["aggregator_args"] = {**cfg["aggregator_args"], "sample_clip": clip}
                out = runs_dir / path_slug(agg, f"sample_clip_{clip}") / f"seed{seed}"
                jobs.append((cfg, out))
                meta.append((agg, clip, seed, out))
    run_jobs(jobs, opts["workers"], "quantity")
    curves: dict[tuple[str, float | None], list[dict[str, Any]]] = {}
    for agg, clip, seed, out in meta:
        rows = read_metrics(out)
        evals = [r for r in rows if "test_accuracy" in r]
        curves.setdefault((agg, clip), []).append(
            {
                "seed": seed,
                "final": evals[-1]["test_accuracy"],
                "best": max(r["test_accuracy"] for r in evals),
                "weights": [r["weights"] for r in rows],
            }
        )
    rows_out, summary = [], []
    for agg in ("fedavg", "fedavgm", "fedloss_n"):
        free = curves[(agg, None)]
        finals_free = [r["final"] for r in free]
        sd = 100 * (statistics.pstdev(finals_free) if len(finals_free) > 1 else 0.0)
        for clip in (None, *SAMPLE_CLIPS):
            runs = curves[(agg, clip)]
            # How much weight the bound moved, round by round (same seed: same clients in the
            # same order): total variation between the two runs' weight vectors.
            moved = [
                0.5 * sum(abs(x - y) for x, y in zip(wf, wc, strict=True))
                for f, c in zip(free, runs, strict=True)
                for wf, wc in zip(f["weights"], c["weights"], strict=True)
            ]
            finals = [r["final"] for r in runs]
            delta = 100 * (statistics.mean(finals) - statistics.mean(finals_free))
            row = {
                "aggregator": agg,
                "sample_clip": clip,
                "final": mean_std(finals),
                "best": mean_std([r["best"] for r in runs]),
                "delta": delta,
                "std_trusting": sd,
                "rounds_moved": sum(m > 1e-9 for m in moved) / len(moved),
                "mean_moved": statistics.mean(moved),
            }
            summary.append(row)
            rows_out.append(
                [
                    agg,
                    "- (trusting)" if clip is None else f"{clip:g}",
                    row["final"],
                    row["best"],
                    "-" if clip is None else f"{delta:+.2f}",
                    "-" if clip is None else ("yes" if abs(delta) <= sd else "no"),
                    "-" if clip is None else f"{100 * row['rounds_moved']:.0f} %",
                    "-" if clip is None else f"{row['mean_moved']:.3f}",
                ]
            )
    return rows_out, summary


QUANTITY_HEADER = [
    "aggregator",
    "sample_clip",
    "final acc %",
    "best acc %",
    "Δ final vs trusting (points)",
    "|Δ| ≤ std of trusting",
    "rounds where weights moved",
    "weight moved per round (mean)",
]
