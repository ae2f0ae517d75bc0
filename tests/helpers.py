"""Helpers shared by the host tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fl_adapters.config import RunConfig


def records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a recorder file (empty when it does not exist)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def fedloss_weights(losses: list[float], clip: float = 5.0, peer: float = 1.0) -> list[float]:
    """FedLoss's default weights by hand: losses clipped at ``clip`` x the lower median, the
    top one at ``peer`` x the runner-up (three clients or more), normalised."""
    med = sorted(losses)[(len(losses) - 1) // 2]
    bounded = [min(x, clip * med) for x in losses]
    if len(bounded) >= 3:
        top = max(range(len(bounded)), key=bounded.__getitem__)
        bounded[top] = min(bounded[top], peer * sorted(bounded)[-2])
    return [x / sum(bounded) for x in bounded]


def check_fedloss_records(lines: list[dict[str, Any]], host: str, rounds: int) -> None:
    """A FedML run's aggregation record: rounds 1..``rounds``, two clients a round, each
    weighted by FedLoss's default rule from the validation loss it sent."""
    import pytest

    assert [r["round"] for r in lines] == list(range(1, rounds + 1)), lines
    for r in lines:
        assert r["host"] == host and r["aggregator"] == "fedloss" and r["rejected"] == []
        losses = [m["val_loss"] for m in r["metrics"]]
        assert len(losses) == 2 and all(x > 0 for x in losses)
        assert r["weights"] == pytest.approx(fedloss_weights(losses))


def digits_run(defaults: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
    """A small FedLab run on scikit-learn's digits (fast enough for CI): one local epoch of
    batches of 32, then a test module's ``defaults``, then one test's ``overrides``."""
    from fl_adapters.config import RunConfig

    fields: dict[str, Any] = dict(
        framework="fedlab", dataset="digits", local_epochs=1, batch_size=32
    )
    return RunConfig.from_dict({**fields, **defaults, **overrides})
