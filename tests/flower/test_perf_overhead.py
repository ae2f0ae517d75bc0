"""The Flower overhead benchmark runs (tiny sizes; its timings are not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedbalance_benchmarks import perf_flower_overhead


@pytest.mark.slow
def test_flower_overhead_benchmark_writes_its_table(tmp_path: Path) -> None:
    argv = ["--repeats", "2", "--rounds", "1", "--clients", "2", "--out", str(tmp_path)]
    assert perf_flower_overhead.main(argv) == 0
    table = (tmp_path / "perf_flower_overhead.md").read_text()
    for row in ("Flower FedAvg.aggregate_train", "fedbalance fedavg", "fedbalance fedloss"):
        assert f"| {row}" in table
