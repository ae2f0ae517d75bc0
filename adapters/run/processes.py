"""Watching the processes of one run: stop them all as soon as one fails (host-free).

A run over several processes (FedLab's cross-process ranks, FedML's gRPC server and silos)
must not be left half alive: the survivors of a dead rank wait for it forever. :func:`watch`
polls every process, and on the first failure or the deadline stops the rest; the caller
words the error (what was lost, how to go on), since only it knows its host's progress.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import ipaddress
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


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


def port_problem(ip: str, port: int) -> str | None:
    """Why ``ip:port`` cannot be listened on here (``None``: it can).

    No ``SO_REUSEPORT`` on the probe, so a server that already holds the port (gRPC sets that
    option, and would otherwise share the port silently) counts as in use; with
    ``SO_REUSEADDR``, as gRPC and torch's ``TCPStore`` bind, a port still in TIME_WAIT from a
    finished run does not.
    """
    try:
        family = socket.getaddrinfo(ip, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((ip, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return "is already in use (another process listens there: a run still alive?)"
        if e.errno == errno.EADDRNOTAVAIL:
            return "is not an address of this machine"
        return f"cannot be bound ({e})"
    return None


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def loopback_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that keep the listeners of processes fedbalance starts on this machine
    (its MPI ranks, its torch.distributed ranks) off every interface but loopback, minus those
    the user has set in ``environ`` (theirs win). Merge the result into the children's
    environment.

    * Open MPI 4.1's TCP BTL listens on every interface whatever ``btl_tcp_if_include`` says
      (measured with 4.1.4); ranks on one machine talk through shared memory (``vader``), so
      the TCP BTL is left out. ``*_if_include`` restrict what Open MPI connects over, should a
      user turn it back on; set only when the user has set neither ``include`` nor
      ``exclude`` (Open MPI refuses both). mpirun's own out-of-band listener is not governed by
      any of these in Open MPI 4.1: :func:`loopback_preload` binds it to loopback.
    * gloo (torch.distributed) binds its pairs to the address of ``GLOO_SOCKET_IFNAME``.
    """
    lo = loopback_interface()
    wanted: dict[str, str] = {"OMPI_MCA_btl": "self,vader"}
    if lo is not None:
        for part in ("oob_tcp", "btl_tcp"):
            if not any(f"OMPI_MCA_{part}_if_{w}" in environ for w in ("include", "exclude")):
                wanted[f"OMPI_MCA_{part}_if_include"] = lo
        wanted["GLOO_SOCKET_IFNAME"] = lo
    wanted["OMPI_MCA_oob_tcp_disable_ipv6_family"] = "1"
    return {k: v for k, v in wanted.items() if k not in environ}


#: The C source of the bind shim :func:`loopback_preload` builds (shipped beside this module).
SHIM_SOURCE = Path(__file__).with_name("_bindlo.c")


@functools.cache
def loopback_preload() -> str | None:
    """A shared library that, loaded with ``LD_PRELOAD``, binds every socket meant for all
    interfaces (``0.0.0.0``, ``[::]``) to loopback instead: mpirun's out-of-band listener,
    which Open MPI 4.1 binds to every interface whatever its MCA parameters say. Built once
    per source with the system's C compiler into the user's cache; ``None`` (with one warning
    naming what stays open) where there is no compiler or the build fails."""
    source = SHIM_SOURCE.read_bytes()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedbalance"
    built = cache / f"bindlo-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if built.exists():
        return str(built)
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    why = "no C compiler (cc) on PATH"
    if cc is not None:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            partial = built.with_suffix(f".{os.getpid()}.tmp")
            done = subprocess.run(
                [cc, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SHIM_SOURCE), "-ldl"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if done.returncode == 0:
                partial.replace(built)  # atomic: two runs building at once both get a whole one
                return str(built)
            why = f"{cc} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
            partial.unlink(missing_ok=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            why = f"{cc} failed: {e}"
    log.warning(
        "cannot build fedbalance's loopback shim (%s): mpirun's out-of-band listener will "
        "listen on every interface (docs/hosts/fedml.md)",
        why,
    )
    return None


def with_preload(env: Mapping[str, str], library: str | None) -> dict[str, str]:
    """``env`` with ``library`` first in ``LD_PRELOAD`` (unchanged when ``None``)."""
    out = dict(env)
    if library is not None:
        out["LD_PRELOAD"] = " ".join(x for x in (library, env.get("LD_PRELOAD", "")) if x)
    return out


def listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` of every TCP socket that ``pids`` listen on (Linux ``/proc``;
    empty elsewhere): each process's socket inodes matched to ``/proc/PID/net/tcp{,6}``."""
    found = []
    for pid in pids:
        inodes = set()
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # it ended meanwhile, or is not ours to read
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{pid}/net/{table}", encoding="ascii") as fh:
                    rows = fh.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    hex_ip, hex_port = cols[1].split(":")
                    found.append((pid, _proc_ip(hex_ip), int(hex_port, 16)))
    return found


def _proc_ip(hex_ip: str) -> str:
    """An address as ``/proc/net/tcp{,6}`` writes it (32-bit words in host byte order)."""
    raw = bytes.fromhex(hex_ip)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw))


def is_loopback(address: str) -> bool:
    """``127.0.0.0/8``, ``::1`` or an IPv4-mapped loopback (``::ffff:127.0.0.1``)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


#: Where :func:`free_ports` looks when the kernel's ephemeral range cannot be read (Linux's
#: default range starts at 32768).
EPHEMERAL_RANGE = (32768, 60999)
#: The lowest port :func:`free_ports` offers: above the registered services most machines run.
LOWEST_PORT = 10000
#: How long a port :func:`free_ports` handed out stays off the table for every other caller
#: on this machine (seconds): long enough for the slowest server to bind it (FedML's start).
PORT_HOLD_S = 180.0


def free_ports(n: int, ip: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``ip`` right now, below the kernel's ephemeral range.

    A port the kernel picks for ``bind((ip, 0))`` lies in the ephemeral range, from which
    every outgoing connection on the machine also takes its local port: between this call and
    the server's own bind, a client socket (a silo polling for its server, Ray, gRPC) may take
    it, and the server then fails to start. Below that range a port is taken only by a process
    that asks for it by number. The scan starts at an offset drawn from the process id and the
    clock (no result depends on a port), so runs started together look in different places;
    each port is held bound until all ``n`` are found, so they differ. The ports handed out
    are also written down (:func:`_port_claims`) for :data:`PORT_HOLD_S` seconds, so two runs
    started together on one machine never get the same port before either has bound it.
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
    with _port_claims() as claimed:
        socks: list[socket.socket] = []
        try:
            for i in range(span):
                port = LOWEST_PORT + (offset + i) % span
                if port in claimed:
                    continue
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    s.bind((ip, port))
                except OSError:
                    s.close()
                    continue
                socks.append(s)
                if len(socks) == n:
                    ports = [int(s.getsockname()[1]) for s in socks]
                    claimed.update(ports)
                    return ports
        finally:
            for s in socks:
                s.close()
    return _kernel_ports(n, ip)


@contextlib.contextmanager
def _port_claims() -> Iterator[set[int]]:
    """The ports handed out on this machine in the last :data:`PORT_HOLD_S` seconds, under a
    lock; ports the caller adds to the set are written back with a fresh hold. The file (one
    ``port expiry`` pair a line, in the temp folder, per user) only ever holds live claims.
    Where it cannot be opened, no claims: the scan alone, as before."""
    path = Path(tempfile.gettempdir()) / f"fedbalance-port-claims-{os.getuid()}"
    try:
        fh = open(path, "a+", encoding="ascii")  # noqa: SIM115 - held for the lock's lifetime
    except OSError:
        yield set()
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        now = time.time()
        fh.seek(0)
        live: dict[int, float] = {}
        for line in fh.read().splitlines():
            with contextlib.suppress(ValueError):
                word, expiry = line.split()
                if float(expiry) > now:
                    live[int(word)] = float(expiry)
        claimed = set(live)
        yield claimed
        for port in claimed - set(live):
            live[port] = now + PORT_HOLD_S
        fh.seek(0)
        fh.truncate()
        fh.write("".join(f"{p} {e:.0f}\n" for p, e in sorted(live.items())))


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
