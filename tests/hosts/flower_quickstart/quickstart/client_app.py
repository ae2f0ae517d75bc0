"""quickstart: the ClientApp. The template's train body is the one line fedbalance's docs give."""

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_adapters.flower.trainer import train_reply
from quickstart.task import Net, load_data
from quickstart.task import test as test_fn
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
    """Evaluate the model on local data (the template's own, unchanged)."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    model.to(device)
    valloader = data(context, False)
    eval_loss, eval_acc = test_fn(model, valloader, device)
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)}
    content = RecordDict({"metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)
