"""What fedbalance's Flower clients reply with, and how the strategy reads it.

A train reply's content holds one ``ArrayRecord`` (the trained model, a torch state dict) and
one ``MetricRecord`` with ``num-examples`` (Flower's own key for FedAvg's weight), the
client metrics the strategy asked for under their names (:data:`CLIENT_METRICS_KEY`;
``val_loss`` for FedLoss) when the client has a validation split, and ``client-id`` (the node's
``partition-id``, so the aggregation record names clients as FedLab and FedML do; Flower's
node ids are random 64-bit numbers in the deployment engine).

Flower carries metrics natively, so unlike FedLab (an extra tensor) and FedML (reserved keys in
the params dict) nothing is smuggled: :func:`reply_to_update` only renames. A reply of the
wrong form is not refused here; it becomes an update the aggregator rejects with its reason
(wrong keys or shapes, a missing or non-finite metric, a bad sample count), so every host
rejects the same things the same way.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fl_adapters.bias import MAX_CLASSES, Counts
from fl_aggregators import ClientUpdate
from fl_checks import shown

log = logging.getLogger(__name__)

NUM_EXAMPLES = "num-examples"
#: An evaluate reply's per-class counts (:func:`~fl_adapters.flower.trainer.evaluate_reply`):
#: samples and correct predictions per class, which the strategy sums into the bias figures.
CLASS_TOTAL, CLASS_CORRECT = "class-total", "class-correct"
#: A train message's config key: the client metrics the strategy's aggregator reads, by name
#: (:mod:`fl_adapters.client_metrics`). A message without it (a stock strategy's) gets all.
CLIENT_METRICS_KEY = "client-metrics"
CLIENT_ID = "client-id"
ARRAYS = "arrays"
METRICS = "metrics"
#: A query message's config key saying what the server asks; ``identify``: the client's id.
QUERY_KEY = "fedbalance-query"
IDENTIFY = "identify"


def to_numpy(array: Array) -> np.ndarray:
    """``array``'s values, read-only, straight from its ``.npy`` bytes when they hold a plain
    C-order array of the dtype the ``Array`` states; anything else through ``Array.numpy``.

    ``Array.numpy`` parses each header with ``ast.literal_eval``, most of a strategy's time per
    round (docs/hosts/flower.md, "Server cost"); the header check keeps the result identical.
    """
    data = array.data
    if array.stype == "numpy.ndarray" and data[:6] == b"\x93NUMPY":
        dtype = np.dtype(array.dtype)
        count = math.prod(array.shape)
        start = len(data) - count * dtype.itemsize
        header = data[:start]
        if (
            not dtype.hasobject
            and f"'descr': {dtype.str!r}".encode() in header
            and b"'fortran_order': False" in header
        ):
            return np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(array.shape)
    return array.numpy()


def to_state_dict(record: ArrayRecord) -> OrderedDict[str, torch.Tensor]:
    """``record`` as a torch state dict of tensors that own their (writable) memory."""
    # Flower's own to_torch_state_dict wraps read-only buffers (torch warns on each one), and
    # the aggregators' output pools must never alias a message's bytes.
    return OrderedDict((k, torch.from_numpy(np.array(to_numpy(v)))) for k, v in record.items())


def to_array_record(params: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """A torch state dict as an ``ArrayRecord`` (copied into Flower's serialised arrays)."""
    return ArrayRecord(
        {k: Array(np.ascontiguousarray(v.detach().cpu().numpy())) for k, v in params.items()}
    )


def make_reply(
    msg: Message,
    params: Mapping[str, torch.Tensor],
    num_examples: int,
    client_metrics: Mapping[str, float] | None,
    client_id: int | None,
) -> Message:
    """The reply to train message ``msg``: the trained model and the metrics aggregators read."""
    metrics: dict[str, Any] = {NUM_EXAMPLES: int(num_examples)}
    metrics.update({k: float(v) for k, v in (client_metrics or {}).items()})
    if client_id is not None:
        metrics[CLIENT_ID] = int(client_id)
    content = RecordDict({ARRAYS: to_array_record(params), METRICS: MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


def reported_client(msg: Message) -> int | None:
    """The ``client-id`` a reply reports (the node's ``partition-id``), if it is an int."""
    if msg.has_error():
        return None
    for metrics in msg.content.metric_records.values():
        client = metrics.get(CLIENT_ID)
        if isinstance(client, int):
            return client
    return None


def reply_to_update(msg: Message, *, with_params: bool = True) -> ClientUpdate:
    """One client's train reply as a fedbalance :class:`~fl_aggregators.ClientUpdate`.

    The client is named by its reported ``client-id``, else by its Flower node id. With
    ``with_params=False`` the reply carries metrics only (secure aggregation's first phase)
    and the update's ``params`` is ``None``.
    """
    arrays = list(msg.content.array_records.values())
    metric_records = list(msg.content.metric_records.values())
    node = msg.metadata.src_node_id
    if len(arrays) != int(with_params) or len(metric_records) != 1:
        log.warning(
            "node %s replied with %d ArrayRecord(s) and %d MetricRecord(s), not %d and 1",
            node,
            len(arrays),
            len(metric_records),
            int(with_params),
        )
    params: Any = None
    if with_params:  # an empty dict differs from the global model's keys: the aggregator rejects it
        params = to_state_dict(arrays[0]) if len(arrays) == 1 else OrderedDict()
    metrics = dict(metric_records[0]) if len(metric_records) == 1 else {}
    num_samples = metrics.pop(NUM_EXAMPLES, None)
    client = metrics.pop(CLIENT_ID, None)
    return ClientUpdate(
        params=params,
        num_samples=cast(int, num_samples),  # whatever it is, the aggregator checks it
        metrics={k: v for k, v in metrics.items() if not isinstance(v, list)},
        client_id=client if isinstance(client, int) else node,
    )


def log_errors(
    server_round: int, replies: list[Message], kind: str = "aggregate_train"
) -> str | None:
    """Flower's count of results and failures, a warning for each reply that carries an error
    instead of content, and the first such error (``None``: none failed)."""
    failed = [msg for msg in replies if msg.has_error()]
    logging.getLogger("flwr").log(  # beside Flower's own count of evaluate replies
        logging.WARNING if failed and len(failed) == len(replies) else logging.INFO,
        "%s: Received %d results and %d failures (round %s)",
        kind,
        len(replies) - len(failed),
        len(failed),
        server_round,
    )
    for msg in failed:
        log.warning(
            "round %s: node %s replied with an error: %s",
            server_round,
            msg.metadata.src_node_id,
            msg.error.reason,
        )
    if not failed:
        return None
    return f"node {failed[0].metadata.src_node_id} replied with an error: {failed[0].error.reason}"


def error_line(reason: str, limit: int = 300) -> str:
    """A node's error reason in one line for a record: the last line of the traceback Flower
    relays (its exception's message), terminal colours removed, at most ``limit`` characters."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", str(reason))
    lines = [line.strip() for line in plain.splitlines() if line.strip()]
    last = lines[-1] if lines else "no reason given"
    last = last.split("Message: ", 1)[-1].removesuffix("'>")
    return last if len(last) <= limit else last[: limit - 3] + "..."


def content_order(msg: Message) -> tuple[bool, str]:
    if msg.has_error():
        return (True, str(msg.error.reason))
    records = msg.content.metric_records
    return (False, json.dumps({k: dict(v) for k, v in records.items()}, sort_keys=True))


def weighs_nothing(msg: Message, key: str) -> bool:
    """A reply whose weighting metric (``num-examples``) is 0: it evaluated no data."""
    records = [] if msg.has_error() else list(msg.content.metric_records.values())
    value = records[0].get(key) if records else None
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def weighted_metrics(updates: list[Any], weights: list[float]) -> dict[str, float]:
    """Accepted clients' scalar metrics, averaged with the weights the aggregator applied.

    A metric only some clients report is averaged over those clients (weights renormalised).
    """
    sums: dict[str, float] = {}
    mass: dict[str, float] = {}
    for update, w in zip(updates, weights, strict=True):
        if w <= 0:
            continue
        for key, value in update.metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                sums[key] = sums.get(key, 0.0) + w * float(value)
                mass[key] = mass.get(key, 0.0) + w
    return {key: total / mass[key] for key, total in sums.items()}


def take_counts(msg: Message) -> tuple[Counts | None, Any, str | None]:
    """An evaluate reply's per-class counts, removed from its metrics (Flower's weighted
    average must not average them), with the reply's ``client-id`` (removed too): ``(counts,
    client, None)``; ``(None, client, None)`` for a reply without counts (a stock ClientApp's);
    ``(None, client, why)`` for counts that cannot be believed: not whole non-negative numbers,
    more than :data:`~fl_adapters.bias.MAX_CLASSES` classes or 2**53 samples, vectors of
    different lengths, more correct than seen, or not adding up to ``num-examples``."""
    records = [] if msg.has_error() else list(msg.content.metric_records.values())
    if not records:
        return None, None, None
    record = records[0]
    client = record.pop(CLIENT_ID, None)
    raw = [record.pop(k, None) for k in (CLASS_TOTAL, CLASS_CORRECT)]
    if raw == [None, None]:
        return None, client, None
    problem = _counts_problem(raw, record.get(NUM_EXAMPLES))
    if problem is not None:
        return None, client, problem
    seen, right = (np.asarray(v, dtype=np.int64) for v in raw)
    return Counts(0.0, seen, right), client, None


def _counts_problem(raw: list[Any], num_examples: Any) -> str | None:
    for key, value in zip((CLASS_TOTAL, CLASS_CORRECT), raw, strict=True):
        if not isinstance(value, list) or len(value) > MAX_CLASSES:
            return f"{key} must be a list of at most {MAX_CLASSES} counts, got {shown(value)}"
        if not all(
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and math.isfinite(v)
            and v == int(v)
            and 0 <= v < 2**53
            for v in value
        ):
            return f"{key} must hold whole numbers in [0, 2**53), got {shown(value)}"
    seen, right = raw
    if len(seen) != len(right):
        return f"{CLASS_TOTAL} and {CLASS_CORRECT} differ in length ({len(seen)}, {len(right)})"
    if any(r > s for s, r in zip(seen, right, strict=True)):
        return f"{CLASS_CORRECT} exceeds {CLASS_TOTAL} for a class"
    if num_examples != sum(int(s) for s in seen):
        return (
            f"{CLASS_TOTAL} sums to {sum(int(s) for s in seen)}, not num-examples {num_examples!r}"
        )
    return None
