"""The FedLoss thesis benchmark: five skew scenarios x six aggregator variants, on FedLab.

Tagarakis, "FedLoss", NTUA diploma thesis, 2023, Tables 1-10 / Figures 12-21: 30 clients,
5 sampled per round, 50 rounds, 10 local epochs, Adam (lr 1e-3), batch 64, the thesis CNN,
accuracy of the global model on every client's test split (weighted by size) after each round.
Every run is one FedLab ``StandalonePipeline`` (:func:`fl_adapters.fedlab.runner.run_standalone`),
spread over worker processes. Each finished run leaves a compact record (its resolved config and
per-round accuracy, loss and top weight, a few KB) in ``<out>/per-run/<stem>/``; those records
are results, committed with the tables, and a run whose record matches its config is never run
again, so a grid resumes across interruptions and machines.

    fedbalance bench thesis [--quick] [--dataset fmnist] [--seeds 3] [--local-epochs 10] [--out DIR]

Writes ``<stem>.md`` (a table per scenario: mean +- std accuracy over seeds every 10 rounds,
best accuracy and its round; with 10 local epochs, the thesis's claims beside ours),
``<stem>.json`` (every run's curve) and ``<stem>_<scenario>.png`` (accuracy vs round, mean +- std
band). The stem is ``thesis_<dataset>``, then ``_<framework>`` unless FedLab, ``_e<E>`` unless
1 local epoch, ``_quick`` with ``--quick``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from fedbalance_benchmarks._runs import (
    RESULTS,
    matching_record,
    read_metrics,
    run_one,
    worker_init,
)

log = logging.getLogger(__name__)

SCENARIOS: dict[str, dict[str, Any]] = {
    "iid": {"name": "iid"},
    "label": {"name": "label_dirichlet", "beta": 0.5},
    "quantity": {"name": "quantity_dirichlet", "beta": 0.5},
    "feature": {"name": "feature_noise", "sigma": 0.1},
    "mixed": {"name": "mixed"},
}
#: The hosts a grid runs on, as the reports name them.
HOST_LABELS = {
    "fedlab": "FedLab standalone",
    "fedml-sp": "FedML sp simulation",
    "flower": "Flower 1.41 simulation engine",
}
FULL = dict(num_clients=30, clients_per_round=5, rounds=50, local_epochs=10)
QUICK = dict(num_clients=10, clients_per_round=3, rounds=5, local_epochs=1, max_samples=6000)
#: The grid's entries: name -> (aggregator, arguments). ``fedloss`` and ``fedloss_n`` are the
#: thesis's rules exactly, every bound off; ``fedloss-default`` is the library's default
#: (``loss_clip: 5``, ``peer_clip: 1``, see fl_aggregators.fedloss), and every record lists the
#: rounds in which a bound changed a weight. FedAvg trusts the reported sample counts
#: (``sample_clip: null``) as the papers do; the library's default margin is measured by the
#: reliability benchmark. FedAvgM runs with the momentum and server learning rate that the
#: committed sweep chose on the clients' validation splits (:func:`fedavgm_args`).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg": ("fedavg", {"sample_clip": None}),
    "fedavgm": ("fedavgm", {}),  # + fedavgm_args()
    "fedmedian": ("fedmedian", {}),
    "fedloss": ("fedloss", {"loss_clip": None, "peer_clip": None}),
    "fedloss-default": ("fedloss", {}),
    "fedloss_n": ("fedloss_n", {"loss_clip": None, "peer_clip": None, "sample_clip": None}),
}
#: The sweep whose choice FedAvgM runs with (``fedbalance bench fedavgm-sweep``).
SWEEP = RESULTS / "fedavgm_sweep_fmnist_e10.json"
#: Arguments that bound a reported value; a record of a run with one on lists the rounds in
#: which it changed a weight.
BOUNDS = ("loss_clip", "peer_clip", "sample_clip")


def fedavgm_args(path: Path = SWEEP) -> dict[str, Any]:
    """FedAvgM's ``beta`` and ``server_lr`` as the committed sweep chose them."""
    try:
        chosen = json.loads(path.read_text())["chosen"]
        return {"beta": float(chosen["beta"]), "server_lr": float(chosen["server_lr"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(
            f"{path} holds no FedAvgM choice ({e}); run `fedbalance bench fedavgm-sweep` first"
        ) from e


AGGREGATORS = tuple(VARIANTS)
#: Seconds per round and local epoch of the thesis setting on one core, when no run of the grid
#: has finished yet to measure it (10 local epochs, Fashion-MNIST, this 2-core machine).
SECONDS_PER_EPOCH_ROUND = 1.0


def aggregator_args(variant: str) -> tuple[str, dict[str, Any]]:
    """A variant's aggregator and every argument it runs with, defaults resolved: a record
    states what ran, and a changed library default makes its records stale."""
    import inspect

    from fl_adapters.registry import get_registry

    aggregator, args = VARIANTS.get(variant, (variant, {}))
    if variant == "fedavgm":
        args = {**args, **fedavgm_args()}
    cls = get_registry().aggregator(aggregator)
    params = inspect.signature(cls).parameters.values()
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    return aggregator, {**defaults, **args}


def run_config(scenario: str, variant: str, seed: int, opts: dict[str, Any]) -> dict[str, Any]:
    extra = opts.get("variants", {})  # a sweep's own entries: name -> (aggregator, arguments)
    aggregator, args = extra[variant] if variant in extra else aggregator_args(variant)
    return {
        "framework": opts.get("framework", "fedlab"),
        "dataset": opts["dataset"],
        "partition": SCENARIOS[scenario],
        "aggregator": aggregator,
        "aggregator_args": args,
        "seed": seed,
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": 64,
        **{
            k: opts[k]
            for k in (
                "num_clients",
                "clients_per_round",
                "rounds",
                "local_epochs",
                "max_samples",
                "eval_data",
            )
            if opts.get(k) is not None
        },
    }


def stem_of(opts: dict[str, Any], framework: str | None = None) -> str:
    """``thesis_<dataset>[_<framework>][_e<E>][_quick]``: what names a grid's tables and records."""
    fw = framework or opts.get("framework", "fedlab")
    return (
        f"{opts.get('name', 'thesis')}_{opts['dataset']}"
        + ("" if fw == "fedlab" else f"_{fw}")
        + ("" if opts["local_epochs"] == 1 else f"_e{opts['local_epochs']}")
        + ("_quick" if opts["quick"] else "")
    )


def record_key(cfg: dict[str, Any]) -> dict[str, Any]:
    """What defines a run: its config with every default resolved, minus where it ran; a
    partition with feature noise adds the noise's units (pixel intensities in [0, 1] since the
    noise moved before normalisation, so runs made with noise in normalised units are stale)."""
    from fedbalance_benchmarks import _runs
    from fl_adapters.registry import get_registry

    key = _runs.record_key(cfg, ("port", "backend", "data_dir"))
    if get_registry().make_partitioner(key["partition"]).noise_std(2).any():
        key["noise_units"] = "pixel"
    return key


#: The bias figures a record keeps per evaluated round, beside accuracy (``metrics.jsonl``'s keys).
BIAS = ("balanced_accuracy", "worst_class_recall", "client_acc_p10")


def make_record(cfg: dict[str, Any], out: Path) -> dict[str, Any]:
    """A finished run, compactly: its config; per evaluated round the accuracy, loss and bias
    figures of the global model (on the clients' test splits, or their validation splits for a
    sweep) and the largest aggregation weight; and the rounds in which a bound changed a weight."""
    rows = read_metrics(out)
    on = "val" if cfg.get("eval_data") == "val" else "test"
    evals = [r for r in rows if f"{on}_accuracy" in r]
    summary = json.loads((out / "summary.json").read_text())
    return {
        "config": record_key(cfg),
        "evaluated_on": on,
        "rounds": [r["round"] for r in evals],
        "accuracy": [r[f"{on}_accuracy"] for r in evals],
        f"{on}_loss": [r.get(f"{on}_loss") for r in evals],
        "bias": {key: [r.get(key) for r in evals] for key in BIAS},
        "top_weight": [max(r["weights"]) if r.get("weights") else None for r in evals],
        "bounded_rounds": [r["round"] for r in rows if r.get("bounded")],
        "bytes_up": sum(r.get("bytes_up", 0) for r in rows),
        "elapsed_s": summary["elapsed_s"],
    }


def _run_record(cfg: dict[str, Any], out: str) -> dict[str, Any]:
    """Run one job (unless its run directory already finished it) and return its record. A
    finished directory counts only if it names the run's record key (``record_key.json``,
    written when the run ends): one made before the key changed (the noise's units, the
    bounds' notes) is run again, never reported."""
    key, marker = record_key(cfg), Path(out) / "record_key.json"
    if not (
        (Path(out) / "summary.json").exists()
        and marker.exists()
        and json.loads(marker.read_text()) == key
    ):
        run_one(cfg, out)
        marker.write_text(json.dumps(key) + "\n")
    return make_record(cfg, Path(out))


def load_record(path: Path, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The record at ``path`` if it is this run's (same resolved config), else None. A run with
    a bound on must say in which rounds it changed a weight: a record from before that was noted
    is stale."""
    rec = matching_record(path, record_key(cfg))
    if rec is None:
        return None
    bounded = any(cfg["aggregator_args"].get(k) is not None for k in BOUNDS)
    return None if bounded and "bounded_rounds" not in rec else rec


def estimate_seconds(records: list[dict[str, Any]], opts: dict[str, Any]) -> tuple[float, str]:
    """Seconds one run of this grid takes on one worker, and where that figure comes from."""
    per = [
        r["elapsed_s"] / (len(r["rounds"]) * r["config"]["local_epochs"])
        for r in records
        if r["rounds"]
    ]
    scale = opts["rounds"] * opts["local_epochs"]
    if per:
        return statistics.median(per) * scale, f"median of {len(per)} finished runs"
    return SECONDS_PER_EPOCH_ROUND * scale, f"{SECONDS_PER_EPOCH_ROUND} s per round and epoch"


def run_grid(opts: dict[str, Any], run: bool = True) -> list[dict[str, Any]]:
    """Run (or resume) every (scenario, variant, seed), seed by seed, so that an interrupted
    grid has whole seeds; return per-run curves (only recorded ones unless ``run``)."""
    stem = stem_of(opts)
    per_run = Path(opts["out"]) / "per-run" / stem
    runs_dir = Path(opts["runs_dir"]) / stem
    jobs = [
        (scenario, variant, seed)
        for seed in range(opts["seeds"])
        for scenario in opts["scenarios"]
        for variant in opts["aggregators"]
    ]
    records: dict[tuple[str, str, int], dict[str, Any]] = {}
    todo = []
    for scenario, variant, seed in jobs:
        cfg = run_config(scenario, variant, seed, opts)
        path = per_run / scenario / variant / f"seed{seed}.json"
        rec = load_record(path, cfg)
        if rec is not None:
            records[(scenario, variant, seed)] = rec
        else:
            if path.exists():
                log.warning("%s was recorded with another config: running it again", path)
            todo.append((scenario, variant, seed, cfg, path))
    if todo and run:
        each, source = estimate_seconds(list(records.values()), opts)
        workers = min(opts["workers"], len(todo))
        total = each * len(todo) / workers
        print(
            f"{stem}: {len(records)} of {len(jobs)} runs recorded in {per_run}; {len(todo)} to run,"
            f" about {each / 60:.1f} min each ({source}): ~{total / 3600:.1f} h on {workers}"
            " worker(s)",
            flush=True,
        )
        _run_todo(todo, runs_dir, per_run, records, workers, stem)
    curves = []
    for scenario, variant, seed in jobs:
        rec = records.get((scenario, variant, seed))
        if rec is not None:
            curves.append({"scenario": scenario, "aggregator": variant, "seed": seed, **rec})
    return curves


def _run_todo(
    todo: list[tuple[str, str, int, dict[str, Any], Path]],
    runs_dir: Path,
    per_run: Path,
    records: dict[tuple[str, str, int], dict[str, Any]],
    workers: int,
    stem: str,
    run_record: Callable[[dict[str, Any], str], dict[str, Any]] | None = None,
    name: Callable[[str], str] = str,
) -> None:
    """Run the missing jobs; write each record as its run finishes. A run that fails is logged
    and the others go on; the grid then stops with the list of failures. ``run_record`` runs
    one job into a directory and returns its record (the thesis's by default; another grid
    passes its own), ``name`` turns a scenario into that directory's name."""
    run_record = run_record or _run_record
    from tqdm import tqdm

    failed = []
    with ProcessPoolExecutor(max_workers=workers, initializer=worker_init) as pool:
        futures = {
            pool.submit(run_record, cfg, str(runs_dir / name(s) / v / f"seed{seed}")): (
                s,
                v,
                seed,
                path,
            )
            for s, v, seed, cfg, path in todo
        }
        bar = tqdm(as_completed(futures), total=len(futures), desc=f"{stem} runs", unit="run")
        for fut in bar:
            scenario, variant, seed, path = futures[fut]
            try:
                rec = fut.result()
            except Exception as exc:  # one bad run must not cost the others
                log.error("%s/%s seed %d failed: %s", scenario, variant, seed, exc)
                failed.append(f"{scenario}/{variant}/seed{seed}: {exc}")
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rec) + "\n")
            records[(scenario, variant, seed)] = rec
    if failed:
        raise SystemExit(
            f"{len(failed)} run(s) failed (the others are recorded):\n" + "\n".join(failed)
        )


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
        choices=list(HOST_LABELS),
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
    ap.add_argument(
        "--no-run",
        action="store_true",
        help="write the report from the runs recorded so far, running nothing",
    )
    ap.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="also set this README's thesis-claims block to the report's verdicts",
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
    curves = run_grid(opts, run=not a.no_run)
    if not curves:
        print("no run of this grid is recorded yet: nothing to report", file=sys.stderr)
        return 1
    from fedbalance_benchmarks.thesis_report import write_report

    # The command that runs this grid: without what only rewrites reports.
    args = list(argv if argv is not None else sys.argv[1:])
    if "--readme" in args:
        del args[args.index("--readme") : args.index("--readme") + 2]
    command = "fedbalance bench thesis " + " ".join(x for x in args if x != "--no-run")
    text = write_report(curves, opts, out_dir, stem_of(opts), command.strip())
    if a.readme is not None:
        from fedbalance_benchmarks.thesis_claims import readme_with_verdicts

        a.readme.write_text(readme_with_verdicts(a.readme.read_text(), text))
    print(text)
    print(
        f"wrote {out_dir}/{stem_of(opts)}.md, .json and .png plots in {time.perf_counter() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
