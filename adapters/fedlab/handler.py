"""A FedLab server handler that aggregates with any fedbalance aggregator: FedLab's
``SyncServerHandler`` with ``global_update`` replaced (a skipped round keeps the model).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from fedlab.contrib.algorithm.basic_server import SyncServerHandler
from fedlab.utils import SerializationTool

from fl_adapters.fedlab.payload import decode
from fl_adapters.registry import build_aggregator
from fl_adapters.sampling import sample_round
from fl_aggregators import AggregationResult, Aggregator


def aggregate_into(
    model: torch.nn.Module,
    aggregator: Aggregator,
    buffer: list[list[torch.Tensor]],
    round: int,
    host: str,
) -> AggregationResult:
    """Aggregate FedLab ``buffer`` with ``aggregator`` and load the result into ``model``."""
    updates = [decode(payload, f"#{i}") for i, payload in enumerate(buffer)]  # stock: by place
    result = aggregator.aggregate(
        SerializationTool.serialize_model(model), updates, round=round, host=host
    )
    if not result.skipped:
        SerializationTool.deserialize_model(model, result.params)
    return result


class FedBalanceServerHandler(SyncServerHandler):
    """``SyncServerHandler`` aggregating with a fedbalance plugin.

    Parameters
    ----------
    model, global_round, sample_ratio : as FedLab's ``SyncServerHandler``.
    aggregator : a registered name (``"fedloss"``) or an :class:`~fl_aggregators.Aggregator`.
    aggregator_args : keyword arguments for a named aggregator.
    seed : seeds client sampling with its own RNG (FedLab's uses the global ``random``).
    clients_per_round : exact number sampled per round (FedLab derives it as
        ``int(sample_ratio * num_clients)``, which float rounding can make one short).
    on_round : called as ``on_round(handler, result)`` after every aggregation.
    """

    #: fedbalance's own class: it aggregates (or trains) itself, with or without the autoload.
    _fedbalance_native = True

    def __init__(
        self,
        model: torch.nn.Module,
        global_round: int,
        sample_ratio: float,
        *,
        aggregator: str | Aggregator = "fedavg",
        aggregator_args: dict[str, Any] | None = None,
        seed: int | None = None,
        clients_per_round: int | None = None,
        host: str = "fedlab",
        on_round: Callable[[FedBalanceServerHandler, AggregationResult], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, global_round, sample_ratio, **kwargs)
        self.aggregator: Aggregator = build_aggregator(aggregator, aggregator_args)
        self.host = host
        self.on_round = on_round
        self.rng = random.Random(seed) if seed is not None else None
        self.last_result: AggregationResult | None = None
        self.clients_per_round = clients_per_round
        #: Local trainings per client so far (clients seed their training with it).
        self.participations: dict[int, int] = {}
        #: Trainings per sampled client per round (Astraea: its mediator epochs).
        self.participation_step = 1

    @property
    def num_clients_per_round(self) -> int:
        if self.clients_per_round is not None:
            return min(self.clients_per_round, self.num_clients)
        return max(1, int(self.sample_ratio * self.num_clients))

    def sample_clients(self) -> list[int]:
        if self.rng is None:
            sampled = list(super().sample_clients())
        else:
            sampled = sample_round(self.rng, self.num_clients, self.num_clients_per_round)
        for c in sampled:
            self.participations[c] = self.participations.get(c, 0) + self.participation_step
        return sampled

    def global_update(self, buffer: list[list[torch.Tensor]]) -> None:
        self.last_result = aggregate_into(
            self._model, self.aggregator, buffer, self.round + 1, self.host
        )
        if self.on_round is not None:
            self.on_round(self, self.last_result)
