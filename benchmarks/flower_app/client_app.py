"""The app's ClientApp: fedbalance's client helper around fedbalance's local training."""

from __future__ import annotations

from typing import cast

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedbalance_benchmarks.flower_app.task import client_data, model_of, train_fn
from fl_adapters.flower.trainer import (
    evaluate_reply,
    identify_reply,
    partition_id,
    train_reply,
)

app = ClientApp()


def _client(context: Context) -> int:
    client = partition_id(context)
    if client is None:
        raise ValueError("this app needs node config 'partition-id' (--node-config)")
    return client


@app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)  # several clients share a machine; one thread each is fastest
    config = msg.content.config_records["config"]
    client = _client(context)
    return train_reply(
        msg,
        context,
        model_of(config),
        client_data(config, client),
        train_fn(config, client, int(cast(int, config["server-round"]))),
    )


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    config = msg.content.config_records["config"]
    return evaluate_reply(msg, context, model_of(config), client_data(config, _client(context)))


@app.query()
def query(msg: Message, context: Context) -> Message:
    return identify_reply(msg, context)  # the strategy's seeded sampling orders nodes by it
