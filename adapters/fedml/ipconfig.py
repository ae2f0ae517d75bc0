"""FedML 0.9.6 cross-silo over its own gRPC backend: the ``grpc_ipconfig`` file and the checks.

FedML reads a CSV (``eid,rank,grpc_server_ip,grpc_server_port``, one row per rank, 0 = the
server) and checks none of it: a missing silo leaves the server waiting forever, and gRPC binds
with ``SO_REUSEPORT``, so a port still in use is shared silently (:func:`port_problem`).
:func:`check_grpc`, run in ``fedml.init()`` before FedML binds, turns each of these into an
error that names the file.
"""

from __future__ import annotations

import csv
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Moved to the host-free module (the Flower runner uses it too); kept importable from here.
from fl_adapters.run.processes import free_ports as free_ports
from fl_adapters.run.processes import port_problem as port_problem
from fl_adapters.run.processes import wait_listening
from fl_checks import ParameterError

log = logging.getLogger(__name__)

HEADER = ("eid", "rank", "grpc_server_ip", "grpc_server_port")


def read_ipconfig(path: str | Path) -> dict[int, tuple[str, int]]:
    """``{rank: (ip, port)}`` from a FedML gRPC ipconfig file; errors name the file and row."""
    path = Path(path)
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
            fieldnames = list(reader.fieldnames or ())
    except OSError as e:
        raise ParameterError(f"comm_args: grpc_ipconfig_path {path} cannot be read ({e})") from e
    missing = [h for h in HEADER if h not in fieldnames]
    if missing:
        raise ParameterError(
            f"{path}: a FedML gRPC ipconfig needs the header {','.join(HEADER)} and one row per "
            f"rank; missing column(s) {', '.join(missing)}"
        )
    out: dict[int, tuple[str, int]] = {}
    for line, row in enumerate(rows, start=2):
        try:
            eid, rank, port = int(row["eid"]), int(row["rank"]), int(row["grpc_server_port"])
        except (TypeError, ValueError) as e:
            raise ParameterError(f"{path} line {line}: eid, rank and port must be integers") from e
        if eid != rank:
            # FedML addresses a receiver by its rank but files rows under their eid.
            raise ParameterError(f"{path} line {line}: eid ({eid}) must equal rank ({rank})")
        if rank in out:
            raise ParameterError(f"{path} line {line}: rank {rank} is listed twice")
        if not 0 < port < 65536:
            raise ParameterError(
                f"{path} line {line}: grpc_server_port must be 1..65535, got {port}"
            )
        out[rank] = (str(row["grpc_server_ip"]), port)
    return out


def write_ipconfig(path: Path, ports: list[int], ip: str = "127.0.0.1") -> Path:
    """An ipconfig file for ranks ``0..len(ports)-1`` on ``ip`` (rank 0 = the server)."""
    lines = [",".join(HEADER)] + [f"{r},{r},{ip},{p}" for r, p in enumerate(ports)]
    path.write_text("\n".join(lines) + "\n")
    return path


def require_grpcio() -> None:
    """FedML 0.9.6 does not depend on grpcio; without it FedML fails at its first bind."""
    if importlib.util.find_spec("grpc") is None:
        raise ModuleNotFoundError(
            "FedML's gRPC backend needs grpcio, which FedML 0.9.6 does not install: "
            "pip install 'fedbalance[fedml]' (or 'grpcio>=1.59,<1.60', which works beside "
            "FedML's protobuf<4)"
        )


def role_given(argv: Sequence[str]) -> bool:
    """Whether the command line names ``--role``. FedML's own launch scripts start the server
    with ``--rank 0`` alone: ``fedml.init()`` leaves ``args.role`` at its default ``client`` and
    ``run_cross_silo_server()`` sets ``server`` only after it, where this check runs. So the
    rank decides the role unless ``--role`` was written, and a written one must agree."""
    return any(a == "--role" or a.startswith("--role=") for a in argv[1:])


def check_grpc(args: Any) -> None:
    """Before round 1: grpcio is installed, the ipconfig lists ranks 0..worker_num, this rank
    among them, and this rank's port is free. Every message about the file names it."""
    require_grpcio()
    path = getattr(args, "grpc_ipconfig_path", None)
    if not path:
        raise ParameterError(
            "FedML cross-silo over gRPC needs comm_args: grpc_ipconfig_path (a CSV with "
            f"{','.join(HEADER)}, one row per rank, 0 = the server)"
        )
    ranks = read_ipconfig(path)
    per_round = int(args.client_num_per_round)
    workers = getattr(args, "worker_num", None)
    if workers is None:
        raise ParameterError(
            f"FedML cross-silo over gRPC needs device_args: worker_num (= client_num_per_round "
            f"= {per_round}, the number of silos)"
        )
    workers = int(workers)
    if workers != per_round:
        raise ParameterError(
            f"FedML cross-silo: worker_num ({workers}) must equal client_num_per_round "
            f"({per_round}); every silo trains every round"
        )
    expected = list(range(workers + 1))
    if sorted(ranks) != expected:
        raise ParameterError(
            f"{path} lists ranks {sorted(ranks)}, but worker_num: {workers} needs exactly "
            f"worker_num + 1 = {workers + 1} ranks {expected} (0 = the server, one per silo)"
        )
    rank = int(getattr(args, "rank", 0))
    if rank not in ranks:
        raise ParameterError(
            f"this process has --rank {rank}, which {path} does not list (ranks {expected})"
        )
    role = str(getattr(args, "role", ""))
    if role_given(sys.argv) and (rank == 0) != (role == "server"):
        raise ParameterError(
            f"--rank {rank} --role {role}: rank 0 is the server (--role server), every other "
            "rank a silo (--role client)"
        )
    ip, port = ranks[rank]
    problem = port_problem(ip, port)
    if problem is not None:
        who = "the server" if rank == 0 else f"silo rank {rank}"
        raise ParameterError(
            f"{who}'s gRPC address {ip}:{port} (rank {rank} in {path}) {problem}; stop that "
            f"process or give rank {rank} another grpc_server_port in {path}"
        )


def wait_for_server(args: Any, poll: float = 0.5) -> None:
    """A silo's wait, before its first message, until the server's gRPC port accepts connections.

    FedML's silo sends its status once, when its own gRPC server is up; if the server is not
    listening yet, the send raises and the silo dies, while the server asks each silo once at
    its own start and then waits forever. Waiting here lets silos start before the server, as
    they do on separate machines. Up to ``grpc_server_wait`` seconds (default 600).
    """
    path = args.grpc_ipconfig_path
    ip, port = read_ipconfig(path)[0]
    limit = float(getattr(args, "grpc_server_wait", 600) or 600)
    why = wait_listening(
        ip,
        port,
        limit,
        poll,
        waiting=lambda: log.info(
            "fedbalance: waiting for the FedML server at %s:%d (%s)", ip, port, path
        ),
    )
    if why is not None:
        raise TimeoutError(
            f"silo rank {getattr(args, 'rank', '?')}: the server (rank 0 in {path}) {why}; "
            "start it with --rank 0 --role server, or check its address in the file"
        )


def expect_silos(manager: Any) -> None:
    """The server's deadline: every silo online within ``grpc_server_wait`` seconds (600).

    FedML's server asks each silo once at its start and otherwise waits for them forever, so a
    silo never started (one process too few) would hang the run before round 1. After the
    deadline the server stops, naming the ranks that never reported.
    """
    args = manager.args
    path = args.grpc_ipconfig_path
    limit = float(getattr(args, "grpc_server_wait", 600) or 600)

    def check() -> None:
        online = manager.client_online_mapping
        missing = [int(c) for c in manager.client_real_ids if not online.get(str(c), False)]
        if missing:
            message = (
                f"fedbalance: FedML server: silo rank(s) {missing} of {path} did not come online "
                f"within {limit:.0f} s; start each with --rank N --role client (or check that "
                "they can reach this server's address in the file). Stopping before round 1."
            )
            log.error(message)
            print(message, file=sys.stderr, flush=True)
            os._exit(1)  # FedML's message loop has no way out; nothing has trained yet

    timer = threading.Timer(limit, check)
    timer.daemon = True
    timer.start()
