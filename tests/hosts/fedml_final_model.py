"""The example FedML host plus one line a user might add: the server saves its final global
model to ``$FINAL_MODEL`` (no fedbalance import). Used to compare transports' end models."""

import os

import torch
from fedml_example_run import run_example

if __name__ == "__main__":
    args, model = run_example()
    if int(args.rank) == 0:  # the server's aggregator trains nothing: it holds this object
        torch.save(model.state_dict(), os.environ["FINAL_MODEL"])
