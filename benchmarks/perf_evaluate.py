"""What the bias figures cost: an evaluation with per-class and per-client counts against the
accuracy-only evaluation it replaced.

The reference (:func:`accuracy_only`) is the loop ``fl_adapters._training.evaluate`` ran before
the bias figures: the loss and the correct predictions of every batch, summed over the union of
the evaluated clients' test splits. The measured path is what every evaluated round runs now
(``fl_adapters.fedlab.runner``): :func:`~fl_adapters._training.evaluate_counts` per client,
then the class and client figures. Both evaluate the thesis CNN on the same clients' data in the
same process, interleaved, so machine noise hits both; the result is the ratio of median times
(the issue's bound: at most 5 % more).

FedML's MPI simulation and cross-silo servers are measured separately (:func:`fedml_server`):
FedML tests its global test set there, with no per-client view. In fedbalance's FedML example
that set is the union of the clients' test splits, so the figures are counted per client in one
pass over it, which also answers FedML's test (``fl_adapters.fedml.patches.distributed.
clients_figures``). The reference is FedML's own test pass (``DefaultServerAggregator._test``)
on that global test set.

    fedbalance bench perf-evaluate [--clients 30] [--repeats 7] [--dataset fmnist]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = "fedbalance bench perf-evaluate"


@torch.no_grad()
def accuracy_only(model: nn.Module, datasets: list[Any], batch_size: int = 1024) -> float:
    """The evaluation before the bias figures: loss and accuracy of the union of ``datasets``."""
    from fl_adapters._training import batches

    model.eval()
    loss_sum, correct, n = 0.0, 0, 0
    criterion = nn.CrossEntropyLoss(reduction="sum")
    for ds in datasets:
        for x, y in batches(ds, batch_size):
            out = model(x)
            loss_sum += float(criterion(out, y))
            correct += int((out.argmax(dim=1) == y).sum())
            n += len(y)
    return correct / n


def with_figures(model: nn.Module, parts: dict[int, Any], num_classes: int) -> float:
    """The evaluation now: per-client counts, then the class and client figures."""
    from fl_adapters import bias
    from fl_adapters._training import evaluate_counts

    per = {c: evaluate_counts(model, ds) for c, ds in parts.items()}
    counts = bias.total(list(per.values()))
    bias.class_figures(counts, num_classes)
    bias.client_figures(per)
    bias.client_accuracies(per)
    return counts.accuracy


def fedml_server(model: nn.Module, parts: dict[int, Any], repeats: int) -> dict[str, Any]:
    """FedML's server test pass (``DefaultServerAggregator._test``, batches of 64) on the union
    of ``parts``, against what a tested round of fedbalance's FedML example runs now: the
    figures counted per client in one pass over that set (``clients_figures``), which then
    answers FedML's test; interleaved; medians and ratio."""
    import logging
    from types import SimpleNamespace

    from fedml.ml.aggregator.default_aggregator import DefaultServerAggregator
    from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

    from fl_adapters._training import batches
    from fl_adapters.fedml.patches.distributed import clients_figures

    args = SimpleNamespace(dataset="fmnist", enable_wandb=False, round_idx=0)
    server = DefaultServerAggregator(model, args)
    # As the example's loaders hold them (fl_adapters.fedml.example.data): each client's split
    # as tensors in batches of 64, and the global test set their concatenation.
    held = {}
    for c, ds in parts.items():
        xs, ys = zip(*batches(ds, 1024), strict=True)
        held[c] = DataLoader(TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=64)
    test_global = DataLoader(ConcatDataset([d.dataset for d in held.values()]), batch_size=64)
    aggregator = SimpleNamespace(
        aggregator=server, test_data_local_dict=held, test_global=test_global, args=args
    )
    logging.getLogger().setLevel(logging.WARNING)  # FedML logs each test at INFO
    logging.getLogger("fl_adapters").setLevel(logging.WARNING)  # and fedbalance its figures
    stock = DefaultServerAggregator._test

    def before() -> Any:
        return stock(server, test_global, "cpu", args)

    def now() -> Any:
        clients_figures(aggregator)
        return server._test(test_global, "cpu", args)

    if before()["test_correct"] != now()["test_correct"]:
        raise AssertionError("FedML's test and the figures' answer disagree")
    names = ("FedML's test (before)", "one pass: figures per client, FedML's test answered (now)")
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        for name, run in zip(names, (before, now), strict=True):
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"seconds": times, "median_s": medians, "ratio": medians[names[1]] / medians[names[0]]}


def measure(dataset: str, clients: int, repeats: int, seed: int = 0) -> dict[str, Any]:
    from fl_adapters.config import RunConfig
    from fl_adapters.datasets import image_spec
    from fl_adapters.experiment import training_data
    from fl_adapters.fedlab.data import PartitionedDataset
    from fl_adapters.models import model_for

    config = RunConfig(dataset=dataset, num_clients=clients, seed=seed)
    train, _, partition = training_data(config)
    data = PartitionedDataset(train, partition)
    parts = {c: data.get_dataset(c, "test") for c in range(clients)}
    model = model_for(config.model, dataset, None, seed=seed)
    num_classes = image_spec(dataset)[2]
    torch.set_num_threads(1)  # one core, as a benchmark worker runs
    old_acc = accuracy_only(model, list(parts.values()))  # warm-up, and the same answer
    new_acc = with_figures(model, parts, num_classes)
    if abs(old_acc - new_acc) > 1e-12:
        raise AssertionError(f"the two evaluations disagree: {old_acc} vs {new_acc}")
    times: dict[str, list[float]] = {"accuracy only": [], "with bias figures": []}
    for _ in range(repeats):
        for name, run in (
            ("accuracy only", lambda: accuracy_only(model, list(parts.values()))),
            ("with bias figures", lambda: with_figures(model, parts, num_classes)),
        ):
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    medians = {k: statistics.median(v) for k, v in times.items()}
    try:
        fedml = fedml_server(model, parts, repeats)
    except ImportError:  # FedML is not in this environment
        fedml = None
    return {
        "command": COMMAND,
        "dataset": dataset,
        "clients": clients,
        "samples": sum(len(p) for p in parts.values()),
        "repeats": repeats,
        "seconds": times,
        "median_s": medians,
        "ratio": medians["with bias figures"] / medians["accuracy only"],
        "fedml_server": fedml,
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }


def report(result: dict[str, Any]) -> str:
    m = result["median_s"]
    return "\n".join(
        [
            "# What the bias figures cost",
            "",
            f"Regenerate: `{result['command']}` ({result['repeats']} interleaved repeats, one "
            "torch thread). The thesis CNN evaluated on the test splits of "
            f"{result['clients']} clients of {result['dataset']} ({result['samples']} samples): "
            "the accuracy-only loop the runs used before, against per-client class counts and "
            "every bias figure (the same pass).",
            "",
            "| evaluation | median s |",
            "|---|---|",
            f"| accuracy only (before) | {m['accuracy only']:.4f} |",
            f"| with bias figures (now) | {m['with bias figures']:.4f} |",
            "",
            f"Ratio now / before: **{result['ratio']:.3f}** (the bound: 1.05).",
            "",
            *fedml_lines(result.get("fedml_server")),
        ]
    )


def fedml_lines(fedml: dict[str, Any] | None) -> list[str]:
    if fedml is None:
        return ["FedML's MPI and cross-silo servers: not measured (FedML not installed).", ""]
    m = fedml["median_s"]
    return [
        "## FedML's MPI simulation and cross-silo servers",
        "",
        "FedML's server tests its global test set, with no per-client view. fedbalance's FedML "
        "example makes that set the union of the clients' test splits (tensors in batches of "
        "64), so a tested round makes one pass over FedML's own set and batches, counting each "
        "sample for its class and client, and FedML's test reads its accuracy and loss from "
        "those counts instead of a pass of its own "
        "(`fl_adapters.fedml.patches.distributed.clients_figures`). "
        "Both sides are timed without FedML's `mlops.log`, which tries the "
        "network on every test and waits for it to fail on a machine that is offline. "
        f"The figures cost {100 * (fedml['ratio'] - 1):+.0f} % of FedML's test: "
        f"{'within' if fedml['ratio'] <= 1.05 else 'over'} the 5 % bound. A server whose test "
        "set is other samples, or whose aggregator tests in its own way, keeps FedML's pass; "
        "there the figures cost one pass more, and the server says so once.",
        "",
        "| evaluation | median s |",
        "|---|---|",
        *(f"| {name} | {s:.4f} |" for name, s in m.items()),
        "",
        f"Ratio now / before: **{fedml['ratio']:.3f}**.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    result = measure(args.dataset, args.clients, args.repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "perf_evaluate.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "perf_evaluate.md").write_text(report(result))
    print(report(result))
    return 0
