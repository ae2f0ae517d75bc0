"""FedML checkpoints and resume with real FedML 0.9.6 processes.

sp resumes bit-identically (fedavgm: momentum; fedloss: validation losses; astraea: plan);
a rank killed in MPI simulation, a silo or the server killed in cross-silo over MPI or over
gRPC stops the run within 60 s naming what died and the checkpoint, and ``resume`` finishes it
(the reliability benchmark times the same faults). The host is the bundled FedML example, configured by
``fedbalance run`` (its YAML gains ``checkpoint_dir:`` and ``resume_from:``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from helpers import check_bias_rows, check_fedloss_records, records

from fl_adapters.checkpoint import NAME, Checkpoint, CheckpointError
from fl_adapters.config import RunConfig

needs_mpi = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs OpenMPI's mpirun")


def run_config(tmp_path: Path, name: str, **extra: object) -> RunConfig:
    doc = {
        "framework": "fedml-sp",
        "dataset": "fmnist",
        "max_samples": 1000,
        "partition": {"name": "mixed"},
        "aggregator": "fedloss",
        "num_clients": 6,
        "clients_per_round": 2,
        "rounds": 3,
        "local_epochs": 1,
    } | extra
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return RunConfig.load(path)


# -- without FedML processes ---------------------------------------------------------------------
def fedml_args(**over: Any) -> SimpleNamespace:
    base = dict(
        training_type="simulation",
        backend="sp",
        dataset="fmnist",
        model="cnn",
        client_num_in_total=6,
        client_num_per_round=2,
        comm_round=3,
        random_seed=0,
        aggregator="fedavgm",
        aggregator_args={},
    )
    return SimpleNamespace(**(base | over))


def test_a_fedml_checkpoint_round_trips_and_refuses_another_run(tmp_path: Path) -> None:
    from fl_adapters.fedml import checkpoint
    from fl_aggregators import FedAvgM

    agg = FedAvgM()
    params = {"w": torch.arange(6.0).reshape(2, 3), "steps": torch.tensor(4)}
    args = fedml_args(checkpoint_dir=str(tmp_path), resume_from=str(tmp_path))
    checkpoint.save(args, 2, params, agg, rng=checkpoint.rng_state())
    ckpt = checkpoint.load(args)
    assert ckpt.round == 2 and list(ckpt.model) == ["w", "steps"]
    assert torch.equal(ckpt.model["w"], params["w"]) and ckpt.model["steps"].dtype == torch.int64
    # comm_round may grow (the host spec's may_change); anything that changes the run may not,
    # and the error names it.
    from fl_adapters.fedml.spec import FEDML

    assert checkpoint.MAY_CHANGE is FEDML.may_change and "comm_round" in FEDML.may_change
    checkpoint.load(fedml_args(resume_from=str(tmp_path), comm_round=10))
    with pytest.raises(CheckpointError, match=r"random_seed: checkpoint 0, now 1"):
        checkpoint.load(fedml_args(resume_from=str(tmp_path), random_seed=1))
    with pytest.raises(
        CheckpointError, match=r"comm_round must be at least .* round \(2\) to resume, got 1"
    ):
        checkpoint.load(fedml_args(resume_from=str(tmp_path), comm_round=1))
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        checkpoint.load(fedml_args(resume_from=str(tmp_path / "elsewhere")))
    with pytest.raises(ValueError, match="checkpoint_dir must be a directory path, got 3"):
        checkpoint.checkpoint_path(fedml_args(checkpoint_dir=3))


def test_nothing_to_resume_when_the_checkpoint_holds_every_round(tmp_path: Path) -> None:
    from fl_adapters.fedml import checkpoint
    from fl_adapters.fedml.adapter import check_resume
    from fl_aggregators import FedAvgM

    args = fedml_args(checkpoint_dir=str(tmp_path), resume_from=str(tmp_path))
    checkpoint.save(args, 3, {"w": torch.zeros(2)}, FedAvgM())
    with pytest.raises(
        CheckpointError, match="holds all 3 rounds of comm_round 3; raise comm_round"
    ):
        check_resume(args)
    check_resume(fedml_args(resume_from=str(tmp_path), comm_round=4))
    check_resume(fedml_args(resume_from=str(tmp_path), comm_round=4, rank=1))  # a client: no read


def test_rng_states_restore_the_same_draws() -> None:
    import random

    import numpy as np

    from fl_adapters.fedml import checkpoint

    random.gauss(0, 1)  # a cached gauss value must survive too
    state = checkpoint.rng_state()
    state = torch.load(_saved(state), weights_only=True)  # as a checkpoint reads it

    def draws() -> tuple[Any, ...]:  # FedML draws from the legacy global numpy RNG
        return (torch.rand(3), np.random.rand(3), random.random(), random.gauss(0, 1))  # noqa: NPY002

    want = draws()
    checkpoint.restore_rng(state)
    got = draws()
    assert torch.equal(got[0], want[0]) and (got[1] == want[1]).all() and got[2:] == want[2:]


def _saved(obj: Any) -> Any:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_a_fedlab_run_refuses_a_fedml_checkpoint(tmp_path: Path) -> None:
    from fl_adapters.fedlab.runner import restore

    ckpt = Checkpoint(
        config={}, round=1, model={"w": torch.zeros(1)}, aggregator={}, participations={},
        host="fedml",
    )  # fmt: skip
    ckpt.save(tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="written by a FedML run; this is a FedLab run"):
        Checkpoint.open(tmp_path / "checkpoint.pt", "fedlab")
    # A restore handed one anyway refuses its model rather than loading it.
    with pytest.raises(CheckpointError, match=r"state dict of 1 tensors\) is not this run's"):
        restore(SimpleNamespace(model=torch.nn.Linear(1, 1)), ckpt)  # type: ignore[arg-type]


def test_eval_keys_take_effect_in_fedml_or_stop_the_run() -> None:
    """``eval_every`` / ``eval_fraction`` in FedML's YAML mean what they mean on every host; a
    setting that could not take effect stops ``fedml.init`` (checked here without FedML)."""
    from fl_adapters.fedml.adapter import Evaluation, check_evaluation, evaluation
    from fl_checks import ParameterError

    assert evaluation(fedml_args(frequency_of_the_test=3)) is None  # FedML's own rule
    assert evaluation(fedml_args(eval_every=2, eval_fraction=0.5)) == Evaluation(2, 0.5)
    assert evaluation(fedml_args(eval_fraction=0.5)) == Evaluation(1, 0.5)
    check_evaluation(
        fedml_args(eval_every=2, eval_fraction=0.5, frequency_of_the_test=1), "fedml-sp"
    )
    for args, host, message in [
        (fedml_args(eval_every=2, frequency_of_the_test=5), "fedml-sp", "eval_every replaces"),
        (fedml_args(eval_fraction=0.5), "fedml-mpi", "eval_fraction must be 1 in FedML fedml-mpi"),
        (fedml_args(eval_fraction=0), "fedml-sp", "eval_fraction must be a number in (0, 1] (the"),
        (fedml_args(eval_every=0), "fedml-sp", "eval_every must be an int >= 1, got 0"),
    ]:
        with pytest.raises(ParameterError) as err:
            check_evaluation(args, host)
        assert message in str(err.value)


def test_fedml_rows_take_test_accuracy_from_the_rounds_fedml_tests(tmp_path: Path) -> None:
    from fl_adapters.fedml.runner import collect, tested_rounds
    from fl_adapters.run.directory import RunFiles

    assert tested_rounds(1, 10, 4) == [4, 8, 10]  # eval_every's rounds, as on every host
    assert tested_rounds(5, 10, 4) == [8, 10]  # resumed after round 4
    assert tested_rounds(1, 3, 1) == [1, 2, 3]
    config = RunConfig(framework="fedml-sp", rounds=6, eval_every=4)
    rec = {"clients": [0], "weights": [1.0], "skipped": False, "rejected": []}
    (tmp_path / "aggregations.jsonl").write_text(
        "".join(json.dumps(rec | {"round": r}) + "\n" for r in range(1, 7))
    )
    # A resumed run: rounds 1-2 kept from before; this log's tests are rounds 4 and 6.
    kept = [{"round": 1, "test_accuracy": 0.1}, {"round": 2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    (tmp_path / "fedml.log").write_text("{'test_acc': 0.5, 'x': 1}\n{'test_acc': 0.6, 'x': 1}\n")
    collect(config, RunFiles(tmp_path))
    rows = records(tmp_path / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r.get("test_accuracy") for r in rows] == [0.1, None, None, 0.5, None, 0.6]


# -- real FedML runs -----------------------------------------------------------------------------
pytest.importorskip("fedml")


def test_a_fedml_run_past_its_deadline_is_stopped_and_says_so(tmp_path: Path) -> None:
    from fl_adapters.config import RunFailed
    from fl_adapters.fedml.runner import run_fedml

    started = time.monotonic()
    with pytest.raises(RunFailed) as err:  # FedML's imports alone take longer than this
        run_fedml(run_config(tmp_path, "slow"), tmp_path / "out", timeout=0.5)
    assert time.monotonic() - started < 30
    assert str(err.value).startswith(
        "FedML: the run did not finish within 0.5 s (stopped after no completed round); see "
    ), err.value
    assert "no round had completed, so there is no checkpoint" in str(err.value)


@pytest.mark.slow
# Astraea's plan is server state a resume must find again; FedAvgM's momentum is every host's
# contract (tests/test_host_contract.py), FedLoss's resume the FedLab and Flower suites'.
def test_sp_resume_ends_on_the_uninterrupted_model(
    tmp_path: Path, aggregator: str = "astraea"
) -> None:
    from fl_adapters.cli import main
    from fl_adapters.fedml.runner import run_fedml

    full, part = tmp_path / "full", tmp_path / "part"
    run_fedml(run_config(tmp_path, "full", aggregator=aggregator), full)
    run_fedml(run_config(tmp_path, "part", aggregator=aggregator, rounds=1), part)
    assert Checkpoint.load(part / NAME).round == 1
    # A longer run continues the shorter one: FedML's loop passes round 1 without training.
    longer = run_config(tmp_path, "longer", aggregator=aggregator)
    assert main(["run", str(tmp_path / "longer.yaml"), "--out", str(part), "--resume"]) == 0
    assert longer.rounds == 3
    want, got = Checkpoint.load(full / NAME), Checkpoint.load(part / NAME)
    assert want.round == got.round == 3
    assert isinstance(want.model, dict) and isinstance(got.model, dict)
    assert list(got.model) == list(want.model)
    assert all(torch.equal(got.model[k], want.model[k]) for k in want.model)  # bit for bit
    assert want.aggregator.keys() == got.aggregator.keys()
    rows_want, rows_got = records(full / "metrics.jsonl"), records(part / "metrics.jsonl")
    assert [r["round"] for r in rows_got] == [1, 2, 3]
    assert [r["weights"] for r in rows_got] == [r["weights"] for r in rows_want]
    assert [r["test_accuracy"] for r in rows_got] == [r["test_accuracy"] for r in rows_want]
    assert (part / "fedml.log.1").exists()  # the stopped run's log is kept
    assert "Communication round : 0" in (part / "fedml.log").read_text()  # FedML's own loop


def test_sp_evaluates_the_rounds_and_clients_eval_every_and_eval_fraction_pick(
    tmp_path: Path,
) -> None:
    """``eval_every: 2, eval_fraction: 0.5`` in FedML sp: rounds 2 and 3 (the last) are tested,
    each on the 3 of 6 clients :func:`evaluated_clients` draws, as on FedLab and Flower; the
    lines saying so are fedbalance's, in FedML's log."""
    from fl_adapters.fedml.runner import run_fedml

    out = tmp_path / "out"
    run_fedml(run_config(tmp_path, "sampled", eval_every=2, eval_fraction=0.5), out)
    rows = records(out / "metrics.jsonl")
    assert [("test_accuracy" in r) for r in rows] == [False, True, True]
    log = (out / "fedml.log").read_text()
    assert "local_test_on_all_clients : 1 (3 clients)" in log
    assert "local_test_on_all_clients : 2 (3 clients)" in log
    assert "local_test_on_all_clients : 0" not in log
    # fedbalance's own INFO lines reach FedML's log (fedml.init replaces logging.root).
    assert "fedbalance: FedML fedml-sp aggregates with 'fedloss'" in log
    check_bias_rows(out, evaluated=2)  # from the counts of FedML's own test pass


def check_killed_and_resumed(got: dict[str, Any], out: Path, rounds: int) -> None:
    assert got["stopped"] and got["stop_s"] < 60, got  # the launcher returned within 60 s
    assert got["processes_left"] == 0, got  # every other process is gone too
    done = got["checkpoint_round"]
    assert (
        done >= 1 and f"{out / NAME} holds round {done}: `fedbalance run --resume`" in got["error"]
    ), got
    assert got["rounds"] == list(range(1, rounds + 1))  # nothing missing, nothing twice
    assert [r["round"] for r in records(out / "aggregations.jsonl")] == got["rounds"]
    rows = records(out / "metrics.jsonl")
    assert all(len(r["weights"]) == 2 for r in rows)
    check_bias_rows(out, evaluated=rounds)  # before the kill, and after the resume
    assert 0 <= rows[-1]["test_accuracy"] <= 1  # the resumed server tested its last round
    assert Checkpoint.load(out / NAME).round == rounds


def check_launched(out: Path, host: str, backend: str, rounds: int) -> None:
    """What ``fedbalance run`` wrote for FedML and launched: the backend, worker_num + 1
    processes (FedML refuses to start with any other count), and FedLoss's weights from every
    round's validation losses, the killed run's rounds and the resumed ones alike."""
    fedml_cfg = yaml.safe_load((out / "fedml.yaml").read_text())
    assert fedml_cfg["comm_args"]["backend"] == backend
    assert fedml_cfg["device_args"]["worker_num"] == 2
    check_fedloss_records(records(out / "aggregations.jsonl"), host, rounds)
    if backend == "GRPC":  # one row per process, each its own port on 127.0.0.1
        ipconfig = Path(fedml_cfg["comm_args"]["grpc_ipconfig_path"]).read_text().splitlines()
        assert ipconfig[0] == "eid,rank,grpc_server_ip,grpc_server_port"
        assert [row.split(",")[:3] for row in ipconfig[1:]] == [
            [str(r), str(r), "127.0.0.1"] for r in range(3)
        ]
        assert (out / "fedml-rank1.log").exists() and (out / "fedml-rank2.log").exists()
        assert '"backend": "grpc"' in (out / "summary.json").read_text()
        for log in ("fedml.log", "fedml-rank1.log", "fedml-rank2.log"):  # no busy receive loop
            assert "FedML's gRPC receive loop waits for messages" in (out / log).read_text(), log


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize(
    ("framework", "rank"),
    [("fedml-mpi", 1), ("fedml-cross-silo", 0)],
    ids=["simulation", "cross-silo-server"],
)
# mpirun ends every rank when one dies, whichever it was: a worker and the server cover its two
# roles (a killed silo is the gRPC test's, where each process stands alone).
def test_a_killed_mpi_rank_names_itself_and_the_run_resumes(
    tmp_path: Path, framework: str, rank: int
) -> None:
    from test_fedml_loopback import Listeners, check_fedml_mpi

    from fedbalance_benchmarks.reliability_faults import fedml_kill_and_resume

    out = tmp_path / "out"
    config = run_config(tmp_path, "mpi", framework=framework, rounds=50)
    with Listeners(out / "aggregations.jsonl") as watch:
        got = fedml_kill_and_resume(out, config, rank=rank, more_rounds=1)
    if framework == "fedml-cross-silo":  # what it listened on until round 1 (#61)
        check_fedml_mpi(watch)
    assert f"process rank {rank} exited on signal 9" in got["error"], got
    check_killed_and_resumed(got, out, got["checkpoint_round"] + 1)
    check_launched(out, framework, "MPI", got["checkpoint_round"] + 1)


@pytest.mark.slow
def test_a_killed_grpc_silo_then_server_name_themselves_and_the_run_resumes(
    tmp_path: Path,
) -> None:
    """A silo (rank 2) is killed; the resume is itself the run whose server (rank 0) is killed
    once it has checkpointed a round past the first stop; the second resume finishes the run.
    Each stop names what died, its log and the checkpoint; each killed run's logs are kept.
    Until round 1 the first run listens on loopback only (:func:`check_fedml_grpc`)."""
    pytest.importorskip("grpc")
    import dataclasses

    from test_fedml_loopback import Listeners, check_fedml_grpc

    from fedbalance_benchmarks.reliability_faults import fedml_kill
    from fl_adapters.fedml.runner import run_fedml

    out = tmp_path / "out"
    config = run_config(tmp_path, "grpc", framework="fedml-cross-silo", backend="grpc", rounds=50)
    with Listeners(out / "aggregations.jsonl") as watch:
        silo = fedml_kill(out, config, rank=2, kill_after=1)
    check_fedml_grpc(watch, out)  # what it listened on until round 1 (#61)
    server = fedml_kill(out, config, rank=0, kill_after=silo["checkpoint_round"] + 1, resume=True)
    rounds = server["checkpoint_round"] + 1
    run_fedml(dataclasses.replace(config, rounds=rounds), out, resume=True, timeout=600)
    got = records(out / "metrics.jsonl")
    for stop, what, log in [
        (silo, "silo rank 2", "fedml-rank2.log"),
        (server, "server (rank 0)", "fedml.log"),
    ]:
        assert f"{what} was killed by signal 9 (SIGKILL) after round" in stop["error"], stop
        assert "of 50; every other process was stopped" in stop["error"], stop
        assert str(out / log) in stop["error"], stop
        check_killed_and_resumed(stop | {"rounds": [r["round"] for r in got]}, out, rounds)
    assert server["checkpoint_round"] > silo["checkpoint_round"]  # the first resume trained on
    check_launched(out, "fedml-cross-silo", "GRPC", rounds)
    # each killed run's logs are kept, numbered by the resume that set them aside
    assert (out / "fedml-rank2.log.1").exists() and (out / "fedml.log.2").exists()
