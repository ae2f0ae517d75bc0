"""``fedbalance run`` on Flower as the tests start it, and what a finished run left behind.

Every simulation costs a Ray start and every deployment a SuperLink, SuperNodes and a ClientApp
process per message (20–70 CPU-s each on this machine), so the runs several test modules read
are made once per session by ``conftest.py`` and shared; a test that needs a run of its own
makes it in its ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from helpers import WALL_TIMES

from fl_adapters.flower.app import ACTORS_ENV

#: FedAvgM (server momentum: aggregator state) with 2 of 3 clients a round (the seeded
#: sampler's state matters on resume), 2 rounds: the runs the resume and CLI tests read.
FEDAVGM: dict[str, Any] = {
    "framework": "flower",
    "dataset": "digits",
    "partition": {"name": "label_dirichlet", "beta": 0.5},
    "aggregator": "fedavgm",
    "aggregator_args": {"beta": 0.9},
    "num_clients": 3,
    "clients_per_round": 2,
    "rounds": 2,
    "local_epochs": 1,
    "batch_size": 32,
    "seed": 7,
}

#: Astraea with mediators of two (gamma 2) over 3 of 4 clients. label_dirichlet gives the same
#: partition under numpy 1.26 (main venv) and 2.x (Flower's venv); global_imbalance does not.
ASTRAEA: dict[str, Any] = {
    **FEDAVGM,
    "aggregator": "astraea",
    "aggregator_args": {"gamma": 2},
    "num_clients": 4,
    "clients_per_round": 3,
    "seed": 2,
}


def fedbalance(
    work: Path,
    config: dict[str, Any],
    *args: str,
    wait: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    """``fedbalance run`` of ``config`` in ``work`` (output in ``work/out``); ``env`` is added to
    an environment without the caller's ``FEDBALANCE_*`` switches."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "run.yaml").write_text(yaml.safe_dump(config))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    environ[ACTORS_ENV] = os.environ.get(ACTORS_ENV, "")  # the suite's actor count (conftest.py)
    environ.update(env or {})
    argv = [sys.executable, "-m", "fl_adapters.cli", "run", "run.yaml", "--out", "out", *args]
    if not wait:
        return subprocess.Popen(
            argv, cwd=work, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return subprocess.run(argv, cwd=work, env=environ, capture_output=True, text=True, timeout=400)


def finished(work: Path, config: dict[str, Any]) -> Path:
    """``work`` after a ``fedbalance run`` of ``config`` that must succeed."""
    done = fedbalance(work, config, "--no-progress")
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 0, done.stderr[-3000:]
    return work


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def outcome(out: Path) -> dict[str, Any]:
    """The final model, metrics rows, aggregation record (less wall times) and summary."""
    record, rows = lines(out / "aggregations.jsonl"), lines(out / "metrics.jsonl")
    for entry in record + rows:
        for key in WALL_TIMES:
            entry.pop(key, None)
    return {
        "model": torch.load(out / "app" / "final.pt"),
        "rows": rows,
        "record": record,
        "summary": json.loads((out / "app" / "summary.json").read_text()),
    }


def assert_same_run(resumed: dict[str, Any], whole: dict[str, Any]) -> None:
    assert resumed["model"].keys() == whole["model"].keys()
    for key, value in whole["model"].items():
        assert torch.equal(resumed["model"][key], value), key
    assert resumed["rows"] == whole["rows"]
    assert resumed["record"] == whole["record"]
    assert resumed["summary"] == whole["summary"]


def simulate_process(argv: list[str], cwd: Path, record: Path, timeout: float = 400) -> str:
    """Run a simulation process (its own session, Ray's processes killed after) that must
    succeed, with the aggregation record at ``record``; returns its output."""
    from fl_adapters.run.processes import stop

    env = {**os.environ, "FEDBALANCE_RECORD": str(record)}
    proc = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=timeout)
    finally:  # on a timeout, with Ray's processes below it
        stop(proc)  # type: ignore[arg-type]
    assert proc.returncode == 0, log[-3000:]
    return log
