"""What every host builds from a run config before round 1: the data and its partition.

:func:`check` runs all of it without training (``fedbalance run --check``): the config, the
aggregator and its arguments, the partitioner and its parameters, the dataset, and the
partition of the dataset over the clients. Whatever would stop a run before its first round
stops here, with the same message.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import torch

from fl_adapters.config import RunConfig
from fl_adapters.registry import build_aggregator, get_registry
from fl_aggregators.record import jsonable
from fl_partitions import Partition


def training_data(config: RunConfig) -> tuple[Any, np.ndarray, Partition]:
    """The training set (capped at ``max_samples``, seeded), its labels and its partition."""
    from fl_adapters.datasets import dataset_targets, load_dataset

    registry = get_registry()
    registry.make_aggregator(config.aggregator, **config.aggregator_args)  # fail before loading
    partitioner = registry.make_partitioner(config.partition)
    train = load_dataset(config.dataset, train=True, data_dir=config.data_dir)
    labels = dataset_targets(train)
    if config.max_samples is not None and config.max_samples < len(labels):
        from torch.utils.data import Subset

        gen = torch.Generator().manual_seed(config.seed)
        keep = torch.randperm(len(labels), generator=gen)[: config.max_samples].sort().values
        scale = getattr(train, "pixel_scale", 1.0)  # feature noise is in pixel units
        train, labels = Subset(train, keep.tolist()), labels[keep.numpy()]
        train.pixel_scale = scale  # type: ignore[attr-defined]
    partition = partitioner.partition(
        labels, config.num_clients, seed=config.seed, split=config.split
    )
    return train, labels, partition


def is_mediated(aggregator: str) -> bool:
    """Whether the named aggregator trains through mediator chains (Astraea)."""
    return bool(getattr(get_registry().aggregator(aggregator), "mediated", False))


def check(config: RunConfig) -> dict[str, Any]:
    """Validate ``config`` end to end without training; a summary of what a run would use."""
    _, labels, partition = training_data(config)
    from fl_adapters.models import model_for

    model_for(config.model, config.dataset, config.data_dir)  # images it can take (1x1 cannot)
    if config.eval_data == "test":
        from fl_adapters.datasets import load_dataset

        load_dataset(config.dataset, train=False, data_dir=config.data_dir)
    sizes = [len(c) for c in partition.client_indices]
    return {
        "framework": config.framework,
        "aggregator": config.aggregator,
        "samples": len(labels),
        "classes": partition.num_classes,
        "clients": config.num_clients,
        "client_sizes": {"min": min(sizes), "max": max(sizes)},
    }


def metric_prefix(config: RunConfig) -> str:
    """``val`` when a run evaluates on the clients' validation splits (``eval_data: val``, for
    tuning), else ``test``: the prefix of the metrics a row and the summary carry."""
    return "val" if config.eval_data == "val" else "test"


def run_summary(
    config: RunConfig, rows: list[dict[str, Any]], elapsed_s: float | None = None
) -> dict[str, Any]:
    """What every host's ``summary.json`` holds: the config, the rounds run, the final and the
    best accuracy over the evaluated rounds (``rows`` are ``metrics.jsonl``'s), and the wall
    time when the host measured it. A host adds its own fields after these."""
    key = f"{metric_prefix(config)}_accuracy"
    evals = [r for r in rows if key in r]
    best = max(evals, key=lambda r: r[key]) if evals else None
    summary: dict[str, Any] = {
        "config": config.to_dict(),
        "rounds": len(rows),
        "aggregated_rounds": sum(1 for r in rows if not r.get("skipped")),
        "evaluated_on": config.eval_data,
        "final_accuracy": evals[-1][key] if evals else None,
        "best_accuracy": best[key] if best else None,
        "best_round": best["round"] if best else None,
    }
    if elapsed_s is not None:
        summary["elapsed_s"] = round(elapsed_s, 3)
    return summary


def json_line(row: dict[str, Any]) -> str:
    """One ``metrics.jsonl`` line (non-finite numbers as ``null``:
    :func:`~fl_aggregators.record.jsonable`)."""
    return json.dumps(jsonable(row), allow_nan=False) + "\n"


def plan_of_run(config: RunConfig) -> dict[str, Any]:
    """Round 1 of an Astraea run of ``config``, as its hosts plan it: the clients' training
    labels counted, the plan from the config's ``aggregator_args``, the round's clients drawn
    by the hosts' sampler (:func:`~fl_adapters.sampling.sample_round`) and grouped
    (:meth:`~fl_adapters.astraea.AstraeaPlanner.preview`)."""
    from fl_adapters.astraea import AstraeaPlanner, label_counts
    from fl_adapters.datasets import image_spec
    from fl_adapters.sampling import sample_round

    aggregator = build_aggregator(config.aggregator, config.aggregator_args)
    _, labels, partition = training_data(config)
    classes = image_spec(config.dataset, config.data_dir)[2]  # the hosts count over these
    counts = np.stack([label_counts(labels[s["train"]], classes) for s in partition.splits])
    clients = sample_round(random.Random(config.seed), config.num_clients, config.clients_per_round)
    return AstraeaPlanner(counts, aggregator).preview(clients)
