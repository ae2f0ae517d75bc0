"""One run owns its ``--out`` directory, and a run's records are never clobbered by accident.

:func:`claim` is what ``fedbalance run`` and ``fedbalance fedlab-server`` do before any host
writes anything:

* ``--out`` must be a directory fedbalance can write (created if missing): a file, ``/dev/full``
  or a read-only place is refused with one line;
* the run takes an exclusive lock on ``OUT/.fedbalance.lock`` for its whole life: a second run
  on the same directory is refused, naming the first (its pid and start time);
* the processes the run starts (FedLab's server) inherit the claim;
* a new run (no ``--resume``) into a directory that holds another run's records is refused
  unless ``--overwrite`` says to replace them. The hosts truncate their files only after this,
  so nothing is lost before the new run owns the directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from fl_partitions.params import FedbalanceError

LOCK = ".fedbalance.lock"
#: Set while a run holds its directory: the processes it starts (FedLab's server) share it.
HELD_ENV = "FEDBALANCE_HELD_OUT"
#: What a run leaves in its directory (any host).
RECORDS = ("metrics.jsonl", "summary.json", "checkpoint.pt", "aggregations.jsonl")


class RunDirError(FedbalanceError, ValueError):
    """``--out`` cannot be used by this run (one line, exit 2)."""


@contextlib.contextmanager
def claim(out: Path, *, resume: bool = False, overwrite: bool = False) -> Iterator[Path]:
    """Hold ``out`` for one run (see the module docstring); yields ``out``."""
    key = str(out.resolve())
    if os.environ.get(HELD_ENV) == key:  # started by the run that holds it
        yield out
        return
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out} is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunDirError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise RunDirError(
                f"--out {out} is in use by another fedbalance run ({holder}); wait for it to "
                "finish or choose another --out"
            ) from None
        if not resume and not overwrite:
            found = [name for name in RECORDS if (out / name).exists()]
            if found:
                raise RunDirError(
                    f"--out {out} holds another run's records ({', '.join(found)}): --resume "
                    "to continue it, --overwrite to replace it, or choose another --out"
                )
        stamp = f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}"
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, stamp.encode(), 0)
        except OSError as e:  # a full or read-only disk: better now than after round 1
            raise RunDirError(f"--out {out}: cannot write there ({e.strerror or e})") from None
        before = os.environ.get(HELD_ENV)
        os.environ[HELD_ENV] = key
        try:
            yield out
        finally:
            if before is None:
                os.environ.pop(HELD_ENV, None)
            else:
                os.environ[HELD_ENV] = before
    finally:
        os.close(fd)  # releases the lock
