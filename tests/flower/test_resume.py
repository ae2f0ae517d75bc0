"""Checkpoints and ``fedbalance run --resume`` on Flower, with real Flower runs.

* Simulation engine: a 1-round run continued to 2 ends on the model, metrics and aggregation
  record of an uninterrupted 2-round run, bit for bit (FedAvgM, whose momentum is aggregator
  state, and 2 of 3 clients a round, so the seeded sampler's state matters too); Astraea, which
  plans again on resume and must find the checkpoint's plan and the same mediators.
* Deployment engine: a SuperNode killed mid-run stops every process; the message names it and
  the checkpoint, and ``--resume`` finishes the run on the same model as the uninterrupted one.
* Refusals, before any Flower process starts: no checkpoint, a changed config, fewer rounds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from flower_runs import ASTRAEA, FEDAVGM, assert_same_run, fedbalance, outcome

from fl_adapters.checkpoint import Checkpoint, CheckpointError
from fl_adapters.config import ConfigError
from fl_adapters.flower import checkpoint
from fl_adapters.flower.config import parse_run_config

CONFIG = FEDAVGM


@pytest.fixture(scope="module")
def uninterrupted(fedavgm_whole: Path) -> dict[str, Any]:
    return outcome(fedavgm_whole / "out")


@pytest.fixture(scope="module")
def stopped(fedavgm_first_round: Path) -> Path:
    """A simulation run of the first round (its checkpoint holds round 1)."""
    return fedavgm_first_round


@pytest.mark.slow
def test_simulation_resume_ends_on_the_uninterrupted_run(
    stopped: Path, uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    ckpt = Checkpoint.load(stopped / "out" / "checkpoint.pt")
    assert ckpt.round == 1 and ckpt.config["host"] == "flower" and ckpt.sampler is not None
    assert set(ckpt.aggregator) and sorted(ckpt.history["evaluate"]) == ["1"]
    work = tmp_path / "resumed"
    work.mkdir()
    (work / "out").mkdir()
    for name in ("checkpoint.pt", "aggregations.jsonl"):
        (work / "out" / name).write_bytes((stopped / "out" / name).read_bytes())
    done = fedbalance(work, CONFIG, "--no-progress", "--resume")
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_run(outcome(work / "out"), uninterrupted)
    assert Checkpoint.load(work / "out" / "checkpoint.pt").round == CONFIG["rounds"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 8}, "seed: checkpoint 7, now 8"),
        ({"aggregator_args": {"beta": 0.5}}, "aggregator-args"),
        ({}, "aggregations.jsonl does not hold rounds 1..1"),
    ],
    ids=["seed", "aggregator-args", "no-record"],
)
def test_resume_refuses_a_checkpoint_the_config_cannot_continue(
    stopped: Path,
    change: dict[str, Any],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "checkpoint.pt").write_bytes(
        (stopped / "out" / "checkpoint.pt").read_bytes()
    )
    started = time.monotonic()
    code, err = refused(tmp_path, {**CONFIG, **change}, capsys)
    assert code == 2 and message in err, err[-2000:]
    assert time.monotonic() - started < 60  # refused before Flower starts
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def refused(
    work: Path, config: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """``fedbalance run --resume`` of ``config`` in this process (a refusal needs no process of
    its own: each cost about 4 CPU-s of imports); its exit code and stderr."""
    from fl_adapters.cli import main

    (work / "run.yaml").write_text(yaml.safe_dump(config))
    code = main(["run", str(work / "run.yaml"), "--out", str(work / "out"), "--resume"])
    return code, capsys.readouterr().err


def test_resume_without_a_checkpoint_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = refused(tmp_path, CONFIG, capsys)
    assert code == 2 and "no checkpoint at" in err and "Traceback" not in err, err[-2000:]


def test_a_checkpoint_of_another_host_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    Checkpoint(
        config={"dataset": "digits"}, round=1, model=torch.zeros(3), aggregator={},
        participations={}, host="fedlab",
    ).save(path)  # fmt: skip
    with pytest.raises(CheckpointError, match="written by a FedLab run; this is a Flower run"):
        checkpoint.load(tmp_path, checkpoint.identity({}), rounds=3)


def test_a_run_shorter_than_its_checkpoint_is_refused(tmp_path: Path) -> None:
    run = checkpoint.identity({"seed": 1, "num-server-rounds": 3})
    Checkpoint(
        config=run,
        round=2,
        model={"w": torch.ones(2)},
        aggregator={},
        participations={},
        host="flower",
    ).save(tmp_path / "checkpoint.pt")
    assert checkpoint.load(tmp_path, run, rounds=2).round == 2
    with pytest.raises(CheckpointError, match=r"at least the checkpoint's round \(2\).*got 1"):
        checkpoint.load(tmp_path, run, rounds=1)
    with pytest.raises(CheckpointError, match="seed: checkpoint 1, now 2"):
        checkpoint.load(tmp_path, checkpoint.identity({"seed": 2}), rounds=3)


def test_what_may_change_on_resume_is_the_host_specs(tmp_path: Path) -> None:
    """The Flower spec declares its resumable run-config keys; the checkpoint check reads them
    there (a key the spec lists may change, any other is refused)."""
    from fl_adapters.flower import config
    from fl_adapters.flower.spec import FLOWER

    keys = {config.CHECKPOINT_KEY, config.RESUME_KEY, config.EVAL_EVERY_KEY,
            config.EVAL_FRACTION_KEY, checkpoint.ROUNDS_KEY}  # fmt: skip
    assert keys <= set(FLOWER.may_change) and checkpoint.MAY_CHANGE is FLOWER.may_change
    written = {"seed": 1, "eval-every": 1, "num-server-rounds": 2}
    Checkpoint(
        config=checkpoint.identity(written), round=2, model={"w": torch.ones(2)}, aggregator={},
        participations={}, host="flower",
    ).save(tmp_path / "checkpoint.pt")  # fmt: skip
    later = checkpoint.identity(written | {"eval-every": 3, "num-server-rounds": 5})
    assert checkpoint.load(tmp_path, later, rounds=5).round == 2
    with pytest.raises(CheckpointError, match="eval-every, eval-fraction may change"):
        checkpoint.load(tmp_path, checkpoint.identity(written | {"seed": 2}), rounds=5)


@pytest.mark.parametrize("key", ["checkpoint-dir", "resume-from"])
def test_checkpoint_keys_must_be_paths(key: str) -> None:
    with pytest.raises(ConfigError, match=f"{key} must be a directory path in a string"):
        parse_run_config({key: 3})


def supernodes(workdir: Path) -> list[int]:
    """Pids of the SuperNodes running in ``workdir`` (the deployment's work directory)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = Path(os.readlink(f"/proc/{entry}/cwd"))
        except OSError:
            continue
        if cwd == workdir and any(part.endswith(b"flower-supernode") for part in cmd[:2]):
            found.append(int(entry))
    return found


@pytest.mark.slow
def test_a_killed_supernode_stops_the_deployment_and_resume_finishes_it(
    uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    config = {**CONFIG, "framework": "flower-deployment"}
    proc = fedbalance(tmp_path, config, "--no-progress", wait=False)
    assert isinstance(proc, subprocess.Popen)
    ckpt = tmp_path / "out" / "checkpoint.pt"
    try:
        deadline = time.monotonic() + 300
        while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ckpt.exists(), "no round completed"
        victims = supernodes((tmp_path / "out" / "deployment").resolve())
        assert len(victims) == 3
        os.kill(victims[1], signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = proc.communicate(timeout=120)
        stopped_in = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    assert "supernode" in stderr and "during the run" in stderr, stderr[-2000:]
    assert "checkpoint.pt holds round" in stderr and "--resume" in stderr
    assert stopped_in < 60
    assert supernodes((tmp_path / "out" / "deployment").resolve()) == []
    done_before = Checkpoint.load(ckpt).round
    assert 1 <= done_before < CONFIG["rounds"]
    resumed = fedbalance(tmp_path, config, "--no-progress", "--resume")
    assert isinstance(resumed, subprocess.CompletedProcess)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # Seeded by (seed, client, round) and summed in client order: the deployment ends on the
    # simulation's model, resumed or not.
    assert_same_run(outcome(tmp_path / "out"), uninterrupted)


@pytest.mark.slow
def test_astraea_resume_replans_the_same_plan_and_ends_on_the_same_model(
    astraea_whole: Path, tmp_path: Path
) -> None:
    part = tmp_path / "part"
    done = fedbalance(part, {**ASTRAEA, "rounds": 1}, "--no-progress")
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 0, done.stderr[-3000:]
    ckpt = Checkpoint.load(part / "out" / "checkpoint.pt")
    assert ckpt.round == 1 and ckpt.plan is not None
    resumed = fedbalance(part, ASTRAEA, "--no-progress", "--resume")
    assert isinstance(resumed, subprocess.CompletedProcess)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, want = outcome(part / "out"), outcome(astraea_whole / "out")
    assert [e["mediators"] for e in got["record"]] == [e["mediators"] for e in want["record"]]
    assert_same_run(got, want)
