"""Flower checkpoints: the strategy's state after every round, and continuing a run from it.

With ``checkpoint-dir`` in the run config, :class:`~fl_adapters.flower.strategy.
FedBalanceStrategy` writes ``checkpoint.pt`` there once a round is complete (after the
clients' evaluation, or after ``evaluate_fn`` when the app gives one) -- the same kind of file
FedLab and FedML runs write (:mod:`fl_adapters.checkpoint`): the global state dict, the
aggregator's state (FedAvgM's momentum), the round, the seeded sampler's RNG state, the
Astraea plan, and the per-round metrics Flower keeps only in memory (its ``Result``).

With ``resume-from`` the strategy starts from that file: Flower's loop runs the remaining
rounds, which the strategy numbers from ``k + 1`` (what it sends the clients, records and
returns), and ``start`` returns the whole run's ``Result``. Local training is seeded by
``(seed, client, server-round)`` and updates are summed in client order, so a resumed run ends
on the model of an uninterrupted one bit for bit, in the simulation engine and in a deployment.

What a resumed run may change: the number of rounds (a longer run continues a shorter one),
where data, output and checkpoints go. Every other run-config key must be the checkpoint's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fl_adapters.checkpoint import NAME, Checkpoint, refuse_changes
from fl_adapters.flower.config import (
    CHECKPOINT_KEY,
    EVAL_EVERY_KEY,
    EVAL_FRACTION_KEY,
    RESUME_KEY,
    WHERE,
)

HOST = "flower"
ROUNDS_KEY = "num-server-rounds"
#: Run-config keys a resumed run may change (evaluation draws from a stream of its own).
MAY_CHANGE = (
    ROUNDS_KEY,
    "out-dir",
    "data-dir",
    CHECKPOINT_KEY,
    RESUME_KEY,
    EVAL_EVERY_KEY,
    EVAL_FRACTION_KEY,
)


def identity(values: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint records of a run (and a resumed run must share): ``values`` but the
    keys that may change, as JSON scalars."""
    out: dict[str, Any] = {"host": HOST}
    for key, value in sorted(values.items()):
        if key in MAY_CHANGE:
            continue
        out[key] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
    return out


def checkpoint_file(where: str | Path) -> Path:
    """``where`` itself if it is a file, else ``where/checkpoint.pt``."""
    path = Path(where).expanduser()
    return path if path.is_file() or path.suffix == ".pt" else path / NAME


def load(
    where: str | Path, run: Mapping[str, Any], rounds: int, *, partial: bool = False
) -> Checkpoint:
    """The Flower checkpoint at ``where``, checked against this run (its :func:`identity`
    ``run``) and its total ``rounds``; a :class:`CheckpointError` names what does not fit.

    ``partial``: compare only the keys ``run`` has (``fedbalance run`` checks the app's keys
    before it starts Flower; the strategy then checks its own as well)."""
    path = checkpoint_file(where)
    ckpt = Checkpoint.load(path)
    ckpt.check_host(HOST, path)
    keys = set(run) if partial else set(run) | set(ckpt.config)
    refuse_changes(path, ckpt.config, run, keys, may_change=MAY_CHANGE)
    ckpt.check_rounds(f"{WHERE} {ROUNDS_KEY}", rounds)
    return ckpt
