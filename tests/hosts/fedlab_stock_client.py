"""A stock FedLab 1.3.0 client process over DistNetwork: only FedLab and torch.

    python fedlab_stock_client.py PORT WORLD_SIZE RANK [single]

Simulates its share of 6 digits clients (the same partition as ``fedlab_stock_standalone.py``)
with FedLab's ``SGDSerialClientTrainer``; with ``single``, one client of WORLD_SIZE - 1 with
FedLab's ``SGDClientTrainer``.
"""

import sys

import torch
from fedlab.contrib.algorithm.basic_client import SGDClientTrainer, SGDSerialClientTrainer
from fedlab.core.client.manager import PassiveClientManager
from fedlab.core.network import DistNetwork
from fedlab_stock_standalone import DigitsFed, digits_mlp


class Slice:
    """Clients ``offset .. offset + num - 1`` of a FedDataset, under local ids 0 .. num - 1."""

    def __init__(self, data, offset, num):
        self.data, self.offset, self.num = data, offset, num

    def get_dataset(self, id, type="train"):
        return self.data.get_dataset(self.offset + id, type)

    def get_dataloader(self, id, batch_size, type="train"):
        return self.data.get_dataloader(self.offset + id, batch_size, type)


def main():
    port, world, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(rank)
    model = digits_mlp()
    if sys.argv[4:] == ["single"]:
        trainer = SGDClientTrainer(model)
        trainer.setup_dataset(Slice(DigitsFed(world - 1), rank - 1, 1))
    else:
        per = 6 // (world - 1)
        trainer = SGDSerialClientTrainer(model, num_clients=per)
        trainer.setup_dataset(Slice(DigitsFed(6), (rank - 1) * per, per))
    trainer.setup_optim(epochs=1, batch_size=32, lr=0.1)
    network = DistNetwork(("127.0.0.1", port), world_size=world, rank=rank)
    PassiveClientManager(trainer=trainer, network=network).run()


if __name__ == "__main__":
    main()
