"""quickstart: the ClientApp. The template's train body is the one line fedbalance's docs give."""

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fl_adapters.flower.trainer import evaluate_reply, train_reply
from quickstart.task import Net, load_data
from quickstart.task import train as train_fn

app = ClientApp()
device = torch.device("cpu")


def data(context: Context, train_part: bool):
    loaders = load_data(
        context.node_config["partition-id"],
        context.node_config["num-partitions"],
        context.run_config["batch-size"],
        rename=bool(context.run_config["rename-keys"]),
    )
    return loaders[0 if train_part else 1]


@app.train()
def train(msg: Message, context: Context):
    """Train the model on local data."""
    epochs, lr = context.run_config["local-epochs"], msg.content["config"]["lr"]
    return train_reply(
        msg, context, Net(), data(context, True), lambda m, d: train_fn(m, d, epochs, lr, device)
    )


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data: the one line fedbalance's docs give (the bias figures'
    class counts beside the template's loss and accuracy)."""
    return evaluate_reply(msg, context, Net(), {"test": data(context, False)})
