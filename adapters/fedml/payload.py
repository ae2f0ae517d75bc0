"""Client metrics inside FedML's model-params payload.

FedML 0.9.6 has no client-to-server metrics channel, so a client's metrics (those its
aggregator asks for, :mod:`fl_adapters.client_metrics`) and id travel as 0-d tensors under
reserved keys of the params ``OrderedDict`` (a metric under :func:`metric_key`): that survives every
transport (sp, MPI, gRPC), and :func:`strip` removes the keys before anything reaches
``load_state_dict``. Always an ``OrderedDict``: FedML reads a plain dict as per-client models.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from fl_adapters.client_metrics import CLIENT_METRICS
from fl_aggregators.update import ClientUpdate

KEY_CLIENT = "__fedbalance_client__"
#: Astraea's per-class ratios, server -> MPI clients.
KEY_RAD = "__fedbalance_astraea_rad__"
#: The server's round number (from 1), server -> MPI / gRPC clients: Astraea's relayed models
#: (it seeds their training) and a resumed server's first round (clients set their count).
KEY_ROUND = "__fedbalance_astraea_round__"
RESERVED = (KEY_CLIENT, KEY_RAD, KEY_ROUND)
METRIC_KEYS = {f"__fedbalance_metric_{name}__": name for name in CLIENT_METRICS}


def metric_key(name: str) -> str:
    """The params key client metric ``name`` travels under."""
    return f"__fedbalance_metric_{name}__"


def reserved(key: str) -> bool:
    return key in RESERVED or key in METRIC_KEYS


def attach(
    params: Mapping[str, torch.Tensor], client: int, metrics: Mapping[str, float] | None = None
) -> OrderedDict[str, Any]:
    out: OrderedDict[str, Any] = OrderedDict((k, v) for k, v in params.items() if not reserved(k))
    out[KEY_CLIENT] = torch.tensor(int(client), dtype=torch.int64)
    for name, value in (metrics or {}).items():
        out[metric_key(name)] = torch.tensor(float(value), dtype=torch.float64)
    return out


def strip(
    params: Mapping[str, Any],
) -> tuple[OrderedDict[str, Any], int | None, dict[str, float]]:
    """``(clean params, client id or None, the client's metrics by name)``."""
    clean: OrderedDict[str, Any] = OrderedDict((k, v) for k, v in params.items() if not reserved(k))
    client = params.get(KEY_CLIENT)
    metrics = {name: float(params[k]) for k, name in METRIC_KEYS.items() if k in params}
    return clean, None if client is None else int(client), metrics


def decode(num_samples: Any, params: Mapping[str, Any], fallback_id: Any = None) -> ClientUpdate:
    """One entry of FedML's ``[(sample_num, params), ...]`` as a
    :class:`~fl_aggregators.ClientUpdate` (a stock client, with no reserved keys, is named
    ``fallback_id``)."""
    clean, client, metrics = strip(params)
    return ClientUpdate(
        params=clean,
        num_samples=int(num_samples),
        metrics=metrics,
        client_id=fallback_id if client is None else client,
    )
