"""perf-partition runs on tiny sizes and writes one table with every size (never a timing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_perf_partition_tables_every_size_with_ratios_for_label_dirichlet(tmp_path: Path) -> None:
    pytest.importorskip("fedlab")
    from fedbalance_benchmarks.perf_partition import main

    args = ["--sizes", "2000x20", "4000x40", "--repeats", "1", "--hang-limit", "0"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "perf_partition.json").read_text())
    assert {(r["labels"], r["clients"]) for r in records} == {(2000, 20), (4000, 40)}
    rows = [r for r in (tmp_path / "perf_partition.md").read_text().splitlines() if "| 4000 " in r]
    assert len(rows) == 4  # fedbalance, fedlab and mixed at beta 0.5; fedbalance at 0.1
    assert rows[0].rstrip(" |").endswith("x") and rows[2].rstrip(" |").endswith("-")


def test_a_malformed_size_is_a_usage_error() -> None:
    from fedbalance_benchmarks.perf_partition import main

    with pytest.raises(SystemExit) as exc:
        main(["--sizes", "1000by10"])
    assert exc.value.code == 2
