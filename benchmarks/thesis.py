"""The FedLoss thesis benchmark: five skew scenarios x five aggregators, on FedLab.

Tagarakis, "FedLoss", NTUA diploma thesis, 2023, Tables 1-10 / Figures 12-21: 30 clients,
5 sampled per round, 50 rounds, Adam (lr 1e-3), batch 64, the thesis CNN, accuracy of the
global model on every client's test split (weighted by size) after each round. Every run is
one FedLab ``StandalonePipeline`` (:func:`fl_adapters.fedlab.runner.run_standalone`); runs are
spread over worker processes and skipped when their ``summary.json`` already exists, so an
interrupted grid resumes where it stopped.

    fedbalance bench thesis [--quick] [--dataset fmnist] [--seeds 3] [--local-epochs 10] [--out DIR]

Writes ``thesis_<dataset>.md`` (a table per scenario: mean +- std accuracy over seeds at five
checkpoints, best accuracy and its round), ``thesis_<dataset>.json`` (every run's curve) and
``thesis_<dataset>_<scenario>.png`` (accuracy vs round, mean +- std band).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

SCENARIOS: dict[str, dict[str, Any]] = {
    "iid": {"name": "iid"},
    "label": {"name": "label_dirichlet", "beta": 0.5},
    "quantity": {"name": "quantity_dirichlet", "beta": 0.5},
    "feature": {"name": "feature_noise", "sigma": 0.1},
    "mixed": {"name": "mixed"},
}
AGGREGATORS = ("fedavg", "fedavgm", "fedmedian", "fedloss", "fedloss_n")
HOST_LABELS = {
    "fedlab": "FedLab standalone",
    "fedml-sp": "FedML sp simulation",
    "flower": "Flower 1.41 simulation engine",
}
FULL = dict(num_clients=30, clients_per_round=5, rounds=50, local_epochs=10)
QUICK = dict(num_clients=10, clients_per_round=3, rounds=5, local_epochs=1, max_samples=6000)
#: The thesis's rule: FedLoss weights exactly l_i / sum l among losses within 5x the median.
#: The library default also lowers a round's top loss to the runner-up's (``peer_clip=1``,
#: see fl_aggregators.fedloss), which the reliability benchmark measures; this grid
#: reproduces the thesis.
#: Likewise FedAvg and FedLoss-n trust the reported sample counts (``sample_clip=None``), as
#: the papers do; the library's default margin (20) is measured by the reliability benchmark.
AGGREGATOR_ARGS: dict[str, dict[str, Any]] = {
    "fedavg": {"sample_clip": None},
    "fedloss": {"peer_clip": None},
    "fedloss_n": {"peer_clip": None, "sample_clip": None},
}


def run_config(scenario: str, aggregator: str, seed: int, opts: dict[str, Any]) -> dict[str, Any]:
    return {
        "framework": opts.get("framework", "fedlab"),
        "dataset": opts["dataset"],
        "partition": SCENARIOS[scenario],
        "aggregator": aggregator,
        "aggregator_args": AGGREGATOR_ARGS.get(aggregator, {}),
        "seed": seed,
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": 64,
        **{
            k: opts[k]
            for k in ("num_clients", "clients_per_round", "rounds", "local_epochs", "max_samples")
            if opts.get(k) is not None
        },
    }


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)  # one process per core beats two threads per process here


def _run_one(cfg: dict[str, Any], out_dir: str, hook: Any = None) -> dict[str, Any]:
    import logging

    from fl_adapters.config import RunConfig

    logging.getLogger("fl_aggregators").setLevel(logging.ERROR)
    config = RunConfig.from_dict(cfg)
    if config.framework == "fedml-sp":
        from fl_adapters.fedml.runner import run_fedml

        return run_fedml(config, Path(out_dir))
    if config.framework == "flower":  # in Flower's environment (.venv-flower)
        from fl_adapters.flower.runner import run_flower

        return run_flower(config, Path(out_dir))
    if config.framework == "fedlab-distributed":  # a server and 2 client processes, 1 thread each
        import dataclasses

        from fl_adapters.fedlab.runner import run_distributed
        from fl_adapters.fedml.ipconfig import free_ports

        # Parallel workers' runs must not share FedLab's default port.
        config = dataclasses.replace(config, port=free_ports(1)[0])
        return run_distributed(config, Path(out_dir), client_processes=2)
    from fl_adapters.fedlab.runner import run_standalone

    return run_standalone(config, Path(out_dir), progress=False, uplink_hook=hook)


def _suffix(opts: dict[str, Any]) -> str:
    host = "" if opts.get("framework", "fedlab") == "fedlab" else f"_{opts['framework']}"
    return host + ("_quick" if opts["quick"] else "")


def run_jobs(
    jobs: list[tuple[dict[str, Any], Path]],
    workers: int,
    desc: str,
    hooks: list[Any] | None = None,
) -> None:
    """Run each ``(config, out_dir)`` whose ``summary.json`` is missing, in worker processes
    (``hooks[i]``, if given, is job ``i``'s FedLab uplink hook: a picklable callable)."""
    from tqdm import tqdm

    hooks = hooks if hooks is not None else [None] * len(jobs)
    todo = [
        (cfg, out, hook)
        for (cfg, out), hook in zip(jobs, hooks, strict=True)
        if not (out / "summary.json").exists()
    ]
    if not todo:
        return
    with ProcessPoolExecutor(max_workers=workers, initializer=_worker_init) as pool:
        futures = [pool.submit(_run_one, cfg, str(out), hook) for cfg, out, hook in todo]
        for fut in tqdm(as_completed(futures), total=len(futures), desc=f"{desc} runs", unit="run"):
            fut.result()


def output_dirs(
    out: Path | None, runs_dir: Path | None, quick: bool, stem: str, cache: str
) -> tuple[Path, Path]:
    """Where a benchmark writes its tables (made) and keeps its runs: ``runs/bench-quick`` and
    its ``runs/STEM`` for ``--quick``; committed results and ``~/.cache/fedbalance/CACHE/STEM``
    otherwise."""
    out_dir = out or (Path("runs/bench-quick") if quick else RESULTS)
    runs = runs_dir or (
        out_dir / "runs" / stem if quick else Path.home() / ".cache" / "fedbalance" / cache / stem
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir, runs


def read_metrics(out_dir: Path) -> list[dict[str, Any]]:
    """A run's ``metrics.jsonl``: one dict per round."""
    return [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]


def run_grid(opts: dict[str, Any]) -> list[dict[str, Any]]:
    """Run (or resume) every (scenario, aggregator, seed); return per-run curves."""
    runs_dir = Path(opts["runs_dir"]) / f"{opts['dataset']}{_suffix(opts)}"
    jobs = []
    for scenario in opts["scenarios"]:
        for agg in opts["aggregators"]:
            for seed in range(opts["seeds"]):
                out = runs_dir / scenario / agg / f"seed{seed}"
                jobs.append((scenario, agg, seed, out))
    run_jobs(
        [(run_config(s, a, seed, opts), out) for s, a, seed, out in jobs], opts["workers"], "thesis"
    )
    curves = []
    for scenario, agg, seed, out in jobs:
        rows = read_metrics(out)
        curves.append(
            {
                "scenario": scenario,
                "aggregator": agg,
                "seed": seed,
                "rounds": [r["round"] for r in rows if "test_accuracy" in r],
                "accuracy": [r["test_accuracy"] for r in rows if "test_accuracy" in r],
                "bytes_up": sum(r.get("bytes_up", 0) for r in rows),
            }
        )
    return curves


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.2f} ± {100 * sd:.2f}"


#: What must match for committed grids of other hosts to stand beside this one.
SAME_SETTINGS = ("dataset", "num_clients", "clients_per_round", "rounds", "local_epochs", "seeds")


def committed_hosts_table(curves: list[dict[str, Any]], opts: dict[str, Any]) -> str:
    """Best accuracy per host from the committed grids (``results/thesis_*.json``) of the same
    settings, beside this run's: how a host that cannot share an environment with the others
    (Flower) compares without their per-run directories."""
    from fl_adapters._table import markdown_table

    hosts: dict[str, list[dict[str, Any]]] = {}
    for framework in HOST_LABELS:
        if framework == opts["framework"]:
            hosts[framework] = curves
            continue
        suffix = "" if framework == "fedlab" else f"_{framework}"
        path = RESULTS / f"thesis_{opts['dataset']}{suffix}.json"
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        if all(doc["options"].get(k) == opts.get(k) for k in SAME_SETTINGS):
            hosts[framework] = doc["runs"]
    if len(hosts) < 2:
        return ""
    rows = []
    for scenario in opts["scenarios"]:
        for agg in opts["aggregators"]:
            row = [scenario, agg]
            for runs in hosts.values():
                best = [
                    max(c["accuracy"])
                    for c in runs
                    if c["scenario"] == scenario and c["aggregator"] == agg
                ]
                row.append(mean_std(best) if len(best) == opts["seeds"] else "-")
            rows.append(row)
    head = ["scenario", "aggregator", *[f"{HOST_LABELS[h]} best %" for h in hosts]]
    return (
        "Beside the committed grids of the other hosts (same partitions, seeds and settings; "
        "each host's own training loop):\n\n" + markdown_table(head, rows)
    )


def tables(curves: list[dict[str, Any]], opts: dict[str, Any]) -> str:
    from fl_adapters._table import markdown_table

    rounds = opts["rounds"]
    checkpoints = sorted({max(1, round(rounds * f / 5)) for f in range(1, 6)})
    out = []
    for scenario in opts["scenarios"]:
        rows = []
        for agg in opts["aggregators"]:
            runs = [c for c in curves if c["scenario"] == scenario and c["aggregator"] == agg]
            cells = [
                mean_std([c["accuracy"][c["rounds"].index(r)] for c in runs if r in c["rounds"]])
                for r in checkpoints
            ]
            best = [max(c["accuracy"]) for c in runs]
            best_round = [c["rounds"][c["accuracy"].index(max(c["accuracy"]))] for c in runs]
            rows.append([agg, *cells, mean_std(best), f"{statistics.mean(best_round):.0f}"])
        header = ["aggregator", *[f"acc@{r}" for r in checkpoints], "best acc", "best round (mean)"]
        out.append(
            f"### {scenario}: `{json.dumps(SCENARIOS[scenario])}`\n\n"
            + markdown_table(header, rows)
        )
    return "\n\n".join(out)


def summary_table(curves: list[dict[str, Any]], opts: dict[str, Any]) -> str:
    """Best accuracy (mean ± std over seeds), aggregators x scenarios: the grid at a glance."""
    from fl_adapters._table import markdown_table

    rows = []
    for agg in opts["aggregators"]:
        row = [agg]
        for scenario in opts["scenarios"]:
            runs = [c for c in curves if c["scenario"] == scenario and c["aggregator"] == agg]
            row.append(mean_std([max(c["accuracy"]) for c in runs]))
        rows.append(row)
    return markdown_table(["best acc %", *opts["scenarios"]], rows)


def host_comparison(curves: list[dict[str, Any]], opts: dict[str, Any]) -> str:
    """FedML's runs beside FedLab's on the same partition, seeds and settings (if run)."""
    from fl_adapters._table import markdown_table

    fedlab_dir = Path(opts["runs_dir"]) / (opts["dataset"] + ("_quick" if opts["quick"] else ""))
    rows = []
    for scenario in opts["scenarios"]:
        for agg in opts["aggregators"]:
            ours = [c for c in curves if c["scenario"] == scenario and c["aggregator"] == agg]
            best_lab = []
            for c in ours:
                run = fedlab_dir / scenario / agg / f"seed{c['seed']}"
                if (run / "metrics.jsonl").exists():
                    rows_lab = read_metrics(run)
                    best_lab.append(
                        max(r["test_accuracy"] for r in rows_lab if "test_accuracy" in r)
                    )
            if len(best_lab) != len(ours):
                continue
            best_ml = [max(c["accuracy"]) for c in ours]
            diff = 100 * (statistics.mean(best_ml) - statistics.mean(best_lab))
            spread = 100 * max(statistics.pstdev(best_ml), statistics.pstdev(best_lab))
            rows.append(
                [
                    scenario,
                    agg,
                    mean_std(best_lab),
                    mean_std(best_ml),
                    f"{diff:+.2f}",
                    f"{spread:.2f}",
                ]
            )
    if not rows:
        return ""
    host = {"fedml-sp": "FedML sp", "flower": "Flower"}[opts["framework"]]
    short = host.split()[0]
    return f"FedLab standalone vs {host}, same partitions, seeds and settings:\n\n" + (
        markdown_table(
            [
                "scenario",
                "aggregator",
                "FedLab best %",
                f"{short} best %",
                f"{short} - FedLab",
                "max std",
            ],
            rows,
        )
    )


def plots(
    curves: list[dict[str, Any]], opts: dict[str, Any], out_dir: Path, stem: str
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    for scenario in opts["scenarios"]:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for agg in opts["aggregators"]:
            runs = [c for c in curves if c["scenario"] == scenario and c["aggregator"] == agg]
            if not runs:
                continue
            acc = 100 * np.array([c["accuracy"] for c in runs])
            x = runs[0]["rounds"]
            mean, sd = acc.mean(axis=0), acc.std(axis=0)
            ax.plot(x, mean, label=agg)
            ax.fill_between(x, mean - sd, mean + sd, alpha=0.2)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{opts['dataset']}: {scenario} (mean ± std over {opts['seeds']} seeds)")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"{stem}_{scenario}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fedbalance bench thesis", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="10 clients, 3 per round, 5 rounds, 1 epoch, 6,000 samples",
    )
    ap.add_argument("--dataset", default="fmnist", choices=["fmnist", "digits", "svhn", "cifar10"])
    ap.add_argument(
        "--seeds", type=int, default=None, help="seeds 0..N-1 (default 3; 1 with --quick)"
    )
    ap.add_argument("--local-epochs", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2)))
    ap.add_argument(
        "--framework",
        default="fedlab",
        choices=["fedlab", "fedml-sp", "flower"],
        help="host: FedLab's standalone pipeline, FedML's sp simulation or Flower's simulation"
        " engine (run from Flower's environment)",
    )
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--aggregators", nargs="+", default=list(AGGREGATORS))
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default benchmarks/results (runs/bench-quick with --quick)",
    )
    ap.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="per-run metrics, kept to resume (default ~/.cache/fedbalance/thesis-runs;"
        " <out>/runs with --quick)",
    )
    a = ap.parse_args(argv)
    opts: dict[str, Any] = dict(QUICK if a.quick else FULL)
    opts.update(
        framework=a.framework,
        dataset=a.dataset,
        quick=a.quick,
        seeds=a.seeds or (1 if a.quick else 3),
        workers=a.workers,
        scenarios=a.scenarios,
        aggregators=a.aggregators,
    )
    if a.local_epochs:
        opts["local_epochs"] = a.local_epochs
    if a.rounds:
        opts["rounds"] = a.rounds
    out_dir = a.out or (Path("runs/bench-quick") if a.quick else RESULTS)
    opts["out"] = str(out_dir)
    default_runs = (
        out_dir / "runs" if a.quick else Path.home() / ".cache" / "fedbalance" / "thesis-runs"
    )
    opts["runs_dir"] = str(a.runs_dir or default_runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    curves = run_grid(opts)
    stem = f"thesis_{a.dataset}{_suffix(opts)}"
    note = (
        ""
        if opts["local_epochs"] == 10
        else (
            f" **{opts['local_epochs']} local epochs** (the thesis used 10; fewer to fit this machine's time)."
        )
    )
    command = "fedbalance bench thesis " + " ".join(argv if argv is not None else sys.argv[1:])
    header = (
        f"# FedLoss thesis benchmark on {a.dataset} ({HOST_LABELS[a.framework]})\n\n"
        f"{opts['num_clients']} clients, {opts['clients_per_round']} per round, {opts['rounds']} rounds,"
        f" Adam lr 1e-3, batch 64, thesis CNN, seeds 0..{opts['seeds'] - 1}; accuracy (%) of the global"
        f" model on all clients' test splits, mean ± std over seeds. fedloss and fedloss_n run"
        f" with `peer_clip: null`, fedavg and fedloss_n with `sample_clip: null` (the papers'"
        f" weights; see `fl_aggregators.fedloss`, `fl_aggregators.fedavg`).{note}\n\n"
        f"Regenerate: `{command.strip()}` (an interrupted grid resumes from `--runs-dir`).\n\n"
    )
    text = header + summary_table(curves, opts) + "\n\n"
    if a.framework != "fedlab":
        comparison = host_comparison(curves, opts)
        text += comparison + "\n\n" if comparison else ""
        committed = committed_hosts_table(curves, opts)
        text += committed + "\n\n" if committed else ""
    text += tables(curves, opts) + "\n"
    (out_dir / f"{stem}.md").write_text(text)
    (out_dir / f"{stem}.json").write_text(
        json.dumps({"options": opts, "runs": curves}, indent=1) + "\n"
    )
    plots(curves, opts, out_dir, stem)
    print(text)
    print(f"wrote {out_dir}/{stem}.md, .json and .png plots in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
