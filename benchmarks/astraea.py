"""Astraea on globally imbalanced Fashion-MNIST: FedAvg vs augmentation vs mediators vs both.

Duan et al., "Self-Balancing Federated Learning With Global Imbalanced Data in Mobile Systems",
IEEE TPDS 2021. The training set is resampled so class sizes follow English letter frequencies
(``global_imbalance`` profile ``letters``, as the paper's imbalanced EMNIST; ``--profile
half_normal`` as its imbalanced CINIC-10), then split over the clients with a label-Dirichlet
(beta 0.5) so clients also differ from each other; the global model is tested on the dataset's
balanced test set. Every run is one FedLab ``StandalonePipeline``; runs resume from
``--runs-dir`` and, where a run's directory is gone (another machine), from the per-run results
committed in the ``.json`` of the same settings.

    fedbalance bench astraea [--quick] [--seeds 3] [--profile letters] [--out DIR]
        [--frameworks fedlab fedlab-distributed]

``--frameworks`` adds a table of the deployment modes: :data:`MODE_VARIANTS` run fresh in
each framework (FedLab cross-process: a server and 2 client processes over ``DistNetwork``),
with their per-round wall time (as a ratio to standalone, same machine, same run of the
benchmark) and bytes.

Writes ``astraea_<dataset>.md`` (accuracy, KL, traffic to a target accuracy, beside the paper's
numbers), ``.json`` (every run's curve) and plots: accuracy vs round, and KL to uniform of
clients (before / after rebalancing) vs mediators (like the paper's Fig. 8).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from fedbalance_benchmarks._runs import mean_std, output_dirs, read_metrics, run_jobs

#: name -> (aggregator, aggregator_args)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg": ("fedavg", {}),
    "augmentation": ("astraea", {"mediators": False, "tau_d": 3.5}),
    "mediators": ("astraea", {"augment": False, "gamma": 10}),
    "astraea tau_d=3.0": ("astraea", {"tau_d": 3.0, "gamma": 10}),
    "astraea tau_d=3.5": ("astraea", {"tau_d": 3.5, "gamma": 10}),
}
#: The variants the deployment-mode table runs in every framework.
MODE_VARIANTS = ("fedavg", "astraea tau_d=3.5")
FRAMEWORKS = ("fedlab", "fedlab-distributed")
#: The options that define a run (a committed run is reused only when they all match).
RUN_KEYS = ("num_clients", "clients_per_round", "rounds", "local_epochs", "max_samples")
RUN_KEYS += ("dataset", "profile", "model", "quick")
FULL = dict(num_clients=100, clients_per_round=20, rounds=50, local_epochs=1)
QUICK = dict(num_clients=20, clients_per_round=10, rounds=4, local_epochs=1, max_samples=6000)


def run_config(
    variant: str, seed: int, opts: dict[str, Any], framework: str = "fedlab"
) -> dict[str, Any]:
    aggregator, args = VARIANTS[variant]
    return {
        "framework": framework,
        "dataset": opts["dataset"],
        "model": opts["model"],
        "partition": {
            "name": "global_imbalance",
            "profile": opts["profile"],
            "then": {"name": "label_dirichlet", "beta": 0.5},
        },
        "aggregator": aggregator,
        "aggregator_args": args,
        "seed": seed,
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": 32,
        "eval_data": "test",
        **{
            k: opts[k]
            for k in ("num_clients", "clients_per_round", "rounds", "local_epochs", "max_samples")
            if opts.get(k) is not None
        },
    }


def _slug(variant: str) -> str:
    return variant.replace(" ", "_").replace("=", "")


def committed_runs(path: Path, opts: dict[str, Any]) -> dict[tuple[str, int, str], Any]:
    """The per-run results in a committed ``.json`` written with the same run options."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if any(doc.get("options", {}).get(k) != opts.get(k) for k in RUN_KEYS):
        return {}
    return {(r["variant"], r["seed"], r.get("framework", "fedlab")): r for r in doc["runs"]}


def collect(
    opts: dict[str, Any],
    jobs_of: list[tuple[str, int, str]],
    committed: dict[tuple[str, int, str], Any] | None = None,
) -> list[dict[str, Any]]:
    """Run (or resume) every ``(variant, seed, framework)``; return per-run curves, traffic,
    KL values and wall time. A job whose run directory is gone but whose result is in
    ``committed`` takes that result."""
    runs_dir = Path(opts["runs_dir"])
    committed = committed or {}
    jobs = [
        (v, seed, fw, runs_dir / ("" if fw == "fedlab" else fw) / _slug(v) / f"seed{seed}")
        for v, seed, fw in jobs_of
    ]
    todo = [
        (run_config(v, s, opts, fw), out)
        for v, s, fw, out in jobs
        if (out / "summary.json").exists() or (v, s, fw) not in committed
    ]
    run_jobs(todo, opts["workers"], "astraea")
    runs = []
    for variant, seed, fw, out in jobs:
        if not (out / "summary.json").exists():
            runs.append(committed[(variant, seed, fw)])
            continue
        rows = read_metrics(out)
        summary = json.loads((out / "summary.json").read_text())
        evals = [r for r in rows if "test_accuracy" in r]
        traffic, cumulative = [], 0
        for r in rows:
            cumulative += r["bytes_up"] + r["bytes_down"]
            traffic.append(cumulative)
        astraea = summary.get("astraea") or {}
        runs.append(
            {
                "variant": variant,
                "seed": seed,
                "framework": fw,
                "seconds_per_round": summary["elapsed_s"] / len(rows),
                "bytes_per_round": (summary["bytes_up"] + summary["bytes_down"]) / len(rows),
                "rounds": [r["round"] for r in evals],
                "accuracy": [r["test_accuracy"] for r in evals],
                "traffic": [traffic[rows.index(r)] for r in evals],
                "client_kl_before": astraea.get("client_kl_before"),
                "client_kl_after": astraea.get("client_kl_after"),
                "mediator_kl": [k for r in rows for k in r.get("mediator_kl", [])],
                "plan": {k: astraea.get(k) for k in ("augment", "downsample", "rad")},
            }
        )
    return runs


def modes_table(runs: list[dict[str, Any]], opts: dict[str, Any]) -> str:
    """The deployment modes side by side: accuracy, wall time per round (ratio to standalone),
    bytes per round."""
    from fl_adapters._table import markdown_table

    rows = []
    for v in MODE_VARIANTS:
        base = [r for r in runs if r["variant"] == v and r["framework"] == "fedlab"]
        for fw in opts["frameworks"]:
            rs = [r for r in runs if r["variant"] == v and r["framework"] == fw]
            ratio = [
                r["seconds_per_round"] / b["seconds_per_round"]
                for r, b in zip(rs, base, strict=True)
            ]
            rows.append(
                [
                    v,
                    fw,
                    mean_std([max(r["accuracy"]) for r in rs]),
                    mean_std([r["accuracy"][-1] for r in rs]),
                    f"{statistics.mean(r['seconds_per_round'] for r in rs):.2f}"
                    f" ± {statistics.pstdev(r['seconds_per_round'] for r in rs):.2f}",
                    f"{statistics.mean(ratio):.2f}x",
                    f"{statistics.mean(r['bytes_per_round'] for r in rs) / 1e6:.2f}",
                ]
            )
    header = ["variant", "framework", "best acc %", "final acc %", "s / round", "vs fedlab"]
    return markdown_table([*header, "MB / round"], rows)


def mode_section(
    mode_runs: list[dict[str, Any]], runs: list[dict[str, Any]], opts: dict[str, Any]
) -> str:
    """The deployment-mode table, and whether its standalone runs reproduce the main table's."""
    main = {(r["variant"], r["seed"]): r["accuracy"] for r in runs}
    again = [
        main.get((r["variant"], r["seed"])) == r["accuracy"]
        for r in mode_runs
        if r["framework"] == "fedlab" and (r["variant"], r["seed"]) in main
    ]
    same = (
        f"The {len(again)} standalone runs here reproduce the main table's runs of the same"
        f" variant and seed: {sum(again)} of {len(again)} have the identical accuracy curve."
        if again
        else ""
    )
    return (
        "## Deployment modes\n\n"
        f"{', '.join(MODE_VARIANTS)} run afresh in each framework, seeds 0..{opts['seeds'] - 1},"
        " timed in the same benchmark run on the same machine (wall time per round includes"
        " evaluating the global model). `fedlab`: one process, one torch thread;"
        " `fedlab-distributed`: a server and 2 client processes over `DistNetwork` (gloo,"
        " 127.0.0.1), one torch thread each. Bytes: `fedlab` counts the protocol's messages"
        " (parameters, metadata, the plan, mediator hops); `fedlab-distributed` counts the"
        " tensors its processes sent.\n\n" + modes_table(mode_runs, opts) + "\n\n" + same + "\n"
    )


def traffic_to(run: dict[str, Any], target: float) -> float | None:
    """Bytes moved until the first evaluated round at or above ``target`` accuracy."""
    for acc, moved in zip(run["accuracy"], run["traffic"], strict=True):
        if acc >= target:
            return float(moved)
    return None


def table(runs: list[dict[str, Any]], opts: dict[str, Any]) -> tuple[str, float]:
    from fl_adapters._table import markdown_table

    by = {v: [r for r in runs if r["variant"] == v] for v in opts["variants"]}
    best = {v: statistics.mean(max(r["accuracy"]) for r in rs) for v, rs in by.items()}
    target = opts.get("target") or round(0.95 * min(best.values()), 4)
    rows = []
    for v, rs in by.items():
        moved = [traffic_to(r, target) for r in rs]
        reached = [m for m in moved if m is not None]
        before = [statistics.mean(r["client_kl_before"]) for r in rs if r["client_kl_before"]]
        after = [statistics.mean(r["client_kl_after"]) for r in rs if r["client_kl_after"]]
        med = [statistics.mean(r["mediator_kl"]) for r in rs if r["mediator_kl"]]
        rows.append(
            [
                v,
                mean_std([max(r["accuracy"]) for r in rs]),
                mean_std([r["accuracy"][-1] for r in rs]),
                f"{statistics.mean(before):.3f}" if before else "-",
                f"{statistics.mean(after):.3f}" if after else "-",
                f"{statistics.mean(med):.3f}" if med else "-",
                (
                    f"{statistics.mean(reached) / 1e6:.1f} ({len(reached)}/{len(rs)})"
                    if reached
                    else f"not reached (0/{len(rs)})"
                ),
            ]
        )
    header = [
        "variant",
        "best acc %",
        "final acc %",
        "client KL",
        "client KL after rebalancing",
        "mediator KL",
        f"MB to {100 * target:.1f} % (runs reaching it)",
    ]
    return markdown_table(header, rows), target


def paper_comparison(runs: list[dict[str, Any]], opts: dict[str, Any], target: float) -> str:
    """The paper's headline numbers beside the same quantities measured in this run."""
    from fl_adapters._table import markdown_table

    if "fedavg" not in opts["variants"] or len(opts["variants"]) < 2:
        return ""
    full = opts["variants"][-1]
    by = {v: [r for r in runs if r["variant"] == v] for v in ("fedavg", full)}
    best = {v: statistics.mean(max(r["accuracy"]) for r in rs) for v, rs in by.items()}
    final = {v: statistics.mean(r["accuracy"][-1] for r in rs) for v, rs in by.items()}
    moved = {
        v: [m for m in (traffic_to(r, target) for r in rs) if m is not None] for v, rs in by.items()
    }
    clients = [k for r in by[full] for k in (r["client_kl_before"] or [])]
    mediators = [k for r in by[full] for k in r["mediator_kl"]]
    saving = (
        f"{100 * (statistics.mean(moved[full]) / statistics.mean(moved['fedavg']) - 1):+.0f} %"
        f" (to {100 * target:.1f} %)"
        if moved["fedavg"] and moved[full]
        else "-"
    )
    rows = [
        [
            "accuracy gain over FedAvg",
            "+4.39 points (imbalanced EMNIST), +6.51 (imbalanced CINIC-10)",
            f"{100 * (best[full] - best['fedavg']):+.2f} points best, "
            f"{100 * (final[full] - final['fedavg']):+.2f} final",
        ],
        [
            "mean KL to uniform, clients -> mediators",
            "0.550 -> 0.174 (EMNIST)",
            f"{statistics.mean(clients):.3f} -> {statistics.mean(mediators):.3f}"
            if clients and mediators
            else "-",
        ],
        ["traffic to a target accuracy", "-45 % (EMNIST), up to -75 % (CINIC-10)", saving],
    ]
    return f"Against the paper (Duan et al. 2021), {full} vs fedavg:\n\n" + markdown_table(
        ["", "paper", "here"], rows
    )


def plots(runs: list[dict[str, Any]], opts: dict[str, Any], out_dir: Path, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for v in opts["variants"]:
        rs = [r for r in runs if r["variant"] == v]
        acc = 100 * np.array([r["accuracy"] for r in rs])
        mean, sd = acc.mean(axis=0), acc.std(axis=0)
        ax.plot(rs[0]["rounds"], mean, label=v)
        ax.fill_between(rs[0]["rounds"], mean - sd, mean + sd, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel("balanced test accuracy (%)")
    ax.set_title(f"{opts['dataset']}, {opts['profile']} imbalance ({opts['seeds']} seeds)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_dir / f"{stem}_accuracy.png", dpi=110)
    plt.close(fig)

    full = [r for r in runs if r["variant"] == opts["variants"][-1] and r["mediator_kl"]]
    if full:
        data = [
            [k for r in full for k in r["client_kl_before"]],
            [k for r in full for k in r["client_kl_after"]],
            [k for r in full for k in r["mediator_kl"]],
        ]
        fig, ax = plt.subplots(figsize=(5.5, 4))
        ax.boxplot(data)
        ax.set_xticks([1, 2, 3], ["clients", "clients,\nrebalanced", "mediators"])
        ax.set_ylabel("KL divergence to uniform")
        ax.set_title(f"{opts['variants'][-1]}: label skew seen by training")
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        fig.savefig(out_dir / f"{stem}_kl.png", dpi=110)
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fedbalance bench astraea", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="20 clients, 10 per round, 4 rounds, 6,000 samples, 1 seed",
    )
    ap.add_argument("--dataset", default="fmnist", choices=["fmnist", "digits"])
    ap.add_argument("--profile", default="letters", choices=["letters", "half_normal"])
    ap.add_argument("--model", default="astraea_cnn", choices=["astraea_cnn", "thesis_cnn"])
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument(
        "--target", type=float, default=None, help="accuracy for the traffic column (0-1)"
    )
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument(
        "--frameworks",
        nargs="+",
        default=["fedlab"],
        choices=list(FRAMEWORKS),
        help="also run fedavg and astraea tau_d=3.5 in these deployment modes, timed",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--runs-dir", type=Path, default=None)
    a = ap.parse_args(argv)
    from fedbalance_benchmarks.datasets import bench_dataset

    dataset = bench_dataset(a.dataset, a.quick)
    opts: dict[str, Any] = dict(QUICK if a.quick else FULL)
    opts.update(
        dataset=dataset,
        profile=a.profile,
        model=a.model,
        quick=a.quick,
        seeds=a.seeds or (1 if a.quick else 3),
        workers=a.workers,
        variants=a.variants,
        target=a.target,
        frameworks=list(dict.fromkeys(["fedlab", *a.frameworks])),
    )
    if a.rounds:
        opts["rounds"] = a.rounds
    stem = f"astraea_{dataset}_{a.profile}" + ("_quick" if a.quick else "")
    out_dir, runs_dir = output_dirs(a.out, a.runs_dir, a.quick, stem, "astraea-runs")
    opts["runs_dir"] = str(runs_dir)
    start = time.perf_counter()
    seeds = range(opts["seeds"])
    runs = collect(
        opts,
        [(v, s, "fedlab") for v in opts["variants"] for s in seeds],
        committed_runs(out_dir / f"{stem}.json", opts),
    )
    text_table, target = table(runs, opts)
    modes, mode_runs = "", []
    if len(opts["frameworks"]) > 1:  # fresh runs: their wall times are compared
        opts["modes_dir"] = str(Path(opts["runs_dir"]) / "modes")
        mode_runs = collect(
            opts | {"runs_dir": opts["modes_dir"]},
            [(v, s, fw) for v in MODE_VARIANTS for fw in opts["frameworks"] for s in seeds],
        )
        modes = mode_section(mode_runs, runs, opts)
    command = "fedbalance bench astraea " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (
        f"# Astraea on {dataset}, {a.profile} global imbalance\n\n"
        f"{opts['num_clients']} clients (global_imbalance `{a.profile}`, then label_dirichlet"
        f" beta 0.5), {opts['clients_per_round']} per round, {opts['rounds']} rounds,"
        f" {opts['local_epochs']} local epoch, Adam lr 1e-3, batch 32, {a.model}, gamma 10;"
        f" accuracy on the balanced test set, mean ± std over seeds 0..{opts['seeds'] - 1}."
        f" KL: to uniform, natural log; clients before / after rebalancing (expected counts),"
        f" mediators over all rounds. Traffic: bytes moved (server <-> mediators and mediator <->"
        f" client hops) until the first round at the target accuracy.\n\n"
        f"Regenerate: `{command.strip()}`\n\n"
        + text_table
        + "\n\n"
        + paper_comparison(runs, opts, target)
        + "\n"
        + ("\n" + modes if modes else "")
    )
    (out_dir / f"{stem}.md").write_text(text)
    (out_dir / f"{stem}.json").write_text(
        json.dumps(
            {"options": opts, "target": target, "runs": runs, "mode_runs": mode_runs}, indent=1
        )
        + "\n"
    )
    plots(runs, opts, out_dir, stem)
    print(text)
    print(f"wrote {out_dir}/{stem}.md, .json and plots in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
