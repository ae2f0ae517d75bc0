"""FedAvg: average client models weighted by their sample counts.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017, https://arxiv.org/abs/1602.05629.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fl_aggregators.base import Aggregator
from fl_aggregators.functional import normalize, weighted_mean
from fl_aggregators.update import ClientUpdate


class FedAvg(Aggregator):
    """FedAvg: weights n_i / sum n (McMahan et al. 2017)."""

    name = "fedavg"

    def __init__(self) -> None:
        super().__init__()

    def client_weights(self, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        """Normalised aggregation weights of the accepted clients."""
        return normalize([u.num_samples for u in updates])

    def _combine(
        self,
        global_tensors: list[torch.Tensor],
        updates: Sequence[ClientUpdate],
        client_tensors: list[list[torch.Tensor]],
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        w = self.client_weights(updates)
        out = [weighted_mean([c[j] for c in client_tensors], w) for j in range(len(global_tensors))]
        return out, w
