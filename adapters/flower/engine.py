"""Flower's simulation engine without per-node polling, so idle virtual nodes cost nothing.

Flower 1.41's engine hands messages to its workers from one thread
(``flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue``) that, every 0.1 s, asks
the link state for one pending message *per virtual node*: at 10^4 nodes that is 10^4 lock
acquisitions and scans of the stored messages per pass, in a thread that competes with the
round for the GIL. :func:`index_message_polling` swaps in a loop with the same contract
(:func:`pending_messages`) that scans the stored messages once per pass, where it reads the
link state it was written against (Flower's ``InMemoryLinkState``); docs/hosts/flower.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from queue import Queue
from typing import Any

from flwr.app import Message
from flwr.server.superlink.fleet.vce import vce_api
from flwr.supercore.date import now

log = logging.getLogger(__name__)

#: Seconds between passes, Flower's.
PASS_S = 0.1

_STOCK: Callable[..., None] = vce_api.add_messages_to_queue


def indexable(state: Any) -> bool:
    """Whether ``state`` is the in-memory link state this module reads."""
    return type(state).__name__ == "InMemoryLinkState" and all(
        hasattr(state, name) for name in ("lock", "message_ins_store", "_check_stored_messages")
    )


def pending_messages(state: Any, order: Mapping[int, int]) -> list[Message]:
    """One pass: for each node in ``order`` (node id -> registration index), its first stored
    undelivered message, in registration order, marked delivered -- what Flower's loop of
    ``state.get_message_ins(node_id=node, limit=1)`` over the nodes returns, in one scan."""
    first: dict[int, Message] = {}
    with state.lock:
        ids = list(state.message_ins_store)
        state._check_stored_messages(set(ids))  # drops expired ones, as get_message_ins does
        for msg_id in ids:
            msg = state.message_ins_store.get(msg_id)
            if msg is None or msg.metadata.delivered_at != "":
                continue
            node = msg.metadata.dst_node_id
            if node in order and node not in first:
                first[node] = msg
    messages = sorted(first.values(), key=lambda m: order[m.metadata.dst_node_id])
    delivered_at = now().isoformat()
    for msg in messages:
        msg.metadata.delivered_at = delivered_at
    return messages


def add_messages_to_queue(
    state: Any, queue: Queue[Message], nodes_mapping: Mapping[int, int], f_stop: threading.Event
) -> None:
    """Flower's message extractor, one scan of the stored messages per pass."""
    if not indexable(state):
        log.info("Flower's link state is %s: its own message polling runs", type(state).__name__)
        _STOCK(state, queue, nodes_mapping, f_stop)
        return
    order = {node: i for i, node in enumerate(nodes_mapping)}
    while not f_stop.is_set():
        for msg in pending_messages(state, order):
            queue.put(msg)
        f_stop.wait(PASS_S)


def index_message_polling() -> None:
    """Make Flower's simulation engine (in this process) poll by message, not by node; call
    it before ``run_simulation`` (the bundled app's simulation does, for every strategy)."""
    if vce_api.add_messages_to_queue is not add_messages_to_queue:
        vce_api.add_messages_to_queue = add_messages_to_queue
        log.info("Flower's simulation engine polls its stored messages once a pass, not per node")
