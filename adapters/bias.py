"""Bias figures: per-class and per-client accuracy beside top-1, the same keys on every host.

One evaluation pass counts, per class, the samples and the correct predictions
(:class:`Counts`); counts add up over batches, clients and replies, so every figure comes from
the pass that gives today's accuracy, without a second one. From the counts of the evaluation
data, :func:`class_figures` gives:

* ``balanced_accuracy``: the mean recall over the classes present in the evaluation data;
* ``class_recall``: one recall per class, ``null`` for a class absent from the evaluation data;
* ``worst_class`` and ``worst_class_recall``: the present class with the lowest recall (the
  lowest index on a tie).

From each evaluated client's own counts (``eval_data: clients``), :func:`client_figures`
summarises the clients' accuracies as q-FFL and FederatedScope judge fairness:
``client_acc_mean``, ``client_acc_std`` (sample std, n - 1; ``null`` for one client),
``client_acc_min``, ``client_acc_p10`` and ``client_acc_p90`` (linear interpolation between
order statistics, numpy's default). A client with no evaluation samples has no accuracy and is
left out of the summary (logged), never counted as 0.

:func:`figures` computes them all for any model and data, e.g. inside a FedLab or FedML
script: ``figures(model, {c: loader for c, loader in test_loaders.items()})``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

log = logging.getLogger(__name__)

#: The most classes a count vector may have (what a client may report is bounded by it).
MAX_CLASSES = 100_000


@dataclass
class Counts:
    """What one evaluation pass counts: the summed loss, and per class the samples and the
    correct predictions (``int64`` vectors of one length, the number of classes)."""

    loss_sum: float = 0.0
    total: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    correct: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def n(self) -> int:
        return int(self.total.sum())

    @property
    def loss(self) -> float:
        return self.loss_sum / self.n if self.n else math.nan

    @property
    def accuracy(self) -> float:
        return int(self.correct.sum()) / self.n if self.n else math.nan

    def __add__(self, other: Counts) -> Counts:
        k = max(len(self.total), len(other.total))
        return Counts(
            self.loss_sum + other.loss_sum,
            _padded(self.total, k) + _padded(other.total, k),
            _padded(self.correct, k) + _padded(other.correct, k),
        )


def _padded(v: NDArray[np.int64], k: int) -> NDArray[np.int64]:
    return np.pad(v, (0, k - len(v))) if len(v) < k else v


def total(counts: Sequence[Counts]) -> Counts:
    """The counts of the union of the evaluations ``counts``."""
    out = Counts()
    for c in counts:
        out = out + c
    return out


def class_figures(counts: Counts, num_classes: int | None = None) -> dict[str, Any]:
    """Balanced accuracy, per-class recall and the worst class of ``counts`` (over
    ``num_classes`` classes when given: a class the model never saw is still listed)."""
    k = max(len(counts.total), num_classes or 0)
    seen, right = _padded(counts.total, k), _padded(counts.correct, k)
    recall: list[float | None] = [float(right[c] / seen[c]) if seen[c] else None for c in range(k)]
    present = [(r, c) for c, r in enumerate(recall) if r is not None]
    if not present:
        return {
            "balanced_accuracy": None,
            "class_recall": recall,
            "worst_class": None,
            "worst_class_recall": None,
        }
    worst_recall, worst = min(present)
    return {
        "balanced_accuracy": float(np.mean([r for r, _ in present])),
        "class_recall": recall,
        "worst_class": worst,
        "worst_class_recall": worst_recall,
    }


def client_figures(per_client: Mapping[Any, Counts]) -> dict[str, Any]:
    """The distribution of the evaluated clients' accuracies (clients with no samples left
    out, logged); the keys are ``None`` when no client had samples."""
    empty = [c for c, v in per_client.items() if v.n == 0]
    if empty:
        log.info("clients %s have no evaluation samples: left out of the client figures", empty)
    accs = np.array([v.accuracy for v in per_client.values() if v.n], dtype=np.float64)
    if not len(accs):
        keys = ("mean", "std", "min", "p10", "p90")
        return {f"client_acc_{k}": None for k in keys} | {"clients_evaluated": 0}
    return {
        "client_acc_mean": float(accs.mean()),
        "client_acc_std": float(accs.std(ddof=1)) if len(accs) > 1 else None,
        "client_acc_min": float(accs.min()),
        "client_acc_p10": float(np.percentile(accs, 10)),
        "client_acc_p90": float(np.percentile(accs, 90)),
        "clients_evaluated": len(accs),
    }


def client_accuracies(per_client: Mapping[Any, Counts]) -> dict[str, float | None]:
    """Each client's accuracy (``None``: no samples), keyed by its id as text (JSON)."""
    return {str(c): (v.accuracy if v.n else None) for c, v in per_client.items()}


def figures(
    model: Any,
    data: Any,
    *,
    num_classes: int | None = None,
    keys: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Loss, accuracy and the bias figures of ``model`` on ``data``, in one pass over it.

    ``data``: a dataset or ``DataLoader`` (of ``(x, y)`` pairs or dict samples, read by
    ``keys``), or a mapping client -> dataset or loader (the client figures and each client's
    accuracy, ``client_accuracy``, are then added). ``num_classes`` lists classes the data
    lacks as ``None`` in ``class_recall``.
    """
    from fl_adapters._training import evaluate_counts  # torch, on first use

    parts = data if isinstance(data, Mapping) else {None: data}
    per = {c: evaluate_counts(model, d, keys=keys) for c, d in parts.items()}
    counts = total(list(per.values()))
    out: dict[str, Any] = {"loss": counts.loss, "accuracy": counts.accuracy, "samples": counts.n}
    out |= class_figures(counts, num_classes)
    if isinstance(data, Mapping):
        out |= client_figures(per) | {"client_accuracy": client_accuracies(per)}
    return out
