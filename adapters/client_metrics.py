"""Client metrics by name: what an aggregator may ask each client to measure and send.

An aggregator lists the names it needs in ``required_metrics`` (FedLoss: ``("val_loss",)``).
:data:`CLIENT_METRICS` says how a client computes each one: from one evaluation of its trained
model on one of its local splits (:class:`Evaluation`, as each host measures it: FedML through
the user's trainer's ``test`` when it reports one). Every host asks :func:`requested` which
names to send, measures them with :func:`measure`, and carries them by name, so a metric is
one entry of this table and no host names any.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from fl_checks import ParameterError

log = logging.getLogger(__name__)


class Evaluation(NamedTuple):
    """One pass of a model over a dataset: mean loss, accuracy and the samples counted."""

    loss: float
    accuracy: float
    n: int


@dataclass(frozen=True)
class ClientMetric:
    """How a client computes the metric ``name``: ``value`` of an :class:`Evaluation` of its
    trained model on its ``split`` (``None``: nothing to report)."""

    name: str
    split: str
    value: Callable[[Evaluation], float | None]
    doc: str


CLIENT_METRICS: Mapping[str, ClientMetric] = {
    m.name: m
    for m in (
        ClientMetric(
            "val_loss",
            "val",
            lambda e: e.loss,
            "mean cross-entropy of the trained local model on the client's validation split",
        ),
    )
}


def requested(aggregator: Any) -> tuple[str, ...]:
    """The client metrics ``aggregator`` (a class or an instance) needs, each one a name of
    :data:`CLIENT_METRICS`; a :class:`ParameterError` naming the unknown ones otherwise (when
    the host arms, before any client trains)."""
    names = tuple(getattr(aggregator, "required_metrics", ()))
    unknown = [n for n in names if n not in CLIENT_METRICS]
    if unknown:
        who = getattr(aggregator, "name", type(aggregator).__name__)
        raise ParameterError(
            f"aggregator {who!r} needs client metrics {unknown}, which no client can compute: "
            f"the client metrics are {', '.join(CLIENT_METRICS)} (fl_adapters.client_metrics)"
        )
    return names


def splits(names: Sequence[str]) -> set[str]:
    """The local splits the metrics ``names`` are computed on (``{"val"}``: clients hold out a
    validation split)."""
    return {CLIENT_METRICS[n].split for n in names}


def measure(
    names: Sequence[str], evaluate: Callable[[], Evaluation | None], client: Any
) -> dict[str, float]:
    """The metrics ``names`` of client ``client``, from one ``evaluate()`` of its trained model
    on their split (``None`` or no samples: an empty split, and nothing is reported, said once
    in the log). Values go as measured: the aggregator's checks judge them (a client whose loss
    diverged is refused there, by name)."""
    if not names:
        return {}
    evaluation = evaluate()
    if evaluation is None or evaluation.n == 0:
        log.warning("client %s has an empty validation split; it reports no %s", client, names)
        return {}
    out: dict[str, float] = {}
    for name in names:
        value = CLIENT_METRICS[name].value(evaluation)
        if value is not None:
            out[name] = float(value)
    return out
