"""The thesis's claims are checked by one rule, on its figures and on our runs alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedbalance_benchmarks import thesis_claims as tc

ROUNDS = list(range(1, 51))


def curves_from(grid: tc.Grid, scenario_filter: set[str] | None = None) -> list[dict[str, Any]]:
    """Two seeds per cell whose checkpoint mean and population std are the grid's figures
    (seed 0 at mean - std, seed 1 at mean + std); other rounds hold the previous checkpoint."""
    out = []
    for scenario, aggs in grid.items():
        if scenario_filter is not None and scenario not in scenario_filter:
            continue
        for variant, s in aggs.items():
            for seed, sign in ((0, -1), (1, 1)):
                at = {
                    r: (m + sign * sd) / 100
                    for r, m, sd in zip(tc.CHECKPOINTS, s.means, s.stds, strict=True)
                }
                acc, last = [], at[10]
                for r in ROUNDS:
                    last = at.get(r, last)
                    acc.append(last)
                out.append(
                    {
                        "scenario": scenario,
                        "aggregator": variant,
                        "seed": seed,
                        "rounds": ROUNDS,
                        "accuracy": acc,
                    }
                )
    return out


@pytest.mark.parametrize("dataset", ["svhn", "cifar10"])
def test_our_summaries_of_runs_with_the_thesis_figures_are_the_thesis_figures(dataset: str) -> None:
    thesis = tc.thesis_grid(dataset)
    ours = tc.our_grid(curves_from(thesis))
    assert ours.keys() == thesis.keys()
    for scenario, aggs in thesis.items():
        for variant, s in aggs.items():
            assert ours[scenario][variant].means == pytest.approx(s.means)
            assert ours[scenario][variant].stds == pytest.approx(s.stds)
            assert ours[scenario][variant].runs == 2
    theirs = [v.verdict for v in tc.verdicts(thesis, None)][:4]
    assert [v.verdict for v in tc.verdicts(ours, curves_from(thesis))][:4] == theirs


def test_the_thesis_figures_under_the_rule() -> None:
    """What the thesis's own tables support: its SVHN margin is ~+2.5 points, CIFAR-10's ~0
    (quantity skew's -7.9 cancels the rest), and FedLoss's quantity deficit on CIFAR-10 sits
    within its own 8.7-point spread."""
    svhn, cifar = tc.thesis_grid("svhn"), tc.thesis_grid("cifar10")
    m, _, per = tc.margin(svhn)
    assert m == pytest.approx(2.47, abs=0.01) and per["label"] == pytest.approx(4.92, abs=0.01)
    m, _, per = tc.margin(cifar)
    assert m == pytest.approx(-0.07, abs=0.01) and per["quantity"] == pytest.approx(-7.90, abs=0.01)
    assert tc.claim_margin(svhn).verdict == tc.HOLDS
    # Without FedAvgM: SVHN's label row is 79.16 - mean(74.40, 75.72) = +4.10.
    _, _, calm = tc.margin(svhn, baselines=("fedavg", "fedmedian"))
    assert calm["label"] == pytest.approx(4.10, abs=0.01)
    assert tc.claim_quantity(cifar).verdict == tc.OPEN
    assert tc.claim_homogeneous(svhn).verdict == tc.HOLDS
    assert tc.thesis_claim_stability(cifar).verdict == tc.HOLDS


def shifted(grid: tc.Grid, scenario: str, variant: str, by: float) -> tc.Grid:
    out = {s: dict(aggs) for s, aggs in grid.items()}
    old = out[scenario][variant]
    out[scenario][variant] = tc.Summary(tuple(m + by for m in old.means), old.stds, old.runs)
    return out


def test_a_fedloss_beaten_beyond_std_under_label_skew_fails_claim_2() -> None:
    grid = shifted(tc.thesis_grid("svhn"), "label", "fedloss", -20.0)
    verdict = tc.claim_best_label_feature(grid)
    assert verdict.verdict == tc.FAILS
    assert "label: 59.16 ± 3.72, behind fedmedian 75.72 ± 5.52" in verdict.evidence


def test_a_fedloss_ahead_beyond_std_under_quantity_skew_fails_claim_3() -> None:
    grid = shifted(tc.thesis_grid("svhn"), "quantity", "fedloss", +5.0)
    assert tc.claim_quantity(grid).verdict == tc.FAILS


def test_a_grid_of_the_fedloss_pair_alone_leaves_every_claim_open() -> None:
    """`--aggregators fedloss fedloss-default` (item 3's runs) reports without the baselines;
    it used to stop with KeyError: 'fedavg' once the pair had two seeds."""
    thesis = tc.thesis_grid("svhn")
    pair = {
        s: {"fedloss": aggs["fedloss"], "fedloss-default": aggs["fedloss"]}
        for s, aggs in thesis.items()
    }
    got = tc.verdicts(pair, curves_from(pair))
    assert [v.verdict for v in got] == [tc.OPEN] * 5
    assert got[1].evidence == "label and feature not both run with all four aggregators"
    without_mixed_fedavg = {s: dict(aggs) for s, aggs in thesis.items()}
    del without_mixed_fedavg["mixed"]["fedavg"]
    assert tc.claim_stability(without_mixed_fedavg, curves_from(thesis)).verdict == tc.OPEN
    assert tc.claim_best_label_feature(without_mixed_fedavg).evidence.startswith("label: 79.16")


def test_a_scenario_keeps_only_the_seeds_every_variant_finished() -> None:
    curves = curves_from(tc.thesis_grid("svhn"), {"label"})
    curves = [c for c in curves if not (c["aggregator"] == "fedavg" and c["seed"] == 1)]
    grid = tc.our_grid(curves)
    assert {s.runs for s in grid["label"].values()} == {1}
    fedloss = tc.thesis_grid("svhn")["label"]["fedloss"]
    expected = [m - sd for m, sd in zip(fedloss.means, fedloss.stds, strict=True)]  # seed 0 alone
    assert grid["label"]["fedloss"].means == pytest.approx(expected)


def test_jitter_is_the_mean_absolute_step_from_round_10() -> None:
    acc = [0.5] * 9 + [0.6, 0.7, 0.6, 0.8]
    assert tc.jitter(acc, list(range(1, 14))) == pytest.approx((10 + 10 + 20) / 3)


def test_report_sets_each_claim_against_the_thesis(tmp_path: Path) -> None:
    thesis = tc.thesis_grid("svhn")
    grid = {
        s: {**aggs, "fedloss-default": shifted(thesis, s, "fedloss", -0.1)[s]["fedloss"]}
        for s, aggs in thesis.items()
    }
    curves = curves_from(grid)
    opts = {"local_epochs": 10, "dataset": "fmnist"}
    text = tc.report(curves, opts, tmp_path)
    assert text.startswith("## Set against the thesis")
    header = next(line for line in text.splitlines() if line.startswith("| claim"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells == ["claim", "thesis SVHN", "thesis CIFAR-10", "ours, 10 ep. (2 seeds)"]
    for i in range(1, 6):
        assert f"- claim {i}, ours, 10 ep. (2 seeds):" in text
    rows = tc.default_vs_thesis_rule(tc.our_grid(curves))
    assert [r[0] for r in rows] == ["iid", "label", "quantity", "feature", "mixed"]
    assert all(r[3] == "-0.10" and r[5] == "within std" for r in rows)
    assert tc.default_decision(rows) in text
    assert "largest loss: -0.10 points under iid, on 2 seeds), so `peer_clip: 1` stays" in text


def test_a_default_costing_beyond_std_anywhere_must_change() -> None:
    thesis = tc.thesis_grid("svhn")
    grid = {
        s: {
            "fedloss": aggs["fedloss"],
            "fedloss-default": shifted(thesis, s, "fedloss", -10.0 if s == "label" else 0.0)[s][
                "fedloss"
            ],
        }
        for s, aggs in thesis.items()
    }
    rows = tc.default_vs_thesis_rule(tc.our_grid(curves_from(grid)))
    assert [r[5] for r in rows].count("costs beyond std") == 1
    assert tc.default_decision(rows).startswith("The default costs more than one std under label:")
    ahead = [[*r[:3], "+0.20", *r[4:5], "within std", r[6]] for r in rows]
    assert "(it is behind the thesis's rule in no scenario, on 2 seeds)" in tc.default_decision(
        ahead
    )


def test_one_seed_gives_no_verdict() -> None:
    curves = [c for c in curves_from(tc.thesis_grid("svhn")) if c["seed"] == 0]
    assert {v.verdict for v in tc.verdicts(tc.our_grid(curves), curves)} == {"too few seeds (1)"}
    with_default = [
        {**c, "aggregator": "fedloss-default"} for c in curves if c["aggregator"] == "fedloss"
    ]
    rows = tc.default_vs_thesis_rule(tc.our_grid(curves + with_default))
    assert rows and {r[5] for r in rows} == {"too few seeds (1)"}
    assert tc.default_decision(rows).startswith("Not decided yet: too few seeds under iid,")


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
README = Path(__file__).resolve().parents[1] / "README.md"


def committed_e10() -> tuple[dict[str, Any], str]:
    import json

    doc = json.loads((RESULTS / "thesis_fmnist_e10.json").read_text())
    return doc, (RESULTS / "thesis_fmnist_e10.md").read_text()


def test_the_committed_report_sets_its_own_runs_against_the_thesis() -> None:
    doc, text = committed_e10()
    assert tc.report(doc["runs"], doc["options"], RESULTS) in text
    total = 5 * 6 * doc["options"]["seeds"]
    assert len(doc["runs"]) == total or f"Unfinished: {len(doc['runs'])} of {total} runs" in text


def test_every_run_of_the_committed_report_is_a_committed_record() -> None:
    import json

    doc, _ = committed_e10()
    for run in doc["runs"]:
        path = RESULTS / "per-run" / "thesis_fmnist_e10" / run["scenario"] / run["aggregator"]
        record = json.loads((path / f"seed{run['seed']}.json").read_text())
        assert record["accuracy"] == run["accuracy"] and record["config"]["local_epochs"] == 10


def test_the_readme_shows_the_reports_verdicts() -> None:
    _, text = committed_e10()
    readme = README.read_text()
    block = readme.split("<!-- thesis-claims -->\n", 1)[1].split("\n<!-- /thesis-claims -->", 1)[0]
    assert block == tc.readme_block(text)
    assert block.startswith(tc.verdict_table(text))
    assert "so `peer_clip: 1` stays the default" in block  # item 3, decided by the grid


def test_readme_with_verdicts_replaces_only_the_block() -> None:
    _, text = committed_e10()
    stale = "intro\n<!-- thesis-claims -->\n| old |\n<!-- /thesis-claims -->\noutro\n"
    fresh = tc.readme_with_verdicts(stale, text)
    assert (
        fresh
        == f"intro\n<!-- thesis-claims -->\n{tc.readme_block(text)}\n<!-- /thesis-claims -->\noutro\n"
    )
    assert tc.readme_with_verdicts(README.read_text(), text) == README.read_text()


def test_the_default_is_compared_on_the_seeds_the_pair_has_finished(tmp_path: Path) -> None:
    """An unfinished grid: the fedloss pair has two seeds, fedavg one. The claims wait for
    fedavg; the default-vs-thesis-rule table does not."""
    thesis = tc.thesis_grid("svhn")
    grid = {
        s: {**aggs, "fedloss-default": shifted(thesis, s, "fedloss", -0.1)[s]["fedloss"]}
        for s, aggs in thesis.items()
    }
    curves = [c for c in curves_from(grid) if not (c["aggregator"] == "fedavg" and c["seed"])]
    text = tc.report(curves, {"local_epochs": 10, "dataset": "fmnist"}, tmp_path)
    table = text.split("thesis's rule (fedloss), this grid", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    assert [r[0].strip() for r in rows] == ["iid", "label", "quantity", "feature", "mixed"]
    assert {(r[5].strip(), r[6].strip()) for r in rows} == {("within std", "2")}
    assert "ours, 10 ep. (1 seed)" in text  # the claims: every variant's common seeds
