"""``fedbalance bench scale``: real ``fedbalance run`` processes at two sizes, the per-round
times read from the aggregation record, and the planning check; ``--no-run`` rewrites the
same report from its JSON. The numbers themselves are the committed report's, not asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedbalance_benchmarks import scale


def test_evaluated_rounds_and_sizes_are_the_runs() -> None:
    config = scale.run_config("flower", 1000, 4, 10, seed=0)
    assert (config["eval_every"], config["eval_fraction"]) == (2, 0.01)
    assert scale.run_config("fedml-sp", 1000, 4, 10, seed=0)["eval_fraction"] == 0.01
    # Flower's own polling is the same Flower run; only the simulation's polling differs
    assert scale.run_config(scale.STOCK_POLLING, 1000, 4, 10, seed=0) == config


@pytest.mark.slow
def test_bench_scale_measures_each_size_and_rewrites_its_report(tmp_path: Path) -> None:
    argv = ["--sizes", "12", "24", "--hosts", "fedlab", "--rounds", "4", "--per-round", "4"]
    argv += ["--side-by-side", "0"]
    assert scale.main([*argv, "--plan-sizes", "100", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "scale.json").read_text())
    assert [(r["host"], r["clients"]) for r in record["hosts"]] == [("fedlab", 12), ("fedlab", 24)]
    for r in record["hosts"]:
        assert r["evaluated"] == [2, 4] and len(r["aggregated_at_s"]) == 4
        assert r["steady_round_s"] > 0 and r["peak_rss_mb"] > 0
        assert 0 < r["aggregation_s"] < max(r["aggregated_at_s"])  # from the record
        # The steady rounds (2 and 4) split: training from the clock, the host's own the rest.
        assert 0 < r["training_s"] < r["steady_round_s"]
        assert r["training_s"] + r["aggregation_s"] + r["host_s"] == pytest.approx(
            r["steady_round_s"], abs=2e-3
        )
        assert 0 <= r["final_accuracy"] <= 1  # a few test samples: 0 is possible
    assert record["plan"] == [
        {**record["plan"][0], "clients": 100, "classes": 47, "identical": True}
    ]
    text = (tmp_path / "scale.md").read_text()
    assert (
        "fedbalance bench scale --sizes 12 24 --hosts fedlab --rounds 4 --per-round 4 "
        "--plan-sizes 100 --side-by-side 0" in text
    )
    assert scale.main(["--no-run", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "scale.md").read_text() == text


def test_the_side_by_side_report_gives_medians_ranges_and_per_repeat_ratios() -> None:
    """Repeated side-by-side runs: the table shows each strategy's median and range, and each
    ratio (of medians, judged against the bound) gives its range repeat by repeat."""
    side: dict[str, object] = {"nodes": 1000, "rounds": 10, "per_round": 10, "repeats": 3}
    side["polling"] = "index"
    side["same_model_max_abs"] = 1e-5
    for key, runs in [
        ("fedbalance", [10.0, 12.0, 11.0]),
        ("flower-fedavg-seeded", [10.0, 10.0, 10.0]),
        ("flower-fedavg", [8.0, 12.0, 10.0]),
    ]:
        side[key] = {"strategy_s": sorted(runs)[1], "wall_s": 20.0, "runs_s": runs}
    text = "\n".join(scale.side_report([side]))
    assert "Each strategy ran 3 time(s) at each size" in text
    assert "| 1,000 | fedbalance | 11.00 (10.00-12.00) | 1.100 | 20.0 |" in text
    assert (
        "same sampling **1.10x** over the whole run (bound: 1.2x) (repeat by repeat 1.00-1.20x)"
        in text
    )
    assert (
        "Flower's sampler **1.10x** over the whole run (bound: 1.2x) (repeat by repeat 1.00-1.25x)"
        in text
    )
    ten_thousand = {**side, "nodes": 10_000}
    text = "\n".join(scale.side_report([side, ten_thousand]))
    assert "fedbalance 1.00x, Flower FedAvg, same sampling 1.00x" in text
    assert "All three ran in the engine polling by message" in text


def test_a_rounds_training_counts_clients_that_train_at_once_once(tmp_path: Path) -> None:
    """The training clock's steps, ``per_round`` to a round in order of their start: each
    round's seconds are the union of its steps; a clock short of a step gives no split."""
    clock = tmp_path / "clock.txt"
    # Round 1: two clients at once (1-3 and 2-4) then one alone (5-6); round 2: 10-11 three times.
    steps = [(5, 6, 2), (1, 3, 0), (2, 4, 1), (10, 11, 3), (10, 11, 4), (10.5, 11, 5)]
    clock.write_text("".join(f"{a} {b} {c}\n" for a, b, c in steps))
    assert scale.training_per_round(clock, rounds=2, per_round=3) == [4.0, 1.0]
    assert scale.training_per_round(clock, rounds=3, per_round=3) is None
    assert scale.training_per_round(tmp_path / "absent.txt", rounds=2, per_round=3) is None
