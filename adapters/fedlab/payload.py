"""The uplink package fedbalance's FedLab trainers send: ``[params, meta]``.

FedLab packs every tensor of a package into one flat buffer of the first tensor's dtype, so
``meta`` is a float32 tensor ``[client_id, num_samples, *metrics]``: one place per name of
:data:`~fl_adapters.client_metrics.CLIENT_METRICS`, in the table's order, NaN where the client
sends none (the aggregator did not ask for it). float32 is exact for ids and counts below
2**24. FedLab's own FedNova sends its ``tau`` the same way, as one extra tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from fl_adapters.client_metrics import CLIENT_METRICS
from fl_aggregators.update import ClientUpdate

META_FIELDS = ("client_id", "num_samples", *CLIENT_METRICS)


def pack_meta(
    client_id: int, num_samples: int, metrics: Mapping[str, float] | None = None
) -> torch.Tensor:
    """The meta tensor of one client's uplink (after a stock trainer's own tensors)."""
    metrics = metrics or {}
    values = [float(metrics.get(name, math.nan)) for name in CLIENT_METRICS]
    return torch.tensor([float(client_id), float(num_samples), *values], dtype=torch.float32)


def encode(
    params: torch.Tensor,
    client_id: int,
    num_samples: int,
    metrics: Mapping[str, float] | None = None,
) -> list[torch.Tensor]:
    """One client's uplink: ``[params, meta]``."""
    return [params, pack_meta(client_id, num_samples, metrics)]


def decode(payload: list[torch.Tensor], fallback_id: Any = None) -> ClientUpdate:
    """An uplink as a :class:`~fl_aggregators.ClientUpdate`: ``[params, meta]`` (fedbalance's
    trainers) or ``[params]`` (a stock FedLab trainer: no count, so ``num_samples`` 1, and the
    client named ``fallback_id``). A count or id that is not a whole number is left out the same
    way, for the aggregator's checks to see."""
    params = payload[0]
    if len(payload) < 2 or payload[1].numel() != len(META_FIELDS):
        return ClientUpdate(params, 1, {}, fallback_id)
    cid, n, *values = (float(v) for v in payload[1].tolist())
    metrics = {k: v for k, v in zip(CLIENT_METRICS, values, strict=True) if not math.isnan(v)}
    whole = lambda v: math.isfinite(v) and v == int(v)  # noqa: E731
    return ClientUpdate(
        params, int(n) if whole(n) else 1, metrics, int(cid) if whole(cid) else fallback_id
    )
