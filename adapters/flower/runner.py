"""``fedbalance run`` on Flower, and a Flower app in the deployment engine on this machine.

:func:`run_flower` runs the bundled Flower app (``adapters/flower/app``) from a fedbalance
:class:`~fl_adapters.config.RunConfig`, each client one node holding its partition (docs/run.md).

:func:`run_deployment` starts ``flower-superlink`` and one ``flower-supernode`` per partition on
127.0.0.1 (free ports), submits the app with ``flwr run APP local-deployment --stream`` and
stops every process it started when the run ends, fails or overruns its deadline. The ``flwr``
command line reads the SuperLink's address from ``$FLWR_HOME/config.toml``; the runner writes
one in its own work directory, so the user's ``~/.flwr`` is never read or changed.

The deployment admits only what the runner started (docs/hosts/flower.md, "Who can join"),
with keys made for the run in ``WORK/keys`` (:mod:`fl_adapters.flower.pki`):

* every API of the SuperLink is served over TLS, with a certificate of the run's own CA;
* ``--enable-supernode-auth``: a SuperNode gets in only with a key the runner registered
  (``flwr supernode register``) before starting it, and signs every request with it;
* the Control API serves only the holder of the run's token
  (:mod:`fl_adapters.flower.superlink`), which only the runner's ``flwr`` has: no one else
  can start a run of another app, register a key, stop the run or read its logs;
* ``--isolation process``: the runner starts each ``flower-superexec`` with the run's secret,
  and the Runtime APIs give an app's task (the global model, a node's reply) to no one else;
* the ServerApp learns the registered node ids and their partitions (:data:`~fl_adapters.
  flower.membership.MEMBERS_ENV`), sends messages to those nodes only and refuses any other
  reply (:mod:`fl_adapters.flower.membership`).

Verified with flwr 1.41.0 and 1.42.0: the SuperLink serves the Fleet, Control and Runtime APIs
over HTTP(S) on one ``--port``; each SuperNode takes ``--superlink``, ``--node-config`` and its
own ``--port``; runtime dependency installation (``uv sync`` of the app's dependencies) is
turned off, since the app runs in the environment that started it.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_adapters.config import ConfigError, RunConfig
from fl_adapters.experiment import check
from fl_adapters.flower import checkpoint
from fl_adapters.flower.config import CHECKPOINT_KEY, EVAL_EVERY_KEY, EVAL_FRACTION_KEY, RESUME_KEY
from fl_adapters.flower.membership import MEMBERS_ENV, write_members
from fl_adapters.flower.pki import RunKeys, make_run_keys
from fl_adapters.flower.superlink import write_cli_credentials
from fl_adapters.run.directory import RunFiles
from fl_adapters.run.lifecycle import RUN_TIMEOUT, failed, finish, watched
from fl_adapters.run.processes import (
    free_ports,
    kill_all,
    matching,
    start_logged,
    stop,
    wait_listening,
    watch,
)
from fl_aggregators.record import RUN_ENV

log = logging.getLogger(__name__)

IP = "127.0.0.1"
FEDERATION = "local-deployment"


class DeploymentFailed(RuntimeError):
    """The deployment did not finish: a process died or the deadline passed."""


@dataclass
class Deployment:
    """What a deployment run left: its ports, keys, members (node id -> partition id), the
    processes' logs and the streamed log of ``flwr run``."""

    superlink_port: int
    supernode_ports: list[int]
    keys: RunKeys | None = None
    members: dict[int, int] = field(default_factory=dict)
    log: str = ""
    logs: dict[str, Path] = field(default_factory=dict)


def _bin(name: str) -> str:
    """A Flower command of this interpreter's environment (the venv that has flwr)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def run_deployment(
    app_dir: str | os.PathLike[str],
    workdir: str | os.PathLike[str],
    *,
    num_supernodes: int = 2,
    run_config: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    on_started: Callable[[Deployment], None] | None = None,
) -> Deployment:
    """Run ``app_dir`` once in a fresh local deployment and stop all of it.

    The deployment admits only its own members (see the module docstring): TLS with a
    certificate of the run's own CA, SuperNodes authenticated by keys the runner registered,
    the Control API behind the run's token, each app process run by a SuperExec holding the
    run's secret, and the strategy told which node serves which partition.

    Parameters
    ----------
    app_dir : the Flower app (a folder with ``pyproject.toml``).
    workdir : where ``FLWR_HOME``, the keys (``keys/``) and the processes' logs go.
    num_supernodes : SuperNodes to start; node ``i`` gets ``partition-id=i`` and
        ``num-partitions=num_supernodes``.
    run_config : ``--run-config`` overrides, e.g. ``["aggregator='fedloss'"]``.
    env : extra environment for every process (e.g. ``FEDBALANCE_RECORD``).
    timeout : seconds for the whole run, start-up included.
    on_started : called with the :class:`Deployment` once ``flwr run`` has been started
        (its ``keys`` and ``members`` filled in), while the run goes on.

    Raises
    ------
    DeploymentFailed
        A process died, a node could not be registered, ``flwr run`` failed, or the run
        overran ``timeout``; every process has been stopped and the message names the first
        failure and where its log is.
    """
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    port, *node_ports = free_ports(1 + num_supernodes, IP)
    keys = make_run_keys(work / "keys", num_supernodes)
    address = f"{IP}:{port}"
    home = work / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(  # the `flwr` CLI's SuperLink
        f'[superlink]\ndefault = "{FEDERATION}"\n\n'
        f'[superlink.{FEDERATION}]\naddress = "{address}"\n'
        f"root-certificates = {json.dumps(str(keys.ca_cert))}\n"
    )
    write_cli_credentials(home, address, keys.token())
    members_file = work / "members.json"
    members_file.unlink(missing_ok=True)  # written once this run's nodes are registered
    # Flower's processes start each other by name (the SuperLink runs `flower-superexec`, which
    # runs `flwr-serverapp`): this environment's commands come first on PATH.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    environ = {**os.environ, "FLWR_HOME": str(home), **(env or {}), "PATH": path}
    environ[MEMBERS_ENV] = str(members_file)
    dep = Deployment(port, node_ports, keys=keys)
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    helpers: set[int] = set()  # the processes Flower started below them

    def start(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        dep.logs[name] = work / f"{name.replace(' ', '-')}.log"
        log.info("starting %s: %s", name, shlex.join(argv))
        procs.append((name, start_logged(argv, dep.logs[name], env=environ, cwd=work)))
        return procs[-1][1]

    def superexec(name: str, runtime: list[str], parent: subprocess.Popen[bytes]) -> None:
        # Started by the runner, not by Flower's subprocess isolation: only then does the
        # Runtime API ask the SuperExec for the run's secret before handing it an app's task.
        start(
            name,
            [_bin("flower-superexec"), *runtime, "--superexec-auth-secret-file",
             str(keys.superexec_secret), "--parent-pid", str(parent.pid)],
        )  # fmt: skip

    deadline = time.monotonic() + timeout
    try:
        link = start(
            "superlink",
            [sys.executable, "-m", "fl_adapters.flower.superlink", str(keys.control_token),
             "--host", IP, "--port", str(port), "--ssl-ca-certfile", str(keys.ca_cert),
             "--ssl-certfile", str(keys.server_cert), "--ssl-keyfile", str(keys.server_key),
             "--enable-supernode-auth", "--isolation", "process", "--superexec-auth-secret-file",
             str(keys.superexec_secret), "--disable-runtime-dependency-installation"],
        )  # fmt: skip
        why = wait_listening(IP, port, min(60.0, timeout), proc=link)
        if why is not None:
            raise DeploymentFailed(f"flower-superlink {why}")
        superexec(
            "superlink superexec",
            ["--root-certificates", str(keys.ca_cert), "--runtime-api-address", address],
            link,
        )
        dep.members = register_nodes(keys, environ, work, deadline - time.monotonic())
        write_members(members_file, dep.members)
        for i, node_port in enumerate(node_ports):
            node = start(
                f"supernode {i}",
                [_bin("flower-supernode"), "--superlink", address, "--root-certificates",
                 str(keys.ca_cert), "--auth-supernode-private-key", str(keys.node_keys[i]),
                 "--node-config", f"partition-id={i} num-partitions={num_supernodes}",
                 "--host", IP, "--port", str(node_port), "--isolation", "process",
                 "--superexec-auth-secret-file", str(keys.superexec_secret)],
            )  # fmt: skip
            # A SuperNode's Runtime API serves plain HTTP on 127.0.0.1 (its callers sign)
            runtime = ["--insecure", "--runtime-api-address", f"{IP}:{node_port}"]
            superexec(f"supernode {i} superexec", runtime, node)
        argv = [_bin("flwr"), "run", str(Path(app_dir).resolve()), FEDERATION, "--stream"]
        for override in run_config:
            argv += ["--run-config", override]
        cli = start("flwr run", argv)
        if on_started is not None:
            on_started(dep)
        # The run is over when `flwr run` is; the SuperLink and SuperNodes never exit by
        # themselves. watch stops every process (and the helpers below them) either way.
        failed = watch(procs, deadline - time.monotonic(), until=cli, helpers=helpers)
        if failed is not None:
            if failed.who is None:  # the deadline
                raise DeploymentFailed(f"{failed} (logs in {work})")
            raise DeploymentFailed(f"{failed} during the run (log: {dep.logs[failed.who]})")
    finally:
        for _, proc in procs:  # a start-up that failed before watch
            helpers.update(stop(proc))
        _sweep({proc.pid for _, proc in procs} | helpers, [port, *node_ports])
    dep.log = dep.logs["flwr run"].read_text(errors="replace")
    return dep


def register_nodes(
    keys: RunKeys, environ: Mapping[str, str], work: Path, timeout: float
) -> dict[int, int]:
    """Register each SuperNode's public key with the SuperLink (``flwr supernode register``,
    as many at once as there are CPUs); node id -> partition id."""
    deadline = time.monotonic() + timeout
    todo = list(range(len(keys.node_keys)))
    running: list[tuple[int, subprocess.Popen[bytes]]] = []
    members: dict[int, int] = {}
    try:
        while todo or running:
            while todo and len(running) < max(2, os.cpu_count() or 1):
                i = todo.pop(0)
                argv = [_bin("flwr"), "supernode", "register", str(keys.node_public(i))]
                argv += [FEDERATION, "--format", "json"]
                pipe, both = subprocess.PIPE, subprocess.STDOUT
                proc = subprocess.Popen(argv, env=dict(environ), cwd=work, stdout=pipe, stderr=both)
                running.append((i, proc))
            i, proc = running[0]
            try:
                printed, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise DeploymentFailed(f"flwr supernode register of node {i} timed out") from None
            running.pop(0)
            members[_registered(i, printed.decode(errors="replace"))] = i
    finally:
        for _, proc in running:  # after a failure
            proc.kill()
            proc.wait()
    return members


def _registered(i: int, output: str) -> int:
    """The node id ``flwr supernode register --format json`` printed for node ``i``."""
    try:
        answer = json.loads(output[output.index("{") :])
        if answer.get("success"):
            return int(answer["node-id"])
    except (ValueError, KeyError, TypeError):
        pass
    raise DeploymentFailed(f"flwr supernode register of node {i} failed: {output.strip()}")


def _sweep(pids: set[int], ports: list[int], seconds: float = 10.0) -> None:
    """Kill what is left of a deployment: processes that name one of ``ports`` or a
    ``--parent-pid`` among ``pids`` on their command line. Flower starts some helpers
    detached (``flower-superexec``), and one was seen alive after its SuperLink or SuperNode
    was gone, on a loaded machine; they only exit by themselves once they notice."""
    deadline = time.monotonic() + seconds
    while True:
        marks = [f"{IP}:{p} " for p in ports] + [f"--parent-pid {p} " for p in sorted(pids)]
        left = matching(marks)
        if not left:
            return
        if time.monotonic() > deadline:
            log.warning("Flower processes %s outlived their deployment", left)
            return
        kill_all(left)
        pids |= set(left)  # and whatever they started
        time.sleep(0.2)


# -- fedbalance run ----------------------------------------------------------------------------
def app_values(config: RunConfig, out_dir: Path, resume: bool = False) -> dict[str, Any]:
    """``config`` as the app's run-config keys; the strategy checkpoints in ``out_dir`` and,
    with ``resume``, continues from the checkpoint there."""
    return {
        "aggregator": config.aggregator,
        "aggregator-args": json.dumps(config.aggregator_args, sort_keys=True),
        "seed": config.seed,
        "num-server-rounds": config.rounds,
        "num-partitions": config.num_clients,
        "clients-per-round": config.clients_per_round,
        "dataset": config.dataset,
        "data-dir": config.data_dir or "",
        "split": json.dumps(config.split),
        "partition": json.dumps(config.partition),
        "model": config.model,
        "local-epochs": config.local_epochs,
        "batch-size": config.batch_size,
        "optimizer": config.optimizer,
        "lr": config.lr,
        "max-samples": config.max_samples or 0,
        EVAL_EVERY_KEY: config.eval_every,
        EVAL_FRACTION_KEY: config.eval_fraction,
        "out-dir": str(out_dir / "app"),
        CHECKPOINT_KEY: str(out_dir),
        RESUME_KEY: str(out_dir) if resume else "",
    }


def check_simulation_env() -> None:
    """The simulation's environment switches, refused in one line before any process starts
    (the simulation process would refuse them too, but only into its log)."""
    from fl_adapters.flower.app import ACTORS_ENV, POLLING, POLLING_ENV, backend_config

    polling = os.environ.get(POLLING_ENV, POLLING[0])
    if polling not in POLLING:
        raise ConfigError(f"{POLLING_ENV} must be one of {', '.join(POLLING)}, got {polling!r}")
    try:
        backend_config(os.environ.get(ACTORS_ENV))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def run_flower(
    config: RunConfig, out_dir: Path, *, timeout: float = RUN_TIMEOUT, resume: bool = False
) -> dict[str, Any]:
    """Run ``config`` on Flower; ``metrics.jsonl`` and ``summary.json`` in ``out_dir``.

    The strategy checkpoints in ``out_dir`` after every round; ``resume`` continues from there
    (same config, ``rounds`` may grow), and a run that stops says which round it holds.
    """
    started = time.monotonic()
    check(config)  # dataset, partition and aggregator arguments, before any process starts
    from fl_adapters.flower.strategy import make_aggregator

    make_aggregator(config.aggregator, config.aggregator_args, mediated=True)  # before any process
    if config.framework == "flower":
        check_simulation_env()
    # Absolute: the ServerApp writes to it from Flower's own processes and working directory.
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    files = RunFiles(out_dir)
    values = app_values(config, out_dir, resume)
    if resume:  # a checkpoint this run cannot continue is refused before any process starts
        ckpt = checkpoint.load(out_dir, checkpoint.identity(values), config.rounds, partial=True)
        # The stopped run's metrics stay until the new rows replace them (collect): a resume
        # that fails inside Flower then changes nothing.
        record = files.start(ckpt.round)
    else:
        record = files.start(None)
        (out_dir / "app" / "summary.json").unlink(missing_ok=True)
    env = {RUN_ENV: str(record)}  # the user's FEDBALANCE_RECORD, inherited, gets it too
    # A file of TOML overrides: Flower splits ``key=value`` pairs with a regular expression that
    # cannot hold a JSON value's quotes and spaces. A JSON string or number is valid TOML.
    overrides = out_dir / "run_config.toml"
    overrides.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    if config.framework == "flower-deployment":
        import fl_adapters.flower.app as app  # its pyproject.toml ships with it

        work = out_dir / "deployment"
        try:
            run_deployment(
                Path(app.__file__).resolve().parent,
                work,
                num_supernodes=config.num_clients,
                run_config=[str(overrides)],
                env=env,
                timeout=timeout,
            )
        except DeploymentFailed as e:
            raise failed(f"Flower deployment: {e}", out_dir) from e  # e names the log
        log_path = work / "flwr-run.log"
    elif config.framework == "flower":
        argv = [sys.executable, "-m", "fl_adapters.flower.app.simulate"]
        argv += ["--num-supernodes", str(config.num_clients), "--run-config", str(overrides)]
        log_path = out_dir / "flower-simulation.log"
        proc = start_logged(argv, log_path, env={**os.environ, **env})  # Ray's in its group
        watched([("the Flower simulation", proc)], timeout, "flower", out_dir, [log_path])
    else:
        raise ConfigError(f"framework must be flower or flower-deployment, got {config.framework}")
    if not (out_dir / "app" / "summary.json").exists():
        # `flwr run` exits 0 whatever the ServerApp did (and a simulation may too): the app's
        # results are the proof it finished, its log says why not.
        raise failed(
            f"{config.framework}: the ServerApp ended without its results", out_dir, log_path
        )
    return collect(config, files, elapsed_s=time.monotonic() - started)


#: The bias figures (:mod:`fl_adapters.bias`) a row takes from the strategy's evaluate metrics.
BIAS_KEYS = (
    "balanced_accuracy", "class_recall", "worst_class", "worst_class_recall", "client_acc_mean",
    "client_acc_std", "client_acc_min", "client_acc_p10", "client_acc_p90", "clients_evaluated",
)  # fmt: skip


def collect(config: RunConfig, files: RunFiles, elapsed_s: float | None = None) -> dict[str, Any]:
    """Per-round rows from the aggregation record and the app's evaluation, and the summary.

    ``test_accuracy`` is Flower's federated evaluation of the rounds ``eval_every`` picks: the
    test splits of the clients ``eval_fraction`` draws (all by default), averaged by size --
    the FedLab runner's ``eval_data: clients``. The summary adds the run's wall time
    (``elapsed_s``, Flower's start-up included).
    """
    evaluate = json.loads((files.out / "app" / "summary.json").read_text())["evaluate"]
    rows = files.aggregation_rows()
    clients: dict[int, dict[str, float | None]] = {}
    for row in rows:
        metrics = evaluate.get(str(row["round"]))
        if metrics is not None:
            row.update(test_accuracy=metrics["eval_acc"], test_loss=metrics["eval_loss"])
            if "class_recall" in metrics:  # fedbalance's strategy, counts from the ClientApp
                row.update({k: metrics.get(k) for k in BIAS_KEYS})
            ids, accs = metrics.get("client_ids"), metrics.get("client_accuracy")
            if ids is not None and accs is not None:
                clients[row["round"]] = {str(c): a for c, a in zip(ids, accs, strict=True)}
    files.write_clients(clients)
    return finish(config, files, rows, elapsed_s)
