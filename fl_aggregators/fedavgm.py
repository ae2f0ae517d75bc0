"""FedAvgM: FedAvg with server momentum on the pseudo-gradient.

Hsu, Qi, Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification", 2019, https://arxiv.org/abs/1909.06335:
``delta = w - FedAvg(clients)``, ``v <- beta * v + delta``, ``w <- w - server_lr * v``.
With ``beta = 0`` and ``server_lr = 1`` it is FedAvg. Integer buffers (e.g. BatchNorm's
``num_batches_tracked``) take the FedAvg value: momentum on a counter means nothing.

Defaults: ``beta = 0.5, server_lr = 0.3``, chosen by ``fedbalance bench fedavgm-sweep`` on the
clients' validation splits at the FedLoss thesis's setting (10 local epochs of Adam,
``benchmarks/results/fedavgm_sweep_fmnist_e10.md``): a steady-state step of 0.6x the averaged
update. The former default ``beta = 0.9, server_lr = 1`` (10x) diverged there. Flower's
``FedAvgM`` defaults to ``server_momentum = 0, server_learning_rate = 1``, which is FedAvg;
set those values here for Flower's behaviour. Momentum interacts with the local work per
round, so tune both on validation data for another setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fl_aggregators.fedavg import FedAvg
from fl_aggregators.functional import momentum_step
from fl_checks import ParameterError, check_float


class FedAvgM(FedAvg):
    """FedAvgM: FedAvg plus server momentum (Hsu et al. 2019); beta, server_lr."""

    name = "fedavgm"

    def __init__(
        self,
        *,
        beta: float = 0.5,
        server_lr: float = 0.3,
        update_clip: float | None = None,
        sample_clip: float | None = None,
    ) -> None:
        super().__init__(update_clip=update_clip, sample_clip=sample_clip)
        self.beta = check_float("beta", beta, 0.0, 1.0, high_open=True)
        self.server_lr = check_float("server_lr", server_lr, 0.0)
        if self.server_lr == 0:
            raise ParameterError(f"server_lr must be > 0, got {server_lr!r}")
        self.velocity: list[torch.Tensor] | None = None
        self._pending: list[torch.Tensor] | None = None

    def step(
        self, global_tensors: list[torch.Tensor], average: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """``g + server_lr * v``, ``v = beta * v_prev + (average - g)`` (kept until commit)."""
        out, velocity = [], []
        for j, (g, avg) in enumerate(zip(global_tensors, average, strict=True)):
            if not g.is_floating_point():
                out.append(avg)
                velocity.append(torch.zeros(0))
                continue
            prev = None if self.velocity is None else self.velocity[j].clone()
            new, v = momentum_step(g, avg, prev, beta=self.beta, server_lr=self.server_lr)
            out.append(new.to(g.dtype))
            velocity.append(v)
        self._pending = velocity
        return out

    def _commit(self) -> None:
        self.velocity, self._pending = self._pending, None

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["velocity"] = None if self.velocity is None else [v.clone() for v in self.velocity]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        v = state.get("velocity")
        if v is not None and (
            not isinstance(v, list) or not all(isinstance(t, torch.Tensor) for t in v)
        ):
            raise ParameterError("state 'velocity' must be None or a list of tensors")
        self.velocity = None if v is None else [t.clone() for t in v]
