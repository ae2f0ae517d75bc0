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

MPI cross-silo (:class:`SiloAstraea`): FedML's server manager sends each round's model to the
first silo of every mediator only and forwards each upload to the next silo of its mediator
(the server plays the mediator); the rebalancing ratios travel in the downlink under a
reserved key, and each silo rebalances its own data once. MPI *simulation* is not covered
yet: its ``FedAVGServerManager`` sends per worker too, so the same relay would apply there.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from fl_adapters.astraea import AstraeaPlanner, dataset_tensors, rebalance_client, run_mediator
from fl_adapters.fedml.payload import KEY_RAD, attach, strip
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


# -- MPI cross-silo: the server relays each mediator's model from one silo to the next ---------
def with_rad(params: Any, rad: Any) -> OrderedDict[str, Any]:
    """Clean ``params`` plus the rebalancing ratios, for a cross-silo downlink."""
    clean, _, _ = strip(params)
    clean[KEY_RAD] = torch.as_tensor(rad, dtype=torch.float64)
    return clean


def take_rad(params: Any) -> tuple[Any, Any]:
    """``(params without reserved keys, rad or None)`` from a cross-silo downlink."""
    if not isinstance(params, dict) or KEY_RAD not in params:
        return params, None
    rad = params[KEY_RAD].double().numpy()
    clean, _, _ = strip(params)
    return clean, rad


class SiloClientData:
    """A cross-silo client's rebalanced training data, per silo index (built once, seeded)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.data: dict[int, tuple[Any, int]] = {}

    def get(self, silo: int, original: Any, rad: Any) -> tuple[Any, int]:
        if silo not in self.data:
            x, y = dataset_tensors(original)
            x2, y2 = rebalance_client(x, y, rad, self.seed, silo)
            self.data[silo] = (like(original, x2, y2), len(y2))
        return self.data[silo]


class SiloAstraea:
    """The cross-silo server's Astraea state: the plan, this round's chains and their results.

    A chain is a mediator: ``[(FedML client id, data silo index), ...]`` in training order.
    FedML sends the round's model to the first member of each chain only; each member's upload
    is forwarded to the next member (the server plays the mediator), and a chain's last upload
    is the mediator's update.
    """

    def __init__(self, manager: Any, aggregator: Astraea) -> None:
        if aggregator.mediator_epochs != 1:
            raise ValueError(
                "astraea in FedML cross-silo needs mediator_epochs: 1 (each silo trains once a "
                f"round, as FedML's client counts rounds), got {aggregator.mediator_epochs}"
            )
        self.aggregator = aggregator
        host = manager.aggregator
        silos = range(int(manager.args.client_num_in_total))
        self.planner = AstraeaPlanner.from_labels(
            [dataset_tensors(host.train_data_local_dict[s])[1] for s in silos], aggregator
        )
        self.chains: list[list[tuple[int, int]]] = []
        self.samples: list[int] = []
        self.results: dict[int, Any] = {}

    def plan_round(self, client_ids: list[int], silo_indexes: list[int]) -> None:
        """Group the round's silos into chains (Algorithm 3 over their label counts)."""
        by_silo = {int(s): int(c) for c, s in zip(client_ids, silo_indexes, strict=True)}
        self.chains = [
            [(by_silo[s], s) for s in members] for members in self.planner.mediators(list(by_silo))
        ]
        self.samples = [0] * len(self.chains)
        self.results = {}

    def first_members(self) -> set[int]:
        return {chain[0][0] for chain in self.chains}

    def received(self, sender: int, params: Any, n: int) -> tuple[int, int] | None:
        """Record ``sender``'s upload; the ``(client id, silo)`` to forward to, or ``None``."""
        m, pos = next(
            (m, i)
            for m, chain in enumerate(self.chains)
            for i, (c, _) in enumerate(chain)
            if c == sender
        )
        self.samples[m] += int(n)
        if pos + 1 < len(self.chains[m]):
            return self.chains[m][pos + 1]
        self.results[m] = strip(params)[0]
        return None

    def done(self) -> bool:
        return len(self.results) == len(self.chains)

    def model_list(self) -> list[tuple[int, Any]]:
        """One ``(n_m, params)`` per mediator; annotates the record (mediators by silo index)."""
        params = [self.results[m] for m in range(len(self.chains))]
        param_bytes = sum(
            int(t.numel() * t.element_size()) for t in params[0].values() if torch.is_tensor(t)
        )
        mediators = [[s for _, s in chain] for chain in self.chains]
        # Every hop goes through the server here: each silo visit is one downlink (model and
        # rad) and one uplink; there is no client-to-client traffic.
        visits = sum(len(chain) for chain in self.chains)
        rad_bytes = 8 * len(self.planner.rad)
        self.aggregator.annotate(
            mediators=mediators,
            kl=self.planner.mediator_kl(mediators),
            bytes={
                "server_down": visits * (param_bytes + rad_bytes),
                "server_up": visits * param_bytes,
                "mediator_clients": 0,
            },
        )
        return [(self.samples[m], attach(params[m], m, None)) for m in range(len(self.chains))]
