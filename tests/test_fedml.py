"""The FedML adapter against real FedML 0.9.6: sp simulation, MPI simulation, MPI cross-silo.

The host is ``benchmarks/fedml_example/main.py``, written as FedML's examples are, with no
fedbalance import; only its YAML changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("fedml")

EXAMPLE = Path(__file__).resolve().parents[1] / "benchmarks" / "fedml_example"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
needs_mpi = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed"
)


def config(tmp_path: Path, name: str, **train_args: object) -> Path:
    doc = yaml.safe_load((EXAMPLE / name).read_text())
    doc["data_args"]["max_samples"] = 2000
    for key, value in train_args.items():
        if value is None:
            doc["train_args"].pop(key, None)
        else:
            doc["train_args"][key] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def run_host(
    tmp_path: Path, cfg: Path, processes: int | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(EXAMPLE / "main.py"), "--cf", str(cfg)]
    if processes:
        cmd = [*MPIRUN, "-np", str(processes), *[a for k in env for a in ("-x", k)], *cmd]
    return subprocess.run(
        cmd, cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=600
    )


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def fedloss_weights(losses: list[float], clip: float = 5.0) -> list[float]:
    med = sorted(losses)[(len(losses) - 1) // 2]
    bounded = [min(x, clip * med) for x in losses]
    return [x / sum(bounded) for x in bounded]


def check_fedloss_records(lines: list[dict], host: str, rounds: int) -> None:
    assert [r["round"] for r in lines] == list(range(1, rounds + 1)), lines
    for r in lines:
        assert r["host"] == host and r["aggregator"] == "fedloss" and r["rejected"] == []
        losses = [m["val_loss"] for m in r["metrics"]]
        assert len(losses) == 2 and all(x > 0 for x in losses)
        assert r["weights"] == pytest.approx(fedloss_weights(losses))


def final_test_metrics(out: str) -> list[str]:
    return re.findall(r"\{'test_acc': [^}]*\}", out)


@pytest.mark.slow
def test_sp_simulation_aggregates_with_fedloss(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    out = run_host(tmp_path, config(tmp_path, "sp.yaml"), FEDBALANCE_RECORD=str(rec))
    assert out.returncode == 0, out.stderr[-3000:]
    check_fedloss_records(records(rec), "fedml-sp", rounds=2)


@pytest.mark.slow
@needs_mpi
def test_mpi_simulation_aggregates_with_fedloss(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    out = run_host(tmp_path, config(tmp_path, "mpi.yaml"), processes=3, FEDBALANCE_RECORD=str(rec))
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    check_fedloss_records(records(rec), "fedml-mpi", rounds=2)


@pytest.mark.slow
@needs_mpi
def test_mpi_cross_silo_aggregates_with_fedloss(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    out = run_host(
        tmp_path, config(tmp_path, "cross_silo.yaml"), processes=3, FEDBALANCE_RECORD=str(rec)
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    check_fedloss_records(records(rec), "fedml-cross-silo", rounds=2)


@pytest.mark.slow
def test_without_the_key_fedml_runs_stock(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    cfg = config(tmp_path, "sp.yaml", aggregator=None)
    armed = run_host(tmp_path, cfg, FEDBALANCE_RECORD=str(rec))
    off = run_host(tmp_path, cfg, FEDBALANCE_DISABLE_HOST_AUTOLOAD="1")
    assert armed.returncode == 0 and off.returncode == 0, armed.stderr[-2000:] + off.stderr[-2000:]
    got, want = (
        final_test_metrics(armed.stdout + armed.stderr),
        final_test_metrics(off.stdout + off.stderr),
    )
    assert got and got == want
    assert not rec.exists()


@pytest.mark.slow
def test_a_typo_stops_the_run_before_training(tmp_path: Path) -> None:
    out = run_host(tmp_path, config(tmp_path, "sp.yaml", aggregator="fedlos"))
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "unknown aggregator 'fedlos'" in text and "did you mean 'fedloss'?" in text
    assert "Communication round" not in text


def test_payload_keys_survive_and_are_stripped() -> None:
    import torch

    from fl_adapters.fedml.payload import KEY_LOSS, attach, strip

    params = {"w": torch.ones(2), "n": torch.tensor(3)}
    sent = attach(params, client=7, val_loss=0.25)
    assert (
        list(sent)[:2] == ["w", "n"] and float(sent[KEY_LOSS]) == 0.25 and sent[KEY_LOSS].dim() == 0
    )
    clean, client, loss = strip(sent)
    assert list(clean) == ["w", "n"] and client == 7 and loss == 0.25
    torch.nn.Module().load_state_dict({}, strict=True)  # the clean dict has no reserved key left
    assert all(not k.startswith("__fedbalance") for k in clean)


@pytest.mark.slow
@needs_mpi
def test_fedbalance_run_launches_fedml_mpi_with_the_right_process_count(tmp_path: Path) -> None:
    from fl_adapters.cli import main

    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "framework": "fedml-mpi",
                "dataset": "fmnist",
                "max_samples": 2000,
                "partition": {"name": "mixed"},
                "aggregator": "fedloss",
                "num_clients": 6,
                "clients_per_round": 2,
                "rounds": 2,
                "local_epochs": 1,
            }
        )
    )
    assert main(["run", str(cfg), "--out", str(tmp_path / "out")]) == 0
    fedml_cfg = yaml.safe_load((tmp_path / "out" / "fedml.yaml").read_text())
    assert (
        fedml_cfg["comm_args"]["backend"] == "MPI" and fedml_cfg["device_args"]["worker_num"] == 2
    )
    check_fedloss_records(records(tmp_path / "out" / "aggregations.jsonl"), "fedml-mpi", rounds=2)
    metrics = records(tmp_path / "out" / "metrics.jsonl")
    assert [m["round"] for m in metrics] == [1, 2]
