"""The run's records (``fl_adapters.rundir.RunFiles``), the same on every host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fl_adapters.checkpoint import CheckpointError
from fl_adapters.rundir import RunFiles


def agg(rnd: int, **extra: object) -> str:
    base = {"round": rnd, "clients": [0, 1], "weights": [0.5, 0.5], "skipped": False}
    return json.dumps(base | {"rejected": [], "elapsed_s": 0.1 * rnd} | extra)


def test_a_fresh_run_removes_an_earlier_runs_records(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    for path in (files.record, files.metrics, files.summary, files.checkpoint):
        path.write_text("earlier\n")
    assert files.start(None) == files.record
    assert not any(
        p.exists() for p in (files.record, files.metrics, files.summary, files.checkpoint)
    )


def test_a_resume_cuts_the_record_back_and_drops_a_line_cut_short(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    # Round 3 was recorded before the kill, round 4 was being written: the checkpoint holds 2.
    files.record.write_text("\n".join([agg(1), agg(2), agg(3), agg(4)[:17]]) + "\n")
    files.start(2)
    assert [json.loads(x)["round"] for x in files.record.read_text().splitlines()] == [1, 2]


def test_a_resume_refuses_records_that_lack_a_round(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    files.record.write_text(agg(1) + "\n" + agg(3) + "\n")
    with pytest.raises(CheckpointError, match=r"aggregations.jsonl does not hold rounds 1\.\.2"):
        files.start(2)
    rows = [{"round": 1}, {"round": 3}]
    with pytest.raises(CheckpointError, match=r"metrics.jsonl does not hold rounds 1\.\.2"):
        files.kept_rows(rows, 2)
    assert files.kept_rows([{"round": 1}, {"round": 2}, {"round": 3}], 2) == rows[:1] + [
        {"round": 2}
    ]


def test_aggregation_lines_become_the_rows_every_host_writes(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    astraea = agg(2, rejected=[{"client": 3}], mediators=[[0, 1]], kl=[0.2])
    files.record.write_text(agg(1) + "\n" + astraea + "\n")
    rows = files.aggregation_rows()
    assert rows[0] == {
        "round": 1,
        "clients": [0, 1],
        "weights": [0.5, 0.5],
        "skipped": False,
        "rejected": 0,
        "elapsed_s": 0.1,
    }
    assert rows[1]["rejected"] == 1 and rows[1]["mediators"] == [[0, 1]]
    assert rows[1]["mediator_kl"] == [0.2]
    assert [r["round"] for r in files.aggregation_rows(first=2)] == [2]
    files.write_rows(rows)
    assert files.rows() == json.loads(json.dumps(rows))
    assert files.finish({"rounds": 2}) == {"rounds": 2}
    assert json.loads(files.summary.read_text()) == {"rounds": 2}
