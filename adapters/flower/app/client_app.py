"""The app's ClientApp: fedbalance's client helper around fedbalance's local training."""

from __future__ import annotations

from typing import cast

from fl_adapters.collector import paused_collector

# Flower starts a ClientApp process for every message; most of its CPU was these imports.
with paused_collector():
    import torch
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp

    from fl_adapters.astraea import dataset_tensors
    from fl_adapters.flower.app.task import client_data, model_of, train_fn
    from fl_adapters.flower.astraea import astraea_query_reply, astraea_train_reply
    from fl_adapters.flower.trainer import evaluate_reply, partition_id
    from fl_checks import ParameterError

app = ClientApp()


def _client(context: Context) -> int:
    client = partition_id(context)
    if client is None:
        raise ParameterError("this app needs node config 'partition-id' (--node-config)")
    return client


@app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)  # several clients share a machine; one thread each is fastest
    config = msg.content.config_records["config"]
    client = _client(context)
    # Plain fedbalance training, or an Astraea mediator hop on data rebalanced by the rad the
    # strategy sent (a node without rad trains on its data as is).
    return astraea_train_reply(
        msg,
        context,
        model_of(config),
        client_data(config, client),
        train_fn(config, client, int(cast(int, config["server-round"]))),
        seed=int(cast(int, config["seed"])),
    )


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    config = msg.content.config_records["config"]
    return evaluate_reply(msg, context, model_of(config), client_data(config, _client(context)))


@app.query()
def query(msg: Message, context: Context) -> Message:
    """The strategy's questions: the node's client id (seeded sampling orders nodes by it)
    and, for Astraea, its training-label counts and the plan's rad."""
    config = msg.content.config_records["config"]

    def train_labels() -> object:
        return dataset_tensors(client_data(config, _client(context))["train"])[1]

    return astraea_query_reply(msg, context, train_labels, num_classes=10)
