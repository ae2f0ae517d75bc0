"""FedLab 1.3.0's standalone example style: only FedLab, torch and torchvision, no fedbalance.

Built from FedLab's own pieces as its examples are — ``PathologicalMNIST`` (which pickles each
client's data and needs ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` on torch >= 2.6), ``MLP``,
``SyncServerHandler``, ``SGDSerialClientTrainer`` and ``StandalonePipeline`` with an
evaluating ``evaluate``. Differences from FedLab's examples: ``cuda=False`` unless ``--cuda``
(they hard-code ``cuda=True``; the test machines have no GPU, `make test-cuda` passes it),
``download=False`` (offline: the tests put MNIST-format idx files under ``--root``), and a final
checksum line for the tests.
"""

import argparse

import torch
import torchvision
from fedlab.contrib.algorithm.basic_client import SGDSerialClientTrainer
from fedlab.contrib.algorithm.basic_server import SyncServerHandler
from fedlab.contrib.dataset.pathological_mnist import PathologicalMNIST
from fedlab.core.standalone import StandalonePipeline
from fedlab.models.mlp import MLP
from fedlab.utils.functional import evaluate
from torch import nn
from torch.utils.data import DataLoader, Subset
from torchvision import transforms


class EvalPipeline(StandalonePipeline):
    def __init__(self, handler, trainer, test_loader):
        super().__init__(handler, trainer)
        self.test_loader = test_loader

    def evaluate(self):
        loss, acc = evaluate(self.handler.model, nn.CrossEntropyLoss(), self.test_loader)
        print(f"round {self.handler.round} loss {loss:.4f} test-acc {acc:.4f}")


def main():
    parser = argparse.ArgumentParser(description="FedLab standalone example (MNIST format)")
    parser.add_argument("--root", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--total_clients", type=int, default=20)
    parser.add_argument("--com_round", type=int, default=2)
    parser.add_argument("--sample_ratio", type=float, default=0.2)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--preprocess", action="store_true", help="partition into --path first")
    parser.add_argument("--cuda", action="store_true", help="server and trainer on the GPU")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = MLP(784, 10)
    handler = SyncServerHandler(model, args.com_round, args.sample_ratio, cuda=args.cuda)
    trainer = SGDSerialClientTrainer(model, args.total_clients, cuda=args.cuda)
    dataset = PathologicalMNIST(
        root=args.root, path=args.path, num_clients=args.total_clients, download=False
    )
    if args.preprocess:
        dataset.preprocess(download=False)
    trainer.setup_dataset(dataset)
    trainer.setup_optim(args.epochs, args.batch_size, args.lr)

    test = torchvision.datasets.MNIST(
        args.root, train=False, download=False, transform=transforms.ToTensor()
    )
    test_loader = DataLoader(Subset(test, range(min(2000, len(test)))), batch_size=1024)
    EvalPipeline(handler, trainer, test_loader).main()
    print("CHECKSUM", float(handler.model_parameters.double().sum()))


if __name__ == "__main__":
    main()
