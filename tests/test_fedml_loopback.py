"""What a run that ``fedbalance run`` starts listens on, read from ``/proc`` while it trains
(issue #61: FedLab's rendezvous store and FedML's MPI listeners were on every interface).

A check lists the listening TCP sockets of every process below it until the first round is
recorded (by then every rank is up) and checks the addresses. :func:`listeners_of_a_run` starts
a run of its own (tests/test_fedlab.py); FedML's checks ride on the runs that
tests/test_fedml_resume.py starts anyway, through :class:`Listeners` and :func:`check_fedml_mpi`
and :func:`check_fedml_grpc` (each FedML start costs a process per rank).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from fl_adapters.run.processes import descendants, is_loopback, listening, stop

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/net/tcp").exists(), reason="reads listening sockets from Linux /proc"
)

#: Open MPI 4.1's launcher, whose out-of-band listener binds every interface whatever any MCA
#: parameter says (docs/hosts/fedml.md, "What listens where").
MPIRUN = "mpirun"


def listeners_of_a_run(
    tmp_path: Path, config: dict[str, object], timeout: float = 120
) -> tuple[dict[tuple[str, str, int], int], float]:
    """``fedbalance run`` on ``config``, watched until its first round is recorded (or it
    ends): ``{(process name, address, port): pid}`` of every socket its processes listened
    on, and the seconds it took. Fails if the run failed or no round came."""
    cfg, out = tmp_path / "run.yaml", tmp_path / "out"
    cfg.write_text(yaml.safe_dump(config))
    log = tmp_path / "run.log"
    argv = [sys.executable, "-m", "fl_adapters.cli", "run", str(cfg), "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    start = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [*argv, "--no-progress"], stdout=fh, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    seen: dict[tuple[str, str, int], int] = {}
    record = out / "aggregations.jsonl"
    try:
        while proc.poll() is None and time.monotonic() - start < timeout:
            for pid, ip, port in listening([proc.pid, *descendants(proc.pid)]):
                try:
                    name = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    continue
                seen[(name, ip, port)] = pid
            if record.exists() and record.read_text().strip():
                break  # round 1 aggregated: every rank has been up for a while
            time.sleep(0.2)
    finally:
        stop(proc)  # the run, and whatever it started
    text = log.read_text(errors="replace")
    assert record.exists() and record.read_text().strip(), text[-3000:]
    return seen, time.monotonic() - start


def exposed(seen: dict[tuple[str, str, int], int]) -> list[tuple[str, str, int]]:
    return sorted(key for key in seen if not is_loopback(key[1]))


class Listeners:
    """The TCP sockets every process below this one listens on (``{(process name, address,
    port): pid}``), polled on a thread from entering until ``record`` holds a line (the first
    round aggregated: every rank has been up for a while); ``first_round_s`` says when."""

    def __init__(self, record: Path, timeout: float = 120) -> None:
        self.record, self.timeout = record, timeout
        self.seen: dict[tuple[str, str, int], int] = {}
        self.first_round_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="listeners", daemon=True)

    def __enter__(self) -> Listeners:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        me = os.getpid()
        while not self._stop.is_set() and time.monotonic() - self._start < self.timeout:
            for pid, ip, port in listening(descendants(me)):
                try:
                    name = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    continue
                self.seen[(name, ip, port)] = pid
            if self.record.exists() and self.record.read_text().strip():
                self.first_round_s = time.monotonic() - self._start
                return
            time.sleep(0.2)


def check_fedml_grpc(watch: Listeners, out: Path) -> None:
    """FedML over gRPC: each rank's gRPC port on 127.0.0.1 and nothing else. (FedML's imports
    of mpi4py used to make every rank a one-rank MPI world whose ``orted`` and TCP transport
    listened on 0.0.0.0 and [::].)"""
    seen = watch.seen
    assert watch.first_round_s is not None and watch.first_round_s < 60, watch.first_round_s
    assert exposed(seen) == [], seen
    assert {name for name, _, _ in seen} == {"python"}, seen  # no orted, no mpirun
    ports = {int(line.rsplit(",", 1)[1]) for line in
             (out / "grpc_ipconfig.csv").read_text().splitlines()[1:]}  # fmt: skip
    assert ports <= {port for _, _, port in seen}, seen  # the three gRPC servers were seen


def check_fedml_mpi(watch: Listeners) -> None:
    """FedML over MPI: the ranks listen on nothing (shared memory between them; the TCP
    transport listened on 0.0.0.0 and [::]), and mpirun's own out-of-band listener, which Open
    MPI 4.1 binds to every interface whatever it is told, is on loopback too (the bind shim,
    ``loopback_preload``)."""
    seen = watch.seen
    assert watch.first_round_s is not None and watch.first_round_s < 60, watch.first_round_s
    assert exposed(seen) == [], seen
    assert {name for name, _, _ in seen} <= {MPIRUN}, seen  # the ranks listen on nothing
    assert any(name == MPIRUN for name, _, _ in seen), seen  # mpirun's listener was seen


def test_without_a_compiler_the_shim_is_none_and_says_what_stays_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from fl_adapters.run import processes

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc
    assert processes.loopback_preload.__wrapped__() is None
    assert "no C compiler" in caplog.text and "every interface" in caplog.text


def test_the_shim_binds_every_interface_to_loopback(tmp_path: Path) -> None:
    """A process that binds 0.0.0.0 and [::] under the shim listens on 127.0.0.1 and [::1];
    a bind to a named address is left alone."""
    from fl_adapters.run import processes

    library = processes.loopback_preload.__wrapped__()
    if library is None:
        pytest.skip("no C compiler")
    probe = (
        "import socket\n"
        "for family, host in ((socket.AF_INET, '0.0.0.0'), (socket.AF_INET6, '::'),"
        " (socket.AF_INET, '127.0.0.1')):\n"
        "    s = socket.socket(family); s.bind((host, 0)); print(s.getsockname()[0])\n"
    )
    env = processes.with_preload(os.environ, library)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["127.0.0.1", "::1", "127.0.0.1"]
