"""A FedML 0.9.6 host with its own ClientTrainer (no fedbalance import), as a user writes one.

The trainer is plain SGD and has no ``test`` of its own; every ``train`` call appends a line to
``$CUSTOM_TRAINER_LOG`` so the test can see that this trainer, not FedML's default, trained.
"""

import os
import sys
from pathlib import Path

import fedml
import torch
import torch.nn.functional as F
from fedml import FedMLRunner
from fedml.core import ClientTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "adapters" / "fedml" / "example"))
import data  # noqa: E402  (the example's data module: Fashion-MNIST or digits partitions)


class PlainSGDTrainer(ClientTrainer):
    def get_model_params(self):
        return self.model.cpu().state_dict()

    def set_model_params(self, model_parameters):
        self.model.load_state_dict(model_parameters)

    def train(self, train_data, device, args):
        model = self.model
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        seen = 0
        for _ in range(args.epochs):
            for x, y in train_data:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                seen += len(y)
        with open(os.environ["CUSTOM_TRAINER_LOG"], "a") as fh:
            fh.write(f"{self.id} {seen}\n")

    def test(self, test_data, device, args):
        raise NotImplementedError  # this user never wrote one


if __name__ == "__main__":
    args = fedml.init()
    device = fedml.device.get_device(args)
    dataset, output_dim = data.load(args)
    model = data.model(args, output_dim)
    FedMLRunner(args, device, dataset, model, client_trainer=PlainSGDTrainer(model, args)).run()
