"""Reliability under attack, faults and bad input: what a misbehaving client can do to a run.

Every attack runs inside a real FedLab ``StandalonePipeline`` on Fashion-MNIST (10 clients,
all sampled every round, label Dirichlet 0.5, thesis CNN): clients ``0 .. k-1`` train honestly
and then rewrite what they send (:class:`Attack`, the trainer's ``uplink_hook``). For each
attack and aggregator the report gives what the aggregator did (bounded, rejected, skipped),
the final accuracy against the clean run of the same aggregator and seed, and the weight the
liars took against the top honest client of the same round. The report's other sections
have their own modules: what ``sample_clip`` costs honest quantity skew
(:mod:`~fedbalance_benchmarks.reliability_quantity`), faults (stopped runs, killed processes,
damaged checkpoints: :mod:`~fedbalance_benchmarks.reliability_faults`), and bad configs and
command lines through the CLI and lies about label counts to Astraea's plan
(:mod:`~fedbalance_benchmarks.reliability_inputs`).

    fedbalance bench reliability [--quick] [--seeds 3] [--workers 2] [--out DIR]

Writes ``reliability_<dataset>.md``, ``.json`` (per-run numbers) and a plot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fedbalance_benchmarks._runs import (
    mean_std,
    output_dirs,
    path_slug,
    public,
    read_metrics,
    run_jobs,
    scrubbed,
)
from fedbalance_benchmarks.reliability_faults import faults
from fedbalance_benchmarks.reliability_inputs import ASTRAEA_LIES_HEADER, astraea_lies, bad_inputs
from fedbalance_benchmarks.reliability_quantity import QUANTITY_HEADER, SAMPLE_CLIPS, quantity_cost
from fedbalance_benchmarks.thesis import run_config as thesis_run_config
from fl_checks import ParameterError

KINDS = (
    "none",
    "inflate",  # val_loss x factor
    "samples",  # num_samples x factor
    "zero_loss",
    "tiny_loss",  # val_loss 1e-12
    "missing_loss",
    "nan",  # some parameters NaN
    "inf",
    "shape",  # one parameter short
    "dtype",  # float64 parameters
)


@dataclass(frozen=True)
class Attack:
    """What clients ``0 .. liars-1`` send instead of their honest uplink.

    ``params``: ``honest``; ``scaled`` (their update x10: ``g + 10 (w - g)``); ``flipped``
    (``g - (w - g)``).
    """

    kind: str = "none"
    liars: int = 0
    factor: float = 1e6
    params: str = "honest"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ParameterError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.params not in ("honest", "scaled", "flipped"):
            raise ParameterError(f"params must be honest, scaled or flipped, got {self.params!r}")

    def __call__(
        self, client: int, downlink: torch.Tensor, package: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        if client >= self.liars:
            return package
        params, meta = package[0], package[1].clone()
        if self.params == "scaled":
            params = downlink + 10.0 * (params - downlink)
        elif self.params == "flipped":
            params = downlink - (params - downlink)
        if self.kind == "inflate":
            meta[2] = meta[2] * self.factor
        elif self.kind == "samples":  # float32 meta: exact below 2**24
            meta[1] = torch.round(meta[1] * self.factor)
        elif self.kind == "zero_loss":
            meta[2] = 0.0
        elif self.kind == "tiny_loss":
            meta[2] = 1e-12
        elif self.kind == "missing_loss":
            meta[2] = float("nan")
        elif self.kind == "nan":
            params = params.clone()
            params[::997] = float("nan")
        elif self.kind == "inf":
            params = params.clone()
            params[0] = float("inf")
        elif self.kind == "shape":
            params = params[:-1].clone()
        elif self.kind == "dtype":
            params = params.double()
        return [params, meta]


#: (attack, setting, Attack, aggregator label, aggregator, aggregator_args)
Scenario = tuple[str, str, Attack, str, str, dict[str, Any]]
UNBOUNDED = {"loss_clip": None, "peer_clip": None}


def scenarios() -> list[Scenario]:
    out: list[Scenario] = []
    aggs = ["fedavg", "fedmedian", "fedloss", "fedloss_n"]
    for agg in aggs:
        out.append(("clean", "-", Attack(), agg, agg, {}))
    one = Attack("inflate", 1, 1e6)
    for agg in aggs:
        out.append(("loss inflation", "1 of 10, x1e6", one, agg, agg, {}))
    out.append(
        (
            "loss inflation",
            "1 of 10, x1e6",
            one,
            "fedloss (median bound only)",
            "fedloss",
            {"peer_clip": None},
        )
    )
    out.append(
        (
            "loss inflation",
            "1 of 10, x1e6",
            one,
            "fedloss (thesis, unbounded)",
            "fedloss",
            UNBOUNDED,
        )
    )
    for f in (1e3, 1e9):
        out.append(
            (
                "loss inflation",
                f"1 of 10, x{f:.0e}",
                Attack("inflate", 1, f),
                "fedloss",
                "fedloss",
                {},
            )
        )
    three = Attack("inflate", 3, 1e6)
    for agg in ("fedloss", "fedloss_n"):
        out.append(("loss inflation", "3 of 10, x1e6", three, agg, agg, {}))
    for mode in ("scaled", "flipped"):
        attack = Attack("inflate", 1, 1e6, mode)
        for agg in aggs:
            out.append((f"loss inflation + {mode} update", "1 of 10, x1e6", attack, agg, agg, {}))
    clip = {"update_clip": 3.0}
    out.append(("clean", "-", Attack(), "fedloss (update_clip 3)", "fedloss", clip))
    for mode in ("scaled", "flipped"):
        attack = Attack("inflate", 1, 1e6, mode)
        for agg in ("fedavg", "fedloss", "fedloss_n"):
            label = f"{agg} (update_clip 3)"
            out.append(
                (f"loss inflation + {mode} update", "1 of 10, x1e6", attack, label, agg, clip)
            )
    for agg in ("fedloss", "fedloss_n"):
        out.append(("loss deflation", "3 of 10 report 0", Attack("zero_loss", 3), agg, agg, {}))
    out.append(
        ("loss deflation", "3 of 10 report 1e-12", Attack("tiny_loss", 3), "fedloss", "fedloss", {})
    )
    for agg in ("fedavg", "fedloss"):
        out.append(("NaN parameters", "1 of 10", Attack("nan", 1), agg, agg, {}))
    out.append(("Inf parameter", "1 of 10", Attack("inf", 1), "fedloss", "fedloss", {}))
    out.append(
        ("wrong shape", "1 of 10, one value short", Attack("shape", 1), "fedloss", "fedloss", {})
    )
    out.append(("wrong dtype", "1 of 10, float64", Attack("dtype", 1), "fedloss", "fedloss", {}))
    for agg in ("fedavg", "fedloss"):
        out.append(("missing val_loss", "1 of 10", Attack("missing_loss", 1), agg, agg, {}))
    out.append(("NaN parameters", "all 10", Attack("nan", 10), "fedloss", "fedloss", {}))
    out += sample_lies()
    return out


#: Astraea with 10 clients a round and gamma 3: four mediators, so n_m / n weights matter.
ASTRAEA_SMALL = {"gamma": 3}


def sample_lies() -> list[Scenario]:
    """One client reports 10^3 x its sample count, against every count-weighted aggregator,
    trusting (the paper rules) and with ``sample_clip: 1``."""
    out: list[Scenario] = [
        ("clean", "-", Attack(), "fedavgm", "fedavgm", {}),
        ("clean", "-", Attack(), "astraea (gamma 3)", "astraea", ASTRAEA_SMALL),
    ]
    lie = Attack("samples", 1, 1e3)
    setting = "1 of 10, x1e3"
    for agg in ("fedavg", "fedavgm", "fedloss_n"):
        out.append(("sample-count inflation", setting, lie, agg, agg, {"sample_clip": None}))
        for clip in SAMPLE_CLIPS:
            label = f"{agg} (sample_clip {clip:g})"
            out.append(("sample-count inflation", setting, lie, label, agg, {"sample_clip": clip}))
    out.append(
        ("sample-count inflation", setting, lie, "astraea (gamma 3)", "astraea", ASTRAEA_SMALL)
    )
    return out


FULL = dict(num_clients=10, clients_per_round=10, rounds=15, local_epochs=1, max_samples=12000)
QUICK = dict(num_clients=10, clients_per_round=10, rounds=2, local_epochs=1, max_samples=2000)


def run_config(
    aggregator: str, args: dict[str, Any], seed: int, opts: dict[str, Any]
) -> dict[str, Any]:
    """The thesis benchmark's label-skew run, with this aggregator's arguments as given."""
    return {**thesis_run_config("label", aggregator, seed, opts), "aggregator_args": args}


def run_stats(rows: list[dict[str, Any]], liars: int) -> dict[str, Any]:
    """Per-run numbers from ``metrics.jsonl`` rows (liars are client ids ``< liars``)."""
    liar_share, top_honest, liar_each, liar_scale, first = [], [], [], [], []
    for r in rows:
        if "update_scale" in r:
            scales = [s for c, s in zip(r["clients"], r["update_scale"], strict=True) if c < liars]
            liar_scale.append(min(scales, default=1.0))
        ws = list(zip(r["clients"], r["weights"], strict=True))
        if "mediators" in r:  # Astraea: weights are per mediator; a liar owns its mediator's
            ws = [
                (min(members), w) for members, w in zip(r["mediators"], r["weights"], strict=True)
            ]
        bad = [w for c, w in ws if isinstance(c, int) and c < liars]
        good = [w for c, w in ws if not (isinstance(c, int) and c < liars)]
        first.append(max((w for c, w in ws if c == 0), default=0.0))
        liar_share.append(sum(bad))
        liar_each.append(max(bad, default=0.0))
        top_honest.append(max(good, default=0.0))
    evals = [r for r in rows if "test_accuracy" in r]
    return {
        "final_accuracy": evals[-1]["test_accuracy"],
        "accuracy": [r["test_accuracy"] for r in evals],
        "liar_share": liar_share,
        "liar_each": liar_each,
        "top_honest": top_honest,
        "client0_share": first,
        "liar_update_scale": liar_scale,
        "rejected": sum(r["rejected"] for r in rows),
        "skipped": sum(bool(r["skipped"]) for r in rows),
        "rounds": len(rows),
    }


def collect(opts: dict[str, Any]) -> list[dict[str, Any]]:
    """Run (or resume) every scenario x seed; return one record per run."""
    runs_dir = Path(opts["runs_dir"])
    jobs, hooks, meta = [], [], []
    for attack, setting, hook, label, agg, args in scenarios():
        for seed in range(opts["seeds"]):
            out = runs_dir / path_slug(attack, setting, label) / f"seed{seed}"
            jobs.append((run_config(agg, args, seed, opts), out))
            hooks.append(hook if hook.kind != "none" else None)
            meta.append((attack, setting, hook, label, agg, seed, out))
    run_jobs(jobs, opts["workers"], "reliability", hooks)
    runs = []
    for attack, setting, hook, label, agg, seed, out in meta:
        runs.append(
            {
                "attack": attack,
                "setting": setting,
                "aggregator": label,
                "base": agg,
                "seed": seed,
                "hook": asdict(hook),
                **run_stats(read_metrics(out), hook.liars),
            }
        )
    return runs


def uses_loss(aggregator: str) -> bool:
    from fl_adapters.registry import get_registry

    return "val_loss" in getattr(get_registry().aggregator(aggregator), "required_metrics", ())


def what_happened(rs: list[dict[str, Any]], liars: int, clean: list[dict[str, Any]]) -> str:
    """What the aggregator did, from the measured weights, rejections and update scales
    (``clean``: the clean runs of the same aggregator, for what a liar weighed honestly)."""
    rounds = sum(r["rounds"] for r in rs)
    rejected = sum(r["rejected"] for r in rs)
    skipped = sum(r["skipped"] for r in rs)
    if skipped:
        return f"{skipped}/{rounds} rounds skipped, global model kept"
    if rejected:
        return f"rejected {rejected / rounds:.1g} client(s) a round, with a logged reason"
    if not liars:
        return "-"
    parts = []
    hook = rs[0]["hook"]
    if hook["kind"] == "inflate" and uses_loss(rs[0]["base"]):
        top = max(s for r in rs for s in r["liar_share"])
        parts.append("val_loss accepted unbounded" if top > 0.99 else "val_loss bounded")
    elif hook["kind"] == "samples":
        honest = max(s for r in clean for s in r["client0_share"])
        lied = max(s for r in rs for s in r["client0_share"])
        verdict = "num_samples accepted" if lied > 2 * honest else "num_samples bounded"
        parts.append(f"{verdict}: its max share {honest:.2f} honest -> {lied:.2f}")
    elif hook["kind"] in ("zero_loss", "tiny_loss"):
        parts.append("accepted: liars weigh ~0")
    else:
        parts.append("accepted")
    scales = [s for r in rs for s in r["liar_update_scale"]]
    if scales:
        worst = min(scales)
        parts.append(f"update shortened to {worst:.2f}x or less" if worst < 1 else "update kept")
    return ", ".join(parts)


def table(runs: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    from fl_adapters._table import markdown_table

    clean = {(r["base"], r["seed"]): r["final_accuracy"] for r in runs if r["attack"] == "clean"}
    order: list[tuple[str, str, str]] = []
    for r in runs:
        key = (r["attack"], r["setting"], r["aggregator"])
        if key not in order:
            order.append(key)
    rows, summary = [], []
    for attack, setting, label in order:
        rs = [
            r
            for r in runs
            if (r["attack"], r["setting"], r["aggregator"]) == (attack, setting, label)
        ]
        liars, base = rs[0]["hook"]["liars"], rs[0]["base"]
        acc = [r["final_accuracy"] for r in rs]
        delta = [100 * (r["final_accuracy"] - clean[(r["base"], r["seed"])]) for r in rs]
        honest_liars = 0 < liars < 10
        share = max(s for r in rs for s in r["liar_share"]) if honest_liars else None
        top = max(s for r in rs for s in r["top_honest"])
        # The target is about reported losses: only the aggregators that weight by them.
        within = (
            all(
                e <= h + 1e-9
                for r in rs
                for e, h in zip(r["liar_each"], r["top_honest"], strict=True)
            )
            if honest_liars and (uses_loss(rs[0]["base"]) or rs[0]["hook"]["kind"] == "samples")
            else None
        )
        rows.append(
            [
                attack,
                setting,
                label,
                what_happened(
                    rs, liars, [r for r in runs if r["attack"] == "clean" and r["base"] == base]
                ),
                mean_std(acc),
                f"{statistics.mean(delta):+.2f}",
                "-" if share is None else f"{share:.3f}",
                f"{top:.3f}",
                "-" if within is None else ("yes" if within else "no"),
            ]
        )
        summary.append(
            {
                "attack": attack,
                "setting": setting,
                "aggregator": label,
                "final_accuracy_mean": 100 * statistics.mean(acc),
                "delta_vs_clean": statistics.mean(delta),
                "liar_max_share": share,
                "top_honest_max_share": top,
                "liar_within_top_honest": within,
            }
        )
    header = [
        "attack",
        "setting",
        "aggregator",
        "what happened",
        "final acc %",
        "Δ vs clean (points)",
        "liars' max share",
        "top honest share",
        "each liar ≤ top honest, every round (loss and sample-count lies)",
    ]
    return markdown_table(header, rows), summary


def plot(summary: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s for s in summary if s["attack"] != "clean"]
    labels = [f"{s['attack']} ({s['setting']}) · {s['aggregator']}" for s in rows]
    deltas = [s["delta_vs_clean"] for s in rows]
    fig, ax = plt.subplots(figsize=(11, 0.3 * len(rows) + 1.4))
    colors = ["tab:red" if d < -2 else "tab:green" for d in deltas]
    ax.barh(range(len(rows)), deltas, color=colors)
    for i, d in enumerate(deltas):
        ax.annotate(
            f"{d:+.1f}",
            (d, i),
            xytext=(-3 if d < 0 else 3, 0),
            textcoords="offset points",
            ha="right" if d < 0 else "left",
            va="center",
            fontsize=7,
        )
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(-2, color="grey", ls="--", lw=0.8)
    ax.set_xscale("symlog", linthresh=2)
    ax.set_xlim(min(deltas) * 1.6, max(2.0, max(deltas) * 2))
    ax.set_xlabel("final accuracy minus the clean run's, points (symlog; red: more than 2 lost)")
    ax.grid(alpha=0.3, axis="x")
    fig.subplots_adjust(left=0.42, right=0.98, top=0.99, bottom=0.06)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fedbalance bench reliability", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="2 rounds, 2,000 samples, 1 seed")
    ap.add_argument("--dataset", default="fmnist", choices=["fmnist", "digits"])
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--runs-dir", type=Path, default=None)
    a = ap.parse_args(argv)
    from fl_adapters.datasets import bench_dataset

    dataset = bench_dataset(a.dataset, a.quick)
    opts: dict[str, Any] = dict(QUICK if a.quick else FULL)
    opts.update(
        dataset=dataset, quick=a.quick, seeds=a.seeds or (1 if a.quick else 3), workers=a.workers
    )
    if a.rounds:
        opts["rounds"] = a.rounds
    stem = f"reliability_{dataset}" + ("_quick" if a.quick else "")
    out_dir, runs_dir = output_dirs(a.out, a.runs_dir, a.quick, stem, "reliability-runs")
    opts["runs_dir"] = str(runs_dir)
    start = time.perf_counter()
    runs = collect(opts)
    attack_table, summary = table(runs)
    from fl_adapters._table import markdown_table

    bad = bad_inputs(runs_dir / "bad-input")
    lies = astraea_lies(opts)
    quantity_rows, quantity = quantity_cost(opts)
    import shutil

    shutil.rmtree(runs_dir / "faults", ignore_errors=True)
    fault_rows, damaged, kill = faults(runs_dir / "faults", processes=not a.quick)
    command = "fedbalance bench reliability " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (
        f"# Reliability on {dataset}: attacks, bad input\n\n"
        f"FedLab standalone, {opts['num_clients']} clients all sampled every round, label Dirichlet"
        f" 0.5, {opts['rounds']} rounds, {opts['local_epochs']} local epoch, Adam lr 1e-3, batch"
        f" 64, thesis CNN, {opts['max_samples']} training samples; default robustness settings"
        f" unless the aggregator column says otherwise. Clients 0..k-1 attack: they train honestly"
        f" and then rewrite their uplink. Accuracy on all clients' test splits, mean ± std over"
        f" seeds 0..{opts['seeds'] - 1}; Δ against the clean run of the same aggregator and seed."
        f" Shares are aggregation weights, the maximum over rounds and seeds.\n\n"
        f"Regenerate: `{command.strip()}` (runs resume from `--runs-dir`).\n\n"
        "## Attacks on the aggregation\n\n"
        + attack_table
        + "\n\n## What `sample_clip` costs honest quantity skew\n\n"
        "The thesis grid's `quantity` scenario (30 clients, quantity Dirichlet 0.5, 5 sampled a"
        " round, 50 rounds, 1 local epoch; seeds as above), each count-weighted aggregator"
        " trusting the reported counts and with `sample_clip: c` (a round's top count beyond c x"
        " the runner-up's counts as the runner-up's). Weight moved: total variation between the"
        " weights of the trusting run and this run in the same round.\n\n"
        + markdown_table(QUANTITY_HEADER, quantity_rows)
        + "\n\n## Faults (small runs on scikit-learn's digits)\n\n"
        + (
            "`--quick` stops and resumes only; killed processes are the full run's.\n\n"
            if a.quick
            else ""
        )
        + markdown_table(["fault", "setting", "what happened", "result"], fault_rows)
        + "\n\nResuming from a damaged or tampered checkpoint (read with"
        " `torch.load(weights_only=True)`, never unpickled):\n\n"
        + markdown_table(["checkpoint", "result", "command ran", "message"], damaged)
        + "\n\n## Bad input (through `fedbalance`; exit status 2 is a usage error)\n\n"
        + markdown_table(["input", "exit", "result", "message"], bad)
        + "\n\n## Astraea: one client lies about its label counts (plan only, seed 0)\n\n"
        + markdown_table(ASTRAEA_LIES_HEADER, lies)
        + "\n"
    )
    hostile_report = out_dir / "hostile_input.md"  # `fedbalance bench hostile` writes it
    if hostile_report.is_file():
        from fedbalance_benchmarks.hostile import with_reliability_section

        text = with_reliability_section(text, hostile_report.read_text())
    folders = {str(runs_dir): "RUNS"}  # error messages name the runs' files there
    (out_dir / f"{stem}.md").write_text(scrubbed(text, folders))
    doc = {"options": public(opts), "summary": summary, "quantity": quantity, "kill": kill,
           "runs": runs}  # fmt: skip
    (out_dir / f"{stem}.json").write_text(json.dumps(scrubbed(doc, folders), indent=1) + "\n")
    plot(summary, out_dir / f"{stem}.png")
    print(text)
    print(f"wrote {out_dir}/{stem}.md, .json and .png in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
