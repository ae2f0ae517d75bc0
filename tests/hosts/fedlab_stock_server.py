"""A stock FedLab 1.3.0 server over DistNetwork: only FedLab and torch, no fedbalance import.

    python fedlab_stock_server.py PORT WORLD_SIZE ROUNDS

Prints the final global parameters' checksum.
"""

import random
import sys

import torch
from fedlab.contrib.algorithm.basic_server import SyncServerHandler
from fedlab.core.network import DistNetwork
from fedlab.core.server.manager import SynchronousServerManager


def main():
    port, world, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    random.seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )
    handler = SyncServerHandler(model, global_round=rounds, sample_ratio=0.5)
    network = DistNetwork(("127.0.0.1", port), world_size=world, rank=0)
    SynchronousServerManager(network=network, handler=handler, mode="LOCAL").run()
    print(
        "CHECKSUM",
        float(handler.model_parameters.double().sum()),
        float(handler.model_parameters.abs().double().sum()),
    )


if __name__ == "__main__":
    main()
