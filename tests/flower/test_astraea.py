"""Astraea on Flower, run for real: the plan and mediators FedLab standalone makes, per round.

The expected rounds come from the host-free pieces FedLab standalone runs on (its seeded
sampler ``random.Random(seed).sample(range(clients), k)``, the planner from the clients'
training labels) and, where the main environment with FedLab exists beside this one (as in
``make test``), from a real FedLab standalone run of the same config.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from flower_runs import ASTRAEA, finished, lines

from fl_adapters.astraea import AstraeaPlanner, label_counts
from fl_adapters.config import RunConfig
from fl_adapters.experiment import training_data
from fl_aggregators import Astraea

ROOT = Path(__file__).resolve().parents[2]
MAIN_FEDBALANCE = ROOT / ".venv" / "bin" / "fedbalance"
CONFIG = ASTRAEA
pytestmark = pytest.mark.slow


def fedlab_standalone(tmp_path: Path) -> list[dict[str, Any]]:
    """The aggregation record of the same config run by the main environment's FedLab."""
    work = tmp_path / "fedlab"
    work.mkdir()
    (work / "run.yaml").write_text(yaml.safe_dump({**CONFIG, "framework": "fedlab"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FEDBALANCE_", "VIRTUAL"))}
    env["FEDBALANCE_RECORD"] = str(work / "record.jsonl")
    out = subprocess.run(
        [str(MAIN_FEDBALANCE), "run", "run.yaml", "--out", "out", "--no-progress"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return lines(work / "record.jsonl")


def expected_mediators(config: dict[str, Any]) -> tuple[AstraeaPlanner, list[list[list[int]]]]:
    """FedLab standalone's rounds: its seeded sampler, the planner from training labels."""
    cfg = RunConfig.from_dict({**config, "framework": "fedlab"})
    _, labels, partition = training_data(cfg)
    counts = np.stack([label_counts(labels[s["train"]], 10) for s in partition.splits])
    planner = AstraeaPlanner(counts, Astraea(**cfg.aggregator_args))
    rng = random.Random(cfg.seed)
    rounds = []
    for _ in range(cfg.rounds):
        sampled = sorted(rng.sample(range(cfg.num_clients), cfg.clients_per_round))
        rounds.append(planner.mediators(sampled))
    return planner, rounds


def check_rounds(record: list[dict[str, Any]], config: dict[str, Any]) -> None:
    planner, rounds = expected_mediators(config)
    assert [e["mediators"] for e in record] == rounds
    for entry, mediators in zip(record, rounds, strict=True):
        assert entry["host"] == "flower" and entry["aggregator"] == "astraea"
        assert entry["kl"] == pytest.approx(planner.mediator_kl(mediators), rel=1e-12)
        n = entry["num_samples"]  # each mediator's n_m: its members' rebalanced data
        assert entry["weights"] == pytest.approx([x / sum(n) for x in n], rel=1e-12)
    assert any(len(m) > 1 for r in rounds for m in r)  # a real chain, not FedAvg in disguise


def test_simulation_runs_fedlab_standalones_plan_and_mediators(
    astraea_whole: Path, tmp_path: Path
) -> None:
    flower = lines(astraea_whole / "out" / "aggregations.jsonl")
    check_rounds(flower, CONFIG)
    if not MAIN_FEDBALANCE.exists():
        pytest.skip(f"no main environment at {MAIN_FEDBALANCE} to run FedLab standalone")
    fedlab = fedlab_standalone(tmp_path)
    for a, b in zip(fedlab, flower, strict=True):
        assert a["mediators"] == b["mediators"] and a["num_samples"] == b["num_samples"]
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-12)


def test_deployment_runs_mediator_chains_across_supernodes(tmp_path: Path) -> None:
    """Three flower-supernode processes, one round: rad reaches each node once (kept in its
    Context.state across the processes Flower starts per message) and the chain crosses
    nodes."""
    # One node evaluates (eval_fraction): each evaluate message is a ClientApp process of its
    # own, and the evaluation is not what this test is about.
    config = {
        **CONFIG,
        "num_clients": 3,
        "clients_per_round": 3,
        "rounds": 1,
        "eval_fraction": 0.34,
    }
    out = finished(tmp_path / "deployment", {**config, "framework": "flower-deployment"}) / "out"
    record = lines(out / "aggregations.jsonl")
    check_rounds(record, config)
    rows = lines(out / "metrics.jsonl")
    assert rows[0]["test_accuracy"] > 0 and rows[0]["mediators"] == record[0]["mediators"]
