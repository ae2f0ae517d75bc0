"""The launcher of a cross-process FedLab run: starts the server and the client processes on
127.0.0.1 and watches them.

It imports neither FedLab nor torch (a checkpoint is read only to resume, or to name it in an
error), so the ``fedbalance run`` process that only waits stays light; the processes it starts
run :func:`fl_adapters.fedlab.runner.run_server` and :func:`~fl_adapters.fedlab.runner.run_client`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fl_adapters.config import ConfigError, RunConfig
from fl_adapters.run.directory import RunFiles
from fl_adapters.run.lifecycle import RUN_TIMEOUT, open_for_resume, watched
from fl_adapters.run.processes import loopback_env, port_problem, start_logged, stop
from fl_checks import ParameterError

if TYPE_CHECKING:
    from fl_adapters.checkpoint import Checkpoint

#: Where the server listens: every process runs on this machine.
HOST = "127.0.0.1"


def check_processes(config: RunConfig, client_processes: int) -> None:
    """A cross-process run needs 1 <= client processes <= num_clients (each holds a client)."""
    if not 1 <= client_processes <= config.num_clients:
        raise ParameterError(
            f"a cross-process run needs between 1 and num_clients={config.num_clients} client "
            f"processes (each simulates at least one client), got {client_processes}"
        )


def check_port(config: RunConfig, host: str = HOST) -> None:
    """The server's port, free on ``host`` before any process starts: FedLab's server would
    otherwise die in its rendezvous (torch gives up after its own retries) and the clients wait
    for it."""
    problem = port_problem(host, config.port)
    if problem is not None:
        raise ConfigError(
            f"fedlab-distributed: port {config.port} on {host} {problem}; stop that process "
            "or set another port: in the config"
        )


def load_checkpoint(config: RunConfig, out_dir: Path) -> Checkpoint:
    """The checkpoint in ``out_dir``, checked against ``config``."""

    path = RunFiles(out_dir).checkpoint
    return open_for_resume(path, "fedlab", config.to_dict())


def run_distributed(
    config: RunConfig,
    out_dir: Path,
    client_processes: int = 2,
    config_path: Path | None = None,
    timeout: float = RUN_TIMEOUT,
    resume: bool = False,
) -> dict[str, Any]:
    """Launch one server and ``client_processes`` client processes on 127.0.0.1 and wait.

    Each process logs to its own file in ``out_dir`` (``fedlab-server.log``,
    ``fedlab-client-rank<R>.log``). If any process dies, the others are stopped and the error
    names its log and the checkpoint of the last completed round; ``resume=True`` continues
    from it.
    """
    check_processes(config, client_processes)
    check_port(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = RunFiles(out_dir)
    if resume:
        load_checkpoint(config, out_dir)  # refused before any process starts
    if config_path is None:
        import yaml

        config_path = out_dir / "config.yaml"
        config_path.write_text(yaml.safe_dump(config.to_dict()))
    world = client_processes + 1
    # One torch thread a process; gloo's sockets on loopback unless the user has chosen.
    env = {**os.environ, "OMP_NUM_THREADS": "1", **loopback_env(os.environ)}
    base = [sys.executable, "-m", "fl_adapters.cli"]
    server = [*base, "fedlab-server", str(config_path), "--out", str(out_dir)]
    server += ["--world-size", str(world), "--no-progress"]
    client = [*base, "fedlab-client", str(config_path), "--world-size", str(world)]
    if resume:
        server.append("--resume")
        client += ["--resume-from", str(files.checkpoint)]
    logs = [out_dir / "fedlab-server.log"]
    logs += [out_dir / f"fedlab-client-rank{r}.log" for r in range(1, world)]
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        procs.append(("server", start_logged(server, logs[0], env=env)))  # aggregates, records
        for r in range(1, world):
            argv = [*client, "--rank", str(r)]
            procs.append((f"client process rank {r}", start_logged(argv, logs[r], env=env)))
    except BaseException:
        for _, proc in procs:
            stop(proc)
        raise
    watched(procs, timeout, "fedlab-distributed", out_dir, logs)  # server first: it explains
    return json.loads(files.summary.read_text())
