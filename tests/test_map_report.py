"""The map of where each method helps (fedbalance_benchmarks.map): its statistics, its wording,
and that the committed report and README block are what the committed records give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedbalance_benchmarks import map as bench_map

ROOT = Path(__file__).resolve().parents[1]
OPTS = {**bench_map.FULL, "dataset": "fmnist", "seeds": 3, "stem": bench_map.STEM,
        "command": bench_map.COMMAND}  # fmt: skip


def record(acc: float, balanced: float, worst: float, p10: float) -> dict:
    return {"final": {"test_accuracy": acc, "balanced_accuracy": balanced,
                      "worst_class_recall": worst, "client_acc_p10": p10}}  # fmt: skip


def test_paired_differences_and_their_verdicts() -> None:
    records = {}
    for seed, (base, better, same) in enumerate([(0.80, 0.83, 0.81), (0.70, 0.731, 0.69),
                                                  (0.75, 0.779, 0.76)]):  # fmt: skip
        records[("iid", "fedavg", seed)] = record(base, base, base, base)
        records[("iid", "fedloss", seed)] = record(better, better, better, better)
        records[("iid", "fedmedian", seed)] = record(same, same, same, same)
    diffs = bench_map.differences(records, 3)
    up, flat = diffs["accuracy"]["iid"]["fedloss"], diffs["accuracy"]["iid"]["fedmedian"]
    assert up["diff"] == pytest.approx(3.0) and up["excludes_zero"] and up["lo"] > 0
    assert flat["diff"] == pytest.approx(1 / 3) and not flat["excludes_zero"]
    assert "**✱**" in bench_map.cell_text(up) and "✱" not in bench_map.cell_text(flat)
    advice = "\n".join(bench_map.advice(diffs))
    assert (
        "**iid**: **use fedloss**. above FedAvg: fedloss on final accuracy by +3.00 points"
        in advice
    )
    assert "**dirichlet 0.1**: not measured yet" in advice
    one = bench_map.differences({k: v for k, v in records.items() if k[2] == 0}, 3)
    assert bench_map.cell_text(one["accuracy"]["iid"]["fedloss"]) == "+3.00 (n = 1)"
    assert "**iid**: not judged yet (1 seed recorded" in "\n".join(bench_map.advice(one))


def test_a_setting_where_no_interval_excludes_zero_says_so() -> None:
    records = {("iid", m, s): record(0.8 + 0.01 * ((s + i) % 2), 0.8, 0.5, 0.6)
               for s in range(3) for i, m in enumerate(("fedavg", "fedmedian"))}  # fmt: skip
    advice = "\n".join(bench_map.advice(bench_map.differences(records, 3)))
    assert "**iid**: no method differs from FedAvg here" in advice


@pytest.mark.parametrize(
    ("better", "worse", "said"),
    [
        ([(3.0, "fedloss"), (1.0, "astraea")], [], "use fedloss or astraea"),
        ([(3.0, "fedloss")], [(-2.0, "fedloss")], "keep FedAvg (avoid fedloss): each method"),
        ([], [(-2.0, "astraea")], "keep FedAvg (avoid astraea): no method is above it"),
        ([(2.0, "fedloss"), (1.0, "astraea")], [(-1.0, "fedloss")], "use astraea"),
    ],
)
def test_the_verdict_recommends_only_a_method_below_fedavg_on_no_figure(
    better: list, worse: list, said: str
) -> None:
    assert bench_map.verdict(better, worse).startswith(said)


def test_the_committed_map_is_what_its_records_give() -> None:
    results = bench_map.RESULTS
    committed = results / f"{bench_map.STEM}.md"
    if not committed.exists():
        pytest.skip("the map has no committed report yet")
    opts = {**OPTS, "out": str(results)}
    records = bench_map.run_map(opts, run=False)
    text, doc = bench_map.report(records, opts)
    assert committed.read_text() == text
    assert json.loads((results / f"{bench_map.STEM}.json").read_text()) == json.loads(
        json.dumps(doc, sort_keys=True)
    )
    readme = (ROOT / "README.md").read_text()
    assert bench_map.readme_with_map(readme, text, doc, bench_map.STEM) == readme
