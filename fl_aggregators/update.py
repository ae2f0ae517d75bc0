"""What a client sends the server: parameters, sample count and metrics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

#: A model's parameters: one flat tensor or a state dict (name -> tensor).
Params = torch.Tensor | Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class ClientUpdate:
    """One client's contribution to a round.

    Attributes
    ----------
    params : the client's trained parameters, in the same form as the global model's.
    num_samples : the number of training samples behind them (FedAvg's weight).
    metrics : scalars the client measured, e.g. ``{"val_loss": 0.41}`` for FedLoss.
    client_id : how logs and the recorder name this client (its index when ``None``).
    """

    params: Params
    num_samples: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    client_id: Any = None
