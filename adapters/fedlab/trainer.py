"""FedLab client trainers that train on fedbalance partitions and report what aggregators need.

Both trainers hold out each client's validation split (from the partition's local split,
70/10/20 by default), train with a fresh optimizer on the train split, measure the validation
metrics the aggregator asks for, and upload ``[params, meta]`` (see :mod:`.payload`).
The data order of client ``c``'s ``k``-th participation is seeded by ``(seed, c, k)``, so a
client trains identically whether it runs in the standalone pipeline or its own process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from fedlab.core.client.trainer import ClientTrainer, SerialClientTrainer
from fedlab.utils import SerializationTool

from fl_adapters._training import evaluate, local_train, stream_seed, training_clock
from fl_adapters.client_metrics import measure
from fl_adapters.fedlab.data import PartitionedDataset
from fl_adapters.fedlab.payload import encode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalConfig:
    """How each client trains locally."""

    epochs: int = 10
    batch_size: int = 64
    optimizer: str = "adam"
    lr: float = 1e-3
    seed: int = 0
    #: The client metrics the aggregator asks for (:mod:`fl_adapters.client_metrics`).
    metrics: tuple[str, ...] = ()


def train_client(
    model: torch.nn.Module,
    params: torch.Tensor,
    data: PartitionedDataset,
    client: int,
    participation: int,
    cfg: LocalConfig,
    carry: dict[str, Any] | None = None,
) -> list[torch.Tensor]:
    """Load ``params``, train client ``client`` locally, and return its uplink package
    (``carry``: the optimizer state a mediator chain carries, see :func:`local_train`)."""
    SerializationTool.deserialize_model(model, params)
    with training_clock(client):
        n = local_train(
            model,
            data.get_dataset(client, "train"),
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            optimizer=cfg.optimizer,
            lr=cfg.lr,
            seed=stream_seed("fedlab-train", cfg.seed, client, participation),
            carry=carry,
        )
    metrics = measure(cfg.metrics, lambda: evaluate(model, data.get_dataset(client, "val")), client)
    return encode(SerializationTool.serialize_model(model), client, n, metrics)


#: ``hook(client_id, downlink_params, package) -> package``: what a client really sends.
UplinkHook = Callable[[int, torch.Tensor, list[torch.Tensor]], list[torch.Tensor]]


class FedBalanceSerialTrainer(SerialClientTrainer):
    """Simulates the clients ``client_ids`` (all of the partition's by default) in one process.

    ``uplink_hook`` replaces a client's honest package before it is sent: fault and attack
    injection for the reliability benchmark and tests (a misbehaving client inside FedLab's
    own loop, not a mock of it).
    """

    #: fedbalance's own class: it aggregates (or trains) itself, with or without the autoload.
    _fedbalance_native = True

    def __init__(
        self,
        model: torch.nn.Module,
        data: PartitionedDataset,
        cfg: LocalConfig,
        client_ids: Sequence[int] | None = None,
        uplink_hook: UplinkHook | None = None,
    ) -> None:
        ids = list(range(data.num)) if client_ids is None else [int(c) for c in client_ids]
        super().__init__(model, len(ids), cuda=False)
        self.dataset = data
        self.cfg = cfg
        self.client_ids = ids
        self.participations: dict[int, int] = {}
        self.cache: list[list[torch.Tensor]] = []
        self.uplink_hook = uplink_hook
        #: Samples trained on so far, counted once per local epoch (the clients' computation).
        self.sample_passes = 0

    def setup_dataset(self, dataset: PartitionedDataset) -> None:  # FedLab API
        self.dataset = dataset

    def train(
        self, client: int, params: torch.Tensor, data: Any, carry: dict[str, Any] | None = None
    ) -> list[torch.Tensor]:
        """Client ``client``'s next local training on ``data``: its package, after ``uplink_hook``
        (``carry``: see :func:`train_client`)."""
        k = self.participations.get(client, 0)
        self.participations[client] = k + 1
        package = train_client(self._model, params, data, client, k, self.cfg, carry)
        self.sample_passes += int(package[1][1]) * self.cfg.epochs
        return package if self.uplink_hook is None else self.uplink_hook(client, params, package)

    def setup_optim(self, *args: Any) -> None:  # FedLab API; the optimizer is per client
        pass

    @property
    def uplink_package(self) -> list[list[torch.Tensor]]:
        package, self.cache = self.cache, []
        return package

    def local_process(self, payload: list[torch.Tensor], id_list: list[int]) -> None:
        for local_id in id_list:
            self.cache.append(self.train(self.client_ids[int(local_id)], payload[0], self.dataset))


class FedBalanceClientTrainer(ClientTrainer):
    """One client per process: FedLab passes its id with every activation."""

    #: fedbalance's own class: it aggregates (or trains) itself, with or without the autoload.
    _fedbalance_native = True

    def __init__(self, model: torch.nn.Module, data: PartitionedDataset, cfg: LocalConfig) -> None:
        super().__init__(model, cuda=False)
        self.dataset = data
        self.cfg = cfg
        self.participations: dict[int, int] = {}
        self._package: list[torch.Tensor] = []

    def setup_dataset(self, dataset: PartitionedDataset) -> None:
        self.dataset = dataset

    def setup_optim(self, *args: Any) -> None:
        pass

    @property
    def uplink_package(self) -> list[torch.Tensor]:
        return self._package

    def local_process(self, payload: list[torch.Tensor], id: int) -> None:
        k = self.participations.get(int(id), 0)
        self.participations[int(id)] = k + 1
        self._package = train_client(self._model, payload[0], self.dataset, int(id), k, self.cfg)
