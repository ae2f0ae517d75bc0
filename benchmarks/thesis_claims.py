"""The FedLoss thesis's claims, each checked by a rule that matches its words.

Tagarakis, "Optimization of Distributed Learning Methods", diploma thesis, NTUA, 2023, ch. 4
(figures in :mod:`fedbalance_benchmarks.thesis_figures`). Neither SVHN nor CIFAR-10 installs
here, so claims are compared, not accuracies: who wins a scenario, by how much, how stable.

Every claim has one rule (:data:`CLAIMS`), printed beside its verdict in the report and applied
alike to the thesis's figures and to our grids:

- a run's *final accuracy* is its mean over the last :data:`FINAL_ROUNDS` evaluated rounds
  (the thesis publishes round 50 only, so its columns use that); best-over-rounds, which reads
  the test data 50 times, is only a secondary column of the report;
- our runs are paired (a seed fixes partitions, sampling and the initial model for every
  aggregator), so FedLoss is compared with a baseline by per-seed differences and a paired
  t-test, and spreads by the Pitman-Morgan test; the thesis's columns, which have only a mean
  and a std of 5 runs, by Welch's t-test and the F-test (:mod:`fedbalance_benchmarks.thesis_stats`);
- stds are sample stds (n - 1); a difference counts at p < 0.05, two-sided.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbalance_benchmarks._runs import mean_spread
from fedbalance_benchmarks.thesis_figures import (
    ALGORITHMS,
    BASELINES,
    CHECKPOINTS,
    SCENARIOS,
    THESIS,
)
from fedbalance_benchmarks.thesis_stats import (
    Estimate,
    SpreadTest,
    average,
    difference,
    f_test,
    paired,
    pitman_morgan,
    welch,
)

#: A run's final accuracy is its mean over this many last evaluated rounds.
FINAL_ROUNDS = 5
#: "About 2 points" (claim 1), read as this interval.
ABOUT_TWO = (1.0, 3.0)
#: Claim 4's non-inferiority margin, points.
NONINFERIORITY = 1.0
FOUR = ("fedloss", *BASELINES)


@dataclass(frozen=True)
class Cell:
    """One aggregator in one scenario: the mean accuracy (%) at rounds 10..50, the final
    accuracy's mean and sample std over ``n`` runs, and (for our runs) the per-seed final
    accuracies and curve jitters in seed order."""

    checkpoints: tuple[float, ...]
    final_mean: float
    final_sd: float
    n: int
    finals: tuple[float, ...] | None = None
    jitters: tuple[float, ...] | None = None
    seeds: tuple[int, ...] | None = None


#: {scenario (grid name): {variant: Cell}}
Grid = dict[str, dict[str, Cell]]


def thesis_grid(dataset: str) -> Grid:
    """The thesis's figures for ``dataset`` (``svhn`` or ``cifar10``): 5 runs a cell, its final
    accuracy the round-50 mean ± std."""
    return {
        SCENARIOS[s]: {
            ALGORITHMS[a]: Cell(tuple(m for m, _ in v), v[-1][0], v[-1][1], 5)
            for a, v in algos.items()
        }
        for s, algos in THESIS[dataset].items()
    }


def final_accuracy(curve: dict[str, Any]) -> float:
    """A run's final accuracy (%): the mean over its last :data:`FINAL_ROUNDS` evaluations."""
    return 100 * statistics.mean(curve["accuracy"][-FINAL_ROUNDS:])


def jitter(accuracy: Sequence[float], rounds: Sequence[int], start: int = 10) -> float:
    """Peaks and valleys of one curve: mean |change| (points) between consecutive evaluated
    rounds from ``start`` on."""
    acc = [100 * a for a, r in zip(accuracy, rounds, strict=True) if r >= start]
    steps = [abs(b - a) for a, b in zip(acc, acc[1:], strict=False)]
    return statistics.mean(steps) if steps else 0.0


def our_grid(curves: Iterable[dict[str, Any]]) -> Grid:
    """Cells of our runs (``curves`` as ``bench thesis`` writes them, accuracy in [0, 1]).

    A scenario keeps only the seeds every variant of it has finished, so an unfinished grid
    compares like with like, and every cell of a scenario lists its seeds in the same order.
    """
    runs: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for c in curves:
        runs.setdefault((c["scenario"], c["aggregator"]), {})[c["seed"]] = c
    grid: Grid = {}
    for scenario in dict.fromkeys(s for s, _ in runs):  # first-seen order
        variants = {v: seeds for (s, v), seeds in runs.items() if s == scenario}
        common = sorted(set.intersection(*(set(seeds) for seeds in variants.values())))
        if not common:
            continue
        grid[scenario] = {}
        for variant, seeds in variants.items():
            chosen = [seeds[s] for s in common]
            finals = tuple(final_accuracy(c) for c in chosen)
            points = [
                statistics.mean(100 * c["accuracy"][c["rounds"].index(r)] for c in chosen)
                for r in CHECKPOINTS
                if all(r in c["rounds"] for c in chosen)
            ]
            grid[scenario][variant] = Cell(
                tuple(points),
                statistics.mean(finals),
                statistics.stdev(finals) if len(finals) > 1 else 0.0,
                len(finals),
                finals,
                tuple(jitter(c["accuracy"], c["rounds"]) for c in chosen),
                tuple(common),
            )
    return grid


def contrast(a: Cell, b: Cell) -> Estimate:
    """``a - b`` in final accuracy: per seed for our runs, Welch for the thesis's figures."""
    if a.finals is not None and b.finals is not None:
        return paired([x - y for x, y in zip(a.finals, b.finals, strict=True)], a.seeds)
    return welch(a.final_mean, a.final_sd, a.n, b.final_mean, b.final_sd, b.n)


def spread(a: Cell, b: Cell) -> SpreadTest:
    """Whether ``a``'s final accuracy is more or less spread than ``b``'s."""
    if a.finals is not None and b.finals is not None:
        return pitman_morgan(a.finals, b.finals)
    return f_test(a.final_sd, a.n, b.final_sd, b.n)


@dataclass(frozen=True)
class Verdict:
    """What a grid shows for one claim, and the numbers that show it."""

    verdict: str
    evidence: str


HOLDS, FAILS, OPEN, CANT = "holds", "does not hold", "inconclusive", "cannot be checked"


def combined(verdicts: Sequence[str]) -> str:
    """Several parts of one claim: it fails if one fails, holds only if all hold."""
    for v in (FAILS, OPEN, CANT):
        if v in verdicts:
            return v
    return HOLDS


def _have(grid: Grid, *scenarios: str, variants: Sequence[str] = FOUR) -> bool:
    """Every one of ``scenarios`` was run with every one of ``variants``."""
    return all(s in grid and set(variants) <= grid[s].keys() for s in scenarios)


def _missing(*scenarios: str) -> Verdict:
    return Verdict(OPEN, f"{' and '.join(scenarios)} not all run with the four aggregators")


def _by_sign(ests: dict[str, Estimate], want: int) -> str:
    """HOLDS if every estimate is significant in direction ``want``, FAILS if one is
    significant the other way, else OPEN."""
    signs = [e.sign for e in ests.values()]
    return FAILS if -want in signs else HOLDS if all(s == want for s in signs) else OPEN


def margins(grid: Grid) -> dict[str, Estimate]:
    """FedLoss minus each baseline, and minus each scenario's strongest baseline (by mean
    final accuracy), in final accuracy averaged over the scenarios that hold all four."""
    scenarios = [s for s in grid if _have(grid, s)]
    if not scenarios:
        return {}
    out = {
        b: average([contrast(grid[s]["fedloss"], grid[s][b]) for s in scenarios]) for b in BASELINES
    }
    best = [
        contrast(grid[s]["fedloss"], grid[s][max(BASELINES, key=lambda b: grid[s][b].final_mean)])
        for s in scenarios
    ]
    out["best"] = average(best)
    return out


def claim_margin(grid: Grid) -> Verdict:
    m = margins(grid)
    if not m:
        return _missing("any scenario")
    best = m["best"]
    lo, hi = best.ci()
    if best.sign > 0 and hi >= ABOUT_TWO[0] and lo <= ABOUT_TWO[1]:
        verdict = HOLDS
    elif hi < ABOUT_TWO[0]:
        verdict = FAILS
    else:
        verdict = OPEN
    each = "; ".join(f"vs {b} {m[b].text()}" for b in BASELINES)
    return Verdict(verdict, f"vs the strongest baseline {best.text()}; {each}")


def claim_best_label_feature(grid: Grid) -> Verdict:
    if not _have(grid, "label", "feature"):
        return _missing("label", "feature")
    parts, texts = [], []
    for s in ("label", "feature"):
        ests = {b: contrast(grid[s]["fedloss"], grid[s][b]) for b in BASELINES}
        parts.append(_by_sign(ests, +1))
        texts.append(f"{s}: " + ", ".join(f"vs {b} {e.text()}" for b, e in ests.items()))
    return Verdict(combined(parts), "; ".join(texts))


def claim_quantity_below_fedavg(grid: Grid) -> Verdict:
    if not _have(grid, "quantity"):
        return _missing("quantity")
    e = contrast(grid["quantity"]["fedloss"], grid["quantity"]["fedavg"])
    verdict = HOLDS if e.sign < 0 else FAILS if e.sign > 0 else OPEN
    return Verdict(verdict, f"FedLoss - FedAvg {e.text()}")


def claim_quantity_worst(grid: Grid) -> Verdict:
    scenarios = [s for s in grid if _have(grid, s)]
    if "quantity" not in scenarios or len(scenarios) < 2:
        return _missing("quantity and another scenario")
    vs_avg = {s: contrast(grid[s]["fedloss"], grid[s]["fedavg"]) for s in scenarios}
    order = sorted(scenarios, key=lambda s: vs_avg[s].diff)
    if order[0] == "quantity":
        gap = difference(vs_avg[order[1]], vs_avg["quantity"])  # > 0: quantity is lower
        verdict = HOLDS if gap.sign > 0 else OPEN
        what = f"{order[1]} (the next lowest) minus quantity"
    else:
        gap = difference(vs_avg["quantity"], vs_avg[order[0]])  # > 0: the other is lower
        verdict = FAILS if gap.sign > 0 else OPEN
        what = f"quantity minus {order[0]} (the lowest)"
    per = ", ".join(f"{s} {vs_avg[s].diff:+.2f}" for s in order)
    return Verdict(verdict, f"FedLoss - FedAvg by scenario: {per}; {what}: {gap.text()}")


def claim_quantity_stability(grid: Grid) -> Verdict:
    if not _have(grid, "quantity"):
        return _missing("quantity")
    q = grid["quantity"]
    loss_vs_avg = spread(q["fedloss"], q["fedavg"])
    others = {b: spread(q[b], q["fedavg"]) for b in ("fedavgm", "fedmedian")}
    avg_smallest = all(q["fedavg"].final_sd <= q[b].final_sd for b in FOUR)
    if loss_vs_avg.sign < 0 or any(t.sign < 0 for t in others.values()):
        verdict = FAILS
    elif loss_vs_avg.sign > 0 and avg_smallest:
        verdict = HOLDS
    else:
        verdict = OPEN
    sds = ", ".join(f"{b} {q[b].final_sd:.2f}" for b in FOUR)
    return Verdict(verdict, f"stds {sds}; FedLoss vs FedAvg {loss_vs_avg.text()}")


def claim_homogeneous(grid: Grid) -> Verdict:
    if not _have(grid, "iid"):
        return _missing("iid")
    parts, texts = [], []
    for b in ("fedavgm", "fedmedian"):
        e = contrast(grid["iid"]["fedloss"], grid["iid"][b])
        lo, hi = e.ci(0.90)  # the one-sided 95 % bounds
        parts.append(HOLDS if lo > -NONINFERIORITY else FAILS if hi < -NONINFERIORITY else OPEN)
        texts.append(f"vs {b} {e.diff:+.2f}, one-sided 95 % bounds [{lo:+.2f}, {hi:+.2f}]")
    return Verdict(combined(parts), "; ".join(texts))


def claim_peaks(grid: Grid) -> Verdict:
    if not _have(grid, "label"):
        return _missing("label")
    cells = grid["label"]
    if cells["fedloss"].jitters is None:
        return Verdict(CANT, "the tables give five rounds of means, not per-run curves")
    ests = {
        b: paired(
            [x - y for x, y in zip(cells["fedloss"].jitters, cells[b].jitters or (), strict=True)]
        )
        for b in BASELINES
    }
    mean = {b: statistics.mean(cells[b].jitters or (0.0,)) for b in FOUR}
    sizes = ", ".join(f"{b} {mean[b]:.2f}" for b in FOUR)
    return Verdict(
        _by_sign(ests, -1),
        f"mean |Δacc| per round: {sizes}; FedLoss - "
        + ", ".join(f"{b} {e.text()}" for b, e in ests.items()),
    )


def claim_final_std(grid: Grid) -> Verdict:
    if not _have(grid, "label", "mixed"):
        return _missing("label", "mixed")
    parts, texts = [], []
    for s in ("label", "mixed"):
        tests = {b: spread(grid[s]["fedloss"], grid[s][b]) for b in BASELINES}
        signs = [t.sign for t in tests.values()]
        parts.append(FAILS if 1 in signs else HOLDS if all(x < 0 for x in signs) else OPEN)
        texts.append(f"{s}: " + ", ".join(f"vs {b} {t.text()}" for b, t in tests.items()))
    return Verdict(combined(parts), "; ".join(texts))


@dataclass(frozen=True)
class Claim:
    """One claim of the thesis, in its words, and the rule that judges it."""

    label: str
    words: str
    rule: str
    check: Callable[[Grid], Verdict]


FINAL = "final accuracy (the thesis: its round-50 mean)"
PAIRED = "per seed, paired t-test; the thesis's columns: Welch's t-test"
CLAIMS = (
    Claim(
        "1",
        "FedLoss outperforms the other three by about 2 points on average over the scenarios",
        f"FedLoss minus a baseline in {FINAL}, averaged over the five scenarios ({PAIRED}),"
        " against each baseline and against the strongest baseline of each scenario. Holds if"
        " the margin over the strongest is > 0 (p < 0.05) and its 95 % CI reaches"
        f" {ABOUT_TWO[0]:g}-{ABOUT_TWO[1]:g} points (about 2); does not hold if that CI lies"
        f" below {ABOUT_TWO[0]:g} point; otherwise inconclusive.",
        claim_margin,
    ),
    Claim(
        "2",
        "FedLoss is the best of the four under label skew and under feature skew",
        f"In each of label and feature, FedLoss minus each baseline in {FINAL} ({PAIRED})."
        " Holds if FedLoss is ahead of all three (p < 0.05) in both; does not hold if a baseline"
        " is ahead of FedLoss (p < 0.05) in either; otherwise inconclusive.",
        claim_best_label_feature,
    ),
    Claim(
        "3a",
        "Under quantity skew FedLoss is below FedAvg",
        f"FedLoss minus FedAvg in {FINAL} under quantity skew ({PAIRED}). Holds if below"
        " (p < 0.05); does not hold if above (p < 0.05); otherwise inconclusive.",
        claim_quantity_below_fedavg,
    ),
    Claim(
        "3b",
        "Quantity skew is FedLoss's weakest scenario",
        "FedLoss minus FedAvg per scenario (as in 3a). Holds if quantity's is the lowest and"
        " below the next lowest (p < 0.05; per seed for ours); does not hold if another"
        " scenario's is below quantity's (p < 0.05); otherwise inconclusive.",
        claim_quantity_worst,
    ),
    Claim(
        "3c",
        "Under quantity skew FedLoss is less stable than FedAvg, and FedAvg is the most stable",
        "Stability: the std of final accuracy over runs (the thesis: its round-50 std), compared"
        " by the Pitman-Morgan test for paired runs (the thesis's columns: the F-test). Holds if"
        " FedLoss's std is above FedAvg's (p < 0.05) and FedAvg's is the smallest of the four;"
        " does not hold if FedLoss's or another baseline's std is below FedAvg's (p < 0.05);"
        " otherwise inconclusive.",
        claim_quantity_stability,
    ),
    Claim(
        "4",
        "Under homogeneous (IID) data FedLoss is at least as good as FedAvgM and FedMedian",
        f"Non-inferiority with a margin of {NONINFERIORITY:g} point: FedLoss minus each of"
        f" FedAvgM and FedMedian in {FINAL} ({PAIRED}). Holds if the one-sided 95 % lower bound"
        f" is above -{NONINFERIORITY:g} for both; does not hold if the one-sided 95 % upper"
        f" bound is below -{NONINFERIORITY:g} for either; otherwise inconclusive.",
        claim_homogeneous,
    ),
    Claim(
        "5a",
        "Under label skew FedLoss's accuracy curve has smaller peaks and valleys than the others'",
        "Peaks and valleys of a run: the mean |change| of accuracy between consecutive rounds"
        " from round 10 on; FedLoss minus each baseline per seed (paired t-test). Holds if"
        " FedLoss's is below all three (p < 0.05); does not hold if a baseline's is below"
        " FedLoss's (p < 0.05); otherwise inconclusive. The thesis publishes five rounds of"
        " means, not curves: it cannot be checked on its figures.",
        claim_peaks,
    ),
    Claim(
        "5b",
        "FedLoss's final std is the smallest of the four under label and under mixed skew",
        "The spread test of 3c, FedLoss against each baseline in label and in mixed. Holds if"
        " FedLoss's std is below each baseline's (p < 0.05) in both; does not hold if a"
        " baseline's is below FedLoss's (p < 0.05) in either; otherwise inconclusive.",
        claim_final_std,
    ),
)


def verdicts(grid: Grid) -> list[Verdict]:
    """Every claim on ``grid``. A grid with fewer than two runs in some cell has no spread to
    judge by: every claim is then open, saying so."""
    runs = min((c.n for cells in grid.values() for c in cells.values()), default=0)
    if runs < 2:
        return [Verdict(f"too few seeds ({runs})", "a spread needs two runs a cell")] * len(CLAIMS)
    return [claim.check(grid) for claim in CLAIMS]


def bounded_rounds(curves: Sequence[dict[str, Any]], scenario: str, variant: str) -> str:
    """How many rounds a run's bounds changed a weight in, mean over its seeds ("-" for runs
    recorded before that was noted)."""
    counts = [
        len(c["bounded_rounds"])
        for c in curves
        if c["scenario"] == scenario and c["aggregator"] == variant and "bounded_rounds" in c
    ]
    return f"{statistics.mean(counts):.1f} of 50" if counts else "-"


def default_vs_thesis_rule(grid: Grid, curves: Sequence[dict[str, Any]] = ()) -> list[list[str]]:
    """``fedloss-default`` (library bounds) against ``fedloss`` (the thesis's rule, unbounded),
    per scenario: final accuracies, their per-seed difference and its paired test, and in how
    many rounds the default's bounds changed a weight."""
    rows = []
    for scenario, cells in grid.items():
        if "fedloss" not in cells or "fedloss-default" not in cells:
            continue
        a, b = cells["fedloss-default"], cells["fedloss"]
        e = contrast(a, b)
        n = min(a.n, b.n)
        verdict = (
            f"too few seeds ({n})"
            if n < 2
            else {-1: "costs", 1: "gains", 0: "no significant difference"}[e.sign]
        )
        rows.append(
            [
                scenario,
                mean_spread(b.final_mean, b.final_sd, b.n),
                mean_spread(a.final_mean, a.final_sd, a.n),
                e.text() if n > 1 else f"{e.diff:+.2f}",
                verdict,
                str(n),
                bounded_rounds(curves, scenario, "fedloss-default"),
            ]
        )
    return rows


def default_decision(rows: list[list[str]]) -> str:
    """What the default-vs-thesis-rule rows decide: the library keeps its bounds unless they
    cost accuracy (paired test, p < 0.05) in some scenario."""
    costly = [r[0] for r in rows if r[4] == "costs"]
    open_ = [r[0] for r in rows if r[4].startswith("too few")]
    if costly:
        return (
            f"The default bounds cost accuracy under {', '.join(costly)} (p < 0.05): they should"
            " change to bounds that bite only beyond a margin."
        )
    if open_:
        return f"Not decided yet: too few seeds under {', '.join(open_)}."
    worst = min(rows, key=lambda r: float(r[3].split()[0]))
    cost = (
        f"its lowest: {worst[3].split()[0]} points under {worst[0]}"
        if float(worst[3].split()[0]) < 0
        else "it is behind the thesis's rule in no scenario"
    )
    return (
        f"The default bounds cost no significant accuracy in any scenario ({cost}, on"
        f" {min(int(r[5]) for r in rows)} seeds), so `loss_clip: 5, peer_clip: 1` stay the"
        " default."
    )


def _grid_seeds(grid: Grid) -> str:
    """``3 seeds``, or ``1-3 seeds`` where scenarios have finished different numbers."""
    seeds = sorted({c.n for cells in grid.values() for c in cells.values()}) or [0]
    span = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    return f"{span} seed{'' if seeds == [1] else 's'}"


def margin_table(grid: Grid) -> list[list[str]]:
    """FedLoss minus each baseline per scenario (final accuracy, per seed), and the mean."""
    rows = []
    for s in grid:
        if not _have(grid, s):
            continue
        ests = [contrast(grid[s]["fedloss"], grid[s][b]) for b in BASELINES]
        rows.append([s, *(e.text() for e in ests)])
    m = margins(grid)
    if m:
        rows.append(["mean over scenarios", *(m[b].text() for b in BASELINES)])
    return rows


def report(curves: list[dict[str, Any]], opts: dict[str, Any], out_dir: Path) -> str:
    """The "set against the thesis" section of a 50-round grid's report: each claim with its
    rule and its verdict on the thesis's own figures and on ours (this grid and, if committed
    beside it, the grid at the other epoch count), FedLoss's margins, and the library default
    against the thesis's rule."""
    from fl_adapters._table import markdown_table

    columns: list[tuple[str, Grid]] = [
        ("thesis SVHN", thesis_grid("svhn")),
        ("thesis CIFAR-10", thesis_grid("cifar10")),
    ]
    ours = our_grid(curves)
    columns.append((f"ours, {opts['local_epochs']} ep. ({_grid_seeds(ours)})", ours))
    other_stem = f"thesis_{opts['dataset']}" + ("_e10" if opts["local_epochs"] == 1 else "")
    other_path = out_dir / f"{other_stem}.json"
    if other_path.exists() and other_stem != f"thesis_{opts['dataset']}_e{opts['local_epochs']}":
        from fedbalance_benchmarks.thesis import record_key, run_config

        doc = json.loads(other_path.read_text())
        # Only runs of today's grid: a report written before a variant or the data changed
        # (its runs then have another config) does not stand beside this one.
        fresh = [
            c
            for c in doc["runs"]
            if c.get("config")
            == record_key(run_config(c["scenario"], c["aggregator"], c["seed"], doc["options"]))
        ]
        if fresh:
            grid = our_grid(fresh)
            epochs = doc["options"]["local_epochs"]
            columns.append((f"ours, {epochs} ep. ({_grid_seeds(grid)})", grid))
    results = [verdicts(grid) for _, grid in columns]
    rows = [
        [f"{c.label}. {c.words}", *(r[i].verdict for r in results)] for i, c in enumerate(CLAIMS)
    ]
    out = [
        "## Set against the thesis",
        "Fashion-MNIST here, SVHN and CIFAR-10 there, so claims are compared, not accuracies."
        f" A run's final accuracy is its mean over the last {FINAL_ROUNDS} rounds (the thesis"
        " publishes round 50 only). Our runs are paired by seed (same partitions, sampling and"
        " initial model for every aggregator), so differences are per seed with a paired t-test"
        " and spreads are compared by the Pitman-Morgan test; the thesis's columns, a mean and"
        " a std of 5 runs per cell, use Welch's t-test and the F-test. Stds are sample stds;"
        " a difference counts at p < 0.05 (`benchmarks/thesis_claims.py`).",
        markdown_table(["claim", *(name for name, _ in columns)], rows),
    ]
    for i, c in enumerate(CLAIMS):
        lines = [f"**Claim {c.label}.** {c.words}.", f"*Rule:* {c.rule}"]
        lines += [
            f"- {name}: **{r[i].verdict}**: {r[i].evidence}"
            for (name, _), r in zip(columns, results, strict=True)
        ]
        out.append("\n".join(lines))
    m_rows = margin_table(ours)
    if m_rows:
        out += [
            "FedLoss (the thesis's rule) minus each baseline, final accuracy, points, this grid:"
            " mean of the per-seed differences [95 % CI], paired t-test:",
            markdown_table(["scenario", *(f"vs {b}" for b in BASELINES)], m_rows),
        ]
    # The pair alone: its seeds need not wait for the other variants of a scenario.
    pair = [c for c in curves if c["aggregator"] in ("fedloss", "fedloss-default")]
    d_rows = default_vs_thesis_rule(our_grid(pair), pair)
    if d_rows:
        out += [
            "FedLoss with the library's default bounds (fedloss-default: `loss_clip: 5,"
            " peer_clip: 1`) against the thesis's unbounded rule (fedloss), this grid, each"
            " scenario on the seeds both have finished; final accuracy (%), the per-seed"
            " difference default - thesis rule [95 % CI] with its paired t-test, and in how"
            " many rounds a bound changed a weight:",
            markdown_table(
                [
                    "scenario",
                    "fedloss (thesis rule)",
                    "fedloss-default",
                    "difference",
                    "verdict",
                    "seeds",
                    "rounds bounded",
                ],
                d_rows,
            ),
            default_decision(d_rows),
        ]
    out.append(
        "What differs from the thesis's setting: the dataset (Fashion-MNIST; SVHN and CIFAR-10"
        " do not install here), the host (FedLab's standalone pipeline, not Flower), the number"
        " of runs per cell (seeds as stated, the thesis ran 5), and the partitions (ours come"
        " from fedbalance's partitioners with the thesis's parameters, seeded; the thesis's"
        " partitions are not published). FedAvgM's server momentum is not stated in the thesis;"
        " ours was chosen on the clients' validation splits (`fedavgm_sweep_fmnist_e10.md`)."
    )
    return "\n\n".join(out)


def verdict_table(report_md: str) -> str:
    """The verdict table of a report's "Set against the thesis" section (what the README shows)."""
    section = report_md[report_md.index("## Set against the thesis") :]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| claim"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def readme_block(report_md: str) -> str:
    """What the README shows of a report: its verdict table (the rest is in the report)."""
    return verdict_table(report_md)


BEGIN, END = "<!-- thesis-claims -->\n", "<!-- /thesis-claims -->"


def readme_with_verdicts(readme: str, report_md: str) -> str:
    """``readme`` with the block between its thesis-claims markers set to the report's
    ``readme_block`` (``fedbalance bench thesis ... --readme README.md`` writes it)."""
    start = readme.index(BEGIN) + len(BEGIN)
    return readme[:start] + readme_block(report_md) + "\n" + readme[readme.index(END) :]
