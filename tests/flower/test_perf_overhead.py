"""The Flower overhead benchmark runs (tiny sizes; its timings are not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from flower_runs import FEDAVGM

from fedbalance_benchmarks import perf_flower_overhead


@pytest.mark.slow
def test_flower_overhead_benchmark_writes_its_table(fedavgm_whole: Path, tmp_path: Path) -> None:
    # The round time comes from the shared FedAvgM simulation's own log (a Ray start of its own
    # cost this test 6 minutes on a busy 2-core machine); the server paths are timed here.
    log = (fedavgm_whole / "out" / "flower-simulation.log").read_text()
    round_s = perf_flower_overhead.seconds_per_round(log, FEDAVGM["rounds"])
    assert round_s > 0
    perf_flower_overhead.run(2, FEDAVGM["rounds"], 1, 2, tmp_path, round_s=round_s)
    table = (tmp_path / "perf_flower_overhead.md").read_text()
    for row in ("Flower FedAvg.aggregate_train", "fedbalance fedavg", "fedbalance fedloss"):
        assert f"| {row}" in table
    assert f"took {round_s:.2f} s here" in table


def test_a_log_without_the_finish_line_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no 'Strategy execution finished' line"):
        perf_flower_overhead.seconds_per_round("INFO : Starting Flower ServerApp\n", 1)
