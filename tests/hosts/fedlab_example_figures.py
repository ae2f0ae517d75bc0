"""FedLab's standalone example (``fedlab_example_standalone.py``) with the one addition
``docs/run.md`` gives a FedLab user: its ``evaluate`` also prints
``fl_adapters.bias.figures(model, loaders)``, on FedLab's own model and test loader, and per
client on three clients' FedLab loaders."""

import json

import fedlab_example_standalone as example

from fl_adapters.bias import figures


class FiguresPipeline(example.EvalPipeline):
    def evaluate(self):
        super().evaluate()
        model = self.handler.model
        clients = {c: self.trainer.dataset.get_dataloader(c, 256) for c in range(3)}
        print("FIGURES", json.dumps(figures(model, self.test_loader)))
        print("CLIENT FIGURES", json.dumps(figures(model, clients)))


if __name__ == "__main__":
    example.EvalPipeline = FiguresPipeline
    example.main()
