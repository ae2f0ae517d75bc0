"""The run's records (``fl_adapters.run.directory.RunFiles``), the same on every host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fl_adapters.checkpoint import CheckpointError
from fl_adapters.run.directory import RunFiles


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


# -- a run's claim on its directory, through the real CLI ---------------------------------------
TINY = {
    "framework": "fedlab",
    "dataset": "digits",
    "partition": {"name": "iid"},
    "aggregator": "fedavg",
    "num_clients": 2,
    "clients_per_round": 2,
    "rounds": 1,
    "local_epochs": 1,
    "seed": 0,
}


@dataclass
class Done:
    returncode: int
    stderr: str


@pytest.fixture
def cli_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """``fedbalance run run.yaml --out out`` in ``work`` with ``env`` beside the process's own
    (no other ``FEDBALANCE_`` variable), through the CLI's ``main`` in this process: the same
    claim, checks and exit codes as the console script, without a Python start of its own."""
    from fl_adapters.cli import main

    def run(work: Path, *flags: str, **env: str) -> Done:
        (work / "run.yaml").write_text(yaml.safe_dump(TINY))
        with monkeypatch.context() as m:
            for k in [k for k in os.environ if k.startswith("FEDBALANCE_")]:
                m.delenv(k)
            for k, v in env.items():
                m.setenv(k, v)
            m.chdir(work)
            capsys.readouterr()
            code = main(["run", "run.yaml", "--out", "out", *flags])
        return Done(code, capsys.readouterr().err)

    return run


@pytest.mark.slow
def test_the_inherited_claim_variable_cannot_stand_in_for_the_lock(
    tmp_path: Path, cli_run: Any
) -> None:
    assert cli_run(tmp_path).returncode == 0
    before = (tmp_path / "out" / "metrics.jsonl").read_text()
    out = str((tmp_path / "out").resolve())
    # By hand, or stale: an ancestor of this process (the CLI runs in it) that holds no lock.
    for held in (out, f"{out}|1", f"{out}|{os.getppid()}"):
        done = cli_run(tmp_path, FEDBALANCE_HELD_OUT=held)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "holds another run's records (metrics.jsonl" in done.stderr
    assert (tmp_path / "out" / "metrics.jsonl").read_text() == before  # nothing erased
    (tmp_path / "out" / "metrics.jsonl").write_text('{"round": 99}\n')  # marks the old records
    again = cli_run(tmp_path, "--overwrite")  # what the refusals offer
    assert again.returncode == 0, again.stderr[-2000:]
    assert '"round": 99' not in (tmp_path / "out" / "metrics.jsonl").read_text()


def test_a_run_still_in_its_first_round_is_in_use_not_stopped(tmp_path: Path) -> None:
    """A run in round 1 holds the lock and has written metrics.jsonl but no checkpoint yet: a
    second run is told the directory is in use, never that the first one stopped."""
    import fcntl

    from fl_adapters.run.directory import LOCK, RunDirError, claim

    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text("")
    with open(out / LOCK, "w") as held:
        held.write("pid 4242, started earlier")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        for flags in ({}, {"resume": True}, {"overwrite": True}):
            with pytest.raises(RunDirError, match="is in use by another fedbalance run"):
                with claim(out, **flags):
                    pass


@pytest.mark.parametrize("name", ["metrics.jsonl", "aggregations.jsonl", "sub/copy.jsonl"])
def test_a_record_path_inside_the_run_directory_is_refused(
    tmp_path: Path, name: str, cli_run: Any
) -> None:
    done = cli_run(tmp_path, FEDBALANCE_RECORD=str(tmp_path / "out" / name))
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert f"FEDBALANCE_RECORD={tmp_path / 'out' / name} is inside --out out" in last, last
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


SAVE_UNDER_A_LIMIT = """
import resource, signal, sys, torch
from pathlib import Path
from fl_adapters.checkpoint import Checkpoint, CheckpointError

out = Path(sys.argv[1])
def ckpt(rnd, size):
    return Checkpoint(config={}, round=rnd, model={"w": torch.zeros(size)}, aggregator={},
                      participations={}, sampler=None, host="fedml")
ckpt(1, 10).save(out / "checkpoint.pt")
# A disk that fills up: writes past 64 kB fail (EFBIG, SIGXFSZ ignored), as ENOSPC would.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
try:
    ckpt(2, 100_000).save(out / "checkpoint.pt")
except CheckpointError as e:
    print(e)
"""


def test_a_disk_that_fills_up_stops_with_one_line_and_keeps_the_last_checkpoint(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SAVE_UNDER_A_LIMIT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip()
    path = tmp_path / "checkpoint.pt"
    assert line.startswith(f"cannot write the checkpoint of round 2 to {path} (File too large; ")
    assert line.endswith(f"{path} still holds round 1; free some space, then resume"), line
    assert "bytes free on that disk" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # no .tmp left
