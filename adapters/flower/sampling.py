"""Seeded node sampling for Flower's message API: the same seed samples the same clients.

Flower's ``FedAvg`` samples with the global ``random``, over node ids that are random per run.
:class:`NodeSampling`, mixed into :class:`~fl_adapters.flower.strategy.FedBalanceStrategy`,
orders the connected nodes by the client id each one has -- read from the simulation engine
(:func:`simulated_partitions`), asked once of each node in a deployment
(:meth:`NodeSampling.identify`) -- and draws with its own ``random.Random(seed)``: FedLab
standalone's ``random.Random(seed).sample(range(n), k)``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from fl_adapters._training import evaluated_clients
from fl_adapters.flower.membership import load_members
from fl_adapters.flower.payload import IDENTIFY, QUERY_KEY, reported_client
from fl_adapters.sampling import sample_round

log = logging.getLogger(__name__)

#: Nodes asked for their client id in one ``send_and_receive`` (:meth:`NodeSampling.identify`).
IDENTIFY_BATCH = 256


def simulated_partitions(grid: Grid) -> dict[int, int] | None:
    """Node id -> ``partition-id`` in Flower's simulation engine, read without a message;
    ``None`` for any other grid.

    Flower 1.41's engine registers its virtual nodes one after another in the in-memory link
    state that the ServerApp's ``InMemoryGrid`` reads, node ``i`` with node config
    ``partition-id = i`` (``flwr.server.superlink.fleet.vce.vce_api._register_nodes``), and
    the state keeps its nodes in a dict, in that order. Asking 10^4 nodes instead took four
    minutes. Every train reply is checked against what was read
    (:meth:`NodeSampling.check_read_clients`).
    """
    state = getattr(grid, "state", None)
    nodes = getattr(state, "nodes", None)
    lock = getattr(state, "lock", None)
    if type(grid).__name__ != "InMemoryGrid" or not isinstance(nodes, dict) or lock is None:
        return None
    with lock:
        return {node: i for i, node in enumerate(nodes)}


class NodeSampling:
    """Seeded sampling over nodes ordered by client id, for a subclass of Flower's ``FedAvg``
    (:meth:`init_sampling` in its ``__init__``)."""

    if TYPE_CHECKING:  # what Flower's FedAvg and the strategy provide
        min_available_nodes: int
        configrecord_key: str
        evaluate_fraction: float | None

        def _construct_messages(
            self, record: RecordDict, node_ids: list[int], message_type: str
        ) -> Iterable[Message]: ...

    def init_sampling(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        #: Node id -> the client id (partition-id) it reported, for reproducible sampling.
        self.client_ids: dict[int, int] = {}
        #: Nodes that could not say their client id.
        self.unidentified: set[int] = set()
        #: Whether node ids -> client ids may be read from Flower's simulation engine
        #: (:func:`simulated_partitions`) rather than asked; off once a reply contradicts it.
        self.read_engine = True
        #: Seconds to wait for the nodes' answers to :meth:`identify`.
        self.identify_timeout = 300.0
        #: Node id -> partition of a deployment's registered nodes (:mod:`.membership`): only
        #: they are sent messages, and their partitions are known without asking.
        self.members = load_members()
        if self.members is not None:
            self.client_ids.update(self.members)
            self.read_engine = False

    def members_only(self, nodes: Iterable[int]) -> list[int]:
        """``nodes`` less those outside the deployment's members (all of them when the
        members are not known), with a warning naming the ones left out."""
        nodes = list(nodes)
        if self.members is None:
            return nodes
        outside = [n for n in nodes if n not in self.members]
        if outside:
            log.warning(
                "nodes %s are connected but not members of this deployment: left out", outside
            )
        return [n for n in nodes if n in self.members]

    def sample(self, grid: Grid, fraction: float, minimum: int) -> list[int]:
        """Node ids for one round: ``max(fraction * connected, minimum)``, seeded.

        Nodes are ordered by the client id they report (see :meth:`identify`): Flower's node
        ids are random per run, so ordering by them would give the same seed other clients.
        """
        # sample_nodes waits until enough nodes are connected; asking it for 0 nodes means it
        # draws nothing from the global RNG, and this strategy's RNG chooses.
        _, connected = sample_nodes(grid, max(self.min_available_nodes, minimum), 0)
        connected = self.members_only(connected)
        size = min(len(connected), max(int(len(connected) * fraction), minimum))
        if size == len(connected):
            return sorted(connected)  # everyone: no draw, so the RNG stream does not depend on it
        nodes = self.by_client(grid, connected)
        return [nodes[i] for i in sample_round(self.rng, len(nodes), size)]

    def by_client(self, grid: Grid, connected: list[int]) -> list[int]:
        """``connected`` ordered by client id: read from Flower's simulation engine
        (:func:`simulated_partitions`), else asked once (:meth:`identify`)."""
        if any(n not in self.client_ids and n not in self.unidentified for n in connected):
            engine = simulated_partitions(grid) if self.read_engine else None
            if engine is not None and all(n in engine for n in connected):
                self.client_ids.update((n, engine[n]) for n in connected)
                log.info("read %d nodes' client ids from Flower's simulation engine", len(engine))
            else:
                self.read_engine = False
                self.identify(grid, connected)
        ids = self.client_ids  # nodes with a client id first, by client id; then by node id
        return sorted(connected, key=lambda n: (n not in ids, ids.get(n, n)))

    def check_read_clients(self, replies: Iterable[Message]) -> None:
        """With the client ids read from the engine, each train reply must name the client its
        node was read as. If one names another, the read is not trusted: a warning, and the
        nodes are asked from the next round on (this round trained the clients it sent to)."""
        if not self.read_engine or not self.client_ids:
            return
        for msg in replies:
            node, reported = msg.metadata.src_node_id, reported_client(msg)
            if reported is not None and reported != self.client_ids.get(node):
                log.warning(
                    "node %s reported client %s, but Flower's simulation engine registered it as "
                    "partition %s; asking the nodes their client ids from the next round on",
                    node,
                    reported,
                    self.client_ids.get(node),
                )
                self.read_engine = False
                self.client_ids.clear()
                return

    def identify(self, grid: Grid, nodes: Iterable[int]) -> None:
        """Ask ``nodes`` for their client id (one ``query`` message each; see
        :func:`fl_adapters.flower.trainer.identify_reply`). A node that cannot answer keeps
        its place by node id, with a warning: sampling is then not reproducible across runs."""
        record = RecordDict({self.configrecord_key: ConfigRecord({QUERY_KEY: IDENTIFY})})
        asked = [n for n in nodes if n not in self.client_ids and n not in self.unidentified]
        replies: list[Message] = []
        started = time.perf_counter()
        # In batches, each with its own timeout: asking 10^4 nodes at once ran past the timeout
        # and the rest were asked again the next round (the simulation's ids are read instead).
        for start in range(0, len(asked), IDENTIFY_BATCH):
            batch = asked[start : start + IDENTIFY_BATCH]
            replies += grid.send_and_receive(
                self._construct_messages(record, batch, MessageType.QUERY),
                timeout=self.identify_timeout,
            )
        for msg in replies:
            node, client = msg.metadata.src_node_id, reported_client(msg)
            if client is not None:
                self.client_ids[node] = client
            else:
                self.unidentified.add(node)  # asked once: not again every round
                log.warning(
                    "node %s did not report its client id (%s); seeded sampling orders it by "
                    "its random node id, so other runs may sample other clients",
                    node,
                    msg.error.reason if msg.has_error() else "no client-id",
                )
        log.info(
            "asked %d nodes their client id in %.2f s (once; seeded sampling needs it)",
            len(asked),
            time.perf_counter() - started,
        )

    def evaluation_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """The nodes of the clients :func:`~fl_adapters._training.evaluated_clients` draws for
        this round, nodes ordered by client id as for training."""
        assert self.evaluate_fraction is not None
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)
        connected = self.members_only(connected)
        chosen = evaluated_clients(len(connected), self.evaluate_fraction, self.seed, server_round)
        if len(chosen) == len(connected):
            return sorted(connected)
        nodes = self.by_client(grid, connected)
        return [nodes[i] for i in chosen]
