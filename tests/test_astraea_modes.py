"""Astraea in every deployment mode: one relay, one behaviour.

The mediator relay (:class:`~fl_adapters.astraea.MediatorRelay`) is tested on its own; then
real runs of each host in each mode — FedLab standalone and cross-process (``DistNetwork``
over gloo on 127.0.0.1, both ``fedbalance run`` and stock scripts), FedML sp, MPI simulation
and MPI cross-silo (``mpirun``) — must give the same plan, mediators, record fields and, to
float-order tolerance, the same models for one config and seed. Faults: a client process that
dies in a mediator chain stops the run, and a wrong process count is an error before round 1.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from helpers import digits_run, records

from fl_adapters.astraea import MediatorRelay, run_mediator
from fl_adapters.run.processes import free_ports

HOSTS = Path(__file__).parent / "hosts"
EXAMPLE = Path(__file__).resolve().parents[1] / "adapters" / "fedml" / "example"
PARTITION = {
    "name": "global_imbalance",
    "profile": "zipf",
    "exponent": 1.2,
    "then": {"name": "label_dirichlet", "beta": 0.5},
}
#: What every mode must record identically.
SAME = ("round", "clients", "num_samples", "weights", "mediators", "kl", "bytes")


def port() -> int:
    """A free port below the ephemeral range (outgoing sockets cannot take it meanwhile)."""
    return free_ports(1)[0]


# -- the relay ------------------------------------------------------------------------------------
def test_relay_groups_consecutive_members_of_one_owner_within_a_pass() -> None:
    owner = {4: "a", 1: "a", 7: "b", 2: "a"}.__getitem__
    relay = MediatorRelay([[4, 1, 7, 2]], mediator_epochs=2, owner=owner)
    hops = relay.hops[0]
    # Members 4 and 1 share an owner: one hop. The pass boundary (2 then 4, both "a") is not
    # merged, so each hop belongs to one pass.
    assert [(h.clients, h.owner, h.epoch) for h in hops] == [
        ((4, 1), "a", 0),
        ((7,), "b", 0),
        ((2,), "a", 0),
        ((4, 1), "a", 1),
        ((7,), "b", 1),
        ((2,), "a", 1),
    ]
    params = "w"
    hop = relay.start()[0]
    while hop is not None:
        params += "".join(map(str, hop.clients))
        hop = relay.received(0, params, 10 * len(hop.clients))
    assert relay.results() == [("w41724172", 40)]  # each member's samples once
    assert [c for _, c in relay.trace] == [4, 1, 7, 2, 4, 1, 7, 2]


def test_relay_runs_mediators_side_by_side_and_refuses_a_stray_update() -> None:
    relay = MediatorRelay([[0, 1], [2]], mediator_epochs=1)
    assert [h.clients for h in relay.start()] == [(0,), (2,)]
    assert relay.received(1, "m1", 5) is None
    with pytest.raises(ValueError, match="no hop of mediator 1 is outstanding"):
        relay.received(1, "again", 5)
    with pytest.raises(RuntimeError, match="1 of 2 mediators have finished"):
        relay.results()
    assert relay.received(0, "m0a", 3) is not None and relay.received(0, "m0", 4) is None
    assert relay.done() and relay.results() == [("m0", 7), ("m1", 5)]
    with pytest.raises(ValueError, match="at least one member"):
        MediatorRelay([[0], []], mediator_epochs=1)


def test_run_mediator_is_the_relay_in_one_process() -> None:
    result = run_mediator([3, 1], "w", lambda c, p: (p + str(c), c + 1), mediator_epochs=3)
    assert result.params == "w313131" and result.num_samples == 4 + 2
    assert result.trace == [3, 1, 3, 1, 3, 1]


# -- wrong process counts: errors before round 1 ---------------------------------------------------
fedlab = pytest.importorskip("fedlab")


def astraea_config(**overrides: Any):
    base = dict(
        aggregator="astraea",
        aggregator_args={"gamma": 2, "tau_d": 2.0, "mediator_epochs": 2},
        partition=PARTITION,
        num_clients=8,
        clients_per_round=5,
        rounds=2,
        seed=5,
        port=port(),
    )
    return digits_run(base, overrides)


@pytest.mark.parametrize("processes", [0, 9], ids=["none", "more-than-clients"])
def test_fedlab_cross_process_refuses_a_process_count_it_cannot_fill(
    processes: int, tmp_path: Path
) -> None:
    from fl_adapters.fedlab.launch import run_distributed

    started = time.monotonic()
    with pytest.raises(ValueError, match=rf"between 1 and num_clients=8 .* got {processes}"):
        run_distributed(astraea_config(framework="fedlab-distributed"), tmp_path, processes)
    assert time.monotonic() - started < 5 and not (tmp_path / "metrics.jsonl").exists()


def test_fedml_mpi_simulation_astraea_needs_client_num_per_round_plus_one() -> None:
    pytest.importorskip("fedml")
    from fl_adapters.fedml.adapter import validate

    args = SimpleNamespace(
        aggregator="astraea",
        aggregator_args={},
        training_type="simulation",
        backend="MPI",
        comm=SimpleNamespace(Get_size=lambda: 3),
        client_num_per_round=3,
    )
    with pytest.raises(ValueError, match=r"client_num_per_round \+ 1 = 4 .* mpirun started 3"):
        validate(args)
    args.comm = SimpleNamespace(Get_size=lambda: 4)
    validate(args)  # the right count: accepted


# -- FedLab: standalone vs cross-process ----------------------------------------------------------
def same_fields(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert {k: x[k] for k in SAME} == {k: y[k] for k in SAME}
        flat = lambda r: [v for d in r["digest"] for v in d]  # noqa: E731
        assert flat(x) == pytest.approx(flat(y), rel=1e-5, abs=1e-5)


@pytest.mark.slow
def test_fedlab_cross_process_astraea_matches_standalone(tmp_path: Path, monkeypatch) -> None:
    import torch

    from fl_adapters.checkpoint import Checkpoint
    from fl_adapters.fedlab.launch import run_distributed
    from fl_adapters.fedlab.runner import run_standalone

    monkeypatch.setenv("FEDBALANCE_RECORD", str(tmp_path / "sa.jsonl"))
    run_standalone(astraea_config(), tmp_path / "sa", progress=False)
    monkeypatch.setenv("FEDBALANCE_RECORD", str(tmp_path / "dist.jsonl"))
    summary = run_distributed(
        astraea_config(framework="fedlab-distributed"), tmp_path / "dist", 2, timeout=300
    )
    sa, dist = records(tmp_path / "sa.jsonl"), records(tmp_path / "dist.jsonl")
    assert [r["round"] for r in dist] == [1, 2] and {r["host"] for r in dist} == {
        "fedlab-distributed"
    }
    same_fields(sa, dist)
    for r in dist:  # 5 clients, gamma 2: three mediators, two passes each
        assert len(r["mediators"]) == 3 and r["bytes"]["mediator_clients"] > 0
    a = Checkpoint.load(tmp_path / "sa" / "checkpoint.pt")
    b = Checkpoint.load(tmp_path / "dist" / "checkpoint.pt")
    assert a.plan == b.plan and a.participations == b.participations
    assert float((a.model - b.model).abs().max()) < 1e-4
    # Cross-process rows carry the measured traffic of the relay, every hop through the server.
    rows = records(tmp_path / "dist" / "metrics.jsonl")
    assert all(r["bytes_down"] > 0 and r["bytes_up"] > 0 and r["mediators"] for r in rows)
    assert summary["astraea"]["augment"] and summary["rounds"] == 2
    assert torch.isfinite(b.model).all()


def run_stock_distnetwork(
    tmp_path: Path, world: int, rounds: int, args: str, single: bool = False
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The stock server and client scripts, armed by the environment; their records."""
    p = str(port())
    base = {
        **os.environ,
        "FEDBALANCE_AGGREGATOR": "astraea",
        "FEDBALANCE_AGGREGATOR_ARGS": args,
        "PYTHONPATH": os.pathsep.join([str(HOSTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    env = {**base, "FEDBALANCE_RECORD": str(tmp_path / "dist.jsonl")}
    py, pipe = sys.executable, subprocess.PIPE
    server = [py, str(HOSTS / "fedlab_stock_server.py"), p, str(world), str(rounds)]
    procs = [subprocess.Popen(server, env=env, stdout=pipe, stderr=pipe, text=True)]
    for r in range(1, world):
        client = [py, str(HOSTS / "fedlab_stock_client.py"), p, str(world), str(r)]
        client += ["single"] if single else []
        procs.append(
            subprocess.Popen(client, env=env, stdout=subprocess.DEVNULL, stderr=pipe, text=True)
        )
    try:
        outs = [proc.communicate(timeout=240) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [0] * world, outs[0][1][-3000:]
    assert "CHECKSUM" in outs[0][0]
    return records(tmp_path / "dist.jsonl"), base


#: What arms FedLab's stock scripts for Astraea: the environment alone.
ASTRAEA_ENV = {
    "FEDBALANCE_AGGREGATOR": "astraea",
    "FEDBALANCE_AGGREGATOR_ARGS": '{"gamma": 2, "tau_d": 2.0}',
}


def run_stock_standalone(tmp_path: Path, rounds: int) -> tuple[list[str], list[dict[str, Any]]]:
    """FedLab's stock standalone script armed by ``ASTRAEA_ENV``: its checksum lines, records."""
    rec = tmp_path / "sa.jsonl"
    out = subprocess.run(
        [sys.executable, str(HOSTS / "fedlab_stock_standalone.py"), str(rounds)],
        env={**os.environ, **ASTRAEA_ENV, "FEDBALANCE_RECORD": str(rec)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [x for x in out.stdout.splitlines() if x.startswith("CHECKSUM")], records(rec)


@pytest.fixture(scope="module")
def stock_standalone(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[str], list[dict[str, Any]]]:
    """One 3-round run of the stock standalone script, shared by the two tests below (the
    second run of the first, and the standalone reference of the second)."""
    return run_stock_standalone(tmp_path_factory.mktemp("stock-standalone"), 3)


@pytest.mark.slow
def test_stock_fedlab_script_runs_astraea_by_environment(
    stock_standalone: tuple[list[str], list[dict[str, Any]]], tmp_path: Path
) -> None:
    outs, recs = zip(stock_standalone, run_stock_standalone(tmp_path, 3), strict=True)
    lines = recs[0]
    assert [r["round"] for r in lines] == [1, 2, 3]
    for r in lines:
        assert r["aggregator"] == "astraea" and r["host"] == "fedlab"
        # FedLab samples 3 of 6 clients; gamma 2 makes two mediators.
        assert [len(g) for g in r["mediators"]] == [2, 1] and len(r["kl"]) == 2
        assert r["clients"] == [0, 1] and r["bytes"]["mediator_clients"] > 0
    assert outs[0] and outs[0] == outs[1] and recs[0] == recs[1]  # same seed, same result


@pytest.mark.slow
def test_stock_fedlab_distnetwork_scripts_run_astraea_by_environment(
    stock_standalone: tuple[list[str], list[dict[str, Any]]], tmp_path: Path
) -> None:
    rounds = 3
    args = ASTRAEA_ENV["FEDBALANCE_AGGREGATOR_ARGS"]
    dist, _ = run_stock_distnetwork(tmp_path, 3, rounds, args)
    sa = stock_standalone[1]
    assert [r["round"] for r in dist] == [1, 2, 3]
    # The stock scripts seed FedLab's sampler alike; the clients report the same counts, so the
    # plan and the mediators are the standalone's (stock training shuffles with torch's global
    # RNG, so the models are not compared; nor is the standalone's torch thread count).
    for x, y in zip(sa, dist, strict=True):
        assert {k: x[k] for k in SAME} == {k: y[k] for k in SAME}
        assert [len(g) for g in y["mediators"]] == [2, 1]


@pytest.mark.slow
def test_stock_sgd_client_trainers_one_client_per_process_relay_astraea(tmp_path: Path) -> None:
    args = '{"gamma": 2, "tau_d": 2.0, "mediator_epochs": 2}'
    dist, _ = run_stock_distnetwork(tmp_path, 5, 2, args, single=True)
    assert [r["round"] for r in dist] == [1, 2]
    for r in dist:  # 2 of 4 clients, each in its own process: one mediator through both, twice
        assert [len(g) for g in r["mediators"]] == [2] and r["weights"] == [1.0]
        assert r["bytes"]["mediator_clients"] == 8 * r["bytes"]["server_up"]


# -- FedML: sp vs MPI simulation vs MPI cross-silo ------------------------------------------------
def fedml_yaml(tmp_path: Path, name: str) -> Path:
    doc = yaml.safe_load((EXAMPLE / name).read_text())
    doc["data_args"].pop("max_samples", None)
    doc["data_args"].update(dataset="digits", partition_spec=PARTITION)
    doc["train_args"].update(
        aggregator="astraea",
        aggregator_args={"gamma": 2, "tau_d": 2.0},
        client_num_in_total=3,
        client_num_per_round=3,
        comm_round=2,
    )
    if "worker_num" in doc["device_args"]:
        doc["device_args"]["worker_num"] = 3
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def run_fedml(
    tmp_path: Path, name: str, script: Path = EXAMPLE / "main.py", **env: str
) -> tuple[list[dict[str, Any]], str]:
    """The example (or ``script``) on ``name``'s YAML: sp in one process, the MPI modes under
    ``mpirun -np 4``, one torch thread each; its records and its output."""
    rec = tmp_path / f"{name}.jsonl"
    cmd = [sys.executable, str(script), "--cf", str(fedml_yaml(tmp_path, name))]
    env = {"FEDBALANCE_RECORD": str(rec), "OMP_NUM_THREADS": "1", **env}
    if name != "sp.yaml":
        if shutil.which("mpirun") is None:
            pytest.skip("OpenMPI's mpirun is not installed")
        mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4"]
        cmd = [*mpirun, *[a for k in env for a in ("-x", k)], *cmd]
    out = subprocess.run(
        cmd,
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    return records(rec), log


@pytest.fixture(scope="module")
def fedml_sp(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    pytest.importorskip("fedml")
    return run_fedml(tmp_path_factory.mktemp("sp"), "sp.yaml")[0]


@pytest.mark.slow
def test_fedml_sp_by_hand_runs_astraea_and_records_mediators(
    fedml_sp: list[dict[str, Any]],
) -> None:
    """The example script run by hand on sp.yaml with ``aggregator: astraea``: each round's
    record holds the mediators (3 clients, gamma 2: one of two, one alone), their KL, the
    paper's traffic and weights n_m / n."""
    assert [r["round"] for r in fedml_sp] == [1, 2]
    for r in fedml_sp:
        assert r["host"] == "fedml-sp" and r["aggregator"] == "astraea"
        assert sorted(len(g) for g in r["mediators"]) == [1, 2] and len(r["kl"]) == 2
        assert r["clients"] == [0, 1]  # one id per mediator
        assert r["bytes"]["server_down"] > 0 and r["bytes"]["mediator_clients"] > 0
        assert r["weights"] == pytest.approx([n / sum(r["num_samples"]) for n in r["num_samples"]])


def check_mpi_mode(got: list[dict[str, Any]], log: str, host: str) -> None:
    assert [r["round"] for r in got] == [1, 2] and {r["host"] for r in got} == {host}
    # 3 clients, gamma 2: a mediator of two relayed through two processes, and one alone.
    assert all(sorted(len(g) for g in r["mediators"]) == [1, 2] for r in got)
    # Each client process trained once a round: the second member got the first one's model
    # from the server (a relayed sync message), not a second copy of the global model.
    assert log.count("#######training###########") == 3 * 2


@pytest.mark.slow
def test_fedml_mpi_simulation_matches_sp(fedml_sp: list[dict[str, Any]], tmp_path: Path) -> None:
    got, log = run_fedml(tmp_path, "mpi.yaml")
    check_mpi_mode(got, log, "fedml-mpi")
    same_fields(fedml_sp, got)


@pytest.mark.slow
def test_fedml_cross_silo_over_mpi_matches_sp_and_over_grpc_bit_for_bit(
    fedml_sp: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Cross-silo over MPI (``mpirun -np 4``) gives sp's plan, mediators, KL, weights and
    traffic; the same YAML over gRPC (each silo its own process) gives MPI's records and final
    global model bit for bit (one torch thread per process in both: with torch's default
    threads the two differ by ~1e-6, the summation order), and the user's ``bias.figures`` on
    FedML's loaders after the run are the figures fedbalance logged for the last round."""
    pytest.importorskip("grpc")
    import json

    import torch
    from test_fedml_grpc import FINAL_FIGURES_HOST, FINAL_MODEL_HOST, finish, launch

    from fl_adapters.fedml.ipconfig import free_ports as grpc_ports
    from fl_adapters.fedml.ipconfig import write_ipconfig
    from fl_adapters.fedml.patches.sp import FIGURES

    mpi_dir, grpc_dir = tmp_path / "mpi", tmp_path / "grpc"
    mpi_dir.mkdir()
    grpc_dir.mkdir()
    over_mpi, log = run_fedml(
        mpi_dir, "cross_silo.yaml", FINAL_MODEL_HOST, FINAL_MODEL=str(mpi_dir / "final.pt")
    )
    check_mpi_mode(over_mpi, log, "fedml-cross-silo")
    same_fields(fedml_sp, over_mpi)

    cfg = fedml_yaml(grpc_dir, "cross_silo_grpc.yaml")
    doc = yaml.safe_load(cfg.read_text())
    ipconfig = write_ipconfig(grpc_dir / "grpc_ipconfig.csv", grpc_ports(4))
    doc["comm_args"]["grpc_ipconfig_path"] = str(ipconfig)
    cfg.write_text(yaml.safe_dump(doc))
    started: list[subprocess.Popen[str]] = []
    try:
        procs = launch(
            started, grpc_dir, cfg, [0, 1, 2, 3], FINAL_FIGURES_HOST,
            FEDBALANCE_RECORD=str(grpc_dir / "rec.jsonl"),
            FINAL_MODEL=str(grpc_dir / "final.pt"),
            FINAL_FIGURES=str(grpc_dir / "figures.json"),
        )  # fmt: skip
        server_log = finish(procs, grpc_dir)
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    mine = json.loads((grpc_dir / "figures.json").read_text())
    logged = [line.split(FIGURES, 1)[1] for line in server_log.splitlines() if FIGURES in line]
    assert len(logged) == 2, server_log[-3000:]
    last = json.loads(logged[-1])
    for key in ("accuracy", "balanced_accuracy", "worst_class", "client_acc_mean"):
        assert mine[key] == pytest.approx(last[key]), key
    assert mine["client_accuracy"] == pytest.approx(last["client_accuracy"])
    over_grpc = records(grpc_dir / "rec.jsonl")
    assert {r["host"] for r in over_grpc} == {"fedml-cross-silo"}
    assert over_grpc == over_mpi  # the same plan, mediators, KL, weights, samples and bytes
    got, want = torch.load(grpc_dir / "final.pt"), torch.load(mpi_dir / "final.pt")
    assert list(got) == list(want)
    assert all(torch.equal(got[k], want[k]) for k in want)


# -- faults ---------------------------------------------------------------------------------------
def client_pids(config_path: Path, rank: int | None = None) -> list[int]:
    """PIDs of the run's FedLab client processes (of one rank, if given)."""
    from fedbalance_benchmarks.reliability_faults import client_pids as all_clients

    def rank_of(pid: int) -> int | None:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        return int(cmd[cmd.index("--rank") + 1]) if "--rank" in cmd else None

    return [pid for pid in all_clients(config_path) if rank is None or rank_of(pid) == rank]


@pytest.mark.slow
def test_a_client_process_dying_in_a_mediator_chain_stops_the_run(tmp_path: Path) -> None:
    cfg = astraea_config(framework="fedlab-distributed", rounds=30, port=port())
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    out = tmp_path / "out"
    cli = [sys.executable, "-m", "fl_adapters.cli", "run", str(path), "--out", str(out)]
    launcher = subprocess.Popen(cli, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        assert launcher.poll() is None and time.monotonic() < deadline, "no round finished"
        time.sleep(0.05)
    assert len(client_pids(path)) == 2
    (victim,) = client_pids(path, rank=2)
    os.kill(victim, signal.SIGKILL)  # while round 2's chains pass through it
    killed = time.monotonic()
    _, err = launcher.communicate(timeout=90)
    assert time.monotonic() - killed < 60
    assert launcher.returncode == 1
    line = next(x for x in err.splitlines() if "fedlab-distributed:" in x)
    rows = records(metrics)
    assert "client process rank 2 was killed by signal 9 (SIGKILL)" in line
    assert f"holds round {rows[-1]['round']}: `fedbalance run --resume`" in line
    assert rows[-1]["round"] < 30 and client_pids(path) == []
