"""FedML checkpoints and resume, keyed by two YAML fields of an unmodified host:
``checkpoint_dir: DIR`` (any section; the server writes ``DIR/checkpoint.pt`` after every
round) and ``resume_from: DIR`` (or the file) to continue from it. How each mode resumes, and
which end bit-identical: docs/hosts/fedml.md.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_adapters.checkpoint import NAME, Checkpoint, CheckpointError, check_plan, refuse_changes
from fl_adapters.fedml.spec import FEDML
from fl_adapters.run.lifecycle import capture, open_for_resume
from fl_checks import ParameterError

log = logging.getLogger(__name__)

#: The FedML args a resumed run must share with the checkpointed one.
SAME = (
    "training_type",
    "backend",
    "dataset",
    "partition_method",
    "partition_alpha",
    "partition_spec",
    "max_samples",
    "model",
    "client_num_in_total",
    "client_num_per_round",
    "epochs",
    "batch_size",
    "client_optimizer",
    "learning_rate",
    "weight_decay",
    "random_seed",
    "aggregator",
    "aggregator_args",
    "val_fraction",
)
#: May change on resume (a longer run continues a shorter one): the host spec's.
MAY_CHANGE = FEDML.may_change


def _path(args: Any, field: str) -> Path | None:
    value = getattr(args, field, None)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, (str, Path)):
        raise ParameterError(f"{field} must be a directory path, got {value!r}")
    return Path(value).expanduser()


def checkpoint_path(args: Any) -> Path | None:
    """Where the server writes its checkpoint (``checkpoint_dir``), or ``None``."""
    directory = _path(args, "checkpoint_dir")
    return None if directory is None else directory / NAME


def resume_path(args: Any) -> Path | None:
    """The checkpoint ``resume_from`` names (a directory holding one, or the file)."""
    path = _path(args, "resume_from")
    return path / NAME if path is not None and path.is_dir() else path


def run_fields(args: Any) -> dict[str, Any]:
    """The args the checkpoint keeps, as plain JSON values."""
    plain = (int, float, str, bool, type(None), dict)
    values = {key: getattr(args, key, None) for key in (*SAME, *MAY_CHANGE)}
    return {k: v if isinstance(v, plain) else str(v) for k, v in values.items()}


def load(args: Any) -> Checkpoint:
    """The checkpoint ``resume_from`` names, checked against this run's args."""
    path = resume_path(args)
    if path is None:
        raise CheckpointError("resume_from is not set")
    ckpt = open_for_resume(path, "fedml")
    refuse_changes(path, ckpt.config, run_fields(args), SAME, may_change=MAY_CHANGE)
    ckpt.check_rounds("comm_round", int(getattr(args, "comm_round", 0)))
    return ckpt


def resume(args: Any, model: Any, aggregator: Any, host: str, astraea: Any = None) -> Checkpoint:
    """``resume_from``'s checkpoint, refused unless its Astraea plan is ``astraea``'s and its
    model ``model``'s kind (names, shapes, dtypes), with ``aggregator``'s state restored."""
    ckpt = load(args)
    if astraea is not None:
        check_plan(ckpt.plan, astraea.planner.plan.as_dict())
    ckpt.check_model(model, resume_path(args))
    aggregator.load_state_dict(ckpt.aggregator)
    log.info("fedbalance: FedML %s resumes after round %d of %d", host, ckpt.round, args.comm_round)
    return ckpt


def save(
    args: Any,
    round_number: int,
    params: Any,
    aggregator: Any,
    astraea: Any = None,
    rng: dict[str, Any] | None = None,
) -> None:
    """Write the round's checkpoint where ``checkpoint_dir`` says (nothing if unset)."""
    capture(
        checkpoint_path(args),
        host="fedml",
        config=run_fields(args),
        round_number=round_number,
        model=params,
        aggregator=aggregator,
        plan=None if astraea is None else astraea.planner.plan.as_dict(),
        rng=rng,
    )


# -- sp: the process's RNG states, taken and restored at the start of a round -----------------
def rng_state() -> dict[str, Any]:
    # The legacy global numpy RNG is FedML's (its samplers seed it by round).
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002
    version, internal, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [str(kind), torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos)],
        "numpy_gauss": [int(has_gauss), float(gauss)],
        "python": [int(version), *internal],
        "python_gauss": py_gauss,
    }


def restore_rng(state: dict[str, Any]) -> None:
    try:
        torch.set_rng_state(state["torch"])
        kind, keys, pos = state["numpy"]
        has_gauss, gauss = state["numpy_gauss"]
        legacy = (kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss)
        np.random.set_state(legacy)  # noqa: NPY002 (the global RNG FedML draws from)
        py = state["python"]
        random.setstate((py[0], tuple(py[1:]), state["python_gauss"]))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"the checkpoint's RNG states are malformed ({e})") from e
