"""The steps of ``fedbalance run`` around a host's own loop, written once for every host.

A host supplies how its processes start (or its in-process loop) and how its rows are read;
what comes before and after is here: the one deadline a run's processes get by default, the
one wording of a run that started and stopped (:func:`failed`, the only place a
:class:`~fl_adapters.config.RunFailed` is made), watching the processes, and writing the rows
and the summary every host writes the same way.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fl_adapters.config import RunFailed
from fl_adapters.run.processes import watch

if TYPE_CHECKING:
    from fl_adapters.config import RunConfig
    from fl_adapters.run.files import RunFiles

#: How long a run's processes may take, by default, before they are stopped (every host).
RUN_TIMEOUT = 24 * 3600.0


def failed(what: str, out_dir: Path, *logs: Path, resumable: bool = True) -> RunFailed:
    """The error of a run that started and could not finish: ``WHAT; see LOG``, then why it
    stopped when a log says it learned nothing, and the checkpoint to resume from (or that
    there is none). ``what`` names the host or mode and what happened; ``logs`` are where to
    look, the first one named. ``resumable=False``: a run that ended, with nothing to resume."""
    from fl_adapters.checkpoint import resume_hint  # reads checkpoints: torch, on failure only

    see = f"; see {logs[0]}" if logs else ""
    return RunFailed(f"{what}{see}{resume_hint(out_dir, *logs) if resumable else ''}")


def watched(
    procs: Sequence[tuple[str, subprocess.Popen[bytes]]],
    timeout: float,
    subject: str,
    out_dir: Path,
    logs: Sequence[Path] = (),
) -> None:
    """Wait for ``procs`` (named; the first's death explains the others'), stopping every one
    when one fails or the deadline passes; then :func:`failed` names what happened, with the
    log of the process that failed first among ``logs`` (in ``procs``' order)."""
    failure = watch(list(procs), timeout)
    if failure is None:
        return
    names = [name for name, _ in procs]
    order = list(logs)
    if failure.who in names and len(order) == len(names):
        first = names.index(failure.who)
        order = [order[first], *order[:first], *order[first + 1 :]]
    raise failed(f"{subject}: {failure}", out_dir, *order)


def finish(
    config: RunConfig, files: RunFiles, rows: list[dict[str, Any]], elapsed_s: float | None
) -> dict[str, Any]:
    """``metrics.jsonl`` from ``rows`` and ``summary.json`` (:func:`~fl_adapters.experiment.run_summary`
    with the run's wall time); returns the summary."""
    from fl_adapters.experiment import run_summary

    files.write_rows(rows)
    return files.finish(run_summary(config, rows, elapsed_s))


def check_learned(framework: str, summary: dict[str, Any], out: Path) -> None:
    """A run none of whose rounds changed the model learned nothing: a failure, whatever the
    host said."""
    if summary.get("aggregated_rounds", 1) == 0:
        raise failed(
            f"{framework}: {summary.get('rounds', 0)} round(s) recorded, none aggregated: the "
            f"model is the initial one (the warnings above say why)",
            out,
            out / "aggregations.jsonl",
            resumable=False,
        )
