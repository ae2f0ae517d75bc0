"""Run checkpoints: everything needed to resume a run so it ends on exactly the same model
(what they hold and what may change: ``docs/run.md``, "Check, stop, resume").

Written atomically (a temporary file, then a rename: a run killed mid-write keeps the previous
one); each client's training count is kept because local training is seeded by ``(seed,
client, participation)``. Read with ``torch.load(weights_only=True)``: a damaged, tampered or
foreign file is a clear ``ValueError``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fl_adapters import hosts
from fl_adapters.autoload import LABELS
from fl_adapters.config import RunConfig
from fl_adapters.inputs import load_json
from fl_adapters.run.directory import scoped_env
from fl_checks import FedbalanceError

FORMAT = "fedbalance-checkpoint"
VERSION = 1
NAME = "checkpoint.pt"
#: Config fields a resumed run may change (a longer run continues a shorter one).
MAY_CHANGE = hosts.MAY_CHANGE


class CheckpointError(FedbalanceError, ValueError):
    """A checkpoint that cannot be read or does not fit the run."""


@dataclass
class Checkpoint:
    config: dict[str, Any]
    round: int
    #: The global parameters: one flat vector (FedLab) or a state dict (FedML).
    model: torch.Tensor | dict[str, torch.Tensor]
    aggregator: dict[str, Any]
    participations: dict[int, int]
    sampler: list[int] | None = None
    plan: dict[str, Any] | None = None
    #: Process RNG states where the host draws from global RNGs (FedML sp: torch, numpy).
    rng: dict[str, Any] | None = None
    #: Per-round metrics the host keeps in memory only (Flower's strategy ``Result``), as JSON.
    history: dict[str, Any] | None = None
    #: The host that wrote it (its registry name: ``fedlab``, ``fedml``, ``flower``): a run
    #: resumes only from its own host's (:meth:`open`).
    host: str = ""

    def save(self, path: Path) -> None:
        if not self.host:
            raise ValueError("a checkpoint names the host that writes it (host=...)")
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "config": json.dumps(self.config, sort_keys=True),
            "round": self.round,
            "model": self.model,
            "aggregator": self.aggregator,
            "participations": [[int(c), int(k)] for c, k in sorted(self.participations.items())],
            "sampler": self.sampler,
            "plan": json.dumps(self.plan) if self.plan is not None else None,
            "rng": self.rng,
            "history": json.dumps(self.history) if self.history is not None else None,
            "host": self.host,
        }
        tmp = path.with_name(path.name + ".tmp")
        buffer = io.BytesIO()  # torch words a failed write as an opaque RuntimeError:
        torch.save(doc, buffer)  # the file is written below, where the OS says what went wrong
        try:
            with open(tmp, "wb") as f:
                f.write(buffer.getbuffer())
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise CheckpointError(
                f"cannot write the checkpoint of round {self.round} to {path} ({_why(e)}; "
                f"{_free(path.parent)}); {_last_saved(path)}"
            ) from e

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        if not path.is_file():
            raise CheckpointError(f"no checkpoint at {path} (a run writes one after every round)")
        try:
            doc = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as e:  # noqa: BLE001 - any failure to read is the same user error
            raise CheckpointError(
                f"{path} is not a readable fedbalance checkpoint (damaged or tampered?): "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            ) from e
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CheckpointError(f"{path} is not a fedbalance checkpoint")
        if doc.get("version") != VERSION:
            raise CheckpointError(
                f"{path}: checkpoint version {doc.get('version')!r}, this fedbalance reads "
                f"version {VERSION}"
            )
        try:
            ckpt = cls(
                config=_json(doc["config"], "config"),
                round=doc["round"],
                model=doc["model"],
                aggregator=doc["aggregator"],
                participations={int(c): int(k) for c, k in doc["participations"]},
                sampler=doc["sampler"],
                plan=_json(doc["plan"], "plan") if doc["plan"] is not None else None,
                rng=doc["rng"],
                history=_json(doc["history"], "history") if doc["history"] is not None else None,
                host=doc["host"],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: malformed checkpoint ({type(e).__name__}: {e})") from e
        ok = (
            isinstance(ckpt.config, dict)
            and isinstance(ckpt.round, int)
            and ckpt.round >= 0
            and isinstance(ckpt.host, str)
            and bool(ckpt.host)
            and _is_model(ckpt.model)
            and isinstance(ckpt.aggregator, dict)
            and (ckpt.sampler is None or all(isinstance(x, int) for x in ckpt.sampler))
            and (ckpt.history is None or isinstance(ckpt.history, dict))
        )
        if not ok:
            raise CheckpointError(f"{path}: malformed checkpoint (a field has the wrong type)")
        tensors = [ckpt.model] if isinstance(ckpt.model, torch.Tensor) else ckpt.model.values()
        if any(t.is_floating_point() and not torch.isfinite(t).all() for t in tensors):
            raise CheckpointError(
                f"{path}: the model holds NaN or Inf values; resuming would skip every round. "
                "Resume from an earlier copy or start afresh"
            )
        if any(c < 0 or k < 0 or k > ckpt.round * 1000 for c, k in ckpt.participations.items()):
            raise CheckpointError(
                f"{path}: participation counts must be non-negative and fit round {ckpt.round}"
            )
        return ckpt

    @classmethod
    def open(cls, path: Path, host: str) -> Checkpoint:
        """The checkpoint at ``path``, to resume a ``host`` run from: every host opens its
        checkpoint here, then checks it against its own config (its own keys). A checkpoint
        another host wrote is refused, naming both."""
        ckpt = cls.load(path)
        if ckpt.host != host:
            written = ckpt.host
            raise CheckpointError(
                f"{path} was written by a {LABELS.get(written, written)} run; this is a "
                f"{LABELS.get(host, host)} run: resume with the host that wrote it"
            )
        return ckpt

    def check_model(self, template: torch.Tensor | Mapping[str, torch.Tensor], path: Path) -> None:
        """Refuse a model that is not ``template``'s: names, shapes and dtypes."""
        mine, want = self.model, template
        if isinstance(want, torch.Tensor) or isinstance(mine, torch.Tensor):
            if not (
                isinstance(want, torch.Tensor)
                and isinstance(mine, torch.Tensor)
                and mine.shape == want.shape
                and mine.dtype == want.dtype
            ):
                raise CheckpointError(
                    f"{path}: its model ({_describe(mine)}) is not this run's ({_describe(want)})"
                )
            return
        missing = [k for k in want if k not in mine]
        extra = [k for k in mine if k not in want]
        if missing or extra:
            raise CheckpointError(
                f"{path}: its model has other parameters than this run's (missing "
                f"{missing[:3]}, unexpected {extra[:3]})"
            )
        for key, value in want.items():
            got = mine[key]
            if got.shape != value.shape or got.dtype != value.dtype:
                raise CheckpointError(
                    f"{path}: parameter {key!r} is {tuple(got.shape)} {got.dtype} in the "
                    f"checkpoint, {tuple(value.shape)} {value.dtype} in this run's model"
                )

    def check_config(self, config: dict[str, Any], path: Path) -> None:
        """Refuse to resume under a different config (``MAY_CHANGE`` fields excepted).

        A field the checkpoint lacks (added to :class:`RunConfig` after it was written) counts
        as its default, which is what that run used.
        """
        written = RunConfig().to_dict() | self.config
        keys = (set(config) | set(self.config)) - set(MAY_CHANGE)
        refuse_changes(path, written, config, keys, label="config", what="run config")
        self.check_rounds("rounds", config.get("rounds", 0))

    def check_rounds(self, key: str, rounds: Any) -> None:
        """Refuse a run shorter than the checkpoint (``key``: the host's name for its rounds)."""
        if rounds < self.round:
            raise CheckpointError(
                f"{key} must be at least the checkpoint's round ({self.round}) to resume, "
                f"got {rounds!r}"
            )


def check_plan(written: dict[str, Any] | None, plan: dict[str, Any]) -> None:
    """Refuse to resume an Astraea run whose plan (from the clients' label counts) is not the
    one the checkpoint was written under (``written``; ``None``: it kept none)."""
    if written is not None and written != plan:
        raise CheckpointError(
            "the Astraea plan from the clients' label counts differs from the checkpoint's: "
            "the data or partition changed since it was written"
        )


def refuse_changes(
    path: Path,
    written: Mapping[str, Any],
    current: Mapping[str, Any],
    keys: Iterable[str],
    *,
    label: str = "now",
    what: str = "run",
    may_change: Iterable[str] = MAY_CHANGE,
) -> None:
    """Refuse to resume when a field in ``keys`` differs between the checkpoint's ``written``
    values and this run's ``current`` ones, naming each and what may change (``may_change``,
    in the host's own key names): every host says it the same way."""
    differ = sorted(k for k in keys if current.get(k) != written.get(k))
    if differ:
        detail = "; ".join(
            f"{k}: checkpoint {written.get(k)!r}, {label} {current.get(k)!r}" for k in differ
        )
        raise CheckpointError(
            f"{path} was written by a different {what} ({detail}); only "
            f"{', '.join(may_change)} may change when resuming"
        )


def _json(text: Any, field: str) -> Any:
    """A checkpoint's JSON field, bounded (a tampered file cannot exhaust the stack or memory)."""
    if not isinstance(text, str):
        raise TypeError(f"{field} is not JSON text")
    return load_json(text, field, max_bytes=64 << 20, max_nodes=1_000_000)


def _describe(model: Any) -> str:
    if isinstance(model, torch.Tensor):
        return f"a {tuple(model.shape)} {model.dtype} vector"
    return f"a state dict of {len(model)} tensors"


def _is_model(model: Any) -> bool:
    if isinstance(model, torch.Tensor):
        return model.is_floating_point()
    return (
        isinstance(model, dict)
        and bool(model)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items())
    )


def sampler_state(rng: Any) -> list[int] | None:
    """A ``random.Random`` state as a flat list of ints (``None`` for no RNG)."""
    if rng is None:
        return None
    version, internal, gauss = rng.getstate()
    if gauss is not None:  # never used by sample(); refuse rather than lose it silently
        raise ValueError("the sampler RNG has a cached gauss value; cannot checkpoint it")
    return [int(version), *internal]


def restore_sampler(rng: Any, state: list[int] | None) -> None:
    if (rng is None) != (state is None):
        raise CheckpointError("the checkpoint's client sampler does not match this run's")
    if rng is not None and state is not None:
        rng.setstate((state[0], tuple(state[1:]), None))


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def _free(folder: Path) -> str:
    """How much room the disk holding ``folder`` has left."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return "its disk could not be read"
    return f"{st.f_bavail * st.f_frsize:,} bytes free on that disk"


def _last_saved(path: Path) -> str:
    """What survives a failed save: the checkpoint already at ``path``, if it reads."""
    try:
        return (
            f"{path} still holds round {Checkpoint.load(path).round}; free some space, then resume"
        )
    except CheckpointError:
        return "no earlier round was saved"


def resume_hint(out_dir: Path, *logs: Path) -> str:
    """For a stopped run's error message: why it stopped when one of ``logs`` says the run
    learned nothing (:class:`~fl_aggregators.NothingAggregated`), then its checkpoint's round
    and how to resume, or that no round had completed."""
    cause = next(filter(None, map(nothing_aggregated, logs)), None)
    stop = f"; it stopped because {cause}" if cause else ""
    path = out_dir / NAME
    try:
        done = Checkpoint.load(path).round
    except CheckpointError:
        return (
            f"{stop}; no round had completed, so there is no checkpoint to resume: start the "
            "run again with `fedbalance run --overwrite` (without --resume)"
        )
    return f"{stop}; {path} holds round {done}: `fedbalance run --resume` continues from it"


def nothing_aggregated(log: Path) -> str | None:
    """The last :class:`~fl_aggregators.NothingAggregated` message in the log at ``log``."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = re.findall(r"NothingAggregated: (.+)", text)
    return found[-1].strip() if found else None


def recording_to(path: Path) -> contextlib.AbstractContextManager[None]:
    """Aggregations in this process (and the processes it starts) also go to ``path``."""
    from fl_aggregators.record import RUN_ENV

    return scoped_env(RUN_ENV, str(path))
