"""The steps of ``fedbalance run`` around a host's own loop, written once for every host.

A host supplies how its processes start (or its in-process loop) and how its rows are read;
what comes before and after is here: the one deadline a run's processes get by default, the
one wording of a run that started and stopped (:func:`failed`, the only place a
:class:`~fl_adapters.config.RunFailed` is made), watching the processes, and writing the rows
and the summary every host writes the same way.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fl_adapters.config import RunFailed
from fl_adapters.run.directory import RunFiles
from fl_adapters.run.processes import watch

if TYPE_CHECKING:
    import torch

    from fl_adapters.checkpoint import Checkpoint
    from fl_adapters.config import RunConfig
    from fl_adapters.hosts import RunOptions

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


def capture(
    path: Path | None,
    *,
    host: str,
    config: dict[str, Any],
    round_number: int,
    model: torch.Tensor | Mapping[str, Any],
    aggregator: Any,
    sampler: list[int] | None = None,
    participations: Mapping[int, int] | None = None,
    plan: dict[str, Any] | None = None,
    rng: dict[str, Any] | None = None,
    history: dict[str, Any] | None = None,
) -> None:
    """The one checkpoint capture every host uses: after round ``round_number``, the global
    ``model`` (a flat vector, or a state dict whose tensors are kept), the ``aggregator``'s
    state and whatever of the rest the host keeps, written atomically to ``path`` (nothing
    when ``None``: a host run without a checkpoint folder), naming the ``host`` that wrote it
    (a run resumes only from its own host's: :func:`open_for_resume`)."""
    if path is None:
        return
    import torch

    from fl_adapters.checkpoint import Checkpoint

    if isinstance(model, torch.Tensor):
        params: Any = model.detach().cpu().clone()
    else:
        params = {k: v.detach().cpu().clone() for k, v in model.items() if torch.is_tensor(v)}
    path.parent.mkdir(parents=True, exist_ok=True)
    Checkpoint(
        config=config,
        round=int(round_number),
        model=params,
        aggregator=aggregator.state_dict(),
        participations=dict(participations or {}),
        sampler=sampler,
        plan=plan,
        rng=rng,
        history=history,
        host=host,
    ).save(path)


def open_for_resume(path: Path, host: str, config: dict[str, Any] | None = None) -> Checkpoint:
    """The checkpoint at ``path`` a resumed run continues from: written by ``host`` and, when
    ``config`` is given, by a run of the same config (the fields a resume may change aside)."""
    from fl_adapters.checkpoint import Checkpoint

    ckpt = Checkpoint.open(path, host)
    if config is not None:
        ckpt.check_config(config, path)
    return ckpt


class Rounds:
    """An in-process host's run, kept by the lifecycle: the host's loop reports each round
    (:meth:`done`) and writes nothing itself. The records start fresh or, resumed, cut back to
    :attr:`resumed`'s round, whose state the loop restores before its next round. Made once
    the run is known to start (the config and data checked): it readies the files."""

    def __init__(
        self, config: RunConfig, out: Path, host: str, resumed: Checkpoint | None = None
    ) -> None:
        self.config, self.host = config, host
        out.mkdir(parents=True, exist_ok=True)
        self.files = RunFiles(out)
        #: The checkpoint a resumed run continues from (:func:`open_for_resume`), or ``None``.
        self.resumed = resumed
        done = self.resumed.round if self.resumed is not None else None
        self.rows = self.files.kept_rows(self.files.rows(), done) if done is not None else []
        self.files.start(done)
        self.files.write_rows(self.rows)
        self.started = time.perf_counter()

    @property
    def first(self) -> int:
        """The round the loop runs next (1, or the one after the resumed checkpoint's)."""
        return 1 + (self.resumed.round if self.resumed is not None else 0)

    def done(self, row: dict[str, Any], **state: Any) -> None:
        """Round ``row["round"]`` ended: its row goes to ``metrics.jsonl``, then the state
        (:func:`capture`'s keywords: ``model``, ``aggregator``, ``sampler``...) to the
        checkpoint."""
        from fl_adapters.experiment import json_line

        self.rows.append(row)
        with open(self.files.metrics, "a") as fh:
            fh.write(json_line(row))
        capture(
            self.files.checkpoint,
            host=self.host,
            config=self.config.to_dict(),
            round_number=int(row["round"]),
            **state,
        )

    def finish(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``summary.json`` from the rows and the wall time, then the host's ``extra``
        fields; returns it."""
        from fl_adapters.experiment import run_summary

        summary = run_summary(self.config, self.rows, time.perf_counter() - self.started)
        summary.update(extra or {})
        return self.files.finish(summary)


def in_process(
    host: str, loop: Callable[[RunConfig, Rounds], None]
) -> Callable[[RunConfig, Path, RunOptions], dict[str, Any]]:
    """A host spec's ``run`` for a host whose rounds run in this process: ``loop(config,
    rounds)`` runs the rounds from ``rounds.first`` and reports each to ``rounds.done``; the
    lifecycle writes the rows, the aggregation record, the checkpoint and the summary."""

    def run(config: RunConfig, out: Path, options: RunOptions) -> dict[str, Any]:
        from fl_adapters.checkpoint import recording_to

        files = RunFiles(out)
        resumed = (
            open_for_resume(files.checkpoint, host, config.to_dict()) if options.resume else None
        )
        rounds = Rounds(config, out, host, resumed)
        with recording_to(rounds.files.record):
            loop(config, rounds)
        return rounds.finish()

    return run
