"""Reliability under faults: stopped runs, killed processes, damaged checkpoints.

The faults section of the reliability report (:mod:`fedbalance_benchmarks.reliability`): small
runs on scikit-learn's digits that stop and resume a FedLab run, kill a FedLab client process
or a FedML rank mid-run and resume it with ``fedbalance run --resume``, and feed damaged or
tampered checkpoints to a resume. ``tests/test_resume.py`` and ``tests/test_fedml_resume.py``
run the same scenarios.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fedbalance_benchmarks._runs import path_slug
from fl_adapters.run.processes import proc_files


def fault_config(**overrides: Any) -> Any:
    """A small FedLab run on scikit-learn's digits (fast enough for CI)."""
    from fl_adapters.config import RunConfig

    base: dict[str, Any] = dict(
        framework="fedlab",
        dataset="digits",
        partition={"name": "label_dirichlet", "beta": 0.5},
        aggregator="fedavgm",
        aggregator_args={"beta": 0.9},
        num_clients=6,
        clients_per_round=3,
        rounds=5,
        local_epochs=1,
        batch_size=32,
        seed=5,
    )
    base.update(overrides)
    return RunConfig.from_dict(base)


def stop_and_resume(work: Path, config: Any, stop_after: int) -> dict[str, Any]:
    """Run straight through; run again stopping after ``stop_after`` rounds and resume."""
    import dataclasses

    from fl_adapters.checkpoint import Checkpoint
    from fl_adapters.fedlab.runner import run_standalone

    run_standalone(config, work / "straight", progress=False)
    run_standalone(dataclasses.replace(config, rounds=stop_after), work / "resumed", progress=False)
    run_standalone(config, work / "resumed", progress=False, resume=True)
    a = Checkpoint.load(work / "straight" / "checkpoint.pt")
    b = Checkpoint.load(work / "resumed" / "checkpoint.pt")
    return {
        "rounds": b.round,
        "identical": bool(torch.equal(a.model, b.model)) and a.participations == b.participations,
    }


def client_pids(config_path: Path) -> list[int]:
    """PIDs of the FedLab client processes of the run configured by ``config_path``."""
    want = str(config_path).encode()
    return [
        pid
        for pid, raw in proc_files("cmdline")
        if b"fedlab-client" in (cmd := raw.split(b"\0")) and want in cmd
    ]


def kill_client_and_resume(work: Path, config: Any, kill_after: int) -> dict[str, Any]:
    """A cross-process run whose first client process is SIGKILLed once ``kill_after`` rounds
    are done; then ``fedbalance run --resume``; then the same config straight through in the
    standalone pipeline, to compare final models."""
    import dataclasses
    import signal
    import subprocess

    import yaml

    from fl_adapters.checkpoint import Checkpoint
    from fl_adapters.fedlab.runner import run_standalone

    work.mkdir(parents=True, exist_ok=True)
    path = work / "run.yaml"
    path.write_text(
        yaml.safe_dump(dataclasses.replace(config, framework="fedlab-distributed").to_dict())
    )
    out = work / "out"
    cli = [sys.executable, "-m", "fl_adapters.cli", "run", str(path), "--out", str(out)]
    launcher = subprocess.Popen(cli, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= kill_after):
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            raise RuntimeError("the cross-process run ended before a client could be killed")
        time.sleep(0.1)
    victims = client_pids(path)
    os.kill(victims[0], signal.SIGKILL)
    _, err = launcher.communicate(timeout=300)
    lines = [x for x in err.splitlines() if "fedlab-distributed:" in x]
    survived = Checkpoint.load(out / "checkpoint.pt")
    leftover = len(client_pids(path))
    done = subprocess.run([*cli, "--resume"], capture_output=True, text=True, timeout=900)
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    run_standalone(
        dataclasses.replace(config, framework="fedlab"), work / "straight", progress=False
    )
    straight = Checkpoint.load(work / "straight" / "checkpoint.pt")
    resumed = Checkpoint.load(out / "checkpoint.pt")
    return {
        "client_processes": len(victims),
        "launcher_exit": launcher.returncode,
        "launcher_error": lines[-1] if lines else err.strip().splitlines()[-1:],
        "checkpoint_round": survived.round,
        "checkpoint_finite": bool(torch.isfinite(survived.model).all()),
        "processes_left": leftover,
        "resume_exit": done.returncode,
        "rounds": [r["round"] for r in rows],
        "participations_equal": resumed.participations == straight.participations,
        "max_abs_diff": float((resumed.model - straight.model).abs().max()),
    }


def fedml_pids(out: Path, rank: int | None = None) -> list[int]:
    """This FedML run's processes (their command line names ``out/fedml.yaml``); with ``rank``,
    the one that is that rank (an ``mpirun`` rank, or a gRPC process's ``--rank``)."""
    found = []
    for pid, raw in proc_files("cmdline"):
        cmd = raw.split(b"\0")
        if str(out / "fedml.yaml").encode() not in cmd:
            continue
        if rank is not None:
            grpc = b"--rank" in cmd and cmd[cmd.index(b"--rank") + 1] == str(rank).encode()
            if not grpc and f"OMPI_COMM_WORLD_RANK={rank}".encode() not in _environ(pid):
                continue
        found.append(pid)
    return found


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # it ended meanwhile
        return []


def fedml_kill(
    out: Path, config: Any, rank: int, kill_after: int = 1, *, resume: bool = False
) -> dict[str, Any]:
    """A FedML run (``fedbalance run``'s launcher; ``resume``: one resuming ``out``'s
    checkpoint) whose process ``rank`` is SIGKILLed once the server's checkpoint holds
    ``kill_after`` rounds. Times the stop (kill to launcher return)."""
    import signal
    import threading

    from fl_adapters.checkpoint import Checkpoint, CheckpointError
    from fl_adapters.fedml.runner import run_fedml

    result: dict[str, Any] = {}

    def run() -> None:
        try:
            run_fedml(config, out, timeout=600, resume=resume)
        except Exception as e:  # noqa: BLE001 (handed to the caller's thread)
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 600
    path, read = out / "checkpoint.pt", None  # read: the (mtime, size) last read, read once
    while True:
        try:
            stat = path.stat()
            version = (stat.st_mtime_ns, stat.st_size)
            if version != read:
                if Checkpoint.load(path).round >= kill_after:
                    break
                read = version
        except (FileNotFoundError, CheckpointError):
            pass
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the FedML run ended before rank {rank} could be killed: {result}")
        time.sleep(0.05)
    (victim,) = fedml_pids(out, rank)
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    thread.join(timeout=120)
    return {
        "error": str(result.get("error", "")),
        "stopped": not thread.is_alive(),
        "stop_s": time.monotonic() - killed,
        "processes_left": len(fedml_pids(out)),
        "checkpoint_round": Checkpoint.load(out / "checkpoint.pt").round,
    }


def fedml_kill_and_resume(
    out: Path, config: Any, rank: int, kill_after: int = 1, more_rounds: int | None = None
) -> dict[str, Any]:
    """:func:`fedml_kill`, then ``resume`` (``more_rounds`` past the checkpoint; by default to
    the config's rounds). Times the stop and the resumed run."""
    import dataclasses

    from fl_adapters.fedml.runner import run_fedml

    got = fedml_kill(out, config, rank, kill_after)
    recorded = len((out / "aggregations.jsonl").read_text().splitlines())
    survived = got["checkpoint_round"]
    started = time.monotonic()
    rounds = config.rounds if more_rounds is None else survived + more_rounds
    resumed = dataclasses.replace(config, rounds=rounds)
    summary = run_fedml(resumed, out, resume=True, timeout=600)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        **got,
        "rounds_lost": recorded - survived,
        "resume_s": time.monotonic() - started,
        "rounds": [r["round"] for r in rows],
        "final_accuracy": summary["final_accuracy"],
    }


class Exploit:
    """A pickle that runs ``touch marker`` when unpickled: loading must refuse it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def damaged_checkpoints(work: Path) -> list[list[str]]:
    """Resume from a damaged or tampered checkpoint: the error each gives."""
    import dataclasses

    from fl_adapters.checkpoint import CheckpointError
    from fl_adapters.fedlab.runner import run_standalone

    config = fault_config(rounds=1)
    rows = []
    for damage in (
        "random bytes",
        "truncated",
        "pickle that runs a command",
        "another run's config",
    ):
        out = work / path_slug(damage)
        run_standalone(config, out, progress=False)
        path = out / "checkpoint.pt"
        resume_with = dataclasses.replace(config, rounds=2)
        if damage == "random bytes":
            path.write_bytes(os.urandom(4096))
        elif damage == "truncated":
            path.write_bytes(path.read_bytes()[:700])
        elif damage == "pickle that runs a command":
            torch.save({"format": "fedbalance-checkpoint", "x": Exploit(work / "pwned")}, path)
        else:
            resume_with = dataclasses.replace(resume_with, aggregator="fedloss", aggregator_args={})
        try:
            run_standalone(resume_with, out, progress=False, resume=True)
            outcome = "resumed (not expected)"
        except CheckpointError as e:
            outcome = str(e).replace(str(out), "OUT")[:160]
        ran = (work / "pwned").exists()
        rows.append(
            [
                damage,
                "clear error" if "not expected" not in outcome else "-",
                "yes" if ran else "no",
                outcome,
            ]
        )
    return rows


def faults(
    work: Path, processes: bool = True
) -> tuple[list[list[str]], list[list[str]], dict[str, Any]]:
    """Stop/resume, and (``processes``) killed processes in FedLab's and FedML's modes. The
    quick run leaves the killed processes to ``tests/test_resume.py`` and
    ``tests/test_fedml_resume.py``, which run the same scenarios."""
    rows = []
    for agg, model, args in (
        ("fedavgm", "thesis_cnn", {"beta": 0.9}),
        ("fedloss", "thesis_cnn", {}),
        ("astraea", "astraea_cnn", {"gamma": 2}),
    ):
        got = stop_and_resume(
            work / f"resume-{agg}",
            fault_config(aggregator=agg, model=model, aggregator_args=args),
            2,
        )
        rows.append(
            [
                "run stopped after round 2, resumed",
                f"standalone, {agg}, 5 rounds",
                f"ran to round {got['rounds']}",
                "final model bit-identical to the uninterrupted run"
                if got["identical"]
                else "final model DIFFERS from the uninterrupted run",
            ]
        )
    if not processes:
        return rows, damaged_checkpoints(work / "damaged"), {}
    from fl_adapters.run.processes import free_ports

    (port,) = free_ports(1)
    kill = kill_client_and_resume(work / "kill", fault_config(port=port), kill_after=2)
    rows.append(
        [
            "client process killed (SIGKILL) mid-run",
            "FedLab cross-process, 2 client processes, fedavgm, 5 rounds, kill after round 2",
            f"launcher exit {kill['launcher_exit']}, {kill['processes_left']} processes left:"
            f' "{kill["launcher_error"]}"'.replace(str(work), "WORK"),
            f"checkpoint of round {kill['checkpoint_round']} (finite: {kill['checkpoint_finite']});"
            f" `--resume` exit {kill['resume_exit']}, rounds {kill['rounds'][0]}..{kill['rounds'][-1]};"
            f" final model vs uninterrupted standalone run: max |Δ| {kill['max_abs_diff']:.1e}"
            f" (update arrival order only)",
        ]
    )
    for framework, backend, rank, what in (
        ("fedml-mpi", "mpi", 1, "MPI simulation rank 1 (a worker)"),
        ("fedml-cross-silo", "grpc", 2, "gRPC cross-silo silo 2"),
        ("fedml-cross-silo", "grpc", 0, "gRPC cross-silo server"),
    ):
        config = fault_config(framework=framework, backend=backend, clients_per_round=2, rounds=5)
        got = fedml_kill_and_resume(work / f"fedml-{framework}-{backend}-{rank}", config, rank, 2)
        kill.setdefault("fedml", []).append({"what": what, **got})
        error = got["error"].replace(str(work), "WORK").split("; see ")[0]
        rows.append(
            [
                f"FedML: {what} killed (SIGKILL) mid-run",
                f"{framework} ({backend}), fedavgm, 2 of 6 clients a round, 5 rounds, kill"
                " after round 2",
                f"stopped in {got['stop_s']:.1f} s, {got['processes_left']} processes left:"
                f' "{error}"',
                f"checkpoint of round {got['checkpoint_round']}, {got['rounds_lost']} aggregated"
                f" round(s) lost; `--resume` ran rounds {got['checkpoint_round'] + 1}..{got['rounds'][-1]}"
                f" in {got['resume_s']:.1f} s",
            ]
        )
    return rows, damaged_checkpoints(work / "damaged"), kill
