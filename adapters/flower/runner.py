"""A Flower app in Flower's deployment engine on this machine: SuperLink, SuperNodes, ``flwr run``.

:func:`run_deployment` starts ``flower-superlink`` and one ``flower-supernode`` per partition on
127.0.0.1 (free ports, no TLS), submits the app with ``flwr run APP local-deployment --stream``
and stops every process it started when the run ends, fails or overruns its deadline. The
``flwr`` command line reads the SuperLink's address from ``$FLWR_HOME/config.toml``; the runner
writes one in its own work directory, so the user's ``~/.flwr`` is never read or changed.

Verified with flwr 1.41.0: the SuperLink serves the Fleet and Control APIs over HTTP on one
``--port``; each SuperNode takes ``--superlink``, ``--node-config`` and its own ``--port``;
runtime dependency installation (``uv sync`` of the app's dependencies) is turned off, since
the app runs in the environment that started it.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fl_adapters.processes import descendants, exit_reason, free_ports, kill_all, stop

log = logging.getLogger(__name__)

IP = "127.0.0.1"
FEDERATION = "local-deployment"


class DeploymentFailed(RuntimeError):
    """The deployment did not finish: a process died or the deadline passed."""


@dataclass
class Deployment:
    """What a finished deployment run left: its ports, work directory and the streamed log."""

    superlink_port: int
    supernode_ports: list[int]
    workdir: Path
    log: str = ""
    seconds: float = 0.0
    logs: dict[str, Path] = field(default_factory=dict)


def _bin(name: str) -> str:
    """A Flower command of this interpreter's environment (the venv that has flwr)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def write_cli_config(home: Path, port: int) -> Path:
    """``$FLWR_HOME/config.toml`` pointing the ``flwr`` CLI at the SuperLink on ``port``."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.toml"
    path.write_text(
        f'[superlink]\ndefault = "{FEDERATION}"\n\n'
        f'[superlink.{FEDERATION}]\naddress = "{IP}:{port}"\ninsecure = true\n'
    )
    return path


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float, who: str) -> None:
    """Until ``IP:port`` accepts connections; an error if ``proc`` dies or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((IP, port), timeout=1):
                return
        except OSError:
            if proc.poll() is not None:
                raise DeploymentFailed(f"{who} {exit_reason(proc.returncode)}") from None
            if time.monotonic() > deadline:
                raise DeploymentFailed(
                    f"{who} did not listen on {IP}:{port} within {timeout:.0f} s"
                ) from None
            time.sleep(0.2)


def run_deployment(
    app_dir: str | os.PathLike[str],
    workdir: str | os.PathLike[str],
    *,
    num_supernodes: int = 2,
    run_config: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> Deployment:
    """Run ``app_dir`` once in a fresh local deployment and stop all of it.

    Parameters
    ----------
    app_dir : the Flower app (a folder with ``pyproject.toml``).
    workdir : where ``FLWR_HOME`` and the processes' logs go.
    num_supernodes : SuperNodes to start; node ``i`` gets ``partition-id=i`` and
        ``num-partitions=num_supernodes``.
    run_config : ``--run-config`` overrides, e.g. ``["aggregator='fedloss'"]``.
    env : extra environment for every process (e.g. ``FEDBALANCE_RECORD``).
    timeout : seconds for the whole run, start-up included.

    Raises
    ------
    DeploymentFailed
        A process died, ``flwr run`` failed, or the run overran ``timeout``; every process
        has been stopped and the message names the first failure and where its log is.
    """
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    port, *node_ports = free_ports(1 + num_supernodes, IP)
    home = work / "flwr-home"
    write_cli_config(home, port)
    # Flower's processes start each other by name (the SuperLink runs `flower-superexec`, which
    # runs `flwr-serverapp`): this environment's commands come first on PATH.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    environ = {**os.environ, "FLWR_HOME": str(home), **(env or {}), "PATH": path}
    dep = Deployment(port, node_ports, work)
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    handles = []

    def start(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        out = work / f"{name.replace(' ', '-')}.log"
        dep.logs[name] = out
        handle = open(out, "wb")  # noqa: SIM115 - closed in the finally below
        handles.append(handle)
        log.info("starting %s: %s", name, shlex.join(argv))
        proc = subprocess.Popen(
            argv, env=environ, cwd=work, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,  # stop() kills the group: Flower's app subprocesses too
        )  # fmt: skip
        procs.append((name, proc))
        return proc

    started = time.monotonic()
    deadline = started + timeout
    try:
        link = start(
            "superlink",
            [_bin("flower-superlink"), "--insecure", "--host", IP, "--port", str(port),
             "--disable-runtime-dependency-installation"],
        )  # fmt: skip
        wait_for_port(port, link, min(60.0, timeout), "flower-superlink")
        for i, node_port in enumerate(node_ports):
            start(
                f"supernode {i}",
                [_bin("flower-supernode"), "--insecure", "--superlink", f"{IP}:{port}",
                 "--node-config", f"partition-id={i} num-partitions={num_supernodes}",
                 "--host", IP, "--port", str(node_port)],
            )  # fmt: skip
        argv = [_bin("flwr"), "run", str(Path(app_dir).resolve()), FEDERATION, "--stream"]
        for override in run_config:
            argv += ["--run-config", override]
        cli = start("flwr run", argv)
        while cli.poll() is None:
            dead = [(n, p) for n, p in procs if p is not cli and p.poll() is not None]
            if dead:
                name, proc = dead[0]
                raise DeploymentFailed(
                    f"{name} {exit_reason(proc.returncode)} during the run (log: {dep.logs[name]})"
                )
            if time.monotonic() > deadline:
                raise DeploymentFailed(
                    f"the run did not finish within {timeout:.0f} s (logs in {work})"
                )
            time.sleep(0.2)
        if cli.returncode != 0:
            raise DeploymentFailed(
                f"flwr run {exit_reason(cli.returncode)} (log: {dep.logs['flwr run']})"
            )
    finally:
        # The SuperLink's flower-superexec (and the ServerApp under it) run in a session of
        # their own; they exit when the SuperLink dies, but are listed to make sure.
        helpers = [pid for _, proc in procs for pid in descendants(proc.pid)]
        for _, proc in reversed(procs):
            stop(proc)
        kill_all(helpers)
        for handle in handles:
            handle.close()
        dep.seconds = time.monotonic() - started
    dep.log = dep.logs["flwr run"].read_text(errors="replace")
    return dep
