"""The example FedML host plus what ``docs/run.md`` gives a FedML user: after the run, the
server saves its final global model to ``$FINAL_MODEL`` and its bias figures,
``fl_adapters.bias.figures(model, loaders)`` on FedML's own per-client test loaders, to
``$FINAL_FIGURES`` (JSON)."""

import json
import os

import torch
from fedml_example_run import data, run_example

from fl_adapters.bias import figures

if __name__ == "__main__":
    args, model = run_example()
    if int(args.rank) == 0:  # the server's aggregator trains nothing: it holds this object
        torch.save(model.state_dict(), os.environ["FINAL_MODEL"])
        dataset, _ = data.load(args)
        test_data_local_dict = dataset[6]  # FedML's dataset list: the clients' test loaders
        with open(os.environ["FINAL_FIGURES"], "w") as fh:
            json.dump(figures(model, test_data_local_dict), fh)
