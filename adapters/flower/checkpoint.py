"""Flower checkpoints: the strategy's state after every round, and continuing a run from it.

With ``checkpoint-dir`` in the run config, :class:`~fl_adapters.flower.strategy.
FedBalanceStrategy` writes ``checkpoint.pt`` there once a round is complete: the host-free file
of :mod:`fl_adapters.checkpoint`, with the per-round metrics Flower keeps only in memory. With
``resume-from`` it continues from it, numbering Flower's remaining rounds from ``k + 1``
(docs/hosts/flower.md, "Checkpoints and resume"). Only :data:`MAY_CHANGE` may change.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fl_adapters.checkpoint import NAME, Checkpoint, refuse_changes
from fl_adapters.flower.config import WHERE
from fl_adapters.flower.spec import FLOWER
from fl_adapters.run.lifecycle import open_for_resume

HOST = FLOWER.name
ROUNDS_KEY = "num-server-rounds"
#: Run-config keys a resumed run may change: the host spec's.
MAY_CHANGE = FLOWER.may_change


def identity(values: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint records of a run (and a resumed run must share): ``values`` but the
    keys that may change, as JSON scalars."""
    return {"host": HOST} | {
        k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
        for k, v in sorted(values.items())
        if k not in MAY_CHANGE
    }


def load(
    where: str | Path, run: Mapping[str, Any], rounds: int, *, partial: bool = False
) -> Checkpoint:
    """The Flower checkpoint at ``where``, checked against this run (its :func:`identity`
    ``run``) and its total ``rounds``; a :class:`CheckpointError` names what does not fit.

    ``partial``: compare only the keys ``run`` has (``fedbalance run`` checks the app's keys
    before it starts Flower; the strategy then checks its own as well)."""
    path = Path(where).expanduser()  # the file itself, else the directory's checkpoint.pt
    path = path if path.is_file() or path.suffix == ".pt" else path / NAME
    ckpt = open_for_resume(path, HOST)
    keys = set(run) if partial else set(run) | set(ckpt.config)
    refuse_changes(path, ckpt.config, run, keys, may_change=MAY_CHANGE)
    ckpt.check_rounds(f"{WHERE} {ROUNDS_KEY}", rounds)
    return ckpt
