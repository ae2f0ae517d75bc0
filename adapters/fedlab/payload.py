"""The uplink package fedbalance's FedLab trainers send: ``[params, meta]``.

FedLab packs every tensor of a package into one flat buffer of the first tensor's dtype, so
``meta`` is a float32 tensor ``[client_id, num_samples, val_loss]`` (``val_loss`` NaN when the
aggregator does not need it). float32 is exact for ids and counts below 2**24. FedLab's own
FedNova sends its ``tau`` the same way, as one extra tensor.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fl_aggregators.update import ClientUpdate

META_FIELDS = ("client_id", "num_samples", "val_loss")


def pack_meta(client_id: int, num_samples: int, val_loss: float | None) -> torch.Tensor:
    """The meta tensor of one client's uplink (after a stock trainer's own tensors)."""
    loss = float("nan") if val_loss is None else float(val_loss)
    return torch.tensor([float(client_id), float(num_samples), loss], dtype=torch.float32)


def encode(
    params: torch.Tensor, client_id: int, num_samples: int, val_loss: float | None = None
) -> list[torch.Tensor]:
    """One client's uplink: ``[params, meta]``."""
    return [params, pack_meta(client_id, num_samples, val_loss)]


def decode(payload: list[torch.Tensor], fallback_id: Any = None) -> ClientUpdate:
    """An uplink as a :class:`~fl_aggregators.ClientUpdate`: ``[params, meta]`` (fedbalance's
    trainers) or ``[params]`` (a stock FedLab trainer: no count, so ``num_samples`` 1, and the
    client named ``fallback_id``). A count or id that is not a whole number is left out the same
    way, for the aggregator's checks to see."""
    params = payload[0]
    if len(payload) < 2 or payload[1].numel() != len(META_FIELDS):
        return ClientUpdate(params, 1, {}, fallback_id)
    cid, n, loss = (float(v) for v in payload[1].tolist())
    metrics = {} if math.isnan(loss) else {"val_loss": loss}
    whole = lambda v: math.isfinite(v) and v == int(v)  # noqa: E731
    return ClientUpdate(
        params, int(n) if whole(n) else 1, metrics, int(cid) if whole(cid) else fallback_id
    )
