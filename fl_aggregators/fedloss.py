"""FedLoss: weight each client by its validation loss after local training.

Tagarakis, "FedLoss: bias mitigation in federated learning", NTUA diploma thesis, 2023. Each
client trains, then measures its loss on a held-out 10 % of its local data (split
70/10/20 train/validation/test); the server averages with weights ``l_i / sum l``, so clients
whose data the model fits worse get more say.

Departure (robustness): the loss is a number the client reports, so one client could take
over the model by reporting a huge one. Two bounds apply before normalising:

* ``loss_clip`` (default 5): no loss counts for more than 5x the round's lower median loss.
  This holds while fewer than half of the clients lie.
* ``peer_clip`` (default 1): no loss counts for more than ``peer_clip`` times the largest
  loss among the *other* clients of the round. Only the round's single largest loss can be
  lowered, and with the default a lone liar takes exactly the share of the highest honest
  client of its round. The price on honest rounds is that the top client's loss is lowered to
  the runner-up's; how far apart the two are in the thesis grid, and so how much weight the
  top client gives up, is in the recorded weights behind ``benchmarks/results/thesis_fmnist.md``.

``loss_clip=None, peer_clip=None`` is the thesis's rule exactly, unbounded (the thesis
benchmark's ``fedloss`` runs that way; ``fedloss-default`` runs these defaults beside it, and
each run's record lists the rounds in which a bound changed a weight). A loss of 0 gives weight 0;
if every loss is 0 the round falls back to FedAvg weights. A reported loss of 0 or close to
it only lowers the reporter's own weight, so deflation cannot starve the others.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from fl_aggregators.fedavg import FedAvg, check_clip
from fl_aggregators.functional import bound_losses, normalize
from fl_aggregators.update import ClientUpdate

log = logging.getLogger(__name__)

METRIC = "val_loss"


class FedLoss(FedAvg):
    """FedLoss: weights l_i / sum l, l_i a client's validation loss (Tagarakis 2023)."""

    name = "fedloss"
    required_metrics = (METRIC,)

    def __init__(
        self,
        *,
        loss_clip: float | None = 5.0,
        peer_clip: float | None = 1.0,
        update_clip: float | None = None,
    ) -> None:
        super().__init__(update_clip=update_clip)
        self.loss_clip = check_clip(loss_clip, "loss_clip")
        self.peer_clip = check_clip(peer_clip, "peer_clip")

    def bounded_losses(self, updates: Sequence[ClientUpdate], peer: bool = True) -> torch.Tensor:
        """Reported losses under ``loss_clip`` (and ``peer_clip`` unless ``peer=False``)."""
        losses = torch.tensor([float(u.metrics[METRIC]) for u in updates], dtype=torch.float64)
        bounded = bound_losses(losses, self.loss_clip, self.peer_clip if peer else None)
        self.note_bounded(updates, losses, bounded)
        for i, (before, after) in enumerate(zip(losses.tolist(), bounded.tolist(), strict=True)):
            if after < before:
                who = updates[i].client_id if updates[i].client_id is not None else f"#{i}"
                # The peer bound moves honest top clients a little every round: say so quietly.
                level = logging.WARNING if after < before / 2 else logging.INFO
                log.log(
                    level,
                    "%s: client %s reported val_loss %.4g, bounded to %.4g",
                    self.name,
                    who,
                    before,
                    after,
                )
        return bounded

    def client_weights(self, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        losses = self.bounded_losses(updates)
        if losses.sum() <= 0:
            log.warning("%s: every client reported val_loss 0; using FedAvg weights", self.name)
            return super().client_weights(updates)
        return normalize(losses)
