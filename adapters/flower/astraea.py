"""Astraea on Flower: plan from the clients' label counts, send ``rad`` once, relay mediators.

Duan et al., "Self-Balancing Federated Learning With Global Imbalanced Data in Mobile Systems",
IEEE TPDS 32(1):59-71, 2021. The host-free pieces are :mod:`fl_adapters.astraea`'s
(:class:`~fl_adapters.astraea.AstraeaPlanner`, :func:`~fl_adapters.astraea.rebalance_client`,
:class:`~fl_adapters.astraea.MediatorRelay`); this module moves them over Flower messages as
docs/astraea.md tells: ``query`` messages for the label counts and the ``rad`` before round 1
(:func:`astraea_query_reply`, :func:`astraea_train_reply`), then each mediator a chain of
``train`` messages, all mediators side by side. A member that fails ends its mediator for the
round, with a warning; ``n_m`` is bounded by what the members' reported data can hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from torch import nn
from torch.utils.data import Dataset

from fl_adapters.astraea import AstraeaPlanner, MediatorRelay, RebalancedCache, label_counts
from fl_adapters.checkpoint import Checkpoint, check_plan
from fl_adapters.flower.payload import (
    CLIENT_ID,
    METRICS,
    NUM_EXAMPLES,
    QUERY_KEY,
    to_array_record,
    to_state_dict,
)
from fl_adapters.flower.strategy import FedBalanceStrategy
from fl_adapters.flower.trainer import TrainFn, partition_id, train_reply
from fl_aggregators import AggregationResult, ClientUpdate
from fl_aggregators.astraea import Astraea
from fl_checks import ParameterError

log = logging.getLogger(__name__)

LABEL_COUNTS = "label-counts"
RAD = "rad"
#: Where a node keeps its ``rad`` between messages (its ``Context.state``).
STATE_KEY = "fedbalance-astraea"
MEDIATOR = "fedbalance-mediator"
STEP = "fedbalance-step"


class AstraeaStrategy(FedBalanceStrategy):
    """:class:`FedBalanceStrategy` running Astraea's mediators (see the module docstring)."""

    def __init__(self, aggregator: str | Astraea = "astraea", **kwargs: Any) -> None:
        super().__init__(aggregator, mediated=True, **kwargs)
        if not isinstance(self.aggregator, Astraea):
            raise ParameterError(
                f"AstraeaStrategy needs the astraea aggregator, got {aggregator!r}"
            )
        self.astraea: Astraea = self.aggregator
        self.planner: AstraeaPlanner | None = None
        self.round_mediators: list[list[int]] = []
        #: This round's chains (a finished mediator's model in ``params``, ``n_m`` in ``samples``).
        self.relay = MediatorRelay([], 1)
        #: Seconds to wait for one wave of mediator hops.
        self.hop_timeout = 3600.0
        #: The plan of the checkpoint a resumed run started from (the new plan must equal it).
        self.resumed_plan: dict[str, Any] | None = None

    def checkpoint_plan(self) -> dict[str, Any] | None:
        return None if self.planner is None else self.planner.plan.as_dict()

    def restore(self, ckpt: Checkpoint) -> None:
        super().restore(ckpt)
        self.resumed_plan = ckpt.plan

    # -- set-up: label counts, plan, rad ------------------------------------------------------
    def plan(self, grid: Grid, nodes: list[int], config: ConfigRecord) -> AstraeaPlanner:
        """Ask every node for its label counts, plan, and send each node its ``rad``.

        The queries carry the round's train ``config`` too: a ClientApp may need it to find
        its data (the bundled app builds its partition from it).
        """
        replies = self._query(grid, nodes, ConfigRecord({**config, QUERY_KEY: LABEL_COUNTS}))
        counts: dict[int, list[int]] = {}
        for node, metrics in replies.items():
            client, reported = metrics.get(CLIENT_ID), metrics.get(LABEL_COUNTS)
            if not isinstance(client, int) or not isinstance(reported, list):
                raise RuntimeError(
                    f"node {node} did not report its client id and label counts; Astraea on "
                    f"Flower needs astraea_query_reply in the ClientApp's @app.query()"
                )
            self.client_ids[node] = client
            counts[client] = [int(c) for c in reported]
        if sorted(counts) != list(range(len(counts))):
            raise RuntimeError(
                f"Astraea plans over clients 0..{len(counts) - 1}; the nodes reported client "
                f"ids {sorted(counts)} (set each node's partition-id)"
            )
        planner = AstraeaPlanner(np.array([counts[c] for c in range(len(counts))]), self.astraea)
        rad = [float(r) for r in planner.rad]
        if self.astraea.augment:  # without augmentation the clients keep their data as is
            self._query(grid, nodes, ConfigRecord({**config, QUERY_KEY: RAD, RAD: rad}))
        log.info("astraea: planned from %d clients' label counts; rad %s", len(counts), rad)
        return planner

    def _query(self, grid: Grid, nodes: list[int], config: ConfigRecord) -> dict[int, Any]:
        record = RecordDict({self.configrecord_key: config})
        replies = grid.send_and_receive(
            self._construct_messages(record, nodes, MessageType.QUERY),
            timeout=self.identify_timeout,
        )
        out: dict[int, Any] = {}
        asked = str(config[QUERY_KEY])
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                raise RuntimeError(
                    f"node {node} failed Astraea's {asked} query: {msg.error.reason}"
                )
            out[node] = next(iter(msg.content.metric_records.values()), {})
        missing = sorted(set(nodes) - set(out))
        if missing:
            raise RuntimeError(f"nodes {missing} did not answer Astraea's {asked} query")
        return out

    # -- a round: mediator chains ------------------------------------------------------------
    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Runs this round's mediator chains through ``grid``; returns no message, so
        Flower's loop goes straight to :meth:`aggregate_train` with the mediators' models."""
        if self.planner is None:
            self.planner = self.plan(grid, sorted(self.members_only(grid.get_node_ids())), config)
            check_plan(self.resumed_plan, self.planner.plan.as_dict())
        nodes = self.sample(grid, self.fraction_train, self.min_train_nodes)
        node_of = {client: node for node, client in self.client_ids.items()}
        self.round_mediators = self.planner.mediators([self.client_ids[n] for n in nodes])
        log.info("astraea round %s: mediators %s", server_round, self.round_mediators)
        self.relay = relay = MediatorRelay(self.round_mediators, self.astraea.mediator_epochs)
        models = {m: arrays for m in range(len(self.round_mediators))}
        wave = relay.start()
        while wave:
            messages = []
            for hop in wave:
                hop_config = ConfigRecord(
                    {**dict(config), "server-round": server_round, MEDIATOR: hop.mediator,
                     STEP: hop.step}
                )  # fmt: skip
                content = RecordDict(
                    {self.arrayrecord_key: models[hop.mediator], self.configrecord_key: hop_config}
                )
                (client,) = hop.clients  # owner = the client itself: one member per hop
                messages.append(
                    Message(content, dst_node_id=node_of[client], message_type=MessageType.TRAIN)
                )
            replies = {
                r.metadata.src_node_id: r
                for r in grid.send_and_receive(messages, timeout=self.hop_timeout)
            }
            next_wave = []
            for hop, sent in zip(wave, messages, strict=True):
                reply = replies.get(sent.metadata.dst_node_id)
                record, n = _hop_result(reply)
                if record is None:
                    log.warning(
                        "astraea round %s: client %s of mediator %s failed (%s); the mediator "
                        "ends this round",
                        server_round,
                        hop.clients[0],
                        hop.mediator,
                        "no reply" if reply is None else "error or malformed reply",
                    )
                    continue
                models[hop.mediator] = record
                following = relay.received(hop.mediator, record, n)
                if following is not None:
                    next_wave.append(following)
            wave = next_wave
        return []

    def aggregate_replies(
        self, server_round: int, replies: list[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the mediators' models with weights ``n_m / n`` (the ``astraea`` aggregator)."""
        if self.global_params is None or self.planner is None:
            raise RuntimeError("aggregate_train before configure_train: no global model")
        relay, done = self.relay, sorted(self.relay.params)
        updates = [
            ClientUpdate(
                params=to_state_dict(relay.params[m]),
                num_samples=self.planner.bound_samples(self.round_mediators[m], relay.samples[m]),
                client_id=m,
            )
            for m in done
        ]
        param_bytes = sum(t.numel() * t.element_size() for t in self.global_params.values())
        self.planner.annotate(self.astraea, [self.round_mediators[m] for m in done], param_bytes)
        result: AggregationResult = self.astraea.aggregate(
            self.global_params, updates, round=server_round, host=self.host
        )
        self.aggregated(result)
        metrics = MetricRecord(
            {"fedbalance-mediators": len(updates), "fedbalance-rejected": len(result.rejected)}
        )
        return (None if result.skipped else to_array_record(result.params)), metrics


def _hop_result(reply: Message | None) -> tuple[ArrayRecord | None, int]:
    if reply is None or reply.has_error():
        return None, 0
    arrays = list(reply.content.array_records.values())
    metrics = list(reply.content.metric_records.values())
    n = metrics[0].get(NUM_EXAMPLES) if len(metrics) == 1 else None
    if len(arrays) != 1 or not isinstance(n, int) or n < 0:
        return None, 0
    return arrays[0], n


# -- the ClientApp side -------------------------------------------------------------------------
def astraea_query_reply(
    msg: Message, context: Context, train_labels: Callable[[], Any], num_classes: int
) -> Message:
    """The answer to the strategy's Astraea queries (register it in ``@app.query()``).

    ``label-counts``: this node's client id and training-label counts (``train_labels()``
    returns the labels of its training split). ``rad``: keeps the plan's ratios in the node's
    ``Context.state`` for :func:`astraea_train_reply`. Other queries (``identify``) get the
    client id.
    """
    config = next(iter(msg.content.config_records.values()), ConfigRecord())
    asked = config.get(QUERY_KEY)
    client = partition_id(context)
    metrics: dict[str, Any] = {} if client is None else {CLIENT_ID: client}
    if asked == LABEL_COUNTS:
        metrics[LABEL_COUNTS] = label_counts(np.asarray(train_labels()), num_classes).tolist()
    elif asked == RAD:
        rad = [float(r) for r in cast(list[float], config[RAD])]
        context.state.config_records[STATE_KEY] = ConfigRecord({RAD: rad})
    return Message(content=RecordDict({METRICS: MetricRecord(metrics)}), reply_to=msg)


#: This process's rebalanced client data: a ClientApp process that lives on (the simulation's
#: workers) rebalances each client once, not on every hop.
REBALANCED = RebalancedCache()


def astraea_train_reply(
    msg: Message,
    context: Context,
    model: nn.Module,
    data: Mapping[str, Dataset[Any]],
    train_fn: TrainFn,
    *,
    seed: int,
) -> Message:
    """One mediator hop on this node: train on the rebalanced training split, reply.

    The rebalancing (:func:`~fl_adapters.astraea.rebalance_client`) is a function of ``rad``,
    ``seed`` and the client, so the node's data is the same in every hop and host. Without a
    ``rad`` (a run with ``augment: false``) the data is used as it is.
    """
    kept = context.state.config_records.get(STATE_KEY)  # the rad the strategy sent
    client = partition_id(context)
    parts = dict(data)
    if kept is not None and client is not None:  # no rad: the run does not augment
        rad = [float(r) for r in cast(list[float], kept[RAD])]
        original = parts["train"]
        parts["train"] = REBALANCED.get(client, rad, seed, lambda: original, scope=context.run_id)
    return train_reply(msg, context, model, parts, train_fn)
