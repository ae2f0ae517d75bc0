"""The optimizer and learning rate of each arm of the Astraea benchmark, chosen on validation data.

``fedbalance bench astraea`` runs FedAvg and Astraea (Duan et al., "Self-Balancing Federated
Learning With Global Imbalanced Data in Mobile Systems", IEEE TPDS 2021) at the paper's design.
The paper does not give its optimizer, and one rate for two arms that train so differently
(FedAvg: 20 clients x 5 local epochs; Astraea: 50 clients in mediators of 10, Em = 2
sequential passes) favours whichever it happens to suit. This sweep gives each arm a small
grid (Adam 3e-4, 1e-3, 3e-3; plain SGD 0.01, 0.03, 0.1, 0.3) at the benchmark's design, taken
from :func:`fedbalance_benchmarks.astraea.run_config`, and chooses per arm; the benchmark
then trains each arm at its choice (:func:`fedbalance_benchmarks.astraea.chosen_settings`).

    fedbalance bench astraea-sweep [--rounds 200] [--seeds 1] [--workers 1] [--no-run]

Where it departs from the benchmark, and why:

- **Validation, never the test set.** Each client keeps 10 % of its data as a validation split
  (``split: [0.9, 0.1, 0.0]``; the benchmark trains on all of it) and the global model is
  evaluated on every client's validation split after every round (``eval_data: val``). The
  balanced test set is never read.
- **Balanced validation accuracy is the score.** The validation splits follow the training
  data's letters imbalance (about 27 % class 4, 0.3 % class 9), while the benchmark scores on
  Fashion-MNIST's balanced test set, whose accuracy is the mean of the class recalls. So a
  setting scores the mean class recall on the validation splits (``balanced_accuracy``),
  averaged over the last :data:`LAST` rounds; the plain validation accuracy is reported beside
  it. The rarest class has few validation samples (6 at seed 0), so one of them moves the
  score by ~1.7 points: read differences of a point or two as ties.
- **One seed.** The rounds are the benchmark's 200: measured here (niced, beside other work
  on a 2-core machine), a run took ~3.8 s a round for FedAvg and ~1.9 s for Astraea, so the
  14 runs take about 2 hours on one worker; ``--rounds`` reduces them. The best round and its
  accuracy are reported beside the score, so a setting that rises and then falls (as
  Astraea's mediators do at Adam 1e-3) shows.
- **SGD is plain** (no momentum): the library builds a fresh optimizer for every local
  training, so client-side momentum would restart at every client anyway.

Per-run records (config, per-round validation curves, wall time) go to
``per-run/astraea_sweep_<dataset>_<profile>/<arm>/<setting>/seed<N>.json`` as each run ends;
a run with a matching record is not run again, and ``--no-run`` rewrites the report
(``.md``, ``.json`` with ``chosen`` per arm, ``.png``) from the records alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from fedbalance_benchmarks import astraea
from fedbalance_benchmarks._runs import output_dirs, read_metrics, run_one

log = logging.getLogger(__name__)

#: The arms swept: variants of :data:`fedbalance_benchmarks.astraea.VARIANTS`.
ARMS = ("fedavg", "astraea")
#: (optimizer, learning rate) pairs; SGD without momentum (see the module docstring).
SETTINGS: tuple[tuple[str, float], ...] = (
    ("adam", 3e-4),
    ("adam", 1e-3),
    ("adam", 3e-3),
    ("sgd", 0.01),
    ("sgd", 0.03),
    ("sgd", 0.1),
    ("sgd", 0.3),  # both arms chose 0.1, the edge of the grid before it
)
#: The benchmark's rounds: short enough to sweep at (see the module docstring).
ROUNDS = astraea.FULL["rounds"]
#: Each client's train / validation / test fractions: no test split, 10 % for validation.
VAL_SPLIT = [0.9, 0.1, 0.0]
#: Rounds whose mean balanced validation accuracy scores a setting.
LAST = 5
#: The per-round figure a setting is scored on, and the plain one reported beside it.
SCORED, PLAIN = "val_balanced_accuracy", "val_accuracy"


def setting_name(optimizer: str, lr: float) -> str:
    """A setting's name (and its records' folder): ``adam_lr0.001``."""
    return f"{optimizer}_lr{lr:g}"


def run_config(arm: str, optimizer: str, lr: float, seed: int, opts: dict[str, Any]) -> dict:
    """The benchmark's run of ``arm`` at ``optimizer``/``lr``, evaluated on validation data."""
    cfg = astraea.run_config(arm, seed, {**opts, "arm_settings": {arm: (optimizer, lr)}})
    return {**cfg, "split": VAL_SPLIT, "eval_data": "val"}


def stem_of(opts: dict[str, Any]) -> str:
    return f"astraea_sweep_{opts['dataset']}_{opts['profile']}" + (
        "_quick" if opts["quick"] else ""
    )


def make_record(cfg: dict[str, Any], out: Path, diverged: str | None = None) -> dict[str, Any]:
    """A run, compactly: its config and per round the validation figures; a run stopped
    because its rounds aggregated nothing (a rate that diverges: every client's model NaN)
    keeps the rounds it finished and why it stopped (``diverged``)."""
    rows = read_metrics(out) if (out / "metrics.jsonl").exists() else []
    summary = json.loads((out / "summary.json").read_text()) if diverged is None else {}
    rec = {
        "config": astraea.record_key(cfg),
        "rounds": [r["round"] for r in rows],
        PLAIN: [r.get(PLAIN) for r in rows],
        SCORED: [r.get("balanced_accuracy") for r in rows],
        "sample_passes": [r["sample_passes"] for r in rows],
        "elapsed_s": summary.get("elapsed_s"),
    }
    return rec if diverged is None else {**rec, "diverged": diverged}


def _run_record(cfg: dict[str, Any], out: str) -> dict[str, Any]:
    """Run ``cfg`` in ``out`` (unless a finished run of the same config is there); its record."""
    from fl_aggregators import NothingAggregated

    marker = Path(out) / "record_key.json"
    done = (Path(out) / "summary.json").exists() and marker.exists()
    if not done or json.loads(marker.read_text()) != astraea.record_key(cfg):
        shutil.rmtree(out, ignore_errors=True)
        try:
            run_one(cfg, out)
        except NothingAggregated as exc:  # the setting diverged: a result of the sweep
            return make_record(cfg, Path(out), diverged=str(exc))
        marker.write_text(json.dumps(astraea.record_key(cfg)) + "\n")
    return make_record(cfg, Path(out))


def jobs(opts: dict[str, Any]) -> list[tuple[str, str, int, dict[str, Any]]]:
    """Every ``(arm, setting, seed, config)``, seed by seed and setting by setting, the arms
    side by side: a sweep cut short has whole seeds and both arms at the settings it reached."""
    return [
        (arm, setting_name(o, lr), seed, run_config(arm, o, lr, seed, opts))
        for seed in range(opts["seeds"])
        for o, lr in opts["settings"]
        for arm in opts["arms"]
    ]


def collect(opts: dict[str, Any], run: bool = True) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Every ``(arm, setting, seed)``'s record: recorded ones as they are, the others run
    (unless ``run`` is false) in worker processes, each record written as its run ends."""
    per_run = Path(opts["out_dir"]) / "per-run" / opts["stem"]
    records, todo = {}, []
    for arm, setting, seed, cfg in jobs(opts):
        path = per_run / astraea.slug(arm) / setting / f"seed{seed}.json"
        rec = astraea.load_record(path, cfg)
        if rec is not None:
            records[(arm, setting, seed)] = rec
        elif run:
            todo.append((arm, setting, seed, cfg, path))
    if not todo:
        return records
    print(f"{opts['stem']}: {len(records)} runs recorded in {per_run}, {len(todo)} to run")
    from fedbalance_benchmarks.thesis import _run_todo  # the grids' pool: one record a run

    runs_dir, workers = Path(opts["runs_dir"]), opts["workers"]
    _run_todo(todo, runs_dir, per_run, records, workers, opts["stem"], _run_record, astraea.slug)
    return records


# -- the measures ----------------------------------------------------------------------------
def score(curve: list[float]) -> float:
    """Mean over the last :data:`LAST` rounds."""
    return statistics.mean(curve[-LAST:])


def mean_curve(recs: list[dict[str, Any]], key: str) -> list[float]:
    """Round by round, the mean of ``key`` over ``recs`` (the seeds of one setting)."""
    return [statistics.mean(values) for values in zip(*(r[key] for r in recs), strict=True)]


def summarise(
    records: dict[tuple[str, str, int], dict[str, Any]], opts: dict[str, Any]
) -> dict[str, Any]:
    """Per arm, a row per setting with all its seeds recorded (figures of the seeds' mean
    curve), and ``chosen``: per arm, the best-scoring setting once the arm's grid is complete
    (``None`` before)."""
    arms: dict[str, list[dict[str, Any]]] = {}
    chosen: dict[str, dict[str, Any] | None] = {}
    for arm in opts["arms"]:
        rows = []
        for optimizer, lr in opts["settings"]:
            name = setting_name(optimizer, lr)
            keys = [(arm, name, s) for s in range(opts["seeds"])]
            recs = [records[k] for k in keys if k in records]
            if len(recs) < len(keys):
                continue
            stopped = [r["diverged"] for r in recs if r.get("diverged")]
            if stopped:  # no score: it is out of the choice
                rows.append({"setting": name, "optimizer": optimizer, "lr": lr,
                             "diverged": stopped[0], "score": None})  # fmt: skip
                continue
            curve = mean_curve(recs, SCORED)
            best = max(range(len(curve)), key=curve.__getitem__)
            rows.append(
                {
                    "setting": name,
                    "optimizer": optimizer,
                    "lr": lr,
                    "score": score(curve),
                    "best": curve[best],
                    "best_round": recs[0]["rounds"][best],
                    "final": curve[-1],
                    "drop": curve[best] - score(curve),
                    "plain_score": score(mean_curve(recs, PLAIN)),
                    "elapsed_s": statistics.mean(r["elapsed_s"] for r in recs),
                }
            )
        arms[arm] = rows
        scored = [r for r in rows if r["score"] is not None]
        complete = len(rows) == len(opts["settings"]) and scored
        top = max(scored, key=lambda r: r["score"]) if complete else None
        chosen[arm] = None if top is None else {k: top[k] for k in ("optimizer", "lr", "score")}
    return {"arms": arms, "chosen": chosen}


def rounds_note(opts: dict[str, Any]) -> str:
    bench = (astraea.QUICK if opts["quick"] else astraea.FULL)["rounds"]
    return "the benchmark's" if opts["rounds"] == bench else f"reduced: the benchmark runs {bench}"


def arm_table(rows: list[dict[str, Any]], chosen: dict[str, Any] | None) -> str:
    from fl_adapters._table import markdown_table

    pick = (chosen["optimizer"], chosen["lr"]) if chosen else None
    cells = []
    for r in rows:
        name = r["setting"] + (" (chosen)" if (r["optimizer"], r["lr"]) == pick else "")
        if r["score"] is None:
            cells.append([name, "diverged (below)", *["-"] * 6])
            continue
        cells.append(
            [
                name,
                f"{100 * r['score']:.2f}",
                f"{100 * r['best']:.2f}",
                str(r["best_round"]),
                f"{100 * r['final']:.2f}",
                f"{100 * r['drop']:.2f}",
                f"{100 * r['plain_score']:.2f}",
                f"{r['elapsed_s']:.0f}",
            ]
        )
    header = [
        "setting",
        f"score: balanced val % (last {LAST})",
        "best %",
        "best round",
        "final %",
        "drop from best (points)",
        f"plain val % (last {LAST})",
        "seconds / run",
    ]
    stopped = [f"- {r['setting']} diverged: {r['diverged']}" for r in rows if r["score"] is None]
    return markdown_table(header, cells) + ("\n\n" + "\n".join(stopped) if stopped else "")


def report(
    records: dict[tuple[str, str, int], dict[str, Any]], opts: dict[str, Any], command: str
) -> tuple[str, dict[str, Any]]:
    """The Markdown report and its JSON (the same figures, ``chosen``, every run's curves)."""
    summary = summarise(records, opts)
    missing = [
        f"{arm} {setting} seed {seed}"
        for arm, setting, seed, _ in jobs(opts)
        if (arm, setting, seed) not in records
    ]
    grid = ", ".join(setting_name(o, lr) for o, lr in opts["settings"])
    lines = [
        f"# Astraea benchmark sweep: optimizer and learning rate per arm ({opts['dataset']},"
        f" {opts['profile']} imbalance)",
        "",
        f"The design of `fedbalance bench astraea`: K = {opts['num_clients']} clients"
        f" (global_imbalance `{opts['profile']}`, then label Dirichlet 0.5), batch"
        f" {opts['batch_size']}, `{opts['model']}`; FedAvg 20 clients x 5 local epochs, Astraea"
        " 50 clients in mediators of 10, 1 epoch, Em = 2 (scaled down 5x with `--quick`). Here"
        f" {opts['rounds']} rounds ({rounds_note(opts)}), seeds"
        f" 0..{opts['seeds'] - 1}, grid {grid} (SGD without momentum). Each client holds out 10 %"
        " of its data for validation (the benchmark trains on all of it). Scored **only on"
        " validation data**: the mean class recall (balanced accuracy, %) of the global model on"
        f" every client's validation split, mean over the last {LAST} rounds. The balanced test"
        " set, which the benchmark reports, is never evaluated. *best* and *best round*: the"
        " highest round and where; *drop*: best minus score, so a rise-then-fall shows.",
        "",
        f"Regenerate: `{command}` (per-run records in"
        f" `benchmarks/results/per-run/{opts['stem']}/`; runs with a record are not run again;"
        " `--no-run` rewrites this report from them alone).",
        "",
    ]
    if missing:
        lines += [f"**Incomplete:** not yet run: {', '.join(missing)}.", ""]
    for arm in opts["arms"]:
        chosen = summary["chosen"][arm]
        lines += [f"## {arm}", "", arm_table(summary["arms"][arm], chosen), ""]
        lines.append(
            f"**Chosen for {arm}: {chosen['optimizer']}, lr {chosen['lr']:g}** (score"
            f" {100 * chosen['score']:.2f})."
            if chosen
            else f"No choice for {arm} yet: its grid is not complete."
        )
        lines.append("")
    lines += [
        f"![balanced validation accuracy per round]({opts['stem']}.png)",
        "",
        "*Chosen*: per arm, the setting with the highest score once every setting of the arm"
        " has run (a setting that diverged, its rounds aggregating nothing once every client's"
        " model held NaN, is out of the choice); the benchmark runs each arm at its own. With one seed and a small rare class"
        " in the validation splits, differences of a point or two are within the noise.",
    ]
    runs = [
        {"arm": arm, "setting": setting, "seed": seed, **records[(arm, setting, seed)]}
        for arm, setting, seed, _ in jobs(opts)
        if (arm, setting, seed) in records
    ]
    doc = {
        "command": command,
        "scored": f"{SCORED}, mean of the last {LAST} rounds",
        "rounds": opts["rounds"],
        "seeds": opts["seeds"],
        **summary,
        "runs": runs,
    }
    return "\n".join(lines) + "\n", doc


def plot(
    records: dict[tuple[str, str, int], dict[str, Any]], opts: dict[str, Any], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(opts["arms"])
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4), sharey=True, squeeze=False)
    for ax, arm in zip(axes[0], opts["arms"], strict=True):
        for optimizer, lr in opts["settings"]:
            name = setting_name(optimizer, lr)
            keys = [(arm, name, s) for s in range(opts["seeds"])]
            if all(k in records and not records[k].get("diverged") for k in keys):
                recs = [records[k] for k in keys]
                curve = [100 * x for x in mean_curve(recs, SCORED)]
                style = "-" if optimizer == "adam" else "--"
                ax.plot(recs[0]["rounds"], curve, label=name, lw=1.2, ls=style)
        ax.set_title(arm)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("balanced validation accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def options(argv: list[str] | None) -> tuple[dict[str, Any], bool]:
    """The sweep's options from its command line, and whether ``--no-run`` was given."""
    ap = argparse.ArgumentParser(
        prog="fedbalance bench astraea-sweep", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="the benchmark's --quick sizes")
    ap.add_argument("--dataset", default="fmnist", choices=["fmnist", "digits"])
    ap.add_argument("--profile", default="letters", choices=["letters", "half_normal"])
    ap.add_argument("--rounds", type=int, default=None, help=f"default {ROUNDS}")
    ap.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(astraea.VARIANTS))
    ap.add_argument(
        "--settings",
        nargs="+",
        type=astraea.parse_setting,
        default=list(SETTINGS),
        help="OPTIMIZER:LR pairs, e.g. adam:1e-3 sgd:0.1",
    )
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--no-run", action="store_true", help="report the recorded runs only")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--runs-dir", type=Path, default=None)
    a = ap.parse_args(argv)
    from fl_adapters.datasets import bench_dataset

    opts: dict[str, Any] = dict(astraea.QUICK if a.quick else astraea.FULL)
    opts.update(
        dataset=bench_dataset(a.dataset, a.quick),
        profile=a.profile,
        model="astraea_cnn",
        quick=a.quick,
        rounds=a.rounds or (opts["rounds"] if a.quick else ROUNDS),
        seeds=a.seeds,
        arms=a.arms,
        settings=a.settings,
        workers=a.workers,
    )
    opts["stem"] = stem_of(opts)
    out_dir, runs_dir = output_dirs(a.out, a.runs_dir, a.quick, opts["stem"], "astraea-sweep-runs")
    opts.update(out_dir=str(out_dir), runs_dir=str(runs_dir))
    return opts, a.no_run


def main(argv: list[str] | None = None) -> int:
    opts, no_run = options(argv)
    records = collect(opts, run=not no_run)
    if not records:
        print("no run of this sweep is recorded yet: nothing to report", file=sys.stderr)
        return 1
    given = [x for x in (argv if argv is not None else sys.argv[1:]) if x != "--no-run"]
    command = " ".join(["fedbalance bench astraea-sweep", *given])
    text, doc = report(records, opts, command)
    out_dir = Path(opts["out_dir"])
    (out_dir / f"{opts['stem']}.md").write_text(text)
    (out_dir / f"{opts['stem']}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(records, opts, out_dir / f"{opts['stem']}.png")
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
