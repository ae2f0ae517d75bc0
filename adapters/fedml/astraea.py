"""Astraea in FedML's sp simulation (``aggregator: astraea`` in an unmodified host script).

FedML's ``FedAvgAPI.train`` keeps its loop; :mod:`.adapter` routes three of its calls here when
the aggregator is Astraea:

* ``_client_sampling``: FedML samples the round's clients as usual; the first call builds the
  :class:`~fl_adapters.astraea.AstraeaPlanner` from every client's label counts (read from
  FedML's ``train_data_local_dict``), and every call groups the sampled clients into mediators
  and returns them *in mediator order*, so FedML's slots visit each mediator's members together.
* ``Client.train``: the slot of a mediator's first member runs the mediator's chain — FedML's
  own ``model_trainer.train`` on each member's rebalanced data in turn, each starting from the
  previous member's weights, ``mediator_epochs`` times; the other members' slots return the
  mediator's result (their training happened in the chain).
* ``_aggregate``: one update per mediator, weights ``n_m / n``, recorded with the mediators,
  their KL to uniform and the round's bytes.

MPI cross-silo is not covered: see the README's Astraea section for what blocks it.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from fl_adapters.astraea import AstraeaPlanner, dataset_tensors, rebalance_client, run_mediator
from fl_adapters.fedml.payload import attach
from fl_aggregators.astraea import Astraea

log = logging.getLogger(__name__)


def like(data: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    """``(x, y)`` in the same form as the host's ``data`` (DataLoader or list of batches)."""
    if isinstance(data, DataLoader):
        return DataLoader(TensorDataset(x, y), batch_size=data.batch_size or 32, shuffle=True)
    batch = len(next(iter(data))[1]) if len(data) else 32
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(y), batch)]


class SpAstraea:
    """One sp run's Astraea state (built on the first sampling call)."""

    def __init__(self, api: Any, aggregator: Astraea, seed: int) -> None:
        self.aggregator = aggregator
        self.seed = seed
        self.api = api
        clients = range(int(api.args.client_num_in_total))
        self.planner = AstraeaPlanner.from_labels(
            [dataset_tensors(api.train_data_local_dict[c])[1] for c in clients], aggregator
        )
        self.data: dict[int, Any] = {}
        self.mediators: list[list[int]] = []
        self.results: dict[int, tuple[OrderedDict[str, Any], int]] = {}
        self.trace: list[tuple[int, int, int]] = []
        self.round = 0

    def client_data(self, client: int) -> Any:
        """The client's rebalanced training data (built once, seeded by ``(seed, client)``)."""
        if client not in self.data:
            original = self.api.train_data_local_dict[client]
            x, y = dataset_tensors(original)
            x2, y2 = rebalance_client(x, y, self.planner.rad, self.seed, client)
            self.data[client] = like(original, x2, y2)
        return self.data[client]

    def sample(self, sampled: Any) -> list[int]:
        """Group this round's clients into mediators; FedML's slot order, mediator by mediator."""
        self.round += 1
        self.mediators = self.planner.mediators([int(c) for c in sampled])
        self.results = {}
        return [c for members in self.mediators for c in members]

    def train_slot(self, client: Any, w_global: Any) -> OrderedDict[str, Any]:
        """FedML's ``Client.train`` for the slot of ``client``: its mediator's chain, once."""
        m = next(i for i, g in enumerate(self.mediators) if int(client.client_idx) in g)
        if m not in self.results:
            trainer = client.model_trainer

            def train_one(c: int, w: Any) -> tuple[Any, int]:
                self.trace.append((self.round, m, c))
                data = self.client_data(c)
                trainer.set_id(c)
                trainer.set_model_params(w)
                trainer.train(data, client.device, client.args)
                n = (
                    len(data.dataset)  # type: ignore[arg-type]
                    if isinstance(data, DataLoader)
                    else sum(len(b[1]) for b in data)
                )
                return trainer.get_model_params(), n

            result = run_mediator(
                self.mediators[m], w_global, train_one, self.aggregator.mediator_epochs
            )
            self.results[m] = (copy.deepcopy(result.params), result.num_samples)
        return self.results[m][0]

    def model_list(self) -> list[tuple[int, Any]]:
        """One ``(n_m, params)`` per mediator, in mediator order; annotates the record."""
        params = [self.results[m][0] for m in range(len(self.mediators))]
        param_bytes = sum(
            int(t.numel() * t.element_size()) for t in params[0].values() if torch.is_tensor(t)
        )
        self.planner.annotate(self.aggregator, self.mediators, param_bytes)
        return [
            (self.results[m][1], attach(params[m], m, None)) for m in range(len(self.mediators))
        ]
