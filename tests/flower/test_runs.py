"""The Flower app of ``adapters/flower/app`` run for real, with FedLoss, at digits size.

* Simulation engine: ``flwr.simulation.run_simulation`` (Ray), two virtual SuperNodes, in a
  child process (``python -m fl_adapters.flower.app.simulate``).
* Deployment engine: ``flower-superlink`` plus two ``flower-supernode`` processes on
  127.0.0.1 free ports and ``flwr run ... --stream`` (:func:`fl_adapters.flower.runner.
  run_deployment`), with the ``flwr`` CLI pointed at a temporary ``FLWR_HOME``.

Both use the thesis's mixed skew (label Dirichlet + feature noise) and the unbounded FedLoss
(``loss_clip`` and ``peer_clip`` null), so each recorded weight must be the client's
validation loss over the round's sum. The same seed must give the same model in both engines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import WALL_TIMES

from fl_adapters._training import TRAIN_CLOCK
from fl_adapters.flower.app import ACTORS_ENV
from fl_adapters.flower.app.task import model_of
from fl_adapters.flower.runner import run_deployment
from fl_adapters.run.processes import stop

APP = Path(__file__).resolve().parents[2] / "adapters" / "flower" / "app"
ROUNDS = 2
RUN_CONFIG = (
    f'num-server-rounds={ROUNDS} seed=3 partition=\'{{"name": "mixed"}}\' '
    "aggregator='fedloss' aggregator-args='{\"loss_clip\": null, \"peer_clip\": null}'"
)
pytestmark = pytest.mark.slow


def outcome(out: Path, record: Path, clock: Path) -> dict[str, Any]:
    return {
        "clock": [line.split() for line in clock.read_text().splitlines()],
        "model": torch.load(out / "final.pt"),
        "summary": json.loads((out / "summary.json").read_text()),
        "record": [
            {k: v for k, v in json.loads(line).items() if k not in WALL_TIMES}
            for line in record.read_text().splitlines()
        ],
    }


@pytest.fixture(scope="module")
def simulation(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("simulation")
    record, clock = work / "record.jsonl", work / "clock.txt"
    env = {**os.environ, "FEDBALANCE_RECORD": str(record), TRAIN_CLOCK: str(clock)}
    env.pop(ACTORS_ENV, None)  # Flower's default actors: this run is the one that keeps them
    argv = [sys.executable, "-m", "fl_adapters.flower.app.simulate"]
    argv += ["--num-supernodes", "2", "--run-config", f"{RUN_CONFIG} out-dir='{work / 'out'}'"]
    proc = subprocess.Popen(
        argv, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=300)
    finally:  # on a timeout, with Ray's processes below it
        stop(proc)  # type: ignore[arg-type]
    assert proc.returncode == 0, log[-3000:]
    return outcome(work / "out", record, clock)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("deployment")
    record, clock = work / "record.jsonl", work / "clock.txt"
    dep = run_deployment(
        APP,
        work,
        num_supernodes=2,
        run_config=[f"{RUN_CONFIG} out-dir='{work / 'out'}'"],
        env={"FEDBALANCE_RECORD": str(record), TRAIN_CLOCK: str(clock)},
        timeout=300,
    )
    return {**outcome(work / "out", record, clock), "deployment": dep}


def initial_model() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)  # the ServerApp seeds the initial model with the run's seed
    return dict(model_of({"model": "thesis_cnn", "dataset": "digits"}).state_dict())


def check_fedloss_run(run: dict[str, Any]) -> None:
    assert [e["round"] for e in run["record"]] == list(range(1, ROUNDS + 1))
    for entry in run["record"]:
        assert entry["host"] == "flower" and entry["aggregator"] == "fedloss"
        assert entry["clients"] == [0, 1] and entry["rejected"] == []
        losses = [m["val_loss"] for m in entry["metrics"]]
        assert entry["weights"] == pytest.approx([x / sum(losses) for x in losses], rel=1e-12)
        assert entry["weights"][0] != pytest.approx(0.5, abs=1e-3)  # mixed skew: unequal
    start = initial_model()
    assert not all(torch.equal(run["model"][k], start[k]) for k in start)
    evaluate = run["summary"]["evaluate"]
    assert sorted(evaluate) == [str(r) for r in range(1, ROUNDS + 1)]
    for metrics in evaluate.values():  # the bias figures of the nodes' class counts
        recall = metrics["class_recall"]
        present = [x for x in recall if x == x]  # NaN: a class no node holds
        assert metrics["balanced_accuracy"] == pytest.approx(sum(present) / len(present))
        assert metrics["worst_class_recall"] == min(present) == recall[metrics["worst_class"]]
        assert metrics["client_ids"] == [0, 1]
        assert metrics["client_acc_mean"] == pytest.approx(sum(metrics["client_accuracy"]) / 2)
    # The clients' test loss falls round on round, from about ln 10 = 2.30 (chance).
    losses = [evaluate[str(r)]["eval_loss"] for r in range(1, ROUNDS + 1)]
    assert losses == sorted(losses, reverse=True) and losses[-1] < 2.0


@pytest.mark.smoke
def test_simulation_engine_runs_fedloss(simulation: dict[str, Any]) -> None:
    check_fedloss_run(simulation)


@pytest.mark.smoke
def test_deployment_engine_runs_fedloss(deployment: dict[str, Any]) -> None:
    check_fedloss_run(deployment)
    assert "Strategy execution finished" in deployment["deployment"].log


def test_same_seed_same_model_in_both_engines(
    simulation: dict[str, Any], deployment: dict[str, Any]
) -> None:
    for key, value in simulation["model"].items():
        assert torch.equal(deployment["model"][key], value), key
    assert deployment["record"] == simulation["record"]


@pytest.mark.parametrize("engine", ["simulation", "deployment"])
def test_the_training_clock_times_each_clients_training(
    engine: str, request: pytest.FixtureRequest
) -> None:
    """``FEDBALANCE_TRAIN_CLOCK`` reaches the processes that train (Ray's workers, the
    SuperNodes' ClientApps): one line per client and round, ending after it starts."""
    steps = request.getfixturevalue(engine)["clock"]
    assert sorted(int(client) for _, _, client in steps) == [0, 0, 1, 1]  # 2 clients x 2 rounds
    assert all(0 < float(end) - float(start) < 300 for start, end, _ in steps)


def test_deployment_leaves_no_flower_process(deployment: dict[str, Any]) -> None:
    port = deployment["deployment"].superlink_port
    ports = [port, *deployment["deployment"].supernode_ports]
    alive = []
    for entry in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(f"127.0.0.1:{p}" in cmd or f"--port {p}" in cmd for p in ports):
            alive.append(cmd)
    assert alive == []


def test_the_app_refuses_a_strategy_it_does_not_have() -> None:
    """The app's ``strategy`` key: fedbalance's or Flower's FedAvg with either sampler (the
    benchmarks' stock references), nothing else, before any node gets work; the references
    evaluate every round."""
    from flwr.common.config import get_fused_config_from_dir

    from fl_adapters.flower.app import server_app
    from fl_checks import ParameterError

    config = get_fused_config_from_dir(APP, {})
    allowed = "'fedbalance', 'flower-fedavg', 'flower-fedavg-seeded'; got 'fedprox'"
    with pytest.raises(ParameterError, match=f"strategy must be one of {allowed}"):
        server_app.run(None, {**config, "strategy": "fedprox"})  # type: ignore[arg-type]
    for stock in ("flower-fedavg", "flower-fedavg-seeded"):
        with pytest.raises(ParameterError, match="evaluate every round: set eval-every = 1"):
            server_app.run(None, {**config, "strategy": stock, "eval-every": 2})  # type: ignore[arg-type]


def test_flower_side_by_side_times_the_strategies_on_the_same_app() -> None:
    """``fedbalance bench scale``'s side by side: fedbalance's strategy and Flower's own FedAvg
    sending to the nodes fedbalance's sampler draws, on the bundled app in Flower's simulation
    engine, both finish, read the nodes' client ids from the engine without asking and end on
    the same model (the same clients trained, 2 of 4); the report sets fedbalance against it.
    The third strategy (Flower's FedAvg with its own sampler) is the same app under Flower's
    code alone, left to the benchmark itself: a third simulation here cost 35-55 s."""
    from fedbalance_benchmarks import scale

    seeded = scale.SIDE_STRATEGIES[:2]
    side = scale.side_by_side(
        nodes=4, rounds=1, per_round=2, timeout=600, repeats=1, strategies=seeded
    )
    assert "error" not in side, side
    for strategy in seeded:
        assert side[strategy]["strategy_s"] > 0 and "identify_s" not in side[strategy]
    assert "flower-fedavg" not in side
    assert side["same_model_max_abs"] < 1e-5
    text = "\n".join(scale.side_report([side]))
    assert "| fedbalance |" in text and "| Flower FedAvg, same sampling |" in text
    assert "Flower's sampler |" not in text  # not run, not reported
    ratio = side["fedbalance"]["strategy_s"] / side["flower-fedavg-seeded"]["strategy_s"]
    assert f"with the same sampling **{ratio:.2f}x** over the whole run (bound: 1.2x)" in text
    assert "the same clients trained" in text
