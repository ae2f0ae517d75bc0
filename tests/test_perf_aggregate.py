"""The aggregation-speed benchmark's smoke run, and how its ratios are formed."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from fedbalance_benchmarks.perf_aggregate import main
from fedbalance_benchmarks.perf_aggregate_report import repeat_ratios


def test_a_ratio_pairs_the_times_of_one_repeat() -> None:
    floor = {"seconds": 2.0, "seconds_all": [1.0, 2.0, 4.0]}
    ours = {"seconds": 4.0, "seconds_all": [1.5, 4.0, 4.4]}  # slow machine in repeat 2
    assert repeat_ratios(ours, floor) == [1.5, 2.0, 1.1]
    # a skipped repeat leaves nothing to pair: the report falls back to the ratio of medians
    assert repeat_ratios({"seconds": 1.0, "seconds_all": [1.0]}, floor) == []


@pytest.mark.slow
def test_tiny_run_reports_per_repeat_ratios_from_its_own_times(tmp_path: Path) -> None:
    assert main(["--tiny", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "perf_aggregate.json").read_text())
    floor = next(r for r in records if r["impl"] == "floor")
    fedavg = next(r for r in records if (r["impl"], r["operation"]) == ("fedbalance", "fedavg"))
    times = zip(fedavg["seconds_all"], floor["seconds_all"], strict=True)
    ratio = statistics.median(t / f for t, f in times)
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in (tmp_path / "perf_aggregate.md").read_text().splitlines()
        if line.startswith("| fedbalance ")
    ]
    vs_floor = {row[1]: row[-1] for row in rows}
    assert vs_floor["fedavg"] == f"{ratio:.2f}x [{ratio:.2f}-{ratio:.2f}]"
