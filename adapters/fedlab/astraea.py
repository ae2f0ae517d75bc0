"""Astraea in FedLab's standalone pipeline: a server handler that plans mediators and a serial
trainer whose units are mediators.

Each round, in FedLab's own ``StandalonePipeline`` loop:

1. :meth:`AstraeaServerHandler.sample_clients` samples clients as FedLab does and groups them
   into mediators (Algorithm 3 on their expected counts after rebalancing);
2. its ``downlink_package`` is ``[params, rad, layout]``: the global model, the rebalancing
   ratio per class, and the mediators (see :func:`encode_mediators`);
3. :class:`AstraeaSerialTrainer` rebalances each client's data once (on first use, seeded by
   ``(seed, client)``), runs each mediator's chain and uploads one ``[params, meta]`` per
   mediator (``meta`` = mediator index, ``n_m``);
4. the handler aggregates the mediators' models with the ``astraea`` aggregator (weights
   ``n_m / n``) and records the mediators, their KL to uniform and the round's bytes.

Clients "report" their label counts once: the runner counts each client's training labels and
hands the matrix to the handler. Mediator chains need every member's data in one process, so
Astraea runs standalone; a cross-process run with ``astraea`` is refused with a message.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fl_adapters.astraea import AstraeaPlanner, dataset_tensors, rebalance_client, run_mediator
from fl_adapters.fedlab.data import PartitionedDataset
from fl_adapters.fedlab.handler import FedBalanceServerHandler
from fl_adapters.fedlab.payload import pack_meta
from fl_adapters.fedlab.trainer import FedBalanceSerialTrainer, LocalConfig, train_client
from fl_aggregators.astraea import Astraea

log = logging.getLogger(__name__)


def encode_mediators(mediators: list[list[int]]) -> torch.Tensor:
    """``[M, len_1, ids_1..., len_2, ids_2..., ...]`` as float32 (FedLab packs one dtype)."""
    flat: list[int] = [len(mediators)]
    for members in mediators:
        flat += [len(members), *members]
    return torch.tensor(flat, dtype=torch.float32)


def decode_mediators(layout: torch.Tensor) -> list[list[int]]:
    values = [int(v) for v in layout.tolist()]
    out, pos = [], 1
    for _ in range(values[0]):
        size = values[pos]
        out.append(values[pos + 1 : pos + 1 + size])
        pos += 1 + size
    if pos != len(values):
        raise ValueError(f"malformed mediator layout of {len(values)} values")
    return out


def client_labels(data: PartitionedDataset) -> list[torch.Tensor]:
    """Each client's training labels: what the clients report to plan the rebalancing."""
    return [dataset_tensors(data.get_dataset(c, "train"))[1] for c in range(data.num)]


def load_per_mediator(handler: Any, payload: list[torch.Tensor], mediators: int) -> bool:
    """``SyncServerHandler.load`` for Astraea: aggregate when every mediator has reported."""
    handler.client_buffer_cache.append(payload)
    if len(handler.client_buffer_cache) < mediators:
        return False
    handler.global_update(handler.client_buffer_cache)
    handler.round += 1
    handler.client_buffer_cache = []
    return True


def param_bytes(model: torch.nn.Module) -> int:
    """Bytes of FedLab's serialized parameters (what a downlink or uplink carries)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


class AstraeaServerHandler(FedBalanceServerHandler):
    """``FedBalanceServerHandler`` that plans mediators and aggregates one update per mediator.

    Parameters
    ----------
    class_counts : clients x classes label counts reported by the clients.
    aggregator : ``"astraea"`` or an :class:`~fl_aggregators.astraea.Astraea`.
    Other parameters as :class:`FedBalanceServerHandler`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        global_round: int,
        sample_ratio: float,
        *,
        class_counts: Any,
        aggregator: str | Astraea = "astraea",
        aggregator_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            model,
            global_round,
            sample_ratio,
            aggregator=aggregator,
            aggregator_args=aggregator_args,
            **kwargs,
        )
        if not isinstance(self.aggregator, Astraea):
            raise ValueError(
                f"AstraeaServerHandler needs the astraea aggregator, got {self.aggregator.name!r}"
            )
        self.astraea: Astraea = self.aggregator
        self.participation_step = self.astraea.mediator_epochs
        self.planner = AstraeaPlanner(class_counts, self.astraea)
        self.round_mediators: list[list[int]] = []

    def sample_clients(self) -> list[int]:
        sampled = super().sample_clients()
        self.round_mediators = self.planner.mediators(sampled)
        return sampled

    @property
    def downlink_package(self) -> list[torch.Tensor]:
        rad = torch.as_tensor(self.planner.rad, dtype=torch.float32)
        return [self.model_parameters, rad, encode_mediators(self.round_mediators)]

    def load(self, payload: list[torch.Tensor]) -> bool:
        """Collect one package per mediator; aggregate when the round's last one arrives."""
        return load_per_mediator(self, payload, len(self.round_mediators))

    def global_update(self, buffer: list[list[torch.Tensor]]) -> None:
        rad_and_layout = 4 * (
            len(self.planner.rad) + encode_mediators(self.round_mediators).numel()
        )
        self.planner.annotate(
            self.astraea, self.round_mediators, param_bytes(self._model), rad_and_layout
        )
        super().global_update(buffer)


class RebalancedData:
    """A ``FedDataset`` whose training splits are rebalanced by ``rad`` (built once per client)."""

    def __init__(self, data: PartitionedDataset, seed: int) -> None:
        self.data = data
        self.seed = seed
        self.num = data.num
        self.rad: np.ndarray | None = None
        self._train: dict[int, torch.utils.data.TensorDataset] = {}

    def set_rad(self, rad: np.ndarray) -> None:
        if self.rad is not None and not np.array_equal(self.rad, rad):
            self._train.clear()  # a new plan: rebalance again
        self.rad = rad

    def get_dataset(self, id: int, type: str = "train") -> Any:
        if type != "train" or self.rad is None:
            return self.data.get_dataset(id, type)
        if id not in self._train:
            x, y = dataset_tensors(self.data.get_dataset(id, "train"))
            self._train[id] = TensorData(*rebalance_client(x, y, self.rad, self.seed, id))
        return self._train[id]


class TensorData(torch.utils.data.TensorDataset):
    """A ``TensorDataset`` with the vectorised ``get_batch`` the training helpers use."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        super().__init__(x, y)
        self.x, self.y = x, y

    def get_batch(self, positions: Any) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.as_tensor(np.asarray(positions, dtype=np.int64))
        return self.x[pos], self.y[pos]


class AstraeaSerialTrainer(FedBalanceSerialTrainer):
    """Serial trainer whose units are mediators: each trains its clients' chain in order.

    ``trace`` lists ``(round, mediator, client)`` for every client visit, in training order.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data: PartitionedDataset,
        cfg: LocalConfig,
        mediator_epochs: int = 1,
        client_ids: Sequence[int] | None = None,
    ) -> None:
        super().__init__(model, data, cfg, client_ids)
        self.mediator_epochs = mediator_epochs
        self.rebalanced = RebalancedData(data, cfg.seed)
        self.trace: list[tuple[int, int, int]] = []
        self.rounds = 0

    def local_process(self, payload: list[torch.Tensor], id_list: list[int]) -> None:
        if len(payload) < 3:
            raise ValueError(
                "AstraeaSerialTrainer needs the [params, rad, layout] downlink of "
                "AstraeaServerHandler"
            )
        params, rad, layout = payload[0], payload[1], payload[2]
        self.rebalanced.set_rad(rad.double().numpy())
        self.rounds += 1
        known = set(self.client_ids)
        for m, members in enumerate(decode_mediators(layout)):
            unknown = [c for c in members if c not in known]
            if unknown:
                raise ValueError(f"mediator {m} names clients {unknown} this trainer does not hold")

            def train_one(client: int, w: torch.Tensor, m: int = m) -> tuple[torch.Tensor, int]:
                k = self.participations.get(client, 0)
                self.participations[client] = k + 1
                self.trace.append((self.rounds, m, client))
                package = train_client(self._model, w, self.rebalanced, client, k, self.cfg)
                return package[0], int(package[1][1])

            result = run_mediator(members, params, train_one, self.mediator_epochs)
            self.cache.append([result.params, pack_meta(m, result.num_samples, None)])
