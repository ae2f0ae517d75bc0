"""Astraea in FedML (``aggregator: astraea`` in an unmodified host script): :class:`SpAstraea`
in sp, :class:`SiloAstraea` on the server of MPI simulation and cross-silo, where ``rad`` and
the round travel in the downlink under reserved keys. How each mode runs the mediators, and
why all three end on the same model: docs/astraea.md.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from fl_adapters._training import stream_seed, training_clock
from fl_adapters.astraea import (
    AstraeaPlanner,
    Hop,
    MediatorRelay,
    RebalancedCache,
    dataset_tensors,
    run_mediator,
)
from fl_adapters.fedml.payload import KEY_RAD, KEY_ROUND, attach, strip
from fl_aggregators.astraea import Astraea
from fl_checks import ParameterError

log = logging.getLogger(__name__)


def like(data: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    """``(x, y)`` in the same form as the host's ``data`` (DataLoader or list of batches)."""
    if isinstance(data, DataLoader):
        return DataLoader(TensorDataset(x, y), batch_size=data.batch_size or 32, shuffle=True)
    batch = len(next(iter(data))[1]) if len(data) else 32
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(y), batch)]


@contextlib.contextmanager
def seeded_training(seed: int, client: int, round: int, epoch: int) -> Iterator[None]:
    """Torch's global RNG (FedML's shuffling loaders, dropout) seeded by ``(seed, client,
    round, epoch)`` for one client's training, then restored: a client trains the same batches
    in sp, in an MPI worker or in a silo."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed("fedml-astraea-train", seed, client, round, epoch))
        yield


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
        self.data = RebalancedCache()
        self.mediators: list[list[int]] = []
        self.results: dict[int, tuple[OrderedDict[str, Any], int]] = {}
        self.trace: list[tuple[int, int, int]] = []
        self.round = 0

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
                epoch = self.trace.count((self.round, m, c))
                self.trace.append((self.round, m, c))
                original = self.api.train_data_local_dict[c]
                data, n = silo_data(self.data, c, original, self.planner.rad, self.seed)
                trainer.set_id(c)
                trainer.set_model_params(w)
                with seeded_training(self.seed, c, self.round, epoch), training_clock(c):
                    trainer.train(data, client.device, client.args)
                return trainer.get_model_params(), n

            result = run_mediator(
                self.mediators[m], w_global, train_one, self.aggregator.mediator_epochs
            )
            self.results[m] = (copy.deepcopy(result.params), result.num_samples)
        return self.results[m][0]

    def model_list(self) -> list[tuple[int, Any]]:
        """One ``(n_m, params)`` per mediator, in mediator order; annotates the record."""
        results = [self.results[m] for m in range(len(self.mediators))]
        return mediator_updates(self.planner, self.aggregator, self.mediators, results)


# -- MPI cross-silo: the server relays each mediator's model from one silo to the next ---------
def with_rad(params: Any, rad: Any, round_number: int) -> OrderedDict[str, Any]:
    """Clean ``params`` plus the rebalancing ratios and the round, for an MPI downlink."""
    clean, _, _ = strip(params)
    clean[KEY_RAD] = torch.as_tensor(rad, dtype=torch.float64)
    clean[KEY_ROUND] = torch.tensor(int(round_number), dtype=torch.int64)
    return clean


def take_rad(params: Any) -> tuple[Any, Any, int | None]:
    """``(params without reserved keys, rad or None, round or None)`` from an MPI downlink."""
    if not isinstance(params, dict) or (KEY_RAD not in params and KEY_ROUND not in params):
        return params, None, None
    rad = params[KEY_RAD].double().numpy() if KEY_RAD in params else None  # a resumed round only
    rnd = params.get(KEY_ROUND)
    clean, _, _ = strip(params)
    return clean, rad, None if rnd is None else int(rnd)


def silo_data(cache: RebalancedCache, silo: int, original: Any, rad: Any, seed: int) -> Any:
    """A cross-silo or MPI client's rebalanced training data and its size."""
    return cache.get(silo, rad, seed, lambda: original, lambda x, y, o: (like(o, x, y), len(y)))


def mediator_updates(
    planner: AstraeaPlanner,
    aggregator: Astraea,
    mediators: list[list[int]],
    results: list[tuple[Any, int]],
) -> list[tuple[int, Any]]:
    """One ``(n_m, params)`` per mediator (``n_m`` held to what the plan allows) from each
    mediator's ``(params, n_m)``, and the round's record fields, the same in every FedML mode:
    mediators (client / silo indexes), their KL, the paper's traffic of the round with the plan
    (``rad``, float64) in each mediator's downlink — whatever route the host's messages take —
    and each mediator model's digest."""
    models = [params for params, _ in results]
    nbytes = sum(
        int(t.numel() * t.element_size()) for t in models[0].values() if torch.is_tensor(t)
    )
    planner.annotate(aggregator, mediators, nbytes, 8 * len(planner.rad), models=models)
    return [
        (planner.bound_samples(mediators[m], n), attach(params, m))
        for m, (params, n) in enumerate(results)
    ]


class SiloAstraea:
    """The MPI server's Astraea state: the plan, this round's relay and its results.

    Used by cross-silo (one silo per client process) and MPI simulation (a worker trains the
    client FedML assigned it). A mediator's members are data indexes (silos / clients);
    ``plan_round`` gets FedML's ``(receiver id, data index)`` pairs of the round, and the
    :class:`~fl_adapters.astraea.MediatorRelay` says which receiver trains next.
    """

    def __init__(self, aggregator: Astraea, train_data: dict[int, Any], num_clients: int) -> None:
        if aggregator.mediator_epochs != 1:
            raise ParameterError(
                "astraea in FedML's MPI modes needs mediator_epochs: 1 (each process trains "
                f"once a round, as FedML's client counts rounds), got {aggregator.mediator_epochs}"
            )
        self.aggregator = aggregator
        self.planner = AstraeaPlanner.from_labels(
            [dataset_tensors(train_data[s])[1] for s in range(num_clients)], aggregator
        )
        self.receiver: dict[int, int] = {}
        self.relay = MediatorRelay([], 1)

    def plan_round(self, receivers: list[int], data_indexes: list[int]) -> None:
        """Group the round's data indexes into mediators (Algorithm 3 over their counts)."""
        self.receiver = {int(s): int(r) for r, s in zip(receivers, data_indexes, strict=True)}
        mediators = self.planner.mediators(list(self.receiver))
        self.relay = MediatorRelay(mediators, 1, owner=self.receiver.__getitem__)

    def first_receivers(self) -> set[int]:
        return {int(hop.owner) for hop in self.relay.start()}

    def received(self, sender: int, params: Any, n: int) -> Hop | None:
        """Record ``sender``'s upload; the next hop of its mediator, or ``None``."""
        m = next(
            m
            for m in range(len(self.relay.mediators))
            if m not in self.relay.params and self.relay.expected(m).owner == sender
        )
        return self.relay.received(m, strip(params)[0], n)

    def model_list(self) -> list[tuple[int, Any]]:
        """One ``(n_m, params)`` per mediator; annotates the record (mediators by data index)."""
        return mediator_updates(
            self.planner, self.aggregator, self.relay.mediators, self.relay.results()
        )
