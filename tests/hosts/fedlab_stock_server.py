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
from fedlab_stock_standalone import digits_mlp, print_checksum


def main():
    port, world, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    random.seed(0)
    torch.manual_seed(0)
    model = digits_mlp()
    handler = SyncServerHandler(model, global_round=rounds, sample_ratio=0.5)
    network = DistNetwork(("127.0.0.1", port), world_size=world, rank=0)
    SynchronousServerManager(network=network, handler=handler, mode="LOCAL").run()
    print_checksum(handler)


if __name__ == "__main__":
    main()
