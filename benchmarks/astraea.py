"""Astraea at its paper's design on globally imbalanced Fashion-MNIST: FedAvg against Astraea
at equal client computation per round, with the paper's ablations.

Duan et al., "Self-Balancing Federated Learning With Global Imbalanced Data in Mobile Systems",
IEEE TPDS 2021 (its settings: ``../shared/reference/astraea-paper-results.md``). The training
set is resampled so class sizes follow English letter frequencies (``global_imbalance``
profile ``letters``, as the paper's imbalanced EMNIST; ``--profile half_normal`` as its
CINIC-10), then split over K = 500 clients with a label Dirichlet (beta 0.5); every client
trains on its whole local data (no local validation or test split) and the global model is
tested on the balanced test set after every round. Batch 10 (the paper's for EMNIST).

Work per round is the paper's: FedAvg samples 20 clients for 5 local epochs; Astraea samples
50 clients, groups them into mediators of gamma = 10 and passes each mediator over its members
Em = 2 times, one epoch each: 100 client-epochs a round either way. The ablations run at the
same design (:data:`VARIANTS`); ``Em = 1`` does half the work, and is compared per
sample-pass as well. FedAvg runs without sample clipping, as the paper's.

Each finished run leaves a compact record in ``per-run/<stem>/<variant>/seed<N>.json``
(committed, so another machine resumes: a run whose record matches its config is not run
again)::

    fedbalance bench astraea [--quick] [--seeds 3] [--rounds 200] [--workers 1]
        [--frameworks fedlab fedlab-distributed] [--no-run]

``--frameworks`` adds the traffic actually sent: :data:`MODE_VARIANTS` run a few rounds
afresh in each framework (FedLab cross-process: a server and 2 client processes over
``DistNetwork``, counting the tensors sent), beside the standalone protocol count.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from fedbalance_benchmarks._runs import (
    RESULTS,
    matching_record,
    mean_std,
    output_dirs,
    public,
    read_metrics,
    run_jobs,
    run_one,
    worker_init,
)

log = logging.getLogger(__name__)

ASTRAEA = {"gamma": 10, "mediator_epochs": 2, "tau_d": 3.5}
#: name -> (aggregator, aggregator_args, clients per round, local epochs). 100 client-epochs
#: a round in each but ``astraea Em=1`` (50).
VARIANTS: dict[str, tuple[str, dict[str, Any], int, int]] = {
    "fedavg": ("fedavg", {"sample_clip": None}, 20, 5),
    "augmentation only": ("astraea", {**ASTRAEA, "mediators": False}, 50, 1),
    "mediators only": ("astraea", {**ASTRAEA, "augment": False}, 50, 1),
    "astraea": ("astraea", ASTRAEA, 50, 1),
    "astraea Em=1": ("astraea", {**ASTRAEA, "mediator_epochs": 1}, 50, 1),
    "astraea, paper's augmentation": ("astraea", {**ASTRAEA, "augment": "paper"}, 50, 1),
    "astraea tau_d=1.0": ("astraea", {**ASTRAEA, "tau_d": 1.0}, 50, 1),
    # Causes of the mediators' fall (CAUSES).
    "astraea batch=50": ("astraea", ASTRAEA, 50, 1),
    "astraea gamma=5": ("astraea", {**ASTRAEA, "gamma": 5}, 50, 1),
    "astraea carry_optimizer": ("astraea", {**ASTRAEA, "carry_optimizer": True}, 50, 1),
}
#: Variants that test a cause of the mediators' fall (run with ``--variants``, at the setting
#: where it happens, ``--setting adam:1e-3``), each changing one thing against ``astraea``,
#: and the run settings beside its aggregator's they change: a larger batch (fewer steps a
#: visit), mediators of 5 (10 models averaged a round instead of 5, at the same 50
#: clients x Em 2), and one optimizer carried along each mediator's chain instead of a fresh
#: one per member (Adam's moments no longer restart 20 times a round).
CAUSES: dict[str, dict[str, Any]] = {
    "astraea batch=50": {"batch_size": 50},
    "astraea gamma=5": {},
    "astraea carry_optimizer": {},
}
#: What runs unless ``--variants`` says otherwise.
MAIN_VARIANTS = [v for v in VARIANTS if v not in CAUSES]
#: The variants the traffic table runs in every framework.
MODE_VARIANTS = ("fedavg", "astraea")
FRAMEWORKS = ("fedlab", "fedlab-distributed")
FULL = dict(num_clients=500, rounds=200, batch_size=10, mode_rounds=3)
#: 40 clients, 5 rounds, 6,000 samples; FedAvg 4 clients a round, Astraea 10 (gamma 5).
QUICK = dict(num_clients=40, rounds=5, batch_size=10, mode_rounds=2, max_samples=6000)
#: The paper's figures (EMNIST unless said), beside ours in the report.
PAPER = {
    "gain": "+4.39 points (EMNIST, 74.85 -> 79.24), +6.51 (CINIC-10)",
    "aug": "+1.68 (EMNIST, tau_d 3.5), +3.01 (CINIC-10)",
    "noaug": "+3.6 at best, then overfits below FedAvg after round 200",
    "em": "Em 2 vs 1: +0.14",
    "kl": "0.550 (clients) -> 0.174 (mediators)",
    "storage": "+81.8 % (EMNIST, tau_d 3.5), +103.8 % (CINIC-10, tau_d 3.0)",
}


def parse_setting(text: str) -> tuple[str, float]:
    """``adam:1e-3`` -> ``("adam", 0.001)``: OPTIMIZER one of the runs' optimizers, LR > 0."""
    from fl_adapters.config import OPTIMIZERS

    optimizer, _, lr = text.partition(":")
    try:
        rate = float(lr)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a setting is OPTIMIZER:LR, e.g. adam:1e-3; got {text!r}"
        ) from None
    if optimizer not in OPTIMIZERS or not rate > 0:
        raise argparse.ArgumentTypeError(
            f"a setting is OPTIMIZER:LR with OPTIMIZER one of {', '.join(OPTIMIZERS)} and"
            f" LR > 0; got {text}"
        )
    return optimizer, rate


def arm_of(variant: str) -> str:
    """The arm of the sweep (``fedbalance bench astraea-sweep``) whose chosen optimizer and
    learning rate ``variant`` trains with: FedAvg's for FedAvg, Astraea's for every Astraea
    variant (they train as Astraea does, in mediators or alone)."""
    return "fedavg" if VARIANTS[variant][0] == "fedavg" else "astraea"


def sweep_path(dataset: str, profile: str) -> Path:
    return RESULTS / f"astraea_sweep_{dataset}_{profile}.json"


def chosen_settings(dataset: str, profile: str) -> dict[str, tuple[str, float]]:
    """Per arm, the ``(optimizer, lr)`` the committed validation sweep chose; a clear stop
    where the sweep has not chosen (the benchmark never falls back to an untuned rate)."""
    path = sweep_path(dataset.removesuffix("_quick"), profile)
    chosen = json.loads(path.read_text()).get("chosen", {}) if path.exists() else {}
    missing = [arm for arm in ("fedavg", "astraea") if not chosen.get(arm)]
    if missing:
        raise SystemExit(
            f"no optimizer chosen yet for {', '.join(missing)} in {path.name}: run "
            f"`fedbalance bench astraea-sweep --dataset {dataset} --profile {profile}` first"
        )
    return {arm: (chosen[arm]["optimizer"], float(chosen[arm]["lr"])) for arm in chosen}


def run_config(variant: str, seed: int, opts: dict[str, Any], framework: str = "fedlab") -> dict:
    """``variant``'s run at ``seed``, training with its arm's setting in ``opts["arm_settings"]``
    (:func:`chosen_settings`)."""
    aggregator, args, per_round, epochs = VARIANTS[variant]
    optimizer, lr = opts["arm_settings"][arm_of(variant)]
    if opts["quick"]:  # 10x fewer clients: mediators of 5, rounds of 4 and 10 clients
        per_round //= 5
        args = {**args, "gamma": 5} if "gamma" in args else args
    return {
        "framework": framework,
        "dataset": opts["dataset"],
        "model": opts["model"],
        "partition": {
            "name": "global_imbalance",
            "profile": opts["profile"],
            "then": {"name": "label_dirichlet", "beta": 0.5},
        },
        "split": [1.0, 0.0, 0.0],  # each client trains on its whole local data
        "aggregator": aggregator,
        "aggregator_args": args,
        "num_clients": opts["num_clients"],
        "clients_per_round": per_round,
        "local_epochs": epochs,
        "rounds": opts["rounds"],
        "seed": seed,
        "optimizer": optimizer,
        "lr": lr,
        "batch_size": opts["batch_size"],
        "eval_data": "test",
        **CAUSES.get(variant, {}),
        **({"max_samples": opts["max_samples"]} if opts.get("max_samples") else {}),
    }


def slug(variant: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "=." else "_" for ch in variant).strip("_")


def stem_of(opts: dict[str, Any]) -> str:
    """The report's name: ``astraea_<dataset>_<profile>``, with ``_<optimizer>_lr<rate>`` when
    ``--setting`` put both arms at one setting instead of the sweep's choices."""
    fixed = opts.get("fixed_setting")
    return (
        f"astraea_{opts['dataset']}_{opts['profile']}"
        + (f"_{fixed[0]}_lr{fixed[1]:g}" if fixed else "")
        + ("_quick" if opts["quick"] else "")
    )


def record_key(cfg: dict[str, Any]) -> dict[str, Any]:
    """What defines a run: its config with every default resolved, less where it ran."""
    from fedbalance_benchmarks import _runs

    return _runs.record_key(cfg, ("port", "backend", "data_dir", "framework"))


def _mean(values: Any) -> float | None:
    values = list(values.values() if isinstance(values, dict) else values or [])
    return statistics.mean(values) if values else None


def _rounded(values: list[float | None] | None) -> list[float | None] | None:
    return None if values is None else [None if v is None else round(v, 5) for v in values]


def make_record(cfg: dict[str, Any], out: Path, diverged: str | None = None) -> dict[str, Any]:
    """A finished run, compactly: per round the test accuracy and the bias figures (balanced
    accuracy, worst-class recall, each class's recall), the samples trained (x local epochs),
    bytes and mediator KL (expected and as trained); the plan and the data it added. A run
    that stopped because its rounds aggregated nothing keeps the rounds it finished and why it
    stopped (``diverged``)."""
    rows = read_metrics(out)
    summary = json.loads((out / "summary.json").read_text()) if diverged is None else {}
    astraea = summary.get("astraea") or {}
    rec: dict[str, Any] = {
        "config": record_key(cfg),
        "rounds": [r["round"] for r in rows],
        "accuracy": [r.get("test_accuracy") for r in rows],
        "balanced_accuracy": [r.get("balanced_accuracy") for r in rows],
        "worst_class_recall": [r.get("worst_class_recall") for r in rows],
        "class_recall": [_rounded(r.get("class_recall")) for r in rows],
        "sample_passes": [r["sample_passes"] for r in rows],
        "bytes": [r["bytes_up"] + r["bytes_down"] for r in rows],
        "elapsed_s": summary.get("elapsed_s"),
    }
    if diverged is not None:
        rec["diverged"] = diverged
    if astraea:
        rec["mediator_kl"] = [_mean(r.get("mediator_kl")) for r in rows]
        rec["mediator_kl_trained"] = [_mean(r.get("mediator_kl_trained")) for r in rows]
        rec["client_kl_before"] = _mean(astraea["client_kl_before"])
        rec["client_kl_after"] = _mean(astraea["client_kl_after"])
        rec["client_kl_after_trained"] = _mean(astraea.get("client_kl_after_trained"))
        rec["plan"] = {k: astraea.get(k) for k in ("augment", "downsample", "rad", "z", "rule")}
        rec["data_added"] = astraea.get("data_added")
    return rec


def _run_record(cfg: dict[str, Any], out: str) -> dict[str, Any]:
    marker = Path(out) / "record_key.json"
    done = (Path(out) / "summary.json").exists() and marker.exists()
    if not done or json.loads(marker.read_text()) != record_key(cfg):
        import shutil

        from fl_aggregators import NothingAggregated

        shutil.rmtree(out, ignore_errors=True)
        try:
            run_one(cfg, out)
        except NothingAggregated as exc:  # diverged at its setting: a result of the benchmark
            return make_record(cfg, Path(out), diverged=str(exc))
        marker.write_text(json.dumps(record_key(cfg)) + "\n")
    return make_record(cfg, Path(out))


def load_record(path: Path, cfg: dict[str, Any]) -> dict[str, Any] | None:
    return matching_record(path, record_key(cfg))


def collect(opts: dict[str, Any], run: bool = True) -> dict[tuple[str, int], dict[str, Any]]:
    """Every ``(variant, seed)``'s record: committed ones as they are, the others run (unless
    ``run`` is false) in worker processes, each record written as its run finishes."""
    from tqdm import tqdm

    per_run = Path(opts["out_dir"]) / "per-run" / opts["stem"]
    records, todo = {}, []
    for seed in range(opts["seeds"]):  # seed by seed: a partial grid compares whole seeds
        for variant in opts["variants"]:
            cfg = run_config(variant, seed, opts)
            path = per_run / slug(variant) / f"seed{seed}.json"
            rec = load_record(path, cfg)
            if rec is not None:
                records[(variant, seed)] = rec
            elif run:
                todo.append((variant, seed, cfg, path))
    if not todo:
        return records
    print(f"{opts['stem']}: {len(records)} runs recorded in {per_run}, {len(todo)} to run")
    failed = []
    runs_dir = Path(opts["runs_dir"])
    with ProcessPoolExecutor(max_workers=opts["workers"], initializer=worker_init) as pool:
        futures = {
            pool.submit(_run_record, cfg, str(runs_dir / slug(v) / f"seed{s}")): (v, s, path)
            for v, s, cfg, path in todo
        }
        for fut in tqdm(as_completed(futures), total=len(futures), desc="astraea runs"):
            variant, seed, path = futures[fut]
            try:
                rec = fut.result()
            except Exception as exc:  # one bad run must not cost the others
                log.error("%s seed %d failed: %s", variant, seed, exc)
                failed.append(f"{variant} seed {seed}: {exc}")
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rec) + "\n")
            records[(variant, seed)] = rec
    if failed:
        raise SystemExit(f"{len(failed)} run(s) failed:\n" + "\n".join(failed))
    return records


# -- the measures ----------------------------------------------------------------------------
def final(rec: dict[str, Any], last: int = 10) -> float:
    """Mean test accuracy over the last ``last`` rounds (less optimistic than the best)."""
    return statistics.mean(rec["accuracy"][-last:])


def accuracy_at_passes(rec: dict[str, Any], passes: float) -> float:
    """Test accuracy after the first round by which the run has trained ``passes`` samples."""
    total = 0
    for acc, n in zip(rec["accuracy"], rec["sample_passes"], strict=True):
        total += n
        if total >= passes:
            return float(acc)
    return float(rec["accuracy"][-1])


def rounds_to(rec: dict[str, Any], target: float) -> int | None:
    """The first round whose test accuracy reaches ``target`` (``None``: never)."""
    for rnd, acc in zip(rec["rounds"], rec["accuracy"], strict=True):
        if acc >= target:
            return int(rnd)
    return None


def plateau(rec: dict[str, Any], width: int = 20) -> float:
    """Mean accuracy of the last ``width`` rounds minus that of the ``width`` before: about 0
    when a run has stopped improving (negative: it is falling)."""
    acc = rec["accuracy"]
    width = min(width, len(acc) // 2)
    if width == 0:
        return 0.0
    return statistics.mean(acc[-width:]) - statistics.mean(acc[-2 * width : -width])


def accuracy_table(by: dict[str, list[dict[str, Any]]], opts: dict[str, Any]) -> str:
    from fl_adapters._table import markdown_table

    fedavg = by.get("fedavg", [])
    # Equal computation: every run at the sample-passes of the variant that trained least.
    budget = min(sum(r["sample_passes"]) for rs in by.values() for r in rs)
    checkpoints = [r for r in (50, 100, opts["rounds"]) if r <= opts["rounds"]]
    rows = []
    for v, rs in by.items():
        per_round = statistics.mean(statistics.mean(r["sample_passes"]) for r in rs)
        reach = []
        for r in rs:  # per seed: FedAvg's best of the same seed
            base = next((f for f in fedavg if f["config"]["seed"] == r["config"]["seed"]), None)
            reach.append(rounds_to(r, max(base["accuracy"])) if base else None)
        reached = [x for x in reach if x is not None]
        cfg = rs[0]["config"]
        args, per, epochs = cfg["aggregator_args"], cfg["clients_per_round"], cfg["local_epochs"]
        rows.append(
            [
                v,
                f"{per} x E{epochs}"
                + (f" x Em{args['mediator_epochs']}" if "gamma" in args else ""),
                f"{per_round:,.0f}",
                mean_std([max(r["accuracy"]) for r in rs]),
                mean_std([final(r) for r in rs]),
                *(mean_std([r["accuracy"][c - 1] for r in rs]) for c in checkpoints),
                mean_std([accuracy_at_passes(r, budget) for r in rs]),
                (
                    f"{statistics.mean(reached):.0f} ({len(reached)}/{len(rs)})"
                    if reached
                    else f"never (0/{len(rs)})"
                ),
                f"{statistics.mean(statistics.mean(r['bytes']) for r in rs) / 1e6:.2f}",
                f"{100 * statistics.mean(plateau(r) for r in rs):+.2f}",
            ]
        )
    header = [
        "variant",
        "clients x epochs",
        "sample-passes / round",
        "best %",
        "final % (last 10)",
        *(f"round {c} %" for c in checkpoints),
        f"at {budget / 1e6:.2f} M sample-passes %",
        "rounds to FedAvg's best",
        "MB / round",
        "last 20 - previous 20 (points)",
    ]
    return markdown_table(header, rows)


def rebalancing_table(by: dict[str, list[dict[str, Any]]]) -> str:
    from fl_adapters._table import markdown_table

    rows = []
    for v, rs in by.items():
        if "plan" not in rs[0]:
            continue
        plan = rs[0]["plan"]
        args = VARIANTS[v][1]
        added = [r["data_added"] for r in rs if r.get("data_added")]

        def kl(key: str, rs: list[dict[str, Any]] = rs) -> str:
            values = [
                statistics.mean(x for x in r[key] if x is not None)
                if isinstance(r[key], list)
                else r[key]
                for r in rs
                if r.get(key) is not None
            ]
            return f"{statistics.mean(values):.3f}" if values else "-"

        rows.append(
            [
                v,
                "off" if args.get("augment") is False else str(args.get("augment", "bounded")),
                f"{args['tau_d']}",
                str(plan["augment"]),
                str(plan["downsample"]),
                mean_std([a["expected"] for a in added], digits=1) if added else "0",
                mean_std([a["trained"] for a in added], digits=1) if added else "0",
                kl("client_kl_before"),
                kl("client_kl_after"),
                kl("client_kl_after_trained"),
                kl("mediator_kl"),
                kl("mediator_kl_trained"),
            ]
        )
    header = [
        "variant",
        "augment",
        "tau_d",
        "augmented classes",
        "downsampled classes",
        "data added, expected %",
        "data added, as built %",
        "client KL",
        "client KL after (expected)",
        "client KL after (as built)",
        "mediator KL (expected)",
        "mediator KL (as trained)",
    ]
    return markdown_table(header, rows)


def paper_table(by: dict[str, list[dict[str, Any]]]) -> str:
    from fl_adapters._table import markdown_table

    def gain(v: str) -> str:
        if v not in by or "fedavg" not in by:
            return "-"
        seeds = {r["config"]["seed"]: r for r in by["fedavg"]}
        diffs = [
            max(r["accuracy"]) - max(seeds[r["config"]["seed"]]["accuracy"])
            for r in by[v]
            if r["config"]["seed"] in seeds
        ]
        finals = [
            final(r) - final(seeds[r["config"]["seed"]])
            for r in by[v]
            if r["config"]["seed"] in seeds
        ]
        text = f"{mean_std(diffs, sign='+')} best, {mean_std(finals, sign='+')} final"
        if len(finals) < 2:
            return text
        from fedbalance_benchmarks.thesis_stats import paired

        lo, hi = paired([100 * x for x in finals]).ci()
        return f"{text} (95 % interval of the final {lo:+.2f} to {hi:+.2f})"

    em = "-"
    if "astraea" in by and "astraea Em=1" in by:
        pairs = {r["config"]["seed"]: r for r in by["astraea Em=1"]}
        em = mean_std(
            [max(r["accuracy"]) - max(pairs[r["config"]["seed"]]["accuracy"]) for r in by["astraea"]
             if r["config"]["seed"] in pairs], sign="+"
        ) + " best, at equal rounds (Em 1 does half the work)"  # fmt: skip
    kl = "-"
    if "astraea" in by:
        before = statistics.mean(r["client_kl_before"] for r in by["astraea"])
        after = statistics.mean(
            statistics.mean(x for x in r["mediator_kl_trained"] if x is not None)
            for r in by["astraea"]
        )
        kl = f"{before:.3f} (clients) -> {after:.3f} (mediators, as trained)"
    storage = "-"
    paper_rule = "astraea, paper's augmentation"
    if paper_rule in by and "astraea" in by:
        storage = (
            f"{mean_std([r['data_added']['trained'] for r in by[paper_rule]], digits=1)} with the"
            f" paper's formula, {mean_std([r['data_added']['trained'] for r in by['astraea']], digits=1)}"
            " with the bounded one (as built)"
        )
    rows = [
        # Like with like: the paper reports one run's best accuracy with its printed formula.
        ["Astraea, the paper's formula, vs FedAvg", PAPER["gain"], gain(paper_rule)],
        [
            "Astraea, fedbalance's bounded rule (default), vs FedAvg",
            "- (not in the paper)",
            gain("astraea"),
        ],  # fmt: skip
        ["augmentation only vs FedAvg", PAPER["aug"], gain("augmentation only")],
        ["mediators only (NoAug) vs FedAvg", PAPER["noaug"], gain("mediators only")],
        ["Em 2 vs Em 1", PAPER["em"], em],
        ["mean KL to uniform", PAPER["kl"], kl],
        ["data added by augmentation", PAPER["storage"], storage],
    ]
    head = ["", "paper", "here (points, paired by seed; mean ± std; paired t interval)"]
    return markdown_table(head, rows)


def _mean_of(values: Any) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.mean(kept) if kept else None


def _final_of(values: list[Any], last: int = 10) -> float | None:
    return _mean_of(values[-last:])


def minority_classes(by: dict[str, list[dict[str, Any]]]) -> dict[int, list[int]]:
    """Per seed, the classes Astraea's plan augments (the same partition for every variant of
    a seed): the minority classes every variant, FedAvg included, is read on."""
    out: dict[int, list[int]] = {}
    for rs in by.values():
        for r in rs:
            plan = r.get("plan") or {}
            if plan.get("augment"):
                out.setdefault(r["config"]["seed"], list(plan["augment"]))
    return out


def bias_table(by: dict[str, list[dict[str, Any]]]) -> tuple[str, str]:
    """Per variant, final (last 10 rounds) balanced accuracy, worst-class recall and the mean
    recall of the minority classes; and each class's final recall. Runs recorded before the
    records kept the bias figures have none (``-``)."""
    from fl_adapters._table import markdown_table

    minority = minority_classes(by)
    rows, per_class = [], []
    classes = max((len(c) for rs in by.values() for r in rs for c in r.get("class_recall") or [] if c), default=0)  # fmt: skip
    minors: dict[str, dict[int, float]] = {}  # variant -> seed -> minority classes' recall
    for v, rs in by.items():
        kept = [r for r in rs if r.get("class_recall")]
        if not kept:
            rows.append([v, "-", "-", "-", "-"])
            continue
        balanced = [_final_of(r["balanced_accuracy"]) for r in kept]
        worst = [_final_of(r["worst_class_recall"]) for r in kept]
        recall = [
            [_final_of([c[k] if c else None for c in r["class_recall"]]) for k in range(classes)]
            for r in kept
        ]
        minors[v] = {
            r["config"]["seed"]: m
            for r, rc in zip(kept, recall, strict=True)
            if (m := _mean_of(rc[k] for k in minority.get(r["config"]["seed"], []))) is not None
        }
        minor = list(minors[v].values())
        seeds = ",".join(str(r["config"]["seed"]) for r in kept)
        rows.append([v, mean_std([x for x in balanced if x is not None]),
                     mean_std([x for x in worst if x is not None]), mean_std(minor), seeds])  # fmt: skip
        per_class.append([v, *(mean_std([rc[k] for rc in recall if rc[k] is not None], digits=1)
                               for k in range(classes))])  # fmt: skip
    for row in rows:  # the minority classes' recall against FedAvg's, paired by seed
        row.insert(4, _paired_cell(minors.get(row[0], {}), minors.get("fedavg", {}), row[0]))
    head = ["variant", "balanced accuracy %", "worst-class recall %",
            "minority classes' recall %", "minority recall vs FedAvg (points, 95 % interval)",
            "seeds"]  # fmt: skip
    sets = sorted({tuple(c) for c in minority.values()})
    note = (
        "Final: mean of the last 10 rounds, then mean ± sample std over the seeds that recorded"
        " the figures. Minority classes: those Astraea's plan augments in each seed ("
        + "; ".join(", ".join(map(str, c)) for c in sets)
        + "), read on every variant. The test set is balanced (1,000 images a class), so the"
        " balanced accuracy equals the accuracy here; the worst and minority classes are what"
        " it hides. `-`: runs recorded before the records kept these figures."
        if sets
        else "Final: mean of the last 10 rounds. `-`: runs recorded before the records kept"
        " these figures."
    )
    table = markdown_table(head, rows) + "\n\n" + note
    classes_table = (
        markdown_table(["variant", *(f"class {k}" for k in range(classes))], per_class)
        if per_class
        else ""
    )
    return table, classes_table


def _paired_cell(mine: dict[int, float], base: dict[int, float], variant: str) -> str:
    """``mine - base`` over the seeds both hold, in points: mean and the paired t interval."""
    seeds = sorted(set(mine) & set(base))
    if variant == "fedavg" or len(seeds) < 2:
        return "-"
    from fedbalance_benchmarks.thesis_stats import paired

    est = paired([100 * (mine[s] - base[s]) for s in seeds], seeds)
    lo, hi = est.ci()
    return f"{est.diff:+.2f} ({lo:+.2f} to {hi:+.2f})"


def fall_table(by: dict[str, list[dict[str, Any]]]) -> str:
    """Per variant: best test accuracy and its round, final (last 10 rounds) and the fall
    from best to final, per seed then mean ± sample std."""
    from fl_adapters._table import markdown_table

    rows = []
    for v, rs in by.items():
        best = [max(r["accuracy"]) for r in rs]
        where = [1 + r["accuracy"].index(max(r["accuracy"])) for r in rs]
        fall = [max(r["accuracy"]) - final(r) for r in rs]
        rows.append([v, mean_std(best), f"{statistics.mean(where):.0f}",
                     mean_std([final(r) for r in rs]), mean_std(fall)])  # fmt: skip
    head = ["variant", "best %", "best round (mean)", "final %", "fall: best - final (points)"]
    return markdown_table(head, rows)


def sweep_fall_table(opts: dict[str, Any]) -> str:
    """The validation sweep's figures of the same fall: per arm and setting, the drop of the
    balanced validation accuracy from its best to its last rounds (one seed)."""
    from fl_adapters._table import markdown_table

    path = sweep_path(opts["dataset"].removesuffix("_quick"), opts["profile"])
    if not path.exists():
        return ""
    doc = json.loads(path.read_text())
    settings = [r["setting"] for r in doc["arms"]["astraea"]]
    rows = []
    for name in settings:
        cells = []
        for arm in ("fedavg", "astraea"):
            row = next((r for r in doc["arms"][arm] if r["setting"] == name), None)
            if row is None:
                cells.append("-")
            elif row["score"] is None:
                cells.append("diverged")
            else:
                cells.append(f"{100 * row['best']:.2f} (r{row['best_round']}) -> "
                             f"{100 * row['score']:.2f}: {100 * row['drop']:.2f}")  # fmt: skip
        rows.append([name, *cells])
    return markdown_table(["setting", "FedAvg: best -> last 5 (drop)",
                           "Astraea: best -> last 5 (drop)"], rows)  # fmt: skip


DEPARTURES = """\
What still differs from the paper:

- **Dataset and classes.** Fashion-MNIST (10 classes) resampled to the letters profile, not
  EMNIST (47 classes) nor CINIC-10: with 10 classes a class z-score is at most 3, so the
  paper's tau_d = 3.5 never downsamples; the `tau_d=1.0` row (a threshold from the paper's own
  sweep) is where downsampling runs. The resampling keeps {samples} of Fashion-MNIST's 60,000
  training images, about {per_client:.0f} a client.
- **Model and optimizer.** The paper's EMNIST CNN (`astraea_cnn`, 68,873 parameters at 47
  classes; fewer at 10). The paper does not give its optimizer; here: {optimizer}.
- **Rounds and seeds.** {rounds} rounds and seeds {seeds}; the paper shows curves to 300 rounds
  and reports the best accuracy of one run. We report the best, the mean of the last 10
  rounds and paired differences.
- **Augmentation.** Shift, rotation, shear and zoom with our values (the paper names the
  transforms, not their ranges); `astraea` uses the bounded augmentation rule (see
  `fl_aggregators/astraea_plan.py`), the `paper's augmentation` row the printed formula.
- **Traffic** in the accuracy table is the standalone protocol count (parameters and the
  plan, per hop); `--frameworks fedlab fedlab-distributed` measures what FedLab's processes
  send (the last table, when run).
"""


def modes_table(mode_runs: list[dict[str, Any]], opts: dict[str, Any]) -> str:
    from fl_adapters._table import markdown_table

    rows = []
    for v in MODE_VARIANTS:
        base = [r for r in mode_runs if r["variant"] == v and r["framework"] == "fedlab"]
        for fw in opts["frameworks"]:
            rs = [r for r in mode_runs if r["variant"] == v and r["framework"] == fw]
            ratio = [
                r["seconds_per_round"] / b["seconds_per_round"]
                for r, b in zip(rs, base, strict=True)
            ]
            rows.append(
                [
                    v,
                    fw,
                    f"{statistics.mean(r['seconds_per_round'] for r in rs):.2f}",
                    f"{statistics.mean(ratio):.2f}x",
                    f"{statistics.mean(r['bytes_per_round'] for r in rs) / 1e6:.3f}",
                ]
            )
    return markdown_table(["variant", "framework", "s / round", "vs fedlab", "MB / round"], rows)


def mode_runs(opts: dict[str, Any]) -> list[dict[str, Any]]:
    """:data:`MODE_VARIANTS` for ``mode_rounds`` rounds in each framework, seed 0, afresh."""
    runs_dir = Path(opts["runs_dir"]) / "modes"
    jobs = []
    for v in MODE_VARIANTS:
        for fw in opts["frameworks"]:
            cfg = run_config(v, 0, opts | {"rounds": opts["mode_rounds"]}, fw)
            jobs.append((v, fw, cfg, runs_dir / fw / slug(v)))
    run_jobs([(cfg, out) for _, _, cfg, out in jobs], opts["workers"], "astraea modes")
    out = []
    for v, fw, _, d in jobs:
        rows = read_metrics(d)
        summary = json.loads((d / "summary.json").read_text())
        out.append(
            {
                "variant": v,
                "framework": fw,
                "seconds_per_round": summary["elapsed_s"] / len(rows),
                "bytes_per_round": (summary["bytes_up"] + summary["bytes_down"]) / len(rows),
            }
        )
    return out


def plots(by: dict[str, list[dict[str, Any]]], opts: dict[str, Any], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for v, rs in by.items():
        acc = 100 * np.array([r["accuracy"] for r in rs])
        mean, sd = acc.mean(axis=0), acc.std(axis=0)
        passes = np.cumsum(np.mean([r["sample_passes"] for r in rs], axis=0)) / 1e6
        for ax, x in ((axes[0], rs[0]["rounds"]), (axes[1], passes)):
            ax.plot(x, mean, label=v, lw=1.2)
            ax.fill_between(x, mean - sd, mean + sd, alpha=0.15)
    axes[0].set_xlabel("round")
    axes[1].set_xlabel("client computation (million sample-passes)")
    axes[0].set_ylabel("balanced test accuracy (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(
        f"{opts['dataset']}, {opts['profile']} imbalance, K={opts['num_clients']} "
        f"({opts['seeds']} seeds; mean ± std)"
    )
    fig.tight_layout()
    fig.savefig(out_dir / f"{opts['stem']}_accuracy.png", dpi=110)
    plt.close(fig)


def training_samples(opts: dict[str, Any]) -> int:
    """Training samples left after the global-imbalance resampling (seed 0's partition)."""
    from fl_adapters.config import RunConfig
    from fl_adapters.experiment import training_data

    _, _, partition = training_data(RunConfig.from_dict(run_config("fedavg", 0, opts)))
    return sum(len(c) for c in partition.client_indices)


def settings_text(opts: dict[str, Any]) -> str:
    """Each arm's optimizer and rate, as the report states them."""
    fedavg, astraea = (tuple(opts["arm_settings"][arm]) for arm in ("fedavg", "astraea"))
    where = "chosen per arm on validation data by `fedbalance bench astraea-sweep`"
    if opts.get("fixed_setting"):
        return f"{fedavg[0]} lr {fedavg[1]:g} for both arms (fixed by `--setting`, not tuned)"
    if fedavg == astraea:
        return f"{fedavg[0]} lr {fedavg[1]:g} for both arms ({where})"
    return (
        f"FedAvg {fedavg[0]} lr {fedavg[1]:g}, the Astraea variants {astraea[0]} lr"
        f" {astraea[1]:g} ({where})"
    )


def finished_runs(
    records: dict[tuple[str, int], dict[str, Any]], opts: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """Per variant (with at least one), its runs that finished, in seed order: a run that
    diverged is left out of its variant's figures and of every comparison by seed."""
    by = {
        v: [
            records[(v, s)]
            for s in range(opts["seeds"])
            if (v, s) in records and not records[(v, s)].get("diverged")
        ]
        for v in opts["variants"]
    }
    return {v: rs for v, rs in by.items() if rs}


def diverged_text(records: dict[tuple[str, int], dict[str, Any]]) -> str:
    """One line per run that diverged: where it peaked and why it stopped."""
    lines = [
        f"- {v} seed {s}: best {100 * max(rec['accuracy']):.2f} % at round"
        f" {1 + rec['accuracy'].index(max(rec['accuracy']))}, then stopped: {rec['diverged']}."
        for (v, s), rec in sorted(records.items())
        if rec.get("diverged")
    ]
    if not lines:
        return ""
    return (
        "**Diverged** at its arm's chosen setting (recorded, not rerun; left out of its"
        " variant's figures and of the comparisons by seed below):\n\n" + "\n".join(lines) + "\n\n"
    )


#: What each cause variant changes against ``astraea``, as the report says it.
CAUSE_TEXT = {
    "astraea batch=50": "`batch=50` trains with batches of 50 instead of 10",
    "astraea gamma=5": "`gamma=5` averages 10 mediator models a round instead of 5",
    "astraea carry_optimizer": "`carry_optimizer` carries one optimizer (Adam's moments) along"
    " each mediator's chain instead of a fresh one for each member",
}


def causes_text(by: dict[str, list[dict[str, Any]]]) -> str:
    """The sentence naming the cause variants the report holds (none: nothing)."""
    held = [CAUSE_TEXT[v] for v in CAUSES if v in by]
    if not held:
        return ""
    return (
        " Variants named after a cause change only that against `astraea`: " + ", ".join(held) + "."
    )


def report_doc(
    records: dict[tuple[str, int], dict[str, Any]], opts: dict[str, Any], command: str
) -> dict[str, Any]:
    """The report's JSON, from the same records as its Markdown: the options (no folder of
    this machine), the command, and per variant and seed the accuracy curve with its best and
    final (last 10 rounds) accuracy."""
    runs = [
        {
            "variant": v,
            "seed": s,
            "best": max(rec["accuracy"]),
            "best_round": 1 + rec["accuracy"].index(max(rec["accuracy"])),
            "final": None if rec.get("diverged") else final(rec),
            "accuracy": rec["accuracy"],
            **({"diverged": rec["diverged"]} if rec.get("diverged") else {}),
        }
        for (v, s), rec in sorted(records.items())
    ]
    return {"options": public(opts), "command": command.strip(), "runs": runs}


def report(
    records: dict[tuple[str, int], dict[str, Any]], opts: dict[str, Any], command: str
) -> str:
    by = finished_runs(records, opts)
    missing = [
        f"{v} seed {s}"
        for v in opts["variants"]
        for s in range(opts["seeds"])
        if (v, s) not in records
    ]
    seeds = f"0..{opts['seeds'] - 1}"
    samples = training_samples(opts)
    bias, per_class = bias_table(by)
    swept = sweep_fall_table(opts)
    text = (
        f"# Astraea at its paper's design: {opts['dataset']}, {opts['profile']} global imbalance\n\n"
        f"K = {opts['num_clients']} clients (global_imbalance `{opts['profile']}`, then label"
        f" Dirichlet 0.5), each training on its whole local data; batch {opts['batch_size']},"
        f" {settings_text(opts)}, `{opts['model']}`; {opts['rounds']} rounds; test accuracy on the"
        f" balanced test set after every round, mean ± sample std over seeds {seeds}. FedAvg:"
        " 20 clients a round, 5 local epochs, no sample clipping. Astraea: 50 clients a round in"
        " mediators of 10, 1 local epoch, Em = 2 passes: the same 100 client-epochs a round."
        " A sample-pass is one sample trained on for one epoch (augmented copies included).\n\n"
        f"Regenerate: `{command.strip()}` (per-run records in"
        f" `benchmarks/results/per-run/{opts['stem']}/`; runs with a record are not run again;"
        " `--no-run` rewrites this report from them alone).\n\n"
        + (f"**Incomplete:** not yet run: {', '.join(missing)}.\n\n" if missing else "")
        + diverged_text(records)
        + "## Accuracy at equal rounds and at equal computation\n\n"
        + accuracy_table(by, opts)
        + "\n\n![accuracy per round and per sample-pass]("
        + f"{opts['stem']}_accuracy.png)\n\n"
        "## Rebalancing and mediators\n\n"
        "Data added: the clients' data after rebalancing against before, expected from the"
        " plan and as built (every client that trained). KL to uniform (natural log): clients"
        " before and after rebalancing, and each round's mediators, on the expected counts"
        " (what the server plans with) and on the labels actually trained.\n\n"
        + rebalancing_table(by)
        + "\n\n## Measured on its purpose: the minority classes\n\n"
        + bias
        + (f"\n\nEach class's final recall (%):\n\n{per_class}" if per_class else "")
        + "\n\n## Why the mediators fall\n\n"
        f"Test accuracy per variant: its best, where, its final and the fall between (seeds"
        f" {seeds}).{causes_text(by)}\n\n"
        + fall_table(by)
        + (
            "\n\nThe learning rate and the optimizer, from the validation sweep"
            " (`fedbalance bench astraea-sweep`; balanced validation accuracy, %, seed 0, its"
            " best round and the mean of its last 5 rounds):\n\n" + swept
            if swept
            else ""
        )
        + "\n\n## Against the paper\n\n"
        + paper_table(by)
        + "\n\n"
        + DEPARTURES.format(
            samples=f"{samples:,}",
            per_client=samples / opts["num_clients"],
            rounds=opts["rounds"],
            seeds=seeds,
            optimizer=settings_text(opts),
        )
    )
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fedbalance bench astraea", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--quick", action="store_true", help="40 clients, 5 rounds, 6,000 samples, 1 seed"
    )
    ap.add_argument("--dataset", default="fmnist", choices=["fmnist", "digits"])
    ap.add_argument("--profile", default="letters", choices=["letters", "half_normal"])
    ap.add_argument("--model", default="astraea_cnn", choices=["astraea_cnn", "thesis_cnn"])
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--variants", nargs="+", default=MAIN_VARIANTS, choices=list(VARIANTS))
    ap.add_argument("--frameworks", nargs="+", default=["fedlab"], choices=list(FRAMEWORKS),
                    help="also run fedavg and astraea a few rounds in these modes, measuring traffic")  # fmt: skip
    ap.add_argument("--no-run", action="store_true", help="report the recorded runs only")
    ap.add_argument(
        "--setting",
        type=parse_setting,
        default=None,
        metavar="OPTIMIZER:LR",
        help="both arms at this setting (e.g. adam:1e-3), not the sweep's choices; its own report",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--runs-dir", type=Path, default=None)
    a = ap.parse_args(argv)
    from fl_adapters.datasets import bench_dataset

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
        frameworks=list(dict.fromkeys(["fedlab", *a.frameworks])),
    )
    if a.rounds:
        opts["rounds"] = a.rounds
    if a.setting:
        opts["fixed_setting"] = a.setting
        opts["arm_settings"] = {"fedavg": a.setting, "astraea": a.setting}
    else:
        opts["arm_settings"] = chosen_settings(a.dataset, a.profile)
    opts["stem"] = stem_of(opts)
    out_dir, runs_dir = output_dirs(a.out, a.runs_dir, a.quick, opts["stem"], "astraea-runs")
    opts.update(out_dir=str(out_dir), runs_dir=str(runs_dir))
    start = time.perf_counter()
    records = collect(opts, run=not a.no_run)
    if not records:
        print("no run of this benchmark is recorded yet: nothing to report", file=sys.stderr)
        return 1
    given = [x for x in (argv if argv is not None else sys.argv[1:]) if x != "--no-run"]
    command = "fedbalance bench astraea " + shlex.join(given)  # what runs the missing runs too
    text = report(records, opts, command)
    modes = mode_runs(opts) if len(opts["frameworks"]) > 1 else []
    if modes:
        text += (
            "\n## Traffic actually sent\n\n"
            f"{', '.join(MODE_VARIANTS)}, seed 0, {opts['mode_rounds']} rounds afresh in each"
            " framework, timed in this run on this machine. `fedlab` counts a copy of the"
            " model to and from every client visit, as the paper's traffic model does;"
            " `fedlab-distributed` (a server and 2 client processes over `DistNetwork`) counts"
            " the tensors its processes actually sent: FedLab sends one downlink per process,"
            " and members of a mediator held by one process train in a row, so less moves.\n\n"
            + modes_table(modes, opts)
            + "\n"
        )
    stem = opts["stem"]
    (out_dir / f"{stem}.md").write_text(text)
    doc = report_doc(records, opts, command)
    (out_dir / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plots(finished_runs(records, opts), opts, out_dir)
    print(text)
    print(f"wrote {out_dir}/{stem}.md, .json and plot in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
