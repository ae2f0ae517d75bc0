"""Client metrics inside FedML's model-params payload.

FedML 0.9.6 has no client-to-server metrics channel, so a client's validation loss and id
travel as 0-d tensors under reserved keys of the params ``OrderedDict``: that survives every
transport (sp, MPI, gRPC), and :func:`strip` removes the keys before anything reaches
``load_state_dict``. Always an ``OrderedDict``: FedML reads a plain dict as per-client models.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from fl_aggregators.update import ClientUpdate

KEY_LOSS = "__fedbalance_val_loss__"
KEY_CLIENT = "__fedbalance_client__"
#: Astraea's per-class ratios, server -> MPI clients.
KEY_RAD = "__fedbalance_astraea_rad__"
#: The server's round number (from 1), server -> MPI / gRPC clients: Astraea's relayed models
#: (it seeds their training) and a resumed server's first round (clients set their count).
KEY_ROUND = "__fedbalance_astraea_round__"
RESERVED = (KEY_LOSS, KEY_CLIENT, KEY_RAD, KEY_ROUND)


def attach(
    params: Mapping[str, torch.Tensor], client: int, val_loss: float | None
) -> OrderedDict[str, Any]:
    out: OrderedDict[str, Any] = OrderedDict((k, v) for k, v in params.items() if k not in RESERVED)
    out[KEY_CLIENT] = torch.tensor(int(client), dtype=torch.int64)
    if val_loss is not None:
        out[KEY_LOSS] = torch.tensor(float(val_loss), dtype=torch.float64)
    return out


def strip(params: Mapping[str, Any]) -> tuple[OrderedDict[str, Any], int | None, float | None]:
    """``(clean params, client id or None, val_loss or None)``."""
    clean: OrderedDict[str, Any] = OrderedDict(
        (k, v) for k, v in params.items() if k not in RESERVED
    )
    client = params.get(KEY_CLIENT)
    loss = params.get(KEY_LOSS)
    return (clean, None if client is None else int(client), None if loss is None else float(loss))


def decode(num_samples: Any, params: Mapping[str, Any], fallback_id: Any = None) -> ClientUpdate:
    """One entry of FedML's ``[(sample_num, params), ...]`` as a
    :class:`~fl_aggregators.ClientUpdate` (a stock client, with no reserved keys, is named
    ``fallback_id``)."""
    clean, client, loss = strip(params)
    return ClientUpdate(
        params=clean,
        num_samples=int(num_samples),
        metrics={} if loss is None else {"val_loss": loss},
        client_id=fallback_id if client is None else client,
    )
