"""The uplink package fedbalance's FedLab trainers send: ``[params, meta]``.

FedLab packs every tensor of a package into one flat buffer of the first tensor's dtype, so
``meta`` is a float32 tensor ``[client_id, num_samples, val_loss]`` (``val_loss`` NaN when the
aggregator does not need it). float32 is exact for ids and counts below 2**24. FedLab's own
FedNova sends its ``tau`` the same way, as one extra tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

META_FIELDS = ("client_id", "num_samples", "val_loss")


def pack_meta(client_id: int, num_samples: int, val_loss: float | None) -> torch.Tensor:
    """The meta tensor of one client's uplink."""
    loss = float("nan") if val_loss is None else float(val_loss)
    return torch.tensor([float(client_id), float(num_samples), loss], dtype=torch.float32)


@dataclass
class Uplink:
    """A decoded uplink: parameters plus whatever the client reported."""

    params: torch.Tensor
    client_id: int | None = None
    num_samples: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def unpack(payload: list[torch.Tensor]) -> Uplink:
    """Decode ``[params]`` (a stock FedLab trainer) or ``[params, meta]`` (fedbalance's)."""
    params = payload[0]
    if len(payload) < 2 or payload[1].numel() != len(META_FIELDS):
        return Uplink(params)
    cid, n, loss = (float(v) for v in payload[1].tolist())
    metrics = {} if math.isnan(loss) else {"val_loss": loss}
    ok_int = lambda v: math.isfinite(v) and v == int(v)  # noqa: E731
    return Uplink(params, int(cid) if ok_int(cid) else None, int(n) if ok_int(n) else None, metrics)
