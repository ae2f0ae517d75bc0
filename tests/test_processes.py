"""The one supervisor of a run's processes (``fl_adapters.run.processes.watch``) and the one wait
for a server's port (``wait_listening``), on real processes and sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fl_adapters.run import processes
from fl_adapters.run.processes import free_ports, wait_listening, watch


def python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_every_process_ending_well_is_a_good_run() -> None:
    procs = [("server", python("pass")), ("client process rank 1", python("pass"))]
    assert watch(procs, timeout=60, poll=0.05) is None


def test_the_first_death_in_order_is_named_and_the_survivors_are_stopped() -> None:
    server = python("import time; time.sleep(60)")
    procs = [("server", server), ("client process rank 2", python("raise SystemExit(3)"))]
    started = time.monotonic()
    failed = watch(procs, timeout=60, poll=0.05)
    assert failed == "client process rank 2 exited with code 3"
    assert failed is not None and failed.who == "client process rank 2"
    assert time.monotonic() - started < 30 and server.returncode == -9


def test_a_killed_process_is_worded_by_its_signal() -> None:
    victim = python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert (
        watch([("silo rank 1", victim)], 60, 0.05) == "silo rank 1 was killed by signal 9 (SIGKILL)"
    )


def test_the_deadline_stops_everything() -> None:
    slow = python("import time; time.sleep(60)")
    failed = watch([("server", slow)], timeout=0.3, poll=0.05)
    assert failed == "the run did not finish within 0.3 s"
    assert failed is not None and failed.who is None  # nobody died: the deadline
    assert slow.returncode == -9


def test_until_ends_the_run_with_its_client_and_stops_the_servers_and_their_helpers() -> None:
    # A server that starts a helper in a session of its own (as Flower's SuperLink does),
    # out of reach of a process-group kill, and never exits by itself.
    code = (
        "import subprocess, sys, time; "
        "h = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "start_new_session=True); print(h.pid, flush=True); time.sleep(60)"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    assert server.stdout is not None
    helper = int(server.stdout.readline())
    client = python("import time; time.sleep(0.2)")
    found: set[int] = set()
    procs = [("server", server), ("client", client)]
    assert watch(procs, 60, 0.05, until=client, helpers=found) is None
    assert client.returncode == 0 and server.returncode == -9
    assert helper in found
    deadline = time.monotonic() + 10
    while alive(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(helper)


def test_the_wait_for_a_port_ends_when_it_listens_and_says_once_that_it_waits() -> None:
    (port,) = free_ports(1)
    waits: list[int] = []
    with socket.socket() as server:

        def listen() -> None:
            time.sleep(0.5)
            server.bind(("127.0.0.1", port))
            server.listen()

        threading.Thread(target=listen).start()
        assert wait_listening("127.0.0.1", port, 30, 0.05, waiting=lambda: waits.append(1)) is None
        assert waits == [1]  # once, though it tried several times
        assert wait_listening("127.0.0.1", port, 30, waiting=lambda: waits.append(1)) is None
        assert waits == [1]  # listening at the first try: no wait to report


def test_the_wait_for_a_port_names_a_dead_server_or_the_deadline() -> None:
    (port,) = free_ports(1)
    dead = python("raise SystemExit(3)")
    assert wait_listening("127.0.0.1", port, 30, 0.05, proc=dead) == "exited with code 3"
    slow = python("import time; time.sleep(60)")
    try:
        why = wait_listening("127.0.0.1", port, 0.3, 0.05, proc=slow)
        assert why == f"did not listen on 127.0.0.1:{port} within 0.3 s"
    finally:
        slow.kill()
        slow.wait()


def test_ports_handed_out_are_not_handed_out_again_while_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs started at the same instant scan from the same offset; the claims file keeps
    the second from getting the first one's ports before either server has bound them."""
    monkeypatch.setattr(processes.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(processes.time, "monotonic_ns", lambda: 10**9)
    first, second = free_ports(3), free_ports(3)
    assert len(set(first) | set(second)) == 6
    claims = (tmp_path / f"fedbalance-port-claims-{os.getuid()}").read_text().split()
    assert sorted(int(p) for p in claims[::2]) == sorted(first + second)
    monkeypatch.setattr(processes, "PORT_HOLD_S", -1.0)  # expired claims are forgotten
    assert free_ports(1) == free_ports(1)
    lines = (tmp_path / f"fedbalance-port-claims-{os.getuid()}").read_text().splitlines()
    assert len(lines) == 6 + 1  # the six held and the newest expired one, read by no one
