"""FedAvgM's server momentum and learning rate, chosen on the clients' validation splits.

FedAvgM (Hsu et al. 2019) steps ``w <- w - server_lr * v`` with ``v <- beta * v + delta``; in a
steady state its step is ``server_lr / (1 - beta)`` times the averaged update, 10x at the
library's former default (``beta 0.9, server_lr 1``), which diverged at the thesis setting
(10 local epochs of Adam). Flower's ``FedAvgM`` defaults to ``server_momentum=0.0,
server_learning_rate=1.0``, which is FedAvg exactly. This sweep picks the pair the thesis grid
runs FedAvgM with, at the grid's setting, scored only on the global model's accuracy on every
client's *validation* split (``eval_data: val``): the test splits are never read.

    fedbalance bench fedavgm-sweep [--rounds 30] [--scenarios label quantity] [--seeds 1]

Score of a pair: the mean validation accuracy over its last 5 rounds, averaged over the
scenarios and seeds. Writes ``fedavgm_sweep_<dataset>_e<E>.md`` and ``.json`` (every run's
validation curve and the ``chosen`` pair, which :func:`fedbalance_benchmarks.thesis.fedavgm_args`
reads); per-run records go to ``per-run/<stem>/`` and a sweep resumes from them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from fedbalance_benchmarks._runs import RESULTS
from fedbalance_benchmarks.thesis import FULL, run_grid, stem_of

BETAS = (0.0, 0.5, 0.7, 0.9)
SERVER_LRS = (0.1, 0.3, 1.0)
#: Rounds whose mean validation accuracy scores a run.
LAST = 5
#: A run whose last-rounds mean is this far below its best round is named as diverging.
DROP = 0.05


def label(beta: float, server_lr: float) -> str:
    """A pair's name (and its records' folder): ``beta0.9_lr1``."""
    return f"beta{beta:g}_lr{server_lr:g}"


def variants(betas: tuple[float, ...], lrs: tuple[float, ...]) -> dict[str, Any]:
    return {
        label(b, lr): (
            "fedavgm",
            {"beta": b, "server_lr": lr, "update_clip": None, "sample_clip": None},
        )
        for b in betas
        for lr in lrs
    }


def score(curve: dict[str, Any]) -> float:
    """Mean validation accuracy over the last :data:`LAST` evaluated rounds."""
    return statistics.mean(curve["accuracy"][-LAST:])


def summarise(curves: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per pair: its score per scenario and overall, the runs that diverged, and the choice."""
    rows = []
    for name in names:
        runs = [c for c in curves if c["aggregator"] == name]
        if not runs:
            continue
        per = {}
        for sc in sorted({c["scenario"] for c in runs}):
            per[sc] = statistics.mean(score(c) for c in runs if c["scenario"] == sc)
        diverged = [
            f"{c['scenario']}/seed{c['seed']}" for c in runs if max(c["accuracy"]) - score(c) > DROP
        ]
        args = runs[0]["config"]["aggregator_args"]
        rows.append(
            {
                "name": name,
                "beta": args["beta"],
                "server_lr": args["server_lr"],
                "runs": len(runs),
                "by_scenario": per,
                "score": statistics.mean(per.values()),
                "diverged": diverged,
            }
        )
    complete = [r for r in rows if r["runs"] == max(x["runs"] for x in rows)] if rows else []
    best = max(complete, key=lambda r: r["score"]) if complete else None
    chosen = None if best is None else {k: best[k] for k in ("beta", "server_lr", "score")}
    return {"pairs": rows, "chosen": chosen}


def write_report(
    curves: list[dict[str, Any]], summary: dict[str, Any], opts: dict[str, Any], command: str
) -> str:
    stem = stem_of(opts)
    scenarios = list(opts["scenarios"])
    chosen = summary["chosen"]
    lines = [
        f"# FedAvgM sweep on {opts['dataset']}: server momentum x server learning rate",
        "",
        f"{opts['num_clients']} clients, {opts['clients_per_round']} per round, {opts['rounds']}"
        f" rounds, {opts['local_epochs']} local epochs, Adam lr 1e-3, batch 64, thesis CNN,"
        f" seeds 0..{opts['seeds'] - 1}, scenarios {', '.join(scenarios)} (a reduced sweep: the"
        " grid runs 50 rounds on five scenarios). Scored **only on validation data**: the"
        " accuracy (%) of the global model on every client's validation split (10 % of its"
        f" data), mean over the last {LAST} rounds, then over scenarios and seeds. The test"
        " splits are never evaluated.",
        "",
        f"Regenerate: `{command}` (resumes from `per-run/{stem}/`; `--no-run` rewrites this"
        " report from the records alone).",
        "",
        "| beta | server_lr | steady step | " + " | ".join(scenarios) + " | score | diverged |",
        "|---|---|---|" + "---|" * len(scenarios) + "---|---|",
    ]
    for r in summary["pairs"]:
        step = r["server_lr"] / (1 - r["beta"])
        cells = [
            f"{100 * r['by_scenario'][s]:.2f}" if s in r["by_scenario"] else "-" for s in scenarios
        ]
        mark = (
            " **(chosen)**"
            if chosen and (r["beta"], r["server_lr"]) == (chosen["beta"], chosen["server_lr"])
            else ""
        )
        lines.append(
            f"| {r['beta']:g} | {r['server_lr']:g} | {step:.2g}x | "
            + " | ".join(cells)
            + f" | {100 * r['score']:.2f}{mark} | {', '.join(r['diverged']) or '-'} |"
        )
    lines += [
        "",
        "*steady step*: `server_lr / (1 - beta)`, the multiple of the averaged client update"
        " that a constant update would be stepped by. *diverged*: runs whose last"
        f" {LAST}-round mean is more than {100 * DROP:.0f} points below their best round.",
        "",
    ]
    if chosen:
        lines.append(
            f"**Chosen: beta = {chosen['beta']:g}, server_lr = {chosen['server_lr']:g}**"
            f" (score {100 * chosen['score']:.2f}). The thesis grids (1 and 10 local epochs)"
            " run FedAvgM with it, and it is the library's default (`fl_aggregators.fedavgm`)."
            " Flower's `FedAvgM` defaults to `server_momentum=0.0, server_learning_rate=1.0`,"
            " which is FedAvg."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fedbalance bench fedavgm-sweep", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--dataset", default="fmnist", choices=["fmnist", "digits"])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--local-epochs", type=int, default=FULL["local_epochs"])
    ap.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1")
    ap.add_argument("--scenarios", nargs="+", default=["label", "quantity"])
    ap.add_argument("--betas", nargs="+", type=float, default=list(BETAS))
    ap.add_argument("--server-lrs", nargs="+", type=float, default=list(SERVER_LRS))
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2)))
    ap.add_argument("--out", type=Path, default=None, help="default benchmarks/results")
    ap.add_argument(
        "--runs-dir",
        type=Path,
        default=Path.home() / ".cache" / "fedbalance" / "thesis-runs",
        help="per-run metrics, kept to resume",
    )
    ap.add_argument("--num-clients", type=int, default=FULL["num_clients"])
    ap.add_argument("--max-samples", type=int, default=None)
    ap.add_argument("--no-run", action="store_true", help="report from the records only")
    a = ap.parse_args(argv)
    names = list(variants(tuple(a.betas), tuple(a.server_lrs)))
    out_dir = a.out or RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    opts: dict[str, Any] = dict(FULL)
    opts.update(
        name="fedavgm_sweep",
        framework="fedlab",
        dataset=a.dataset,
        quick=False,
        seeds=a.seeds,
        workers=a.workers,
        scenarios=a.scenarios,
        aggregators=names,
        variants=variants(tuple(a.betas), tuple(a.server_lrs)),
        rounds=a.rounds,
        local_epochs=a.local_epochs,
        num_clients=a.num_clients,
        clients_per_round=min(FULL["clients_per_round"], a.num_clients),
        max_samples=a.max_samples,
        eval_data="val",
        out=str(out_dir),
        runs_dir=str(a.runs_dir),
    )
    curves = run_grid(opts, run=not a.no_run)
    if not curves:
        print("no run of this sweep is recorded yet: nothing to report", file=sys.stderr)
        return 1
    summary = summarise(curves, names)
    args = [x for x in (argv if argv is not None else sys.argv[1:]) if x != "--no-run"]
    command = ("fedbalance bench fedavgm-sweep " + " ".join(args)).strip()
    stem = stem_of(opts)
    text = write_report(curves, summary, opts, command)
    (out_dir / f"{stem}.md").write_text(text)
    doc = {"command": command, **summary, "runs": curves}
    (out_dir / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
