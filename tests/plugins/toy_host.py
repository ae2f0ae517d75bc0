"""A fourth host in one module: the smallest host ``fedbalance run`` can drive.

Each client holds a target point; a round sends the global point to the sampled clients, each
steps halfway to its target and reports its distance as ``val_loss``, and the run's aggregator
combines the reports. The host writes nothing itself: it reports each round to the lifecycle
(:func:`fl_adapters.run.lifecycle.in_process`), which writes the rows, the aggregation
record, the checkpoint and the summary. ``tests/test_registry.py`` installs it under an entry
point; ``tests/test_host_contract.py`` holds it to what every host does.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from fl_adapters.checkpoint import restore_sampler, sampler_state
from fl_adapters.hookspecs import hookimpl
from fl_adapters.hosts import HostSpec
from fl_adapters.registry import build_aggregator
from fl_adapters.run.lifecycle import Rounds, in_process
from fl_adapters.sampling import sample_round
from fl_aggregators import ClientUpdate


def toy_rounds(config: Any, rounds: Rounds) -> None:
    aggregator = build_aggregator(config.aggregator, config.aggregator_args)
    targets = torch.arange(config.num_clients, dtype=torch.float64)[:, None] * torch.ones(4)
    goal = targets.mean(dim=0)
    rng = random.Random(config.seed)
    w = torch.zeros(4, dtype=torch.float64)
    if rounds.resumed is not None:
        w = rounds.resumed.model.clone()
        aggregator.load_state_dict(rounds.resumed.aggregator)
        restore_sampler(rng, rounds.resumed.sampler)
    for r in range(rounds.first, config.rounds + 1):
        clients = sample_round(rng, config.num_clients, config.clients_per_round)
        updates = []
        for c in clients:
            local = w + 0.5 * (targets[c] - w)
            loss = float((targets[c] - local).norm()) + 0.1
            updates.append(ClientUpdate(local, 10 + c, {"val_loss": loss}, client_id=c))
        result = aggregator.aggregate(w, updates, round=r, host="toy")
        w = result.params
        row = {
            "round": r,
            "clients": result.clients,
            "weights": result.weights,
            "rejected": len(result.rejected),
            "skipped": result.skipped,
            "test_accuracy": 1.0 / (1.0 + float((w - goal).norm())),
        }
        rounds.done(row, model=w, aggregator=aggregator, sampler=sampler_state(rng))


TOY = HostSpec(
    name="toy",
    label="Toy",
    frameworks=("toy",),
    releases=("0",),
    run=in_process("toy", toy_rounds),
    description="Toy: clients walk halfway to their points",
)


@hookimpl
def fedbalance_hosts() -> list[HostSpec]:
    return [TOY]
