"""FedMedian: coordinate-wise median of the client models.

Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates", ICML 2018, https://arxiv.org/abs/1803.01498. For an even number of clients
the median is the mean of the two middle values (as ``numpy.median``, and Flower's
``aggregate_median``). Sample counts do not weigh in; the recorded weights are 1/K each, the
say each accepted client has.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fl_aggregators.base import Aggregator
from fl_aggregators.functional import columns, medians
from fl_aggregators.update import ClientUpdate


class FedMedian(Aggregator):
    """FedMedian: coordinate-wise median of client parameters (Yin et al. 2018)."""

    name = "fedmedian"

    def __init__(self) -> None:
        super().__init__()

    def _combine(
        self,
        global_tensors: list[torch.Tensor],
        updates: Sequence[ClientUpdate],
        client_tensors: list[list[torch.Tensor]],
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        out = medians(columns(client_tensors), self._pool)
        k = len(updates)
        return out, torch.full((k,), 1.0 / k, dtype=torch.float64)
