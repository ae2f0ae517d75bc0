"""The example FedML host plus one line a user might add: the server saves its final global
model to ``$FINAL_MODEL`` (no fedbalance import). Used to compare transports' end models."""

import os
import sys
from pathlib import Path

import fedml
import torch
from fedml import FedMLRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "fedml_example"))
import data  # noqa: E402  (the example's data module)

if __name__ == "__main__":
    args = fedml.init()
    device = fedml.device.get_device(args)
    dataset, output_dim = data.load(args)
    model = data.model(args, output_dim)
    FedMLRunner(args, device, dataset, model).run()
    if int(args.rank) == 0:  # the server's aggregator trains nothing: it holds this object
        torch.save(model.state_dict(), os.environ["FINAL_MODEL"])
