"""``fedbalance run`` for FedML: writes the host's YAML and launches the bundled FedML example
(``fl_adapters/fedml/example/main.py``, a FedML script with no fedbalance import) in
the framework's mode, watched so that one dead process stops them all. The process counts, the
files it writes and how it resumes: docs/hosts/fedml.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from fl_adapters import autoload
from fl_adapters._training import evaluates
from fl_adapters.config import ConfigError, RunConfig
from fl_adapters.fedml.adapter import HOSTS, check_resume
from fl_adapters.fedml.ipconfig import require_grpcio, write_ipconfig
from fl_adapters.run.directory import RunFiles
from fl_adapters.run.lifecycle import RUN_TIMEOUT, failed, finish, open_for_resume
from fl_adapters.run.processes import (
    free_ports,
    loopback_env,
    loopback_preload,
    start_logged,
    stop,
    watch,
    with_preload,
)
from fl_aggregators.record import ENV, RUN_ENV

#: A round's bias figures in FedML's log (``fl_adapters.fedml.patches.sp.test_clients``).
FIGURES_LINE = r"fedbalance bias figures: (\{.*\})"
#: What the figures line carries beside the figures a row takes.
FIGURE_ONLY = ("accuracy", "loss", "client_accuracy")
#: ``framework`` -> FedML's ``(training_type, backend)`` (``backend: grpc`` changes the latter).
MODES = {host: mode for mode, host in HOSTS.items() if mode[1] != "GRPC"}
#: FedML's gRPC ranks import mpi4py (``fedml.utils.context`` and others), and mpi4py initialises
#: MPI on import: each process became a one-rank MPI world whose Open MPI helper (``orted``) and
#: TCP transport listened on every interface. Nothing uses MPI over gRPC, so it stays off.
NO_MPI = {"MPI4PY_RC_INITIALIZE": "false"}


def host_script(cfg_path: Path) -> list[str]:
    """The bundled FedML example (a host script with no fedbalance import) on ``cfg_path``."""
    main = Path(__file__).resolve().parent / "example" / "main.py"
    return [sys.executable, str(main), "--cf", str(cfg_path)]


def fedml_config(
    config: RunConfig, ipconfig: Path | None, checkpoint_dir: Path, resume: bool
) -> dict[str, Any]:
    """The FedML YAML (as a dict) for ``config`` (``ipconfig``: the gRPC ranks' file;
    ``checkpoint_dir``: where the server checkpoints, and with ``resume`` resumes from)."""
    training_type, backend = MODES[config.framework]
    if config.backend == "grpc":
        backend = "GRPC"
    common: dict[str, Any] = {
        "training_type": training_type,
        "random_seed": config.seed,
        "using_mlops": False,
    }
    device: dict[str, Any] = {"using_gpu": False, "gpu_id": 0}
    if backend in ("MPI", "GRPC"):
        device.update(worker_num=config.clients_per_round, gpu_mapping_key="mapping_default")
    doc: dict[str, Any] = {
        "common_args": common,
        "data_args": {
            "dataset": config.dataset,
            "data_cache_dir": config.data_dir or "/tmp/fedml_data",
            "partition_method": "homo",
            "partition_spec": config.partition,
        },
        "model_args": {"model": config.model},
        "train_args": {
            "federated_optimizer": "FedAvg",
            "aggregator": config.aggregator,
            "aggregator_args": config.aggregator_args,
            "client_id_list": "[]",
            "client_num_in_total": config.num_clients,
            "client_num_per_round": config.clients_per_round,
            "comm_round": config.rounds,
            "epochs": config.local_epochs,
            "batch_size": config.batch_size,
            "client_optimizer": config.optimizer,
            "learning_rate": config.lr,
            "weight_decay": 0.0,
            "checkpoint_dir": str(checkpoint_dir),
        },
        # fedbalance's keys, with the meaning they have on every host (FedML's own
        # frequency_of_the_test tests rounds 1, 1 + f, ...; adapter.evaluation).
        "validation_args": {
            "frequency_of_the_test": 1,
            "eval_every": config.eval_every,
            "eval_fraction": config.eval_fraction,
        },
        "device_args": device,
        "comm_args": {"backend": backend}
        | ({"is_mobile": 0} if backend == "MPI" else {})
        | ({"grpc_ipconfig_path": str(ipconfig)} if backend == "GRPC" else {}),
        "tracking_args": {"enable_tracking": False, "enable_wandb": False},
    }
    if config.max_samples is not None:
        doc["data_args"]["max_samples"] = config.max_samples
    if training_type == "cross_silo":
        common["scenario"] = "horizontal"
        doc["environment_args"] = {"bootstrap": ""}
    if resume:
        doc["train_args"]["resume_from"] = str(checkpoint_dir)
    return doc


def command(config: RunConfig, cfg_path: Path) -> list[str]:
    script = host_script(cfg_path)
    if config.framework == "fedml-sp":
        return script
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise FileNotFoundError(
            f"framework {config.framework} needs OpenMPI's mpirun (apt-get install openmpi-bin libopenmpi-dev)"
        )
    return [
        mpirun,
        *(["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        "--oversubscribe",
        "-np",
        str(config.clients_per_round + 1),
        # The ranks record to the run's copy (set by run_fedml) and to the user's file, if any.
        *(["-x", ENV] if ENV in os.environ else []),
        "-x",
        RUN_ENV,
        *script,
    ]


def run_fedml(
    config: RunConfig, out_dir: Path, timeout: float = RUN_TIMEOUT, resume: bool = False
) -> dict[str, Any]:
    started = time.monotonic()
    if autoload.disabled():
        # FedML's processes apply fedbalance only through the autoload: without it they would
        # train stock FedAvg under this config's aggregator name.
        raise ConfigError(
            f"{autoload.DISABLE_ENV}=1 keeps fedbalance out of FedML's processes, so "
            f"'fedbalance run' cannot apply {config.aggregator!r} there: unset it"
        )
    grpc = config.backend == "grpc"
    if grpc:
        require_grpcio()  # before anything is written or started
    out_dir = out_dir.resolve()
    files = RunFiles(out_dir)
    cfg_path, ipconfig = out_dir / "fedml.yaml", out_dir / "grpc_ipconfig.csv"
    doc = fedml_config(config, ipconfig if grpc else None, out_dir, resume)
    if resume:  # refuse a checkpoint this config cannot continue before anything changes
        check_resume(SimpleNamespace(**{k: v for part in doc.values() for k, v in part.items()}))
        keep_completed_rounds(config, files)
    out_dir.mkdir(parents=True, exist_ok=True)
    if grpc:
        write_ipconfig(ipconfig, free_ports(config.clients_per_round + 1))
    cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    record = files.record if resume else files.start(None)
    # Every rank on this machine, listening on loopback only (what the user set wins); the
    # user's FEDBALANCE_RECORD gets the record too.
    env = {**os.environ, **loopback_env(os.environ), RUN_ENV: str(record)}
    if grpc:
        # One torch thread each unless the user says otherwise (FedLab's cross-process launcher
        # does the same).
        run_grpc(config, files, cfg_path, {"OMP_NUM_THREADS": "1", **NO_MPI} | env, timeout)
        return collect(config, files, elapsed_s=time.monotonic() - started)
    log_path = out_dir / "fedml.log"
    # mpirun's own listener binds every interface whatever Open MPI is told: the shim binds it
    # (and anything else meant for every interface) to loopback.
    env = with_preload(env, loopback_preload())
    proc = start_logged(command(config, cfg_path), log_path, cwd=out_dir, env=env)  # and its ranks
    failure = watch([("FedML", proc)], timeout)
    if failure is not None:
        dead = mpi_casualty(log_path.read_text(errors="replace"))
        what = (
            f"{failure}{f' ({dead})' if dead else ''} after {progress(config, files)}"
            if failure.who is not None
            else f"FedML: {failure} (stopped after {progress(config, files)})"  # the deadline
        )
        raise failed(what, out_dir, log_path)
    return collect(config, files, elapsed_s=time.monotonic() - started)


def mpi_casualty(log: str) -> str | None:
    """What mpirun says killed the job (``process rank 1 exited on signal 9 (Killed)``)."""
    m = re.search(
        r"noticed that process rank (\d+) with PID \d+ on node \S+ exited on (signal \d+[^.\n]*)",
        log,
    )
    return f"process rank {m[1]} exited on {m[2].strip()}" if m else None


def keep_completed_rounds(config: RunConfig, files: RunFiles) -> None:
    """Before a resume: the stopped run's rows up to its checkpoint into ``metrics.jsonl``, its
    log set aside (``fedml.log.<N>``), its recorder lines after the checkpoint dropped."""
    done = open_for_resume(files.checkpoint, "fedml").round  # missing or foreign: a clear error
    clients = clients_so_far(config, files)
    rows = files.kept_rows(collect_rows(config, files), done)
    files.write_clients({r: a for r, a in clients.items() if r <= done})
    files.start(done)
    files.write_rows(rows)
    n = 1
    while (files.out / f"fedml.log.{n}").exists():
        n += 1
    for log in files.out.glob("fedml*.log"):
        log.rename(log.with_name(f"{log.name}.{n}"))


def progress(config: RunConfig, files: RunFiles) -> str:
    """``round 3 of 10`` (the last aggregation in the record) or ``no completed round``."""
    rounds = [agg["round"] for _, agg in files.aggregations()]
    return f"round {rounds[-1]} of {config.rounds}" if rounds else "no completed round"


def run_grpc(
    config: RunConfig, files: RunFiles, cfg_path: Path, env: dict[str, str], timeout: float
) -> None:
    """The server and every silo as separate processes over FedML's gRPC; one dies, all stop."""
    out_dir = files.out
    script = host_script(cfg_path)
    silos = range(1, config.clients_per_round + 1)
    names = {r: f"silo rank {r}" for r in silos} | {0: "server (rank 0)"}
    logs = {r: out_dir / (f"fedml-rank{r}.log" if r else "fedml.log") for r in names}
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        # Silos first: when a silo dies, the server's error (if it has one) comes second.
        for rank, name in names.items():
            argv = [*script, "--rank", str(rank), "--role", "client" if rank else "server"]
            procs.append((name, start_logged(argv, logs[rank], cwd=out_dir, env=env)))
    except BaseException:
        for _, proc in procs:
            stop(proc)
        raise
    failure = watch(procs, timeout)
    if failure is not None:
        dead = next((r for r, name in names.items() if name == failure.who), 0)
        others = [log for rank, log in logs.items() if rank != dead]
        raise failed(
            f"FedML cross-silo over gRPC: {failure} after {progress(config, files)}; every "
            "other process was stopped",
            out_dir,
            logs[dead],
            *others,
        )


def tested_rounds(first: int, rounds: int, every: int) -> list[int]:
    """The rounds (from 1) a FedML run that starts at round ``first`` tests: ``eval_every``'s,
    as on every host."""
    return [r for r in range(first, rounds + 1) if evaluates(r, every, rounds)]


def collect_rows(config: RunConfig, files: RunFiles) -> list[dict[str, Any]]:
    """Per-round rows: those kept from before a resume (``metrics.jsonl``), then the recorder's
    later rounds with FedML's logged test accuracy of each round it tested."""
    kept = files.rows()
    first = len(kept) + 1
    acc, figs = logged_tests(config, files, first)
    rows = files.aggregation_rows(first)
    for row in rows:
        if row["round"] in acc:
            row["test_accuracy"] = acc[row["round"]]
        if row["round"] in figs:  # the clients' test splits, as on every host
            fig = figs[row["round"]]
            row.update(test_accuracy=fig["accuracy"], test_loss=fig["loss"])
            row.update({k: v for k, v in fig.items() if k not in FIGURE_ONLY})
    return kept + rows


def logged_tests(
    config: RunConfig, files: RunFiles, first: int
) -> tuple[dict[int, float], dict[int, dict[str, Any]]]:
    """The test accuracy and the bias figures FedML's log holds for each round it tested from
    round ``first`` on (the log of a resumed run starts there)."""
    log = files.out / "fedml.log"
    text = log.read_text() if log.exists() else ""
    accs = [float(a) for a in re.findall(r"'test_acc': ([0-9.eE+-]+)", text)]
    figures = [json.loads(f) for f in re.findall(FIGURES_LINE, text)]
    tested = tested_rounds(first, config.rounds, config.eval_every)
    return dict(zip(tested, accs, strict=False)), dict(zip(tested, figures, strict=False))


def collect(config: RunConfig, files: RunFiles, elapsed_s: float | None = None) -> dict[str, Any]:
    """``metrics.jsonl`` and ``summary.json`` from the recorder and FedML's log (and the run's
    wall time, ``elapsed_s``, as the other hosts write it)."""
    clients = clients_so_far(config, files)
    rows = collect_rows(config, files)
    files.write_clients(clients)
    return finish(config, files, rows, elapsed_s)


def clients_so_far(config: RunConfig, files: RunFiles) -> dict[int, dict[str, float | None]]:
    """Each tested round's client accuracies: ``clients.jsonl``'s lines of the rounds kept
    before a resume, then FedML's log of this run."""
    first = len(files.rows()) + 1
    clients = {r: a for r, a in files.client_rows().items() if r < first}
    figs = logged_tests(config, files, first)[1]
    return clients | {r: f["client_accuracy"] for r, f in figs.items() if "client_accuracy" in f}
