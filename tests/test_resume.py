"""Checkpoint and resume: a stopped run continues to exactly the uninterrupted run's model.

Real FedLab standalone pipelines, and a real cross-process run whose client process is
killed mid-run (SIGKILL) and then resumed. The last two are the reliability report's fault
checks (``fedbalance bench reliability``) at the same small size.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("fedlab")

from helpers import digits_run

from fedbalance_benchmarks.reliability_faults import (
    Exploit,
    damaged_checkpoints,
    fault_config,
    kill_client_and_resume,
)
from fl_adapters.checkpoint import Checkpoint, CheckpointError
from fl_adapters.cli import main
from fl_adapters.config import RunConfig
from fl_adapters.fedlab.runner import run_standalone
from fl_adapters.run.processes import free_ports


def config(**overrides: object) -> RunConfig:
    base = {"partition": {"name": "label_dirichlet", "beta": 0.5}, "aggregator": "fedavgm"}
    return digits_run(
        {**base, "num_clients": 6, "clients_per_round": 3, "rounds": 4, "seed": 5}, overrides
    )


def rows_without_time(out: Path) -> list[dict[str, object]]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("elapsed_s")
    return rows


def stop_and_resume(cfg: RunConfig, out: Path, stop_after: int) -> Checkpoint:
    full_rounds = cfg.rounds
    cfg.rounds = stop_after
    run_standalone(cfg, out, progress=False)
    assert Checkpoint.load(out / "checkpoint.pt").round == stop_after
    # Killed between writing round stop_after + 1's record line and its checkpoint.
    with open(out / "aggregations.jsonl", "a") as fh:
        fh.write(json.dumps({"round": stop_after + 1, "weights": [1.0]}) + "\n")
    cfg.rounds = full_rounds
    run_standalone(cfg, out, progress=False, resume=True)
    return Checkpoint.load(out / "checkpoint.pt")


@pytest.mark.parametrize(
    ("aggregator", "model", "args"),
    [
        # FedAvgM (server momentum) on every host: tests/test_host_contract.py
        ("fedloss", "thesis_cnn", {}),
        ("astraea", "astraea_cnn", {"gamma": 2}),  # plan, mediators, dropout
    ],
)
def test_resumed_run_ends_on_the_uninterrupted_model(
    aggregator: str, model: str, args: dict[str, object], tmp_path: Path
) -> None:
    cfg = config(aggregator=aggregator, model=model, aggregator_args=args)
    run_standalone(cfg, tmp_path / "straight", progress=False)
    straight = Checkpoint.load(tmp_path / "straight" / "checkpoint.pt")
    resumed = stop_and_resume(cfg, tmp_path / "resumed", stop_after=2)
    assert straight.round == resumed.round == 4
    assert torch.equal(straight.model, resumed.model)
    for key, value in straight.aggregator.items():
        other = resumed.aggregator[key]
        if isinstance(value, list):
            assert all(torch.equal(a, b) for a, b in zip(value, other, strict=True))
        else:
            assert value == other
    assert straight.participations == resumed.participations
    assert rows_without_time(tmp_path / "straight") == rows_without_time(tmp_path / "resumed")
    # The run's aggregation record: the stray line cut, the resumed rounds written once.
    records = {
        run: [
            (r["round"], r["weights"])
            for r in map(
                json.loads, (tmp_path / run / "aggregations.jsonl").read_text().splitlines()
            )
        ]
        for run in ("straight", "resumed")
    }
    assert [r for r, _ in records["resumed"]] == [1, 2, 3, 4]
    assert records["straight"] == records["resumed"]


def test_a_finished_run_resumes_to_nothing_and_a_longer_one_continues(tmp_path: Path) -> None:
    cfg = config(rounds=2)
    run_standalone(cfg, tmp_path, progress=False)
    before = Checkpoint.load(tmp_path / "checkpoint.pt")
    summary = run_standalone(cfg, tmp_path, progress=False, resume=True)
    assert summary["rounds"] == 2
    assert torch.equal(Checkpoint.load(tmp_path / "checkpoint.pt").model, before.model)


def test_resume_refuses_another_config(tmp_path: Path) -> None:
    run_standalone(config(rounds=1), tmp_path, progress=False)
    with pytest.raises(
        CheckpointError, match=r"aggregator: checkpoint 'fedavgm', config 'fedloss'"
    ):
        run_standalone(config(rounds=2, aggregator="fedloss"), tmp_path, resume=True)
    with pytest.raises(CheckpointError, match="seed: checkpoint 5, config 6"):
        run_standalone(config(rounds=2, seed=6), tmp_path, resume=True)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "pickle-exploit", "foreign", "types"])
def test_a_damaged_or_tampered_checkpoint_is_a_clear_error(damage: str, tmp_path: Path) -> None:
    run_standalone(config(rounds=1), tmp_path, progress=False)
    path, marker = tmp_path / "checkpoint.pt", tmp_path / "pwned"
    if damage == "garbage":
        path.write_bytes(os.urandom(2048))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:500])
    elif damage == "pickle-exploit":
        torch.save({"format": "fedbalance-checkpoint", "x": Exploit(marker)}, path)
    elif damage == "foreign":
        torch.save({"state_dict": {"w": torch.zeros(2)}}, path)
    else:
        doc = torch.load(path, weights_only=True)
        doc["round"] = "three"
        torch.save(doc, path)
    with pytest.raises(CheckpointError) as err:
        run_standalone(config(rounds=2), tmp_path, progress=False, resume=True)
    assert str(path) in str(err.value)
    assert not marker.exists()
    assert pickle.dumps(Exploit(marker))  # the exploit itself is a valid pickle


def test_cli_resume_without_a_checkpoint_exits_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(config(rounds=1).to_dict()))
    assert main(["run", str(cfg), "--out", str(tmp_path / "none"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint at" in err and "Traceback" not in err


@pytest.mark.slow
def test_killed_client_process_loses_nothing_and_the_run_resumes(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    got = kill_client_and_resume(tmp_path, fault_config(port=port), kill_after=2)
    assert got["client_processes"] == 2 and got["launcher_exit"] == 1
    assert "client process rank" in got["launcher_error"]
    assert "`fedbalance run --resume` continues from it" in got["launcher_error"]
    assert 2 <= got["checkpoint_round"] < 5 and got["checkpoint_finite"]
    assert got["processes_left"] == 0  # the launcher stopped everything
    assert got["resume_exit"] == 0 and got["rounds"] == [1, 2, 3, 4, 5]
    # The same clients trained on the same seeds as an uninterrupted standalone run; only the
    # order updates arrive in differs (float sums).
    assert got["participations_equal"] and got["max_abs_diff"] < 1e-4


def test_the_reliability_report_finds_every_damaged_checkpoint(tmp_path: Path) -> None:
    rows = damaged_checkpoints(tmp_path)
    assert len(rows) == 4
    for damage, result, ran, message in rows:
        assert result == "clear error" and ran == "no", (damage, message)


def test_resume_needs_the_metrics_the_run_wrote(tmp_path: Path) -> None:
    run_standalone(config(rounds=2), tmp_path, progress=False)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text(lines[1] + "\n")  # round 1 lost
    with pytest.raises(CheckpointError, match=r"does not hold rounds 1\.\.2"):
        run_standalone(config(rounds=3), tmp_path, progress=False, resume=True)


@pytest.mark.parametrize(
    ("writer", "reader"),
    [("fedml", "fedlab"), ("flower", "fedlab"), ("fedlab", "fedml"), ("flower", "fedml")],
)
def test_a_checkpoint_of_another_host_is_refused_naming_both(
    writer: str, reader: str, tmp_path: Path
) -> None:
    """Every checkpoint names the host that wrote it; none can be written without."""
    from types import SimpleNamespace

    from fl_adapters.fedml import checkpoint as fedml_checkpoint

    model = torch.zeros(3) if writer == "fedlab" else {"w": torch.zeros(3)}
    fields = dict(config={}, round=1, model=model, aggregator={}, participations={})
    with pytest.raises(ValueError, match="names the host that writes it"):
        Checkpoint(**fields).save(tmp_path / "checkpoint.pt")  # type: ignore[arg-type]
    Checkpoint(**fields, host=writer).save(tmp_path / "checkpoint.pt")  # type: ignore[arg-type]
    labels = {"fedlab": "FedLab", "fedml": "FedML", "flower": "Flower"}
    message = f"written by a {labels[writer]} run; this is a {labels[reader]} run"
    with pytest.raises(CheckpointError, match=message):
        if reader == "fedlab":
            run_standalone(config(), tmp_path, progress=False, resume=True)
        else:
            fedml_checkpoint.load(SimpleNamespace(resume_from=str(tmp_path)))


def test_an_astraea_plan_other_than_the_checkpoints_is_refused() -> None:
    """Every host resumes Astraea only under the plan its checkpoint was written with."""
    from fl_adapters.checkpoint import check_plan

    plan = {"rad": [1.0, 2.5], "augment": [1], "downsample": []}
    check_plan(None, plan)  # a checkpoint that kept no plan
    check_plan(dict(plan), plan)
    with pytest.raises(CheckpointError, match="differs from the checkpoint's: the data or"):
        check_plan(plan | {"rad": [1.0, 2.4]}, plan)
