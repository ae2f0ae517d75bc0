"""Watching the processes of one run: stop them all as soon as one fails (host-free).

A run over several processes (FedLab's cross-process ranks, FedML's gRPC server and silos)
must not be left half alive: the survivors of a dead rank wait for it forever. :func:`watch`
polls every process, and on the first failure or the deadline stops the rest; the caller
words the error (what was lost, how to go on), since only it knows its host's progress.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def exit_reason(code: int) -> str:
    """``exited with code 3`` / ``was killed by signal 9 (SIGKILL)``."""
    if code < 0:
        try:
            name = f" ({signal.Signals(-code).name})"
        except ValueError:
            name = ""
        return f"was killed by signal {-code}{name}"
    return f"exited with code {code}"


def start_logged(argv: list[str], log: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` with its output (stdout and stderr) in ``log``, in a session of its own:
    :func:`stop` kills its process group, so whatever it starts goes with it."""
    with open(log, "wb") as fh:
        return subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, **popen
        )


def stop(proc: subprocess.Popen[bytes]) -> list[int]:
    """Kill ``proc``, its process group when it leads one, and every process below it (a host
    may start helpers in sessions of their own: Flower's SuperLink detaches its
    ``flower-superexec``), and reap it. Returns the pids of the helpers it killed."""
    if proc.poll() is not None:
        return []
    helpers = descendants(proc.pid)  # listed first: once it dies they belong to init
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(proc.pid) == proc.pid:  # started with start_new_session=True
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    proc.wait()
    kill_all(helpers)
    return helpers


class Failure(str):
    """What :func:`watch` reports: the message (``"silo rank 2 was killed by signal 9
    (SIGKILL)"``), with ``who`` the name of the process that failed, ``None`` at the deadline."""

    who: str | None

    def __new__(cls, message: str, who: str | None = None) -> Failure:
        self = super().__new__(cls, message)
        self.who = who
        return self


def watch(
    procs: list[tuple[str, subprocess.Popen[bytes]]],
    timeout: float,
    poll: float = 0.2,
    until: subprocess.Popen[bytes] | None = None,
    helpers: set[int] | None = None,
) -> Failure | None:
    """Supervise a run's processes; ``None`` when the run ended well, else what went wrong.

    The run ends well when every process has exited with 0, or, given ``until`` (a client
    whose end is the run's, beside servers that never exit by themselves), when that one has.
    As soon as one fails (or ``timeout`` seconds pass) the failure is returned, e.g. ``"silo
    rank 2 was killed by signal 9 (SIGKILL)"``: the first process in ``procs`` order that
    failed, so list the one whose death explains the others first. Every process of ``procs``
    (and below them) is stopped before this returns; ``helpers``, when given, receives the
    pids of those below them.
    """
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [(name, p.poll()) for name, p in procs]  # every process, every time
            for who, code in codes:
                if code not in (None, 0):
                    return Failure(f"{who} {exit_reason(code)}", who)
            if until.returncode == 0 if until is not None else all(c == 0 for _, c in codes):
                return None
            if time.monotonic() > deadline:
                shown = f"{timeout:.0f}" if timeout >= 1 else f"{timeout:.2g}"
                return Failure(f"the run did not finish within {shown} s")
            time.sleep(poll)
    finally:
        for _, p in procs:
            found = stop(p)
            if helpers is not None:
                helpers.update(found)


def wait_listening(
    ip: str,
    port: int,
    timeout: float,
    poll: float = 0.2,
    proc: subprocess.Popen[bytes] | None = None,
    waiting: Callable[[], None] | None = None,
) -> str | None:
    """Wait until ``ip:port`` accepts connections: ``None`` then, else why the wait ended --
    ``proc`` (the process that should listen) ended (:func:`exit_reason`), or ``timeout``
    seconds passed. ``waiting`` is called once, when the first try fails. The caller words
    the error around the reason."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((ip, port), timeout=2):
                return None
        except OSError:
            if proc is not None and proc.poll() is not None:
                return exit_reason(proc.returncode)
            if time.monotonic() > deadline:
                return f"did not listen on {ip}:{port} within {timeout:g} s"
            if waiting is not None:
                waiting()
                waiting = None
            time.sleep(poll)


#: Where :func:`free_ports` looks when the kernel's ephemeral range cannot be read (Linux's
#: default range starts at 32768).
EPHEMERAL_RANGE = (32768, 60999)
#: The lowest port :func:`free_ports` offers: above the registered services most machines run.
LOWEST_PORT = 10000


def free_ports(n: int, ip: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``ip`` right now, below the kernel's ephemeral range.

    A port the kernel picks for ``bind((ip, 0))`` lies in the ephemeral range, from which
    every outgoing connection on the machine also takes its local port: between this call and
    the server's own bind, a client socket (a silo polling for its server, Ray, gRPC) may take
    it, and the server then fails to start. Below that range a port is taken only by a process
    that asks for it by number. The scan starts at an offset drawn from the process id and the
    clock (no result depends on a port), so runs started together look in different places;
    each port is held bound until all ``n`` are found, so they differ.
    """
    try:  # the kernel's range for the local ports of outgoing connections
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            low, _ = (int(v) for v in fh.read().split())
    except (OSError, ValueError):
        low, _ = EPHEMERAL_RANGE
    span = low - LOWEST_PORT
    if span < 4 * n:  # a machine whose ephemeral range starts low: the kernel's choice
        return _kernel_ports(n, ip)
    offset = (os.getpid() * 7919 + time.monotonic_ns() // 1000) % span
    socks: list[socket.socket] = []
    try:
        for i in range(span):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((ip, LOWEST_PORT + (offset + i) % span))
            except OSError:
                s.close()
                continue
            socks.append(s)
            if len(socks) == n:
                return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
    return _kernel_ports(n, ip)


def _kernel_ports(n: int, ip: str) -> list[int]:
    socks = []
    try:
        for _ in range(n):  # held open together, so the n ports differ
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((ip, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux ``/proc``; empty elsewhere), for :func:`stop`."""
    children: dict[int, list[int]] = {}
    for child, stat in proc_files("stat"):
        # The command name may hold spaces or parentheses: the fields start after the last ")".
        children.setdefault(int(stat.rsplit(b")", 1)[1].split()[1]), []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of ``pids`` that is still alive (the ones already gone are skipped)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def matching(marks: list[str]) -> list[int]:
    """Live processes (other than this one) whose command line contains any of ``marks``
    (Linux ``/proc``; empty elsewhere)."""
    found = []
    for pid, raw in proc_files("cmdline"):
        cmd = raw.replace(b"\0", b" ").decode(errors="replace")
        if pid != os.getpid() and any(mark in cmd for mark in marks):
            found.append(pid)
    return found


def proc_files(name: str) -> Iterator[tuple[int, bytes]]:
    """``(pid, /proc/PID/NAME)`` of every live process (none where there is no ``/proc``)."""
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return
    for pid in entries:
        try:
            with open(f"/proc/{pid}/{name}", "rb") as fh:
                yield pid, fh.read()
        except OSError:  # it ended meanwhile
            continue
