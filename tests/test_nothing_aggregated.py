"""A run that learns nothing stops: after ``max_skipped_rounds`` skipped rounds in a row every
aggregator raises NothingAggregated naming the cause, on the plain and the secure path alike,
and ``fedbalance run`` exits non-zero on every host process model (in-process, MPI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fl_adapters.registry import build_aggregator
from fl_aggregators import ClientUpdate, NothingAggregated

GLOBAL = {"w": torch.zeros(3)}


def update(value: float, client: int = 0) -> ClientUpdate:
    params = {"w": torch.full((3,), value)}
    return ClientUpdate(params=params, num_samples=5, metrics={"val_loss": 1.0}, client_id=client)


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedmedian", "fedloss", "fedloss_n"])
def test_the_limit_stops_the_run_naming_the_rounds_and_the_cause(name: str) -> None:
    agg = build_aggregator(name, {"max_skipped_rounds": 3})
    for _ in range(2):
        assert agg.aggregate(GLOBAL, [update(float("nan"), 4)]).skipped
    with pytest.raises(NothingAggregated) as info:
        agg.aggregate(GLOBAL, [update(float("nan"), 4)])
    assert str(info.value) == (
        f"{name}: rounds 1-3 aggregated nothing (3 in a row, max_skipped_rounds 3), so the run "
        "learns nothing; the last round's first cause: client 4: parameters contain NaN or Inf"
    )


def test_an_aggregated_round_starts_the_count_again() -> None:
    agg = build_aggregator("fedavg", {"max_skipped_rounds": 2})
    agg.aggregate(GLOBAL, [update(float("nan"))])
    assert not agg.aggregate(GLOBAL, [update(1.0)]).skipped
    agg.aggregate(GLOBAL, [update(float("nan"))])
    with pytest.raises(NothingAggregated, match="round 4 aggregated nothing|rounds 3-4"):
        agg.aggregate(GLOBAL, [])


def test_a_round_without_updates_says_none_arrived() -> None:
    agg = build_aggregator("fedavg", {"max_skipped_rounds": 1})
    with pytest.raises(NothingAggregated, match="cause: no client update arrived"):
        agg.aggregate(GLOBAL, [])


def test_the_secure_path_counts_too() -> None:
    agg = build_aggregator("fedloss", {"max_skipped_rounds": 1})
    weighing = agg.weigh([update(1.0, 0), update(1.0, 1)])
    with pytest.raises(NothingAggregated, match="client 0: dropped out after its weight"):
        agg.finish(GLOBAL, None, weighing, dropped=[0, 1])


def test_the_default_is_five_and_the_setting_is_bounded() -> None:
    assert build_aggregator("fedavg").max_skipped_rounds == 5
    for bad in (0, -1, 10**7, 2.5, "3", True):
        with pytest.raises(
            ValueError, match=r"max_skipped_rounds must be an int in \[1, 1000000\]"
        ):
            build_aggregator("fedavg", {"max_skipped_rounds": bad})


DIVERGING = {
    "dataset": "digits",
    "partition": {"name": "iid"},
    "aggregator": "fedavg",
    "aggregator_args": {"max_skipped_rounds": 2},
    "num_clients": 3,
    "clients_per_round": 3,
    "rounds": 4,
    "local_epochs": 1,
    "batch_size": 32,
    "optimizer": "sgd",
    "lr": 1e30,  # every client's model overflows: every round is skipped
    "seed": 1,
}


def fedbalance_run(work: Path, config: dict, **env: str) -> subprocess.CompletedProcess[str]:
    """``fedbalance run`` of ``config`` in ``work``, with only ``env``'s fedbalance switches."""
    (work / "run.yaml").write_text(yaml.safe_dump(config))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")} | env
    return subprocess.run(
        [sys.executable, "-m", "fl_adapters.cli", "run", "run.yaml", "--out", "out"],
        cwd=work,
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,  # FedML's MPI job used to hang here until killed
    )


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["fedlab", "fedml-mpi"])
def test_fedbalance_run_that_learns_nothing_exits_non_zero_naming_why(
    tmp_path: Path, framework: str
) -> None:
    if framework == "fedml-mpi":
        pytest.importorskip("fedml")
        pytest.importorskip("mpi4py")
    config = {**DIVERGING, "framework": framework}
    if framework == "fedml-mpi":  # 2 clients, all in every round: mpirun -np 3, not 4
        config.update(num_clients=2, clients_per_round=2)
    done = fedbalance_run(tmp_path, config)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "rounds 1-2 aggregated nothing (2 in a row, max_skipped_rounds 2)" in last, last
    assert "client 0: parameters contain NaN or Inf" in last, last


@pytest.mark.slow
def test_a_run_shorter_than_the_limit_that_aggregated_nothing_still_fails(tmp_path: Path) -> None:
    config = {**DIVERGING, "framework": "fedlab", "rounds": 2, "aggregator_args": {}}
    done = fedbalance_run(tmp_path, config)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "fedbalance run: failed: fedlab: 2 round(s) recorded, none aggregated: the model is the "
        "initial one (the warnings above say why); see out/aggregations.jsonl"
    )
