"""FedLoss: weight each client by its validation loss after local training.

Tagarakis, "FedLoss: bias mitigation in federated learning", NTUA diploma thesis, 2023. Each
client trains, then measures its loss on a held-out 10 % of its local data (split
70/10/20 train/validation/test); the server averages with weights ``l_i / sum l``, so clients
whose data the model fits worse get more say.

Departure (robustness): the loss is a number the client reports, so one client could take
over the model by reporting a huge one. Each loss is clipped at ``loss_clip`` (default 5)
times the round's lower median loss before normalising. On honest clients — whose validation
losses after the same local training lie well within 5x of each other — the weights are
exactly the thesis's; a liar gets at most the share of a client with ``loss_clip`` times the
median loss. ``loss_clip=None`` restores the unbounded rule. A loss of 0 gives weight 0; if
every loss is 0 the round falls back to FedAvg weights.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from fl_aggregators.fedavg import FedAvg
from fl_aggregators.functional import bound_losses, normalize
from fl_aggregators.update import ClientUpdate

log = logging.getLogger(__name__)

METRIC = "val_loss"


def check_clip(value: float | None) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1
    if not ok or value != value or value == float("inf"):
        raise ValueError(f"loss_clip must be None or a finite float >= 1, got {value!r}")
    return float(value)


class FedLoss(FedAvg):
    """FedLoss: weights l_i / sum l, l_i a client's validation loss (Tagarakis 2023)."""

    name = "fedloss"
    required_metrics = (METRIC,)

    def __init__(self, *, loss_clip: float | None = 5.0) -> None:
        super().__init__()
        self.loss_clip = check_clip(loss_clip)

    def bounded_losses(self, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        losses = torch.tensor([float(u.metrics[METRIC]) for u in updates], dtype=torch.float64)
        bounded = bound_losses(losses, self.loss_clip)
        for i, (before, after) in enumerate(zip(losses.tolist(), bounded.tolist(), strict=True)):
            if after < before:
                who = updates[i].client_id if updates[i].client_id is not None else f"#{i}"
                log.warning(
                    "%s: client %s reported val_loss %.4g, bounded to %.4g (%gx median)",
                    self.name,
                    who,
                    before,
                    after,
                    self.loss_clip,
                )
        return bounded

    def client_weights(self, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        losses = self.bounded_losses(updates)
        if losses.sum() <= 0:
            log.warning("%s: every client reported val_loss 0; using FedAvg weights", self.name)
            return super().client_weights(updates)
        return normalize(losses)
