"""FedML 0.9.6 cross-silo over FedML's own gRPC backend, with real separate processes on
127.0.0.1: the server (``--rank 0 --role server``) and each silo (``--rank N --role client``)
started as FedML's docs launch them, no mpirun.

The host is ``adapters/fedml/example/main.py`` (no fedbalance import); only its YAML and the
ipconfig file change. Sizes are the other FedML tests' (2,000 Fashion-MNIST samples, 2 rounds).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from helpers import check_fedloss_records, records
from test_fedml import EXAMPLE, HOSTS, config, final_test_metrics

pytest.importorskip("fedml")
pytest.importorskip("grpc")

from fl_adapters.config import ConfigError, RunConfig  # noqa: E402
from fl_adapters.fedml.ipconfig import check_grpc, free_ports, write_ipconfig  # noqa: E402
from fl_adapters.run.processes import watch  # noqa: E402

FINAL_MODEL_HOST = Path(__file__).parent / "hosts" / "fedml_final_model.py"
FINAL_FIGURES_HOST = Path(__file__).parent / "hosts" / "fedml_final_figures.py"
#: Three processes share two cores here; one torch thread each is faster, and makes every run
#: sum in the same order whatever launched it (mpirun binds cores, so torch's default differs).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def grpc_config(tmp_path: Path, ranks: int = 3, **train_args: object) -> Path:
    """The example's gRPC cross-silo YAML with its own ipconfig on free 127.0.0.1 ports."""
    path = config(tmp_path, "cross_silo_grpc.yaml", **train_args)
    doc = yaml.safe_load(path.read_text())
    ipconfig = write_ipconfig(tmp_path / "grpc_ipconfig.csv", free_ports(ranks))
    doc["comm_args"]["grpc_ipconfig_path"] = str(ipconfig)
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; whatever is still alive at its end is killed."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def launch(
    procs: list[subprocess.Popen[str]],
    tmp_path: Path,
    cfg: Path,
    ranks: list[int],
    script: Path = EXAMPLE / "main.py",
    *,
    server_script: Path | None = None,
    server_role: bool = True,
    scripts: dict[int, Path] | None = None,
    **env: str,
) -> dict[int, subprocess.Popen[str]]:
    """Each rank as its own process, silos before the server (FedML's silo waits for it).

    ``server_script`` runs rank 0 (default: ``script``), ``scripts`` the silos it names;
    ``server_role=False`` starts rank 0 as FedML's ``run_server.sh`` does, with ``--rank 0``
    and no ``--role``."""
    out = {}
    for rank in sorted(ranks, reverse=True):
        log = open(tmp_path / f"rank{rank}.log", "w")  # noqa: SIM115 (closed with the process)
        role = ["--role", "server" if rank == 0 else "client"]
        if rank == 0 and not server_role:
            role = []
        path = server_script if rank == 0 and server_script is not None else script
        path = (scripts or {}).get(rank, path)
        p = subprocess.Popen(
            [sys.executable, str(path), "--cf", str(cfg), "--rank", str(rank), *role],
            cwd=tmp_path,
            env={**os.environ, **ONE_THREAD, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log.close()
        procs.append(p)
        out[rank] = p
    return out


def finish(procs: dict[int, subprocess.Popen[str]], tmp_path: Path, timeout: float = 300) -> str:
    """Wait for every rank; fail with the logs as soon as one fails. Returns the server's log.

    A rank that dies leaves the others waiting for it (a silo for its server up to
    ``grpc_server_wait``), so the first failure stops them all (``processes.watch``).
    """
    failed = watch([(f"rank {r}", p) for r, p in procs.items()], timeout)
    logs = {r: (tmp_path / f"rank{r}.log").read_text() for r in procs}
    assert failed is None, (failed, {r: t[-2000:] for r, t in logs.items()})
    return logs[0]


#: What a cross-silo process over gRPC logs once its receive loop waits instead of spinning.
QUIET = "fedbalance: FedML's gRPC receive loop waits for messages instead of spinning"


@pytest.mark.slow
def test_grpc_cross_silo_with_fedmls_own_scripts_and_ours_aggregates_with_fedloss(
    tmp_path: Path, started: list
) -> None:
    """FedML's cross-silo example as its run_server.sh / run_client.sh start it (the server with
    ``--rank 0`` alone; silo 1 its client script), changed only by the YAML's aggregator line,
    beside a silo running fedbalance's example script (silo 2): every round applies FedLoss,
    FedML's server tests after each round, and every process's receive loop waits instead of
    spinning. (One run for both kinds of script: each start costs three FedML processes; our
    script as the server runs in the Astraea comparison and the killed-process tests.)"""
    rec = tmp_path / "rec.jsonl"
    procs = launch(
        started,
        tmp_path,
        grpc_config(tmp_path),
        [0, 1, 2],
        HOSTS / "fedml_official_torch_client.py",
        server_script=HOSTS / "fedml_official_torch_server.py",
        server_role=False,
        scripts={2: EXAMPLE / "main.py"},
        FEDBALANCE_RECORD=str(rec),
    )
    server_log = finish(procs, tmp_path)
    check_fedloss_records(records(rec), "fedml-cross-silo", rounds=2)
    assert len(final_test_metrics(server_log)) == 2  # FedML's server tested after each round
    for rank in (0, 1, 2):
        assert QUIET in (tmp_path / f"rank{rank}.log").read_text(), rank


@pytest.mark.timeout(60)
def test_a_receive_queue_waits_for_a_message_instead_of_spinning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FedML's own servicer queue, its class changed in place: ``qsize`` on an empty queue
    returns when a message is put (an hour's wait would time the test out), in FedML's order;
    an MPI manager's receive queue the same way."""
    import queue

    from fedml.core.distributed.communication.grpc.grpc_server import GRPCCOMMServicer

    from fl_adapters.fedml.patches import distributed

    servicer = GRPCCOMMServicer("127.0.0.1", free_ports(1)[0], 2, 0)
    q = servicer.message_q
    manager = SimpleNamespace(com_manager=SimpleNamespace(grpc_servicer=servicer))
    assert distributed.quiet_run(manager, lambda self: "FedML's loop ran") == "FedML's loop ran"
    assert servicer.message_q is q and type(q) is distributed.WaitingQueue

    monkeypatch.setattr(distributed, "RECEIVE_WAIT_S", 3600.0)
    threading.Timer(0.2, lambda: servicer.message_q.put(b"first")).start()
    assert q.qsize() == 1  # woken by the put, not by the hour's timeout
    q.put(b"second")
    assert [q.get(), q.get()] == [b"first", b"second"]
    monkeypatch.setattr(distributed, "RECEIVE_WAIT_S", 0.01)
    assert q.qsize() == 0  # empty: FedML's loop checks whether it should stop, then asks again

    received: queue.Queue[bytes] = queue.Queue()
    over_mpi = SimpleNamespace(com_manager=SimpleNamespace(q_receiver=received))
    distributed.quiet_run(over_mpi, lambda self: None)
    assert over_mpi.com_manager.q_receiver is received
    assert type(received) is distributed.WaitingQueue


@pytest.mark.slow
def test_a_port_in_use_stops_the_server_before_round_1(tmp_path: Path, started: list) -> None:
    cfg = grpc_config(tmp_path)
    ipconfig = tmp_path / "grpc_ipconfig.csv"
    port = int(ipconfig.read_text().splitlines()[1].split(",")[3])
    with socket.socket() as holder:  # another program listening on the server's port
        holder.bind(("127.0.0.1", port))
        holder.listen()
        start = time.monotonic()
        procs = launch(started, tmp_path, cfg, [0])
        procs[0].wait(timeout=120)
    log = (tmp_path / "rank0.log").read_text()
    assert procs[0].returncode != 0
    assert (
        f"the server's gRPC address 127.0.0.1:{port} (rank 0 in {ipconfig}) is already in use"
        in log
    ), log[-3000:]
    assert "Started gRPC server" not in log and "Communication round" not in log
    assert time.monotonic() - start < 120


@pytest.mark.timeout(60)
@pytest.mark.parametrize("graceful", [False, True], ids=["fedml-stop-none", "fedbalance-grace"])
def test_a_finishing_silo_lets_the_call_that_delivered_its_last_message_end(
    graceful: bool,
) -> None:
    """FedML's end-of-run race (benchmarks/results/grpc_shutdown.md): a silo that finishes while
    the call that delivered its last model is still answering. FedML's stop(None) cancels that
    call (the server's send raises); fedbalance's graceful_finish lets it end."""
    from concurrent import futures

    import grpc
    from fedml.core.distributed.communication.grpc import (
        grpc_comm_manager_pb2,
        grpc_comm_manager_pb2_grpc,
    )
    from fedml.core.distributed.communication.grpc.grpc_server import GRPCCOMMServicer

    from fl_adapters.fedml.patches import cross_silo

    class LateAnswer(GRPCCOMMServicer):  # the answer goes out after the loop has the message
        def sendMessage(self, request: Any, context: Any) -> Any:  # noqa: N802 (FedML's name)
            out = super().sendMessage(request, context)
            time.sleep(0.5)
            return out

    (port,) = free_ports(1)
    servicer = LateAnswer("127.0.0.1", port, 2, 1)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    grpc_comm_manager_pb2_grpc.add_gRPCCommManagerServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    stopped = []
    com = SimpleNamespace(grpc_server=server)
    com.stop_receive_message = lambda: server.stop(None)  # FedML's
    silo = SimpleNamespace(com_manager=com)

    def fedml_finish(self: Any) -> None:
        self.com_manager.stop_receive_message()
        stopped.append(True)

    def silo_loop() -> None:  # FedML's receive loop: the last message, then finish
        servicer.message_q.get(timeout=10)
        if graceful:
            cross_silo.graceful_finish(silo, fedml_finish)
        else:
            fedml_finish(silo)

    loop = threading.Thread(target=silo_loop)
    loop.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = grpc_comm_manager_pb2_grpc.gRPCCommManagerStub(channel)
        request = grpc_comm_manager_pb2.CommRequest(client_id=0, message=b"final model")
        if graceful:
            stub.sendMessage(request)  # the server's send returns: no error
        else:
            with pytest.raises(grpc.RpcError, match="Cancelling all calls"):
                stub.sendMessage(request)
    loop.join()
    assert stopped == [True]


# -- fast checks of the ipconfig rules (no processes) ------------------------------------------
def grpc_args(tmp_path: Path, ranks: int, **extra: object) -> SimpleNamespace:
    path = write_ipconfig(tmp_path / "ip.csv", free_ports(ranks))
    fields: dict[str, Any] = dict(
        grpc_ipconfig_path=str(path),
        client_num_per_round=2,
        worker_num=2,
        rank=0,
        role="server",
    )
    return SimpleNamespace(**(fields | extra))


@pytest.mark.parametrize(
    ("ranks", "extra", "message"),
    [
        (2, {}, "lists ranks [0, 1], but worker_num: 2 needs exactly worker_num + 1 = 3 ranks"),
        (4, {}, "lists ranks [0, 1, 2, 3], but worker_num: 2 needs exactly worker_num + 1 = 3"),
        (3, {"rank": 5, "role": "client"}, "this process has --rank 5, which"),
        (3, {"rank": 1, "role": "server"}, "--rank 1 --role server: rank 0 is the server"),
        (3, {"worker_num": 3}, "worker_num (3) must equal client_num_per_round (2)"),
        (3, {"grpc_ipconfig_path": "/nonexistent/ip.csv"}, "/nonexistent/ip.csv cannot be read"),
    ],
    ids=["too-few-ranks", "too-many-ranks", "rank-not-listed", "role", "worker-num", "no-file"],
)
def test_ipconfig_mismatches_are_clear_errors(
    tmp_path: Path,
    ranks: int,
    extra: dict[str, object],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = grpc_args(tmp_path, ranks, **extra)
    monkeypatch.setattr(sys, "argv", ["main.py", "--rank", str(args.rank), "--role", args.role])
    with pytest.raises(ValueError) as info:
        check_grpc(args)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["--rank", "0"], False),  # FedML's run_server.sh: the rank makes it the server
        (["--rank", "0", "--role", "client"], True),  # written, and contradicting the rank
        (["--rank", "0", "--role=client"], True),
    ],
    ids=["no-role", "role-client", "role=client"],
)
def test_rank_0_without_role_is_the_server_as_in_fedml(
    tmp_path: Path, argv: list[str], refused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fedml.init() leaves args.role at its default, 'client', whatever the launch said.
    args = grpc_args(tmp_path, 3, rank=0, role="client")
    monkeypatch.setattr(sys, "argv", ["torch_server.py", "--cf", "c.yaml", *argv])
    if refused:
        with pytest.raises(ValueError, match="--rank 0 --role client: rank 0 is the server"):
            check_grpc(args)
    else:
        check_grpc(args)


def test_ipconfig_header_and_rows_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("rank,ip,port\n0,127.0.0.1,1\n")
    with pytest.raises(ValueError, match="needs the header eid,rank,grpc_server_ip"):
        check_grpc(grpc_args(tmp_path, 3, grpc_ipconfig_path=str(bad)))
    bad.write_text("eid,rank,grpc_server_ip,grpc_server_port\n0,0,127.0.0.1,1\n1,2,127.0.0.1,2\n")
    with pytest.raises(ValueError, match=r"line 3: eid \(1\) must equal rank \(2\)"):
        check_grpc(grpc_args(tmp_path, 3, grpc_ipconfig_path=str(bad)))


def test_validate_accepts_grpc_cross_silo(tmp_path: Path) -> None:
    from fl_adapters.fedml.adapter import HOSTS, validate

    args = grpc_args(tmp_path, 3, aggregator="fedloss", training_type="cross_silo", backend="GRPC")
    validate(args)  # no error: a free port, ranks 0..2
    assert HOSTS[("cross_silo", "GRPC")] == "fedml-cross-silo"


def test_backend_is_validated_with_the_allowed_values() -> None:
    with pytest.raises(ConfigError, match=r"backend must be one of mpi, grpc; got 'GRPC'"):
        RunConfig(framework="fedml-cross-silo", backend="GRPC")
    with pytest.raises(ConfigError, match="backend: grpc is for framework: fedml-cross-silo"):
        RunConfig(framework="fedml-mpi", backend="grpc")
    assert RunConfig(framework="fedml-cross-silo").backend == "mpi"


def test_a_silo_waits_for_the_server_then_gives_up_naming_the_file(tmp_path: Path) -> None:
    from fl_adapters.fedml.ipconfig import wait_for_server

    args = grpc_args(tmp_path, 3, rank=1, role="client", grpc_server_wait=1)
    port = int(Path(args.grpc_ipconfig_path).read_text().splitlines()[1].split(",")[3])
    with pytest.raises(TimeoutError) as info:
        wait_for_server(args, poll=0.1)
    said = f"the server (rank 0 in {args.grpc_ipconfig_path}) did not listen on 127.0.0.1:{port}"
    assert said in str(info.value)
    with socket.socket() as server:  # the server comes up half a second later: the silo goes on

        def listen() -> None:
            time.sleep(0.5)
            server.bind(("127.0.0.1", port))
            server.listen()

        threading.Thread(target=listen).start()
        start = time.monotonic()
        wait_for_server(SimpleNamespace(**(vars(args) | {"grpc_server_wait": 30})), poll=0.1)
        assert 0.4 < time.monotonic() - start < 10


def test_a_port_another_grpc_server_holds_counts_as_in_use() -> None:
    # gRPC binds with SO_REUSEPORT: a second FedML process would share this port silently.
    from concurrent import futures

    import grpc

    from fl_adapters.fedml.ipconfig import port_problem

    (port,) = free_ports(1)
    assert port_problem("127.0.0.1", port) is None
    other = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    assert other.add_insecure_port(f"127.0.0.1:{port}") == port
    other.start()
    try:
        assert "is already in use" in str(port_problem("127.0.0.1", port))
    finally:
        other.stop(None)


def test_without_grpcio_the_error_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a)
    )
    from fl_adapters.fedml.runner import run_fedml

    with pytest.raises(ModuleNotFoundError, match=r"pip install 'fedbalance\[fedml\]'"):
        run_fedml(RunConfig(framework="fedml-cross-silo", backend="grpc"), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written, nothing started


@pytest.mark.slow
def test_a_silo_never_started_stops_the_server_before_round_1(
    tmp_path: Path, started: list
) -> None:
    # The server alone (no silo process pays for importing FedML): stock FedML's server would
    # wait for its silos forever.
    cfg = grpc_config(tmp_path)
    doc = yaml.safe_load(cfg.read_text())
    # Short: FedML's processes poll while they wait (both cores busy for the whole wait).
    doc["comm_args"]["grpc_server_wait"] = 4
    cfg.write_text(yaml.safe_dump(doc))
    procs = launch(started, tmp_path, cfg, [0])
    procs[0].wait(timeout=180)
    log = (tmp_path / "rank0.log").read_text()
    assert procs[0].returncode == 1, log[-3000:]
    ipconfig = tmp_path / "grpc_ipconfig.csv"
    assert re.search(
        rf"silo rank\(s\) \[1, 2\] of {re.escape(str(ipconfig))} did not come online "
        r"within 4 s",
        log,
    ), log[-3000:]
    assert "Communication round" not in log and "test_acc" not in log


def test_a_checkpoint_written_before_the_backend_field_still_resumes(tmp_path: Path) -> None:
    import torch

    from fl_adapters.checkpoint import Checkpoint, CheckpointError

    config = RunConfig(rounds=3).to_dict()
    old = {k: v for k, v in config.items() if k != "backend"}  # as written before the field
    ckpt = Checkpoint(config=old, round=1, model=torch.zeros(1), aggregator={}, participations={})
    ckpt.check_config(config, tmp_path / "checkpoint.pt")  # backend: mpi, the default: same run
    with pytest.raises(CheckpointError, match="seed: checkpoint 0, config 1"):
        ckpt.check_config(config | {"seed": 1}, tmp_path / "checkpoint.pt")


def test_metrics_rows_carry_astraea_mediators_and_fedml_accuracy(tmp_path: Path) -> None:

    from fl_adapters.fedml.runner import collect
    from fl_adapters.run.directory import RunFiles

    record = {"round": 1, "clients": [0], "weights": [1.0], "skipped": False, "rejected": []}
    astraea = record | {"mediators": [[2, 5]], "kl": [0.3]}
    (tmp_path / "aggregations.jsonl").write_text(json.dumps(astraea) + "\n")
    (tmp_path / "fedml.log").write_text("[INFO] {'test_acc': 0.25, 'test_loss': 2.0}\n")
    summary = collect(RunConfig(framework="fedml-cross-silo", rounds=1), RunFiles(tmp_path))
    (row,) = records(tmp_path / "metrics.jsonl")
    assert row["mediators"] == [[2, 5]] and row["mediator_kl"] == [0.3]
    assert row["test_accuracy"] == 0.25 and summary["final_accuracy"] == 0.25


def test_the_committed_shutdown_report_is_what_its_records_give() -> None:
    """benchmarks/results/grpc_shutdown.md, regenerated from its per-run records alone."""

    from fedbalance_benchmarks import grpc_shutdown as study

    records = [json.loads(p.read_text()) for p in sorted(study.RECORDS.glob("*.json"))]
    assert len(records) == 66  # 20 stock, fedbalance and stock-first runs, 3 per -late probe
    assert study.report(records) == study.REPORT.read_text()
