"""FedAvg: average client models weighted by their sample counts.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017, https://arxiv.org/abs/1602.05629.

``update_clip`` (off by default; every FedAvg-family aggregator takes it): a client whose
update ``w_i - g`` is longer than ``update_clip`` x the round's lower-median update norm has
it shortened to that length before averaging (norm bounding, as Sun et al., "Can You Really
Backdoor Federated Learning?", 2019). It stops a client that scales or flips its update from
dominating the model whatever its weight; it costs one more read of every client's
parameters, which is why it is opt-in (``fedbalance bench reliability`` measures both).
The weights reported stay the aggregator's; the record adds each client's ``update_scale``.

``sample_clip`` (FedAvg, FedAvgM, FedLoss-n and Astraea take it; 20 by default in FedAvg and
FedLoss-n, off in FedAvgM and Astraea): the sample
count is a number the client reports, so one client claiming 10^3 x its samples takes the
model. With ``sample_clip = c``, a count more than ``c`` x the round's runner-up count is not
believed and counts as the runner-up's: a lone liar beyond that margin takes exactly the share
of the largest honest client. Honest quantity skew is heavy-tailed, so ``c = 1`` would move
weight in most rounds while a wide margin rarely touches honest rounds; the price of the margin
is that a liar who stays within it gets up to ``c`` x the runner-up's weight.
``fedbalance bench reliability`` measures both sides (how far honest counts spread in the
thesis grid's quantity skew, what ``c = 20`` does to a liar and to honest runs of each
aggregator; benchmarks/results/reliability_fmnist.md); from those figures FedAvgM (and
Astraea, whose ``n_m`` has its own bound) keep it off unless asked.
It needs three or more clients a round.

Every bound notes whom it touched: a round's result (and aggregation record) carries
``bounded``, the ids of the clients whose reported count or loss a bound lowered, whenever
there are any, so a benchmark can say in which rounds its bounds changed a weight.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from fl_aggregators.base import Aggregator
from fl_aggregators.functional import (
    columns,
    normalize,
    update_scales,
    weighted_means,
)
from fl_aggregators.update import ClientUpdate
from fl_checks import check_float

log = logging.getLogger(__name__)


def check_clip(value: float | None, name: str) -> float | None:
    """A bound parameter: ``None`` (off) or a finite float >= 1."""
    return check_float(name, value, 1.0, optional=True)


#: The default ``sample_clip`` where it is on (FedAvg, FedLoss-n): see the module docstring.
SAMPLE_CLIP = 20.0


class FedAvg(Aggregator):
    """FedAvg: weights n_i / sum n (McMahan et al. 2017); optional ``update_clip``;
    ``sample_clip`` (default 20)."""

    name = "fedavg"

    def __init__(
        self, *, update_clip: float | None = None, sample_clip: float | None = SAMPLE_CLIP
    ) -> None:
        super().__init__()
        self.update_clip = check_clip(update_clip, "update_clip")
        self.sample_clip = check_clip(sample_clip, "sample_clip")
        self._scales: list[float] | None = None
        self._bounded: list[Any] = []  # clients a bound touched in this round's combine

    def note_bounded(
        self, updates: Sequence[ClientUpdate], before: torch.Tensor, after: torch.Tensor
    ) -> None:
        """Remember the clients whose value a bound lowered (``after < before``)."""
        for i in torch.nonzero(after < before).flatten().tolist():
            who = updates[i].client_id if updates[i].client_id is not None else i
            if who not in self._bounded:
                self._bounded.append(who)

    def bounded_counts(self, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        """Reported sample counts (float64); under ``sample_clip`` a round's top count beyond
        ``sample_clip`` x the runner-up's counts as the runner-up's."""
        counts = torch.tensor([float(u.num_samples) for u in updates], dtype=torch.float64)
        if self.sample_clip is None:
            return counts
        if len(counts) < 3:  # with two clients neither can be told apart from a liar
            return counts
        top2 = torch.topk(counts, 2)
        i, runner_up = int(top2.indices[0]), top2.values[1]
        if counts[i] > self.sample_clip * runner_up:
            bounded = counts.clone()
            bounded[i] = runner_up
            self.note_bounded(updates, counts, bounded)
            who = updates[i].client_id if updates[i].client_id is not None else f"#{i}"
            log.warning(
                "%s: client %s reported num_samples %d, more than sample_clip=%g x the "
                "runner-up's %d; counted as %d",
                self.name,
                who,
                int(counts[i]),
                self.sample_clip,
                int(runner_up),
                int(runner_up),
            )
            return bounded
        return counts

    def client_weights(self, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        """Normalised aggregation weights of the accepted clients."""
        return normalize(self.bounded_counts(updates))

    def secure_refusal(self) -> str | None:
        if self.update_clip is not None:
            return (
                f"{self.name!r} with update_clip needs each client's update norm, and under "
                "secure aggregation the server sees only the masked sum: set update_clip: null"
            )
        return None

    def _combine(
        self,
        global_tensors: list[torch.Tensor],
        updates: Sequence[ClientUpdate],
        client_tensors: list[list[torch.Tensor]],
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        self._bounded = []  # a retried combine (after rejecting a client) notes afresh
        w = self.client_weights(updates)
        return self.step(global_tensors, self.average(global_tensors, client_tensors, w)), w

    def average(
        self,
        global_tensors: list[torch.Tensor],
        client_tensors: list[list[torch.Tensor]],
        w: torch.Tensor,
    ) -> list[torch.Tensor]:
        """``sum_i w_i x_i`` per tensor, with long updates shortened under ``update_clip``."""
        if self.update_clip is None:
            return weighted_means(columns(client_tensors), w, self._pool)
        scale = update_scales(global_tensors, client_tensors, self.update_clip)
        self._scales = scale.tolist()
        # g + sum_i w_i s_i (x_i - g): a weighted mean over [g, x_1 .. x_k], no extra copy.
        ws = w.to(torch.float64) * scale
        mixed = torch.cat([(1.0 - ws.sum()).clamp(min=0.0).reshape(1), ws])
        return weighted_means(columns([global_tensors, *client_tensors]), mixed, self._pool)

    def _take_extra(self) -> dict[str, Any]:
        extra = super()._take_extra()
        if self._scales is not None:
            extra["update_scale"], self._scales = self._scales, None
        if self._bounded:
            extra["bounded"], self._bounded = self._bounded, []
        return extra
