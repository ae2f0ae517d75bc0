"""The ClientApp side: split off the validation data, train with the user's function, reply.

FedLoss needs each client's loss on a held-out validation split after local training
(Tagarakis 2023: 70 % train / 10 % validation / 20 % test of the client's data). FedLab's and
FedML's trainers hold that split out themselves; on Flower the user's ClientApp calls
:func:`train_reply`, which does the same around the user's own training function.

``data`` is either the client's whole data, split here with
:func:`fl_partitions.partition.local_splits` (the split fedbalance partitions use, seeded by
the run config's ``seed`` and the node's ``partition-id``), or a mapping with the ``"train"``
and ``"val"`` data already split (e.g. a fedbalance :class:`~fl_partitions.Partition`'s
``splits``, as FedLab's :class:`~fl_adapters.fedlab.PartitionedDataset` serves them). Data is
a dataset or a ``DataLoader`` whose samples are ``(x, y)`` pairs or dicts, as Flower Datasets
yields them (``{"img": ..., "label": ...}`` in Flower's ``quickstart-pytorch``; the keys are
found, or given as ``keys=``). A ``DataLoader`` is split into ``DataLoader``s of the same
batch size and collation, so the user's ``train_fn`` gets what it was written for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict
from numpy.typing import NDArray
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, Subset

from fl_adapters._training import (
    check_sample,
    evaluate,
    evaluate_counts,
    num_samples,
    stream_seed,
    training_clock,
)
from fl_adapters.bias import Counts
from fl_adapters.client_metrics import CLIENT_METRICS, measure
from fl_adapters.flower.config import SEED_KEY
from fl_adapters.flower.payload import (
    CLASS_CORRECT,
    CLASS_TOTAL,
    CLIENT_ID,
    CLIENT_METRICS_KEY,
    METRICS,
    NUM_EXAMPLES,
    make_reply,
    to_state_dict,
)
from fl_checks import ParameterError
from fl_partitions.partition import DEFAULT_SPLIT, local_splits

log = logging.getLogger(__name__)

#: ``train_fn(model, train_data)`` trains ``model`` in place; it may return the number of
#: samples it trained on (else ``len(train_data)`` is reported as ``num-examples``).
TrainFn = Callable[[nn.Module, Dataset[Any]], Any]
#: The Flower node config key that numbers a node's data partition (Flower's convention).
PARTITION_ID = "partition-id"


def local_split(
    n: int, *, seed: int, split: Sequence[float] = DEFAULT_SPLIT
) -> dict[str, NDArray[np.int64]]:
    """Indices ``0..n-1`` split into ``train``/``val``/``test`` as fedbalance partitions are.

    Parameters
    ----------
    n : the client's number of samples.
    seed : the shuffle's seed (same seed, same split).
    split : train, validation and test fractions (the thesis's 70/10/20 by default).
    """
    return local_splits([np.arange(n, dtype=np.int64)], split, seed)[0]


def global_state(msg: Message) -> dict[str, Any]:
    """The global model a train or evaluate message carries, as a torch state dict."""
    records = list(msg.content.array_records.values())
    if len(records) != 1:
        raise ValueError(f"expected one ArrayRecord (the global model), got {len(records)}")
    return to_state_dict(records[0])


def partition_id(context: Context) -> int | None:
    """The node's ``partition-id`` from its node config, if it has one."""
    value = context.node_config.get(PARTITION_ID)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def client_splits(
    context: Context,
    data: Any,
    split: Sequence[float] = DEFAULT_SPLIT,
) -> Mapping[str, Any]:
    """``data`` as ``{"train", "val", "test"}`` datasets or ``DataLoader``s (see the module
    docstring)."""
    if isinstance(data, Mapping):
        if "train" not in data:
            raise ParameterError(f"data must hold a 'train' dataset, got keys {sorted(data)}")
        return data
    loader = data if isinstance(data, DataLoader) else None
    dataset = loader.dataset if loader is not None else data
    seed = stream_seed("flower-split", context.run_config.get(SEED_KEY, 0), partition_id(context))
    parts = local_split(len(dataset), seed=seed, split=split)  # type: ignore[arg-type]
    subsets = {name: Subset(dataset, ix.tolist()) for name, ix in parts.items()}
    if loader is None:
        return subsets
    shuffled = isinstance(loader.sampler, RandomSampler)
    return {
        name: DataLoader(
            subset,
            batch_size=loader.batch_size,
            shuffle=shuffled and name == "train",
            generator=loader.generator,  # the user's seeding of its order, if any
            collate_fn=loader.collate_fn,
            num_workers=loader.num_workers,
            drop_last=loader.drop_last and name == "train",
        )
        for name, subset in subsets.items()
    }


def train_reply(
    msg: Message,
    context: Context,
    model: nn.Module,
    data: Any,
    train_fn: TrainFn,
    *,
    split: Sequence[float] = DEFAULT_SPLIT,
    keys: tuple[str, str] | None = None,
) -> Message:
    """Train ``model`` from the message's global model and reply as fedbalance's strategy reads.

    Parameters
    ----------
    msg, context : the ClientApp's train message and context.
    model : a model of the global model's architecture (its weights are replaced).
    data : the client's dataset or ``DataLoader``, or its ``{"train", "val"}`` splits (of
        ``(x, y)`` pairs or dict samples, see the module docstring).
    train_fn : the user's local training, ``train_fn(model, train_data)``; ``train_data`` is
        of the kind ``data`` is (a ``DataLoader`` for a ``DataLoader``).
    split : train/validation/test fractions when ``data`` is one dataset or loader.
    keys : the (inputs, labels) keys of dict samples, when not one of
        :data:`~fl_adapters._training.KNOWN_KEYS`.

    Returns
    -------
    Message
        The reply: the trained model and a ``MetricRecord`` with ``num-examples`` (samples, not
        batches), the client metrics the strategy asks for (``val_loss`` for FedLoss; when the
        validation split is not empty) and ``client-id`` (the
        node's ``partition-id``).

    Raises
    ------
    ParameterError
        Before training, when the samples are neither pairs nor dicts with known keys.
    """
    client = partition_id(context)
    parts = client_splits(context, data, split)
    val = parts.get("val")
    check_sample(val if val is not None and num_samples(val) else parts["train"], keys)
    model.load_state_dict(global_state(msg))
    with training_clock(client):
        trained = train_fn(model, parts["train"])
    n = trained if isinstance(trained, int) and not isinstance(trained, bool) else None
    n = n if n is not None else num_samples(parts["train"])
    names = asked_metrics(msg)
    metrics = measure(
        names, lambda: evaluate(model, val, keys=keys) if val is not None else None, client
    )
    return make_reply(msg, model.state_dict(), n, metrics, client)


def asked_metrics(msg: Message) -> tuple[str, ...]:
    """The client metrics train message ``msg`` asks for (:data:`CLIENT_METRICS_KEY` in its
    config): every one a client can compute when it does not say (a stock strategy's message);
    a :class:`ParameterError` naming any this fedbalance cannot compute."""
    for config in msg.content.config_records.values():
        if CLIENT_METRICS_KEY in config:
            names = config[CLIENT_METRICS_KEY]
            names = [names] if isinstance(names, str) else list(cast(list[str], names))
            unknown = [n for n in names if n not in CLIENT_METRICS]
            if unknown:
                raise ParameterError(
                    f"the strategy asks for client metrics {unknown}, which this client cannot "
                    f"compute: it knows {', '.join(CLIENT_METRICS)} (update fedbalance on it)"
                )
            return tuple(names)
    return tuple(CLIENT_METRICS)


def evaluate_reply(
    msg: Message,
    context: Context,
    model: nn.Module,
    data: Any,
    *,
    split: Sequence[float] = DEFAULT_SPLIT,
    keys: tuple[str, str] | None = None,
) -> Message:
    """Loss and accuracy of the message's global model on the client's test split, with the
    per-class counts fedbalance's strategy turns into the bias figures.

    ``data``, ``split`` and ``keys`` as :func:`train_reply` takes them, or ``{"test": data}``
    for a test set of the client's own (a ``DataLoader`` as a Flower template makes). The reply's
    ``MetricRecord`` holds ``num-examples``, ``eval_loss``, ``eval_acc``, ``client-id`` and,
    from the same pass, ``class-total`` and ``class-correct`` (samples and correct predictions
    per class, one entry per model output). A client without test data replies
    ``num-examples`` 0 with loss and accuracy 0 (not NaN): weight 0 then adds nothing to an
    average weighted by ``num-examples``, even Flower's own.
    """
    model.load_state_dict(global_state(msg))
    own = isinstance(data, Mapping) and "train" not in data  # {"test": loader}: as it is
    test = data.get("test") if own else client_splits(context, data, split).get("test")
    if test is not None:
        check_sample(test, keys)
    counts = evaluate_counts(model, test, keys=keys) if test is not None else Counts()
    n = counts.n
    loss, acc = (counts.loss, counts.accuracy) if n else (0.0, 0.0)
    client = partition_id(context)
    if n == 0:
        log.warning("client %s has an empty test split; it reports num-examples 0", client)
    values: dict[str, Any] = {NUM_EXAMPLES: n, "eval_loss": loss, "eval_acc": acc}
    values |= {CLASS_TOTAL: counts.total.tolist(), CLASS_CORRECT: counts.correct.tolist()}
    if client is not None:
        values[CLIENT_ID] = client
    return Message(content=RecordDict({METRICS: MetricRecord(values)}), reply_to=msg)


def identify_reply(msg: Message, context: Context) -> Message:
    """The reply to the strategy's ``identify`` query: this node's ``partition-id``.

    Register it in the ClientApp (``@app.query()``) so that a run sampling fewer clients than
    it has nodes samples the same clients for the same seed (Flower's node ids are random).
    """
    client = partition_id(context)
    metrics = MetricRecord({} if client is None else {CLIENT_ID: client})
    return Message(content=RecordDict({METRICS: metrics}), reply_to=msg)
