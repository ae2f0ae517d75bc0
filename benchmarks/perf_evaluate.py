"""What the bias figures cost: an evaluation with per-class and per-client counts against the
accuracy-only evaluation it replaced.

The reference (:func:`accuracy_only`) is the loop ``fl_adapters._training.evaluate`` ran before
the bias figures: the loss and the correct predictions of every batch, summed over the union of
the evaluated clients' test splits. The measured path is what every evaluated round runs now
(``fl_adapters.fedlab.runner``): :func:`~fl_adapters._training.evaluate_counts` per client,
then the class and client figures. Both evaluate the thesis CNN on the same clients' data in the
same process, interleaved, so machine noise hits both; the result is the ratio of median times
(the issue's bound: at most 5 % more).

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
    return {
        "command": COMMAND,
        "dataset": dataset,
        "clients": clients,
        "samples": sum(len(p) for p in parts.values()),
        "repeats": repeats,
        "seconds": times,
        "median_s": medians,
        "ratio": medians["with bias figures"] / medians["accuracy only"],
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
        ]
    )


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
