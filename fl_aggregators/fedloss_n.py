"""FedLoss-n: FedLoss that also respects how much data each client has.

The FedLoss thesis (Tagarakis 2023) found FedLoss behind FedAvg under quantity skew and
proposed combining the two as future work (the thesis's tables against ours:
benchmarks/results/thesis_fmnist.md). Under quantity skew a
client with 20 samples and a high validation loss gets as much say as one with 5,000; the
loss of a tiny client is also the noisiest. Weighting by ``n_i * l_i`` keeps FedLoss's
preference for badly fit clients *per sample*: a sample on a poorly fit client counts more
than one on a well fit client, and every sample counts. ``mix`` blends in plain FedAvg:
``w = mix * n_i / sum n + (1 - mix) * (n_i l_i) / sum(n l)``; ``size_aware=False`` uses the
thesis's ``l_i / sum l`` in the second term instead. ``loss_clip`` bounds the losses as in
FedLoss; ``peer_clip`` bounds the weighted scores ``n_i * l_i`` (the round's top score at most
the runner-up's), so a lone loss liar again takes no more than the top honest client, and a
lone *sample-count* liar likewise (its score grows with the count it claims).
``sample_clip`` bounds the counts themselves first, as in FedAvg.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fl_aggregators.fedavg import SAMPLE_CLIP, FedAvg, check_clip
from fl_aggregators.fedloss import FedLoss
from fl_aggregators.functional import bound_losses, normalize
from fl_aggregators.update import ClientUpdate
from fl_checks import check_flag, check_float


class FedLossN(FedLoss):
    """FedLoss-n: weights ~ n_i * l_i, optionally mixed with FedAvg (mix)."""

    name = "fedloss_n"

    def __init__(
        self,
        *,
        mix: float = 0.0,
        size_aware: bool = True,
        loss_clip: float | None = 5.0,
        peer_clip: float | None = 1.0,
        update_clip: float | None = None,
        sample_clip: float | None = SAMPLE_CLIP,
    ) -> None:
        super().__init__(loss_clip=loss_clip, peer_clip=peer_clip, update_clip=update_clip)
        self.sample_clip = check_clip(sample_clip, "sample_clip")
        self.mix = check_float("mix", mix, 0.0, 1.0)
        self.size_aware = check_flag("size_aware", size_aware)

    def client_weights(self, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        sizes = self.bounded_counts(updates)
        fedavg = FedAvg.client_weights(self, updates)
        if self.size_aware:  # the peer bound applies to what is weighted: n_i * l_i
            losses = self.bounded_losses(updates, peer=False)
            # Each factor over its largest: the weights and the peer bound are ratios, and the
            # product of two large finite values must not overflow.
            raw = _unit(losses) * _unit(sizes)
            scores = bound_losses(raw, None, self.peer_clip)
            self.note_bounded(updates, raw, scores)
        else:
            scores = self.bounded_losses(updates)
        loss_w = normalize(scores) if scores.sum() > 0 else fedavg
        return normalize(self.mix * fedavg + (1.0 - self.mix) * loss_w)


def _unit(values: torch.Tensor) -> torch.Tensor:
    """``values`` over their largest (unchanged if that is 0)."""
    top = values.max() if len(values) else values.new_zeros(())
    return values / top if top > 0 else values
