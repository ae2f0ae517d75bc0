"""Astraea in FedLab: a server handler that plans mediators, a serial trainer whose units are
mediators, and the relay that carries mediators across processes. The messages of each mode
(:func:`encode_mediators`, :func:`report_counts`, :func:`encode_hop`, :func:`relay_rounds`)
are in ``docs/astraea.md`` (FedLab rows).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from fedlab.utils import MessageCode

from fl_adapters.astraea import (
    AstraeaPlanner,
    MediatorRelay,
    RebalancedCache,
    dataset_tensors,
    label_counts,
    run_mediator,
)
from fl_adapters.fedlab.data import PartitionedDataset
from fl_adapters.fedlab.handler import FedBalanceServerHandler
from fl_adapters.fedlab.payload import decode, encode, pack_meta
from fl_adapters.fedlab.trainer import FedBalanceSerialTrainer, LocalConfig, UplinkHook
from fl_aggregators.astraea import Astraea
from fl_checks import ParameterError


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


#: First value of a relay hop's tag (a standalone layout starts with the mediator count >= 0).
RELAY = -1


def encode_hop(mediator: int, clients: Sequence[int]) -> torch.Tensor:
    """A relay hop's tag: ``[-1, mediator, global client ids...]`` as float32."""
    return torch.tensor([RELAY, mediator, *clients], dtype=torch.float32)


def decode_hop(payload: list[torch.Tensor]) -> tuple[int, list[int]] | None:
    """``(mediator, global client ids)`` if ``payload`` is a relay hop's downlink, else ``None``."""
    if len(payload) < 3 or payload[2].numel() < 2 or int(payload[2][0]) != RELAY:
        return None
    values = [int(v) for v in payload[2].tolist()]
    return values[1], values[2:]


def report_counts(network: Any, counts: Any) -> None:
    """A client process's label counts (its clients x classes), sent once after FedLab's set-up."""
    matrix = torch.as_tensor(np.asarray(counts, dtype=np.float64), dtype=torch.float32)
    rows, cols = matrix.shape if matrix.dim() == 2 else (0, 0)
    content = torch.cat([torch.tensor([rows, cols], dtype=torch.float32), matrix.flatten()])
    network.send(content=content, message_code=MessageCode.SetUp, dst=0)


def receive_counts(network: Any, min_classes: int = 0) -> np.ndarray:
    """Every client process's label counts, stacked in rank order (= FedLab's global ids)."""
    parts = []
    for rank in range(1, network.world_size):
        _, _, content = network.recv(src=rank)
        flat = content[0]
        rows, cols = int(flat[0]), int(flat[1])
        parts.append(flat[2 : 2 + rows * cols].view(rows, cols).double().numpy())
    classes = max([min_classes, *(p.shape[1] for p in parts)])
    padded = [np.pad(p, ((0, 0), (0, classes - p.shape[1]))) for p in parts]
    return np.rint(np.concatenate(padded)).astype(np.int64)


def relay_rounds(manager: Any, planner: AstraeaPlanner, plan: Any) -> None:
    """``SynchronousServerManager.main_loop`` for Astraea: each round ``plan()`` samples and
    returns the mediators; their models travel through the client processes along a
    :class:`~fl_adapters.astraea.MediatorRelay`, and the handler's ``load`` gets one package per
    mediator (it aggregates on the last)."""
    handler, network, coordinator = manager._handler, manager._network, manager.coordinator
    rad = torch.as_tensor(planner.rad, dtype=torch.float32)
    # Sends run on their own thread, as FedLab's activator does: a gloo send to a process that
    # is itself sending to the server would otherwise wait forever for the server's recv.
    outbox: queue.Queue[tuple[Any, torch.Tensor] | None] = queue.Queue()
    failed: list[BaseException] = []

    def sender() -> None:
        while (item := outbox.get()) is not None:
            hop, params = item
            local = [coordinator.map_id(c)[1] for c in hop.clients]
            content = [torch.tensor(local, dtype=params.dtype), params, rad]
            content.append(encode_hop(hop.mediator, hop.clients))
            try:
                network.send(
                    content=content, message_code=MessageCode.ParameterUpdate, dst=hop.owner
                )
            except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
                failed.append(e)
                return

    def send(hop: Any, params: torch.Tensor) -> None:
        if failed:
            raise RuntimeError(f"sending a mediator's model failed: {failed[0]}") from failed[0]
        outbox.put((hop, params))

    thread = threading.Thread(target=sender, name="astraea-relay-send", daemon=True)
    thread.start()
    try:
        _relay_loop(handler, network, planner, plan, send, lambda c: coordinator.map_id(c)[0])
    finally:
        outbox.put(None)
        thread.join()


def _relay_loop(
    handler: Any, network: Any, planner: AstraeaPlanner, plan: Any, send: Any, owner: Any
) -> None:
    while handler.if_stop is not True:
        mediators = plan()
        relay = MediatorRelay(mediators, planner.aggregator.mediator_epochs, owner=owner)
        start = handler.model_parameters
        for hop in relay.start():
            send(hop, start)
        while not relay.done():
            sender, code, payload = network.recv()
            if code != MessageCode.ParameterUpdate:
                raise RuntimeError(f"unexpected message code {code} from rank {sender}")
            up = decode(payload, -1)
            m = up.client_id
            if not 0 <= m < len(mediators) or relay.expected(m).owner != sender:
                raise RuntimeError(
                    f"rank {sender} sent an update for mediator {m}, which is not waiting for it"
                )
            nxt = relay.received(m, payload[0], up.num_samples)
            if nxt is not None:
                send(nxt, payload[0])
        for m, (params, n) in enumerate(relay.results()):
            handler.load(encode(params, m, n))


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
        **kwargs: Any,
    ) -> None:
        super().__init__(model, global_round, sample_ratio, aggregator=aggregator, **kwargs)
        if not isinstance(self.aggregator, Astraea):
            raise ParameterError(
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

    def plan_round(self) -> list[list[int]]:
        self.sample_clients()
        return self.round_mediators

    @property
    def downlink_package(self) -> list[torch.Tensor]:
        rad = torch.as_tensor(self.planner.rad, dtype=torch.float32)
        return [self.model_parameters, rad, encode_mediators(self.round_mediators)]

    def load(self, payload: list[torch.Tensor]) -> bool:
        """Collect one package per mediator; aggregate when the round's last one arrives."""
        return load_per_mediator(self, payload, len(self.round_mediators))

    def global_update(self, buffer: list[list[torch.Tensor]]) -> None:
        bound_counts(self.planner, self.round_mediators, buffer)
        mediators, models = self.round_mediators, [payload[0] for payload in buffer]
        rad_and_layout = 4 * (len(self.planner.rad) + encode_mediators(mediators).numel())
        nbytes = param_bytes(self._model)
        self.planner.annotate(self.astraea, mediators, nbytes, rad_and_layout, models=models)
        super().global_update(buffer)


def bound_counts(
    planner: AstraeaPlanner, mediators: list[list[int]], buffer: list[list[torch.Tensor]]
) -> None:
    """Hold each mediator's reported ``n_m`` (``buffer[m]``'s meta) to what the plan allows
    (:meth:`~fl_adapters.astraea.AstraeaPlanner.bound_samples`), in place."""
    for m, payload in enumerate(buffer):
        claimed = int(payload[1][1]) if len(payload) > 1 and len(payload[1]) > 1 else None
        if claimed is not None:
            n = planner.bound_samples(mediators[m], claimed)
            if n != claimed:
                payload[1] = pack_meta(m, n)


class RebalancedData:
    """A ``FedDataset`` whose training splits are rebalanced by ``rad`` (built once per client)."""

    def __init__(self, data: PartitionedDataset, seed: int) -> None:
        self.data = data
        self.seed = seed
        self.num = data.num
        self.rad: np.ndarray | None = None
        self._cache = RebalancedCache()

    @property
    def trained_counts(self) -> dict[int, np.ndarray]:
        """Label counts of each client's rebalanced data built so far (what it trains on)."""
        return self._cache.trained_counts

    def get_dataset(self, id: int, type: str = "train") -> Any:
        if type != "train" or self.rad is None:
            return self.data.get_dataset(id, type)
        load = lambda: self.data.get_dataset(id, "train")  # noqa: E731
        return self._cache.get(id, self.rad, self.seed, load, lambda x, y, _: TensorData(x, y))


class TensorData(torch.utils.data.TensorDataset):
    """A ``TensorDataset`` with the vectorised ``get_batch`` the training helpers use."""

    def get_batch(self, positions: Any) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.as_tensor(np.asarray(positions, dtype=np.int64))
        return self.tensors[0][pos], self.tensors[1][pos]


class AstraeaSerialTrainer(FedBalanceSerialTrainer):
    """Serial trainer whose units are mediators: each trains its clients' chain in order.

    ``carry_optimizer``: each mediator's members continue one optimizer along the chain (a
    fresh one per mediator and round) instead of each starting a fresh one. Standalone only:
    a relay hop (:meth:`train_hop`) refuses it, as the optimizer would stop at the process.
    ``trace`` lists ``(round, mediator, client)`` for every client visit, in training order.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data: PartitionedDataset,
        cfg: LocalConfig,
        mediator_epochs: int = 1,
        client_ids: Sequence[int] | None = None,
        uplink_hook: UplinkHook | None = None,
        carry_optimizer: bool = False,
    ) -> None:
        super().__init__(model, data, cfg, client_ids, uplink_hook=uplink_hook)
        self.mediator_epochs = mediator_epochs
        self.carry_optimizer = carry_optimizer
        self.rebalanced = RebalancedData(data, cfg.seed)
        self.trace: list[tuple[int, int, int]] = []
        self.rounds = 0

    def local_process(self, payload: list[torch.Tensor], id_list: list[int]) -> None:
        if len(payload) < 3:
            raise ParameterError(
                "AstraeaSerialTrainer needs the [params, rad, layout] downlink of "
                "AstraeaServerHandler"
            )
        params, rad, layout = payload[0], payload[1], payload[2]
        self.rebalanced.rad = rad.double().numpy()  # a new plan: the cache rebalances again
        hop = decode_hop(payload)
        if hop is not None:  # cross-process: one hop of a mediator's chain
            self.train_hop(params, hop[0], hop[1], id_list)
            return
        self.rounds += 1
        known = set(self.client_ids)
        for m, members in enumerate(decode_mediators(layout)):
            unknown = [c for c in members if c not in known]
            if unknown:
                raise ValueError(f"mediator {m} names clients {unknown} this trainer does not hold")

            carry: dict[str, Any] | None = {} if self.carry_optimizer else None

            def train_one(
                client: int, w: torch.Tensor, m: int = m, carry: dict[str, Any] | None = carry
            ) -> tuple[torch.Tensor, int]:
                self.trace.append((self.rounds, m, client))
                package = self.train(client, w, self.rebalanced, carry)  # what it reports
                return package[0], int(package[1][1])

            result = run_mediator(members, params, train_one, self.mediator_epochs)
            self.cache.append(encode(result.params, m, result.num_samples))

    def train_hop(
        self, params: torch.Tensor, mediator: int, clients: list[int], id_list: list[int]
    ) -> None:
        """One relay hop: train ``id_list`` (local ids of ``clients``) in order, upload once."""
        if self.carry_optimizer:
            raise ParameterError(
                f"carry_optimizer: a relay hop of mediator {mediator} cannot continue the "
                "optimizer of the process before it; it is applied by the standalone trainer only"
            )
        ids = [self.client_ids[int(i)] for i in id_list]
        if ids != clients:
            raise ValueError(f"hop of mediator {mediator} names {clients}, local ids map to {ids}")
        n = 0
        for client in ids:
            self.trace.append((-1, mediator, client))
            package = self.train(client, params, self.rebalanced)  # as standalone
            params, n = package[0], n + int(package[1][1])
        self.cache.append(encode(params, mediator, n))


def trainer_counts(trainer: Any, num_classes: int = 0) -> np.ndarray:
    """Label counts of the clients a FedLab trainer holds (its local ids, in order)."""
    dataset = trainer.dataset
    ids = range(int(getattr(trainer, "num_clients", 1) or 1))
    labels = [dataset_tensors(dataset.get_dataset(i, "train"))[1] for i in ids]
    classes = max([num_classes, *(int(y.max()) + 1 for y in labels if len(y))])
    return np.stack([label_counts(y, classes) for y in labels])
