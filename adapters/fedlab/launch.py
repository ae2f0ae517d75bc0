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

from fl_adapters.config import ConfigError, RunConfig, RunFailed
from fl_adapters.processes import loopback_env, port_problem, watch
from fl_adapters.rundir import RunFiles
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
    from fl_adapters.checkpoint import Checkpoint

    path = RunFiles(out_dir).checkpoint
    ckpt = Checkpoint.load(path)
    ckpt.check_host("fedlab", path)
    ckpt.check_config(config.to_dict(), path)
    return ckpt


def run_distributed(
    config: RunConfig,
    out_dir: Path,
    client_processes: int = 2,
    config_path: Path | None = None,
    timeout: float = 3600,
    resume: bool = False,
) -> dict[str, Any]:
    """Launch one server and ``client_processes`` client processes on 127.0.0.1 and wait.

    If any process dies, the others are stopped and the error names the checkpoint of the
    last completed round; ``resume=True`` continues from it.
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
    procs = [("server", subprocess.Popen(server, env=env))]  # it aggregates and records
    procs += [
        (f"client process rank {r}", subprocess.Popen([*client, "--rank", str(r)], env=env))
        for r in range(1, world)
    ]
    failed = watch(procs, timeout)  # server first: its death explains the clients'
    if failed is not None:
        from fl_adapters.checkpoint import resume_hint

        raise RunFailed(f"fedlab-distributed: {failed}{resume_hint(out_dir)}")
    return json.loads(files.summary.read_text())
