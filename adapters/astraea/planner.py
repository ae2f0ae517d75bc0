"""Astraea's server side: the plan from the clients' label counts, each round's mediators,
and what a round moves (bytes) and how far its mediators are from uniform (KL)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from fl_adapters.astraea.rebalance import label_counts
from fl_aggregators.astraea import Astraea
from fl_aggregators.astraea_plan import (
    RebalancePlan,
    assign_mediators,
    check_counts,
    client_kl,
    expected_counts_after,
    mediator_kl,
    plan_rebalance,
)

log = logging.getLogger(__name__)


class AstraeaPlanner:
    """The server's Astraea state: the rebalancing plan and each round's mediators.

    Parameters
    ----------
    counts : clients x classes label counts, as the clients report them (row = client id).
    aggregator : the run's :class:`~fl_aggregators.astraea.Astraea` (its ``tau_d``, ``gamma``,
        ``augment`` and ``mediators``).
    """

    def __init__(self, counts: Any, aggregator: Astraea) -> None:
        self.counts = check_counts(counts, "client label counts")
        self.aggregator = aggregator
        classes = self.counts.shape[1]
        if aggregator.augment:
            self.plan = plan_rebalance(
                self.counts, aggregator.tau_d, aggregator.count_clip, aggregator.augment_rule
            )
        else:  # mediators only: nothing is rescaled
            self.plan = RebalancePlan(
                z=np.zeros(classes),
                rad=np.ones(classes),
                augment=[],
                downsample=[],
                mu=float(self.counts.sum(axis=0).mean()),
                sigma=0.0,
                tau_d=aggregator.tau_d,
            )
        self.expected = expected_counts_after(self.counts, self.plan)
        if self.plan.augment or self.plan.downsample:
            log.info(
                "astraea: augment classes %s, downsample %s (rad %s)",
                self.plan.augment,
                self.plan.downsample,
                np.round(self.plan.rad, 3).tolist(),
            )

    @property
    def rad(self) -> NDArray[np.float64]:
        return self.plan.rad

    def mediators(self, sampled: Sequence[int]) -> list[list[int]]:
        """Algorithm 3 over this round's sampled clients: client ids per mediator, in order."""
        ids = sorted(int(c) for c in sampled)
        groups = assign_mediators(self.expected[ids], self.aggregator.group_size)
        return [[ids[i] for i in g] for g in groups]

    @classmethod
    def from_labels(cls, labels: Sequence[torch.Tensor], aggregator: Astraea) -> AstraeaPlanner:
        """The planner from each client's training labels (client id = position)."""
        classes = max(int(y.max()) for y in labels if len(y)) + 1
        return cls(np.stack([label_counts(y, classes) for y in labels]), aggregator)

    def bound_samples(self, members: Sequence[int], claimed: int) -> int:
        """A mediator's reported ``n_m``, held to what its members can hold after rebalancing.

        Rebalancing keeps each sample at most ``ceil(rad)`` times (downsampled classes at most
        once), so ``sum counts x max(1, ceil(rad))`` over the members' reported label counts
        bounds any honest ``n_m``: an honest mediator is never lowered, and a member inflating
        the sample count it reports after training gets no more than its own data's weight.
        """
        copies = np.maximum(1.0, np.ceil(self.plan.rad))
        ceiling = int((self.counts[[int(c) for c in members]] * copies).sum())
        if claimed <= ceiling:
            return claimed
        log.warning(
            "astraea: mediator of clients %s reported %d samples, at most %d after "
            "rebalancing; bounded to %d",
            list(members),
            claimed,
            ceiling,
            ceiling,
        )
        return ceiling

    def mediator_kl(self, mediators: list[list[int]]) -> list[float]:
        return mediator_kl(self.expected, mediators)

    def preview(self, clients: list[int]) -> dict[str, Any]:
        """A round's plan as ``fedbalance astraea plan`` prints it: the rebalancing, the
        round's clients grouped into mediators, and the KL to uniform of mediators and
        clients."""
        mediators = self.mediators(clients)
        kl = self.client_kl()
        return {
            **self.plan.as_dict(),
            "gamma": self.aggregator.group_size,
            "clients": clients,
            "mediators": mediators,
            "kl": self.mediator_kl(mediators),
            "client_kl_before": kl["before"],
            "client_kl_after": kl["after"],
        }

    def annotate(
        self,
        aggregator: Astraea,
        mediators: list[list[int]],
        param_bytes: int,
        extra_down: int = 0,
        models: Sequence[Any] | None = None,
    ) -> None:
        """Add the round's mediators, their KL and its traffic to ``aggregator``'s next record;
        with ``models`` (one per mediator), a ``digest`` of each (:func:`model_digest`)."""
        aggregator.annotate(
            mediators=mediators,
            kl=self.mediator_kl(mediators),
            bytes=round_traffic(param_bytes, mediators, aggregator.mediator_epochs, extra_down),
            **({"digest": [model_digest(m) for m in models]} if models is not None else {}),
        )

    def client_kl(self) -> dict[str, list[float]]:
        """Each client's KL to uniform before and (expected) after rebalancing."""
        return {"before": client_kl(self.counts), "after": client_kl(self.expected)}


def model_digest(params: Any) -> list[float]:
    """``[sum, L2 norm]`` of a model's parameters (a flat tensor or a state dict), in float64:
    what a mediator sent, comparable across hosts and processes to float-order tolerance."""
    tensors = (
        [t for t in params.values() if torch.is_tensor(t)] if isinstance(params, dict) else [params]
    )
    flat = torch.cat([t.detach().double().flatten().cpu() for t in tensors])
    return [float(flat.sum()), float(flat.norm())]


def round_traffic(
    param_bytes: int, mediators: list[list[int]], mediator_epochs: int, extra_down: int = 0
) -> dict[str, int]:
    """Bytes one Astraea round moves: server <-> mediators, and mediators <-> their clients.

    ``extra_down`` is what the downlink carries besides the parameters (plan, layout) per
    mediator. Each client visit moves the model to the client and back, except in a mediator
    of one client: that client is its own mediator (with ``mediators: false`` every client
    is, and the traffic is plain FedAvg's).
    """
    m = len(mediators)
    visits = mediator_epochs * sum(len(g) for g in mediators if len(g) > 1)
    return {
        "server_down": m * (param_bytes + extra_down),
        "server_up": m * param_bytes,
        "mediator_clients": 2 * param_bytes * visits,
    }
