"""A fourth host in one module: the smallest host ``fedbalance run`` can drive.

Each client holds a target point; a round sends the global point to the sampled clients, each
steps halfway to its target and reports its distance as ``val_loss``, and the run's aggregator
combines the reports. ``tests/test_registry.py`` installs it under an entry point.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from fl_adapters.hookspecs import hookimpl
from fl_adapters.hosts import HostSpec, RunOptions
from fl_adapters.registry import build_aggregator
from fl_adapters.sampling import sample_round
from fl_aggregators import ClientUpdate


def run_toy(config: Any, out: Path, options: RunOptions) -> dict[str, Any]:
    aggregator = build_aggregator(config.aggregator, config.aggregator_args)
    targets = torch.arange(config.num_clients, dtype=torch.float64)[:, None] * torch.ones(4)
    goal = targets.mean(dim=0)
    rng = random.Random(config.seed)
    w = torch.zeros(4, dtype=torch.float64)
    rows = []
    for r in range(1, config.rounds + 1):
        clients = sample_round(rng, config.num_clients, config.clients_per_round)
        updates = []
        for c in clients:
            local = w + 0.5 * (targets[c] - w)
            loss = float((targets[c] - local).norm()) + 0.1
            updates.append(ClientUpdate(local, 10 + c, {"val_loss": loss}, client_id=c))
        result = aggregator.aggregate(w, updates)
        w = result.params
        accuracy = 1.0 / (1.0 + float((w - goal).norm()))
        rows.append({"round": r, "clients": clients, "weights": result.weights,
                     "test_accuracy": accuracy})  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    best = max(rows, key=lambda row: row["test_accuracy"])
    summary = {
        "rounds": config.rounds,
        "final_accuracy": rows[-1]["test_accuracy"],
        "best_accuracy": best["test_accuracy"],
        "best_round": best["round"],
    }
    (out / "summary.json").write_text(json.dumps(summary))
    return summary


TOY = HostSpec(
    name="toy",
    label="Toy",
    frameworks=("toy",),
    releases=("0",),
    run=run_toy,
    description="Toy: clients walk halfway to their points",
)


@hookimpl
def fedbalance_hosts() -> list[HostSpec]:
    return [TOY]
