"""One run owns its ``--out`` directory, and a run's records are never clobbered by accident.

:func:`claim` is what ``fedbalance run`` and ``fedbalance fedlab-server`` do before any host
writes anything:

* ``--out`` must be a directory fedbalance can write (created if missing): a file, ``/dev/full``
  or a read-only place is refused with one line;
* the run takes an exclusive lock on ``OUT/.fedbalance.lock`` for its whole life: a second run
  on the same directory is refused, naming the first (its pid and start time);
* the processes the run starts (FedLab's server) inherit the claim: ``FEDBALANCE_HELD_OUT`` names
  the directory and the holder's pid, and counts only in a descendant of that pid while the
  lock is held (inherited by a later run, or written by hand, it is ignored);
* ``FEDBALANCE_RECORD`` (the user's copy of the aggregation record) must lie outside ``--out``:
  inside, its lines would interleave with the run's own files;
* a new run (no ``--resume``) into a directory that holds another run's records is refused
  unless ``--overwrite`` says to replace them. The hosts truncate their files only after this,
  so nothing is lost before the new run owns the directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fl_checks import FedbalanceError

LOCK = ".fedbalance.lock"
#: Set while a run holds its directory: the processes it starts (FedLab's server) share it.
HELD_ENV = "FEDBALANCE_HELD_OUT"
#: What a run leaves in its directory (any host).
RECORDS = ("metrics.jsonl", "summary.json", "checkpoint.pt", "aggregations.jsonl")


class RunDirError(FedbalanceError, ValueError):
    """``--out`` cannot be used by this run (one line, exit 2)."""


@contextlib.contextmanager
def scoped_env(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` inside it; the previous value (or none) again after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def claim(out: Path, *, resume: bool = False, overwrite: bool = False) -> Iterator[Path]:
    """Hold ``out`` for one run (see the module docstring); yields ``out``."""
    key = str(out.resolve())
    if inherited(out, os.environ.get(HELD_ENV, "")):  # started by the run that holds it
        yield out
        return
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out} is not a directory")
    check_record_outside(out)
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
        restart = _restart_problem(out, resume=resume, overwrite=overwrite)
        if restart is not None:
            raise RunDirError(restart)
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
        with scoped_env(HELD_ENV, f"{key}|{os.getpid()}"):
            yield out
    finally:
        os.close(fd)  # releases the lock


def _restart_problem(out: Path, *, resume: bool, overwrite: bool) -> str | None:
    """A run stopped before its first checkpoint (killed in round 1) has nothing to resume:
    say to start it again, rather than send the user to ``--resume`` and from there back.
    Asked with the lock held, so a run still in its first round is never taken for one."""
    from fl_adapters.checkpoint import NAME  # here: it imports torch

    path = out / NAME
    if path.exists():
        return None
    found = [name for name in RECORDS if (out / name).exists()]
    if resume:
        again = f" and with --overwrite (it holds that run's {', '.join(found)})" if found else ""
        return (
            f"--resume: no checkpoint at {path} (a run writes one after each round it "
            f"completes), so there is nothing to resume: start the run again without "
            f"--resume{again}"
        )
    if found and "summary.json" not in found and not overwrite:  # it never finished either
        return (
            f"--out {out} holds the records of a run that stopped before its first checkpoint "
            f"({', '.join(found)}; no {NAME}), so there is nothing to --resume: --overwrite to "
            "start it again, or choose another --out"
        )
    return None


def check_record_outside(out: Path) -> None:
    """Refuse a ``FEDBALANCE_RECORD`` inside ``out`` (see the module docstring)."""
    from fl_aggregators.record import ENV  # here: it imports torch

    record = os.environ.get(ENV)
    if record and out.resolve() in (Path(record).resolve(), *Path(record).resolve().parents):
        raise RunDirError(
            f"{ENV}={record} is inside --out {out}, whose files the run writes itself (its "
            f"aggregation record is {out / 'aggregations.jsonl'}): point {ENV} outside the run "
            "directory"
        )


def inherited(out: Path, held: str) -> bool:
    """Whether ``held`` (``FEDBALANCE_HELD_OUT``: ``DIR|PID``) is a claim on ``out`` this
    process inherited: ``PID`` is an ancestor of this process and still holds the lock."""
    where, _, pid = held.rpartition("|")
    if where != str(out.resolve()) or not pid.isdigit() or int(pid) not in ancestors():
        return False
    try:
        fd = os.open(out / LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True  # held: by the ancestor that set the variable
    finally:
        os.close(fd)  # a lock this check took goes with it
    return False


def ancestors(pid: int | None = None) -> set[int]:
    """The pids above ``pid`` (this process) up to init, read from Linux's ``/proc``."""
    found: set[int] = set()
    pid = os.getpid() if pid is None else pid
    while pid > 1 and len(found) < 4096:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
        found.add(pid)
    return found


class RunFiles:
    """The records of one run in its ``--out`` directory, kept the same way on every host.

    ``aggregations.jsonl`` holds one line per aggregation (every host's aggregator writes it;
    a user's ``FEDBALANCE_RECORD`` receives the same lines); ``metrics.jsonl`` one row per
    round, built from those lines plus the host's evaluation; ``summary.json`` the run's end.
    :meth:`start` readies them before a run: a fresh run removes an earlier run's records, a
    resumed one cuts them back to its checkpoint's round.
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self.record = (out / "aggregations.jsonl").resolve()
        self.metrics = out / "metrics.jsonl"
        self.summary = out / "summary.json"
        self.checkpoint = out / "checkpoint.pt"
        #: One line per evaluated round: each evaluated client's accuracy (``eval_data:
        #: clients`` or ``val``).
        self.clients = out / "clients.jsonl"

    def start(self, done: int | None) -> Path:
        """Before a run: ``done=None`` removes an earlier run's records; a resume after round
        ``done`` drops the aggregation lines written after it (a run stopped between its
        record and its checkpoint wrote one more) and refuses a record that lacks a round.
        Returns the aggregation record's path."""
        if done is None:
            for path in (self.record, self.metrics, self.summary, self.checkpoint, self.clients):
                path.unlink(missing_ok=True)
            return self.record
        kept = [(line, agg) for line, agg in self.aggregations() if agg["round"] <= done]
        self._require_rounds([agg["round"] for _, agg in kept], done, self.record)
        self.record.write_text("".join(line + "\n" for line, _ in kept))
        if self.clients.is_file():
            lines = self.clients.read_text().splitlines()
            self.clients.write_text("".join(x + "\n" for x in lines if _round_of(x) <= done))
        return self.record

    def add_clients(self, round_number: int, accuracies: dict[str, float | None]) -> None:
        """Round ``round_number``'s line of :attr:`clients`: each evaluated client's accuracy
        (``null``: no samples)."""
        with open(self.clients, "a") as fh:
            fh.write(_clients_line(round_number, accuracies))

    def client_rows(self) -> dict[int, dict[str, float | None]]:
        """:attr:`clients` by round (a line cut short by a kill is left out)."""
        text = self.clients.read_text() if self.clients.is_file() else ""
        out = {}
        for line in text.splitlines():
            try:
                doc = json.loads(line)
                out[int(doc["round"])] = doc["client_accuracy"]
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def write_clients(self, rounds: dict[int, dict[str, float | None]]) -> None:
        """:attr:`clients` from every evaluated round's client accuracies."""
        self.clients.write_text("".join(_clients_line(r, a) for r, a in sorted(rounds.items())))

    def rows(self) -> list[dict[str, Any]]:
        """``metrics.jsonl``'s rows (none before the first round)."""
        text = self.metrics.read_text() if self.metrics.is_file() else ""
        return [json.loads(x) for x in text.splitlines()]

    def kept_rows(self, rows: list[dict[str, Any]], done: int) -> list[dict[str, Any]]:
        """The rows a run resumed after round ``done`` keeps (rows 1..``done``); an error when
        one is missing."""
        kept = [r for r in rows if r.get("round", 0) <= done]
        self._require_rounds([r.get("round") for r in kept], done, self.metrics)
        return kept

    def aggregation_rows(self, first: int = 1) -> list[dict[str, Any]]:
        """The ``metrics.jsonl`` rows of the aggregations of round ``first`` on, from the
        record: clients, weights, rejected and skipped counts, an Astraea round's mediators
        and their KL, and the aggregator's wall time since it was made."""
        rows = []
        for _, agg in self.aggregations():
            if agg["round"] < first:
                continue
            row = {k: agg[k] for k in ("round", "clients", "weights", "skipped")}
            row["rejected"] = len(agg["rejected"])
            if "mediators" in agg:
                row.update(mediators=agg["mediators"], mediator_kl=agg["kl"])
            if "elapsed_s" in agg:
                row["elapsed_s"] = agg["elapsed_s"]
            rows.append(row)
        return rows

    def write_rows(self, rows: list[dict[str, Any]]) -> None:
        from fl_adapters.experiment import json_line

        self.metrics.write_text("".join(json_line(r) for r in rows))

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write ``summary.json``; returns ``summary``."""
        from fl_aggregators.record import jsonable  # torch: not in a launcher that only waits

        self.summary.write_text(json.dumps(jsonable(summary), indent=1, allow_nan=False) + "\n")
        return summary

    def aggregations(self) -> list[tuple[str, dict[str, Any]]]:
        """The record's lines with what they hold. A line that does not parse was cut short by
        a kill while it was written: the last one, of a round no checkpoint holds, so it is
        left out (a round missing from the middle is refused by :meth:`start`)."""
        text = self.record.read_text() if self.record.is_file() else ""
        out = []
        for line in text.splitlines():
            try:
                agg = json.loads(line)
                int(agg["round"])
            except (ValueError, KeyError, TypeError):
                continue
            out.append((line, agg))
        return out

    def _require_rounds(self, rounds: list[Any], done: int, path: Path) -> None:
        if rounds != list(range(1, done + 1)):
            from fl_adapters.checkpoint import CheckpointError

            raise CheckpointError(
                f"{path} does not hold rounds 1..{done} of the checkpointed run; resume in "
                "the directory the run wrote"
            )


def _round_of(line: str) -> float:
    """The round of a line of ``clients.jsonl`` (a line cut short by a kill: after any)."""
    try:
        return int(json.loads(line)["round"])
    except (ValueError, KeyError, TypeError):
        return float("inf")


def _clients_line(round_number: int, accuracies: dict[str, float | None]) -> str:
    from fl_aggregators.record import jsonable  # torch: not in a launcher that only waits

    line = {"round": round_number, "client_accuracy": accuracies}
    return json.dumps(jsonable(line), allow_nan=False) + "\n"
