"""Where each method helps: every aggregator against FedAvg, per skew setting, on the bias
figures as well as top-1 accuracy.

Settings (:data:`SETTINGS`): label Dirichlet 0.1 and 0.5, iid, global imbalance (the letters
profile, then Dirichlet 0.5), quantity skew (Dirichlet 0.5 over sizes) and noisy clients (30 %
of the clients with 40 % of their labels flipped, on Dirichlet 0.5). Methods
(:data:`METHODS`): FedAvg, FedAvgM at the committed sweep's choice, FedMedian, FedLoss by the
thesis's rule and with the library's default bounds, FedLoss-n, and Astraea at the same
client-epochs a round (one pass of each mediator, ``mediator_epochs: 1``). The thesis's CNN on
Fashion-MNIST: 30 clients, 5 a round, 50 rounds, 1 local epoch, Adam 1e-3, batch 64, evaluated
on every client's test split every 5 rounds and at the last (FedLab standalone). Three seeds;
a seed fixes the partition, the model's start and the clients sampled, so each method is
compared with FedAvg seed by seed.

For each setting and metric (the last round's accuracy, balanced accuracy, worst-class recall
and the 10th percentile of the clients' accuracies), the report gives each method's mean paired
difference from FedAvg in points with its 95 % t-interval (2 degrees of freedom for 3 seeds),
marked where the interval excludes zero, as tables and one heatmap per metric; its first
section says, per setting, which method to use and by how much, only as strongly as the
intervals allow. The README's Results section is that section (``--readme``).

Each finished run leaves a compact record in ``per-run/map_fmnist/<setting>/<method>/seed<N>.json``
(committed; a run whose record matches its config is never run again, so the map resumes
across machines), and ``--no-run`` rewrites everything from the records::

    fedbalance bench map [--seeds 3] [--workers 1] [--no-run] [--readme README.md]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from fedbalance_benchmarks._runs import RESULTS, matching_record, read_metrics, run_one

log = logging.getLogger(__name__)

STEM = "map_fmnist"
COMMAND = "fedbalance bench map"
SETTINGS: dict[str, dict[str, Any]] = {
    "dirichlet 0.1": {"name": "label_dirichlet", "beta": 0.1},
    "dirichlet 0.5": {"name": "label_dirichlet", "beta": 0.5},
    "iid": {"name": "iid"},
    "global imbalance": {
        "name": "global_imbalance",
        "profile": "letters",
        "then": {"name": "label_dirichlet", "beta": 0.5},
    },
    "quantity": {"name": "quantity_dirichlet", "beta": 0.5},
    "noisy clients": {
        "name": "mixed",
        "components": [
            {"name": "label_dirichlet", "beta": 0.5},
            {"name": "label_noise", "share": 0.3, "rate": 0.4},
        ],
    },
}
#: name -> (aggregator, arguments); the thesis's entries take its arguments (and FedAvgM the
#: committed sweep's choice, :func:`fedbalance_benchmarks.thesis.aggregator_args`).
METHODS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "fedavg": None,
    "fedavgm": None,
    "fedmedian": None,
    "fedloss": None,
    "fedloss-default": None,
    "fedloss_n": None,
    "astraea": ("astraea", {"mediator_epochs": 1}),
}
BASELINE = "fedavg"
#: metric -> (row key, what the report calls it).
METRICS: dict[str, tuple[str, str]] = {
    "accuracy": ("test_accuracy", "final accuracy"),
    "balanced": ("balanced_accuracy", "balanced accuracy"),
    "worst class": ("worst_class_recall", "worst-class recall"),
    "client p10": ("client_acc_p10", "client accuracy, 10th percentile"),
}
FULL = dict(num_clients=30, clients_per_round=5, rounds=50, local_epochs=1, eval_every=5)
QUICK = dict(num_clients=10, clients_per_round=3, rounds=3, local_epochs=1, eval_every=1,
             max_samples=4000)  # fmt: skip


def method_args(method: str) -> tuple[str, dict[str, Any]]:
    import inspect

    from fedbalance_benchmarks.thesis import aggregator_args
    from fl_adapters.registry import get_registry

    own = METHODS[method]
    if own is None:
        return aggregator_args(method)
    aggregator, args = own
    cls = get_registry().aggregator(aggregator)
    params = inspect.signature(cls).parameters.values()
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    return aggregator, {**defaults, **args}


def run_config(setting: str, method: str, seed: int, opts: dict[str, Any]) -> dict[str, Any]:
    aggregator, args = method_args(method)
    return {
        "framework": "fedlab",
        "dataset": opts["dataset"],
        "partition": SETTINGS[setting],
        "aggregator": aggregator,
        "aggregator_args": args,
        "seed": seed,
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": 64,
        "eval_data": "clients",
        **{k: opts[k] for k in (*FULL, "max_samples") if opts.get(k) is not None},
    }


def record_key(cfg: dict[str, Any]) -> dict[str, Any]:
    from fedbalance_benchmarks import _runs

    return _runs.record_key(cfg, ("port", "backend", "data_dir"))


def make_record(cfg: dict[str, Any], out: Path) -> dict[str, Any]:
    """A finished run: its config, the accuracy at each evaluated round, and the last
    evaluated round's figures (every metric of :data:`METRICS`, and the per-class recall)."""
    rows = read_metrics(out)
    evals = [r for r in rows if "test_accuracy" in r]
    last = evals[-1]
    summary = json.loads((out / "summary.json").read_text())
    return {
        "config": record_key(cfg),
        "rounds": [r["round"] for r in evals],
        "accuracy": [r["test_accuracy"] for r in evals],
        "final": {key: last.get(key) for key, _ in METRICS.values()},
        "class_recall": last.get("class_recall"),
        "sample_passes": sum(r.get("sample_passes", 0) for r in rows),
        "elapsed_s": summary["elapsed_s"],
    }


def _run_record(cfg: dict[str, Any], out: str) -> dict[str, Any]:
    run_one(cfg, out)
    return make_record(cfg, Path(out))


def load_record(path: Path, cfg: dict[str, Any]) -> dict[str, Any] | None:
    return matching_record(path, record_key(cfg))


def jobs(opts: dict[str, Any]) -> list[tuple[str, str, int]]:
    """Seed by seed: an interrupted map has whole seeds first."""
    return [(s, m, seed) for seed in range(opts["seeds"]) for s in SETTINGS for m in METHODS]


def run_map(opts: dict[str, Any], run: bool = True) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Run (or resume) every (setting, method, seed); the records so far."""
    per_run = Path(opts["out"]) / "per-run" / opts["stem"]
    records: dict[tuple[str, str, int], dict[str, Any]] = {}
    todo = []
    for setting, method, seed in jobs(opts):
        cfg = run_config(setting, method, seed, opts)
        path = per_run / slug(setting) / method / f"seed{seed}.json"
        rec = load_record(path, cfg)
        if rec is not None:
            records[(setting, method, seed)] = rec
        else:
            todo.append((setting, method, seed, cfg, path))
    if not (todo and run):
        return records
    print(f"{opts['stem']}: {len(records)} runs recorded, {len(todo)} to run", flush=True)
    from fedbalance_benchmarks.thesis import _run_todo

    runs_dir, workers = Path(opts["runs_dir"]), opts["workers"]
    _run_todo(todo, runs_dir, per_run, records, workers, opts["stem"], _run_record, slug)
    return records


def slug(setting: str) -> str:
    return setting.replace(" ", "_")


# -- the report --------------------------------------------------------------------------------
def differences(
    records: dict[tuple[str, str, int], dict[str, Any]], seeds: int
) -> dict[str, dict[str, dict[str, Any]]]:
    """metric -> setting -> method -> the paired difference from FedAvg in points (mean, 95 %
    interval, the seeds it rests on), over the seeds both have recorded."""
    from fedbalance_benchmarks.thesis_stats import paired

    out: dict[str, dict[str, dict[str, Any]]] = {}
    for metric, (key, _) in METRICS.items():
        for setting in SETTINGS:
            for method in METHODS:
                if method == BASELINE:
                    continue
                ids, diffs = [], []
                for seed in range(seeds):
                    a = records.get((setting, method, seed))
                    b = records.get((setting, BASELINE, seed))
                    if a is None or b is None:
                        continue
                    va, vb = a["final"].get(key), b["final"].get(key)
                    if va is None or vb is None:
                        continue
                    ids.append(seed)
                    diffs.append(100 * (va - vb))
                if not diffs:
                    continue
                est = paired(diffs, ids)
                lo, hi = est.ci()
                cell = {"diff": est.diff, "lo": lo, "hi": hi, "seeds": ids}
                cell["excludes_zero"] = len(ids) > 1 and (lo > 0 or hi < 0)
                out.setdefault(metric, {}).setdefault(setting, {})[method] = cell
    return out


def cell_text(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    if len(cell["seeds"]) < 2:
        return f"{cell['diff']:+.2f} (n = {len(cell['seeds'])})"
    mark = " **✱**" if cell["excludes_zero"] else ""
    return f"{cell['diff']:+.2f} [{cell['lo']:+.2f}, {cell['hi']:+.2f}]{mark}"


def verdict(better: list[tuple[Any, ...]], worse: list[tuple[Any, ...]]) -> str:
    """Which method a setting's intervals recommend: those above FedAvg on some figure and below
    it on none (the largest gain first); else FedAvg, with the methods to avoid."""
    below = sorted({m for _, m, *_ in worse})
    gains: dict[str, float] = {}
    for d, m, *_ in better:
        if m not in below:
            gains[m] = max(gains.get(m, d), d)
    if gains:
        return "use " + " or ".join(sorted(gains, key=lambda m: -gains[m]))
    avoid = f" (avoid {', '.join(below)})" if below else ""
    if better:
        return f"keep FedAvg{avoid}: each method above it on one figure is below it on another"
    return f"keep FedAvg{avoid}: no method is above it on any figure"


def advice(diffs: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Per setting, which method to use (:func:`verdict`), then the methods whose interval
    on a figure lies above FedAvg's (the largest such gain first), those below it, or none."""
    lines = []
    for setting in SETTINGS:
        better, worse = [], []
        for metric in ("accuracy", "balanced", "worst class", "client p10"):
            for method, cell in diffs.get(metric, {}).get(setting, {}).items():
                if not cell["excludes_zero"]:
                    continue
                entry = (cell["diff"], method, METRICS[metric][1], cell)
                (better if cell["diff"] > 0 else worse).append(entry)
        cells = diffs.get("accuracy", {}).get(setting, {})
        if not cells:
            lines.append(f"- **{setting}**: not measured yet.")
            continue
        seeds = max(len(c["seeds"]) for c in cells.values())
        if seeds < 2:
            lines.append(f"- **{setting}**: not judged yet ({seeds} seed recorded; an interval "
                         "needs two).")  # fmt: skip
            continue
        parts = []
        if better:
            best = sorted(better, key=lambda e: -e[0])[:3]
            parts.append(
                "above FedAvg: "
                + "; ".join(
                    f"{m} on {what} by {d:+.2f} points [{c['lo']:+.2f}, {c['hi']:+.2f}]"
                    for d, m, what, c in best
                )  # fmt: skip
            )
        if worse:
            worst = sorted(worse, key=lambda e: e[0])[:3]
            parts.append(
                "below FedAvg: "
                + "; ".join(
                    f"{m} on {what} by {d:+.2f} [{c['lo']:+.2f}, {c['hi']:+.2f}]"
                    for d, m, what, c in worst
                )  # fmt: skip
            )
        if not parts:
            parts.append(
                "no method differs from FedAvg here (every 95 % interval holds zero): FedAvg, "
                "the simplest, is enough"
            )
        else:
            parts.insert(0, f"**{verdict(better, worse)}**")
        lines.append(f"- **{setting}**: " + ". ".join(parts) + ".")
    return lines


def report(
    records: dict[tuple[str, str, int], dict[str, Any]], opts: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The Markdown report and its JSON (every figure in it, from the records)."""
    diffs = differences(records, opts["seeds"])
    done = len(records)
    total = len(jobs(opts))
    lines = [
        "# Where each method helps: a map against FedAvg",
        "",
        f"Regenerate: `{opts['command']}` (records: `per-run/{opts['stem']}/`; `--no-run` "
        "rewrites this from them). Fashion-MNIST, the thesis CNN, "
        f"{opts['num_clients']} clients, {opts['clients_per_round']} a round, "
        f"{opts['rounds']} rounds, {opts['local_epochs']} local epoch, seeds "
        f"0-{opts['seeds'] - 1}; {done} of {total} runs recorded.",
        "",
        "Each cell: the method's mean paired difference from FedAvg over the seeds (points), "
        "with its 95 % t-interval; **✱** where the interval excludes zero. Figures of the last "
        "round, on every client's test split.",
        "",
        "## Which method to use",
        "",
        *advice(diffs),
        "",
    ]
    for metric, (_, name) in METRICS.items():
        lines += [f"## {name[0].upper() + name[1:]}", ""]
        header = "| method | " + " | ".join(SETTINGS) + " |"
        lines += [header, "|---" * (len(SETTINGS) + 1) + "|"]
        for method in METHODS:
            if method == BASELINE:
                base = []
                for setting in SETTINGS:
                    vals = [
                        records[(setting, BASELINE, s)]["final"].get(METRICS[metric][0])
                        for s in range(opts["seeds"])
                        if (setting, BASELINE, s) in records
                    ]
                    vals = [v for v in vals if v is not None]
                    base.append(_mean_sd(vals))
                lines.append("| fedavg (level) | " + " | ".join(base) + " |")
                continue
            cells = [cell_text(diffs.get(metric, {}).get(s, {}).get(method)) for s in SETTINGS]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines += ["", f"![{name}]({opts['stem']}_{slug(metric)}.png)", ""]
    doc = {
        "command": opts["command"],
        "settings": SETTINGS,
        "methods": {m: list(method_args(m)) for m in METHODS},
        "metrics": {m: k for m, (k, _) in METRICS.items()},
        "differences": diffs,
        "recorded": done,
        "runs": total,
    }
    return "\n".join(lines) + "\n", doc


def _mean_sd(vals: list[float]) -> str:
    from fedbalance_benchmarks._runs import mean_std

    return mean_std(vals)


def heatmaps(diffs: dict[str, dict[str, dict[str, Any]]], out: Path, stem: str) -> list[Path]:
    """One heatmap per metric: methods x settings, the mean difference from FedAvg, with the
    interval's verdict marked (✱)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in METHODS if m != BASELINE]
    paths = []
    for metric, (_, name) in METRICS.items():
        grid = [
            [diffs.get(metric, {}).get(s, {}).get(m, {}).get("diff", math.nan) for s in SETTINGS]
            for m in methods
        ]
        finite = [abs(v) for row in grid for v in row if math.isfinite(v)]
        span = max(finite, default=1.0) or 1.0
        fig, ax = plt.subplots(figsize=(1.5 * len(SETTINGS) + 2, 0.55 * len(methods) + 1.5))
        im = ax.imshow(grid, cmap="RdBu", vmin=-span, vmax=span, aspect="auto")
        ax.set_xticks(range(len(SETTINGS)), list(SETTINGS), rotation=25, ha="right")
        ax.set_yticks(range(len(methods)), methods)
        for i, m in enumerate(methods):
            for j, s in enumerate(SETTINGS):
                cell = diffs.get(metric, {}).get(s, {}).get(m)
                if cell is not None:
                    mark = "✱" if cell["excludes_zero"] else ""
                    ax.text(
                        j, i, f"{cell['diff']:+.1f}{mark}", ha="center", va="center", fontsize=8
                    )
        ax.set_title(f"{name}: difference from FedAvg (points; ✱ 95 % interval excludes 0)")
        fig.colorbar(im, ax=ax, shrink=0.8)
        fig.tight_layout()
        path = out / f"{stem}_{slug(metric)}.png"
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        paths.append(path)
    return paths


BEGIN, END = "<!-- map:begin -->", "<!-- map:end -->"


def readme_with_map(readme: str, report_md: str, doc: dict[str, Any], stem: str) -> str:
    """``readme`` with the block between the map markers set to the report's advice."""
    advice_lines = report_md.split("## Which method to use\n\n", 1)[1].split("\n\n", 1)[0]
    so_far = (
        ""
        if doc["recorded"] == doc["runs"]
        else f"; {doc['recorded']} of {doc['runs']} runs so far"
    )
    block = (
        f"\nWhere each method helps, against FedAvg seed by seed ([the map](benchmarks/results/"
        f"{stem}.md): {len(SETTINGS)} skew settings, {len(METHODS)} methods, 95 % intervals"
        f"{so_far}):\n\n{advice_lines}\n"
    )
    start = readme.index(BEGIN) + len(BEGIN)
    return readme[:start] + block + readme[readme.index(END) :]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 clients, 3 rounds, 4,000 samples")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (3; 1 with --quick)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--dataset", default="fmnist", choices=["fmnist", "digits"])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--runs-dir", type=Path, default=None)
    ap.add_argument("--no-run", action="store_true", help="only rewrite the report")
    ap.add_argument("--readme", type=Path, default=None, help="set this README's map block")
    a = ap.parse_args(argv)
    opts: dict[str, Any] = dict(QUICK if a.quick else FULL)
    out = a.out or (Path("runs/bench-quick") if a.quick else RESULTS)
    stem = f"map_{a.dataset}" + ("_quick" if a.quick else "")
    opts.update(
        dataset=a.dataset,
        seeds=a.seeds or (1 if a.quick else 3),
        workers=a.workers,
        out=str(out),
        stem=stem,
        command=COMMAND + (" --quick" if a.quick else ""),
        runs_dir=str(a.runs_dir or Path.home() / ".cache" / "fedbalance" / "map-runs" / stem),
    )
    out.mkdir(parents=True, exist_ok=True)
    records = run_map(opts, run=not a.no_run)
    text, doc = report(records, opts)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    heatmaps(doc["differences"], out, stem)
    if a.readme is not None:
        a.readme.write_text(readme_with_map(a.readme.read_text(), text, doc, stem))
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
