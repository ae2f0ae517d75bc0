"""Helpers shared by the host tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a recorder file (empty when it does not exist)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def fedloss_weights(losses: list[float], clip: float = 5.0) -> list[float]:
    """FedLoss's weights by hand: losses clipped at ``clip`` x the lower median, normalised."""
    med = sorted(losses)[(len(losses) - 1) // 2]
    bounded = [min(x, clip * med) for x in losses]
    return [x / sum(bounded) for x in bounded]
