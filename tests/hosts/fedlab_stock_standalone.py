"""A stock FedLab 1.3.0 standalone script: only FedLab and torch, no fedbalance import.

Used by the tests to show that ``FEDBALANCE_AGGREGATOR`` switches its aggregation with no
edit. Prints the final global parameters' checksum.
"""

import random
import sys

import numpy as np
import torch
from fedlab.contrib.algorithm.basic_client import SGDSerialClientTrainer
from fedlab.contrib.algorithm.basic_server import SyncServerHandler
from fedlab.contrib.dataset.basic_dataset import FedDataset
from fedlab.core.standalone import StandalonePipeline
from fedlab.utils.dataset.functional import hetero_dir_partition
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


class DigitsFed(FedDataset):
    def __init__(self, num_clients):
        d = load_digits()
        x = torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0  # 8 x 8 images
        y = torch.tensor(d.target)
        np.random.seed(0)  # noqa: NPY002 - FedLab partitions with the global RNG
        parts = hetero_dir_partition(d.target, num_clients, 10, 0.5, min_require_size=20)
        self.sets = {c: TensorDataset(x[idx], y[idx]) for c, idx in parts.items()}
        self.num = num_clients

    def get_dataset(self, id, type="train"):
        return self.sets[id]

    def get_dataloader(self, id, batch_size, type="train"):
        return DataLoader(self.sets[id], batch_size=batch_size, shuffle=True)


class QuietPipeline(StandalonePipeline):
    def evaluate(self):
        pass


def digits_mlp():
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )


def print_checksum(handler):
    params = handler.model_parameters.double()
    print("CHECKSUM", float(params.sum()), float(params.abs().sum()))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    random.seed(0)
    torch.manual_seed(0)
    model = digits_mlp()
    handler = SyncServerHandler(model, global_round=rounds, sample_ratio=0.5)
    trainer = SGDSerialClientTrainer(model, num_clients=6)
    trainer.setup_dataset(DigitsFed(6))
    trainer.setup_optim(epochs=1, batch_size=32, lr=0.1)
    QuietPipeline(handler, trainer).main()
    print_checksum(handler)


if __name__ == "__main__":
    main()
