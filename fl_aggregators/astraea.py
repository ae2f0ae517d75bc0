"""Astraea's server side: the ``astraea`` aggregator (FedAvg over mediators, weights n_m / n).

Duan et al., "Self-Balancing Federated Learning With Global Imbalanced Data in Mobile Systems",
IEEE TPDS 32(1):59-71, 2021, https://doi.org/10.1109/TPDS.2020.3009406.

Astraea changes *who trains what* more than how updates are combined: clients rebalance their
data once (z-score augmentation / downsampling, :mod:`fl_aggregators.astraea_plan`), and each
round the sampled clients are grouped into mediators that pass the model through their clients
in sequence. What reaches the server is one update per mediator, averaged with weights
``n_m / n`` -- sample-weighted FedAvg over mediators. This class carries Astraea's parameters,
so the host adapters (FedLab standalone, FedML sp) know to run mediators when a config says
``aggregator: astraea``, and adds the round's mediators, KL values and traffic to the
aggregation record.

The two strategies can run alone: ``augment=False`` is mediators only, ``mediators=False``
is augmentation with plain FedAvg (each client its own mediator). ``augment="paper"``
augments with the paper's printed formula instead of the bounded default (see
:mod:`fl_aggregators.astraea_plan`). ``count_clip`` bounds what one
client's reported label counts can do to the plan (see :mod:`fl_aggregators.astraea_plan`).
``carry_optimizer`` carries one optimizer along each mediator's chain within a round (its
state, e.g. Adam's moments, passes from member to member) instead of a fresh optimizer per
member; it takes effect only where fedbalance trains a mediator's members itself in one
process (FedLab standalone under ``fedbalance run``), and every other host or mode refuses it
before training.
Upper limits keep a round's work bounded: ``mediator_epochs`` at most 100, ``tau_d`` in
[0.01, 100], a finite ``count_clip`` at most 1000.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from fl_aggregators.astraea_plan import check_count_clip, check_tau_d
from fl_aggregators.fedavg import FedAvg
from fl_checks import ParameterError, check_flag, check_int_range, check_positive_int

#: Largest ``mediator_epochs``: every pass trains each member again, so the round's work
#: grows with it (the paper passes once).
MAX_MEDIATOR_EPOCHS = 100


def _augment(value: Any) -> tuple[bool, str]:
    """``augment``: ``true`` (the bounded rule), ``"paper"`` (the printed one) or ``false``."""
    if value == "paper" and isinstance(value, str):
        return True, "paper"
    if isinstance(value, bool):
        return value, "bounded"
    raise ParameterError(
        f"augment must be true (the bounded rule), 'paper' (the paper's printed formula) or "
        f"false, got {value!r}"
    )


class Astraea(FedAvg):
    """Astraea (Duan et al. 2021): rebalancing + mediators; tau_d, gamma, mediator_epochs."""

    name = "astraea"
    #: Host adapters run mediator chains for aggregators that set this.
    mediated: ClassVar[bool] = True

    def __init__(
        self,
        *,
        tau_d: float = 3.5,
        gamma: int = 10,
        mediator_epochs: int = 1,
        augment: bool | str = True,
        mediators: bool = True,
        count_clip: float | None = 20.0,
        update_clip: float | None = None,
        sample_clip: float | None = None,
        carry_optimizer: bool = False,
    ) -> None:
        super().__init__(update_clip=update_clip, sample_clip=sample_clip)
        self.tau_d = check_tau_d(tau_d)
        self.count_clip = check_count_clip(count_clip)
        # gamma needs no ceiling: a mediator never holds more than the round's clients.
        self.gamma = check_positive_int("gamma", gamma, note="max clients per mediator")
        self.mediator_epochs = check_int_range(
            "mediator_epochs",
            mediator_epochs,
            1,
            MAX_MEDIATOR_EPOCHS,
            note="passes of a mediator over its clients per round",
        )
        self.augment, self.augment_rule = _augment(augment)
        self.mediators = check_flag("mediators", mediators)
        self.carry_optimizer = check_flag("carry_optimizer", carry_optimizer)
        self._annotations: dict[str, Any] = {}

    @property
    def group_size(self) -> int:
        """Clients per mediator this run uses (1 when mediators are off)."""
        return self.gamma if self.mediators else 1

    def secure_refusal(self) -> str | None:
        if self.mediators or self.augment:
            return (
                "'astraea' trains mediator chains on client models and rebalances client data "
                "from their class counts; under secure aggregation the server sees only the "
                "masked sum. Its aggregation alone (mediators: false, augment: false) can run"
            )
        return super().secure_refusal()

    def annotate(self, **extra: Any) -> None:
        """Keys the host adds to the next aggregation's record (``mediators``, ``kl``, ``bytes``)."""
        self._annotations.update(extra)

    def _take_extra(self) -> dict[str, Any]:
        extra, self._annotations = {**super()._take_extra(), **self._annotations}, {}
        return extra


def paper_traffic(param_bytes: int, clients: int, gamma: int) -> int:
    """Bytes per round in the paper's model: ``2|w| (ceil(c / gamma) + c)``."""
    return 2 * param_bytes * (math.ceil(clients / gamma) + clients)
