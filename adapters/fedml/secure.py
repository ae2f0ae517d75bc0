"""FedAvg, FedAvgM, FedLoss and FedLoss-n under FedML 0.9.6's cross-silo LightSecAgg (``LSA``).

FedML's LightSecAgg server unmasks ``sum_i y_i`` and takes ``1/N`` of it, never calling a
server aggregator, and its clients mask right after training. With a fedbalance aggregator,
each round gets one more message pair between training and masking:

1. the client trains (fedbalance's validation split and loss, as with FedAvg) and sends its
   sample count, validation loss and client id in clear (:data:`MSG_SCALARS`); its model stays
   on the client;
2. once every client of the round has reported, the server weighs them
   (:meth:`~fl_aggregators.Aggregator.weigh`: the same checks and bounds as in clear) and
   sends each its factor ``N * w_i`` (:data:`MSG_SCALE`);
3. the client scales its model by it and masks it as FedML does; FedML's ``1/N`` average of
   the unmasked sum is then ``sum_i w_i x_i``, which the aggregator's
   :meth:`~fl_aggregators.Aggregator.finish` turns into the new model (FedAvgM's momentum,
   the aggregation record with ``secure: lightsecagg``).

Two defects of FedML 0.9.6's LightSecAgg are mended while fedbalance runs it (stock runs are
left as they are): its server re-sends the round's set-up for every repeated "online" status
(each client announces itself twice), so clients re-draw masks after masking and the model is
garbage; and every rank draws its masks from numpy's global generator, which ``fedml.init``
seeds identically on every rank, so all clients draw the same mask. The set-up now goes out
once, and each client draws its masks from a generator seeded from ``os.urandom`` (then puts
numpy's global state back, so training stays reproducible).

Limits (FedML's protocol, not fedbalance's): there is no dropout tolerance (the server waits
for every client), the encoded mask shares travel through the server unencrypted (a curious
server holding ``U`` shares of a client's mask can remove it), and values are fixed-point with
``precision_parameter`` fractional bits modulo ``prime_number``: the *sum* must stay within
``+-(prime_number - 1) / 2 / 2**precision_parameter``. With ``prime_number: 1073741789``,
``precision_parameter: 20`` that is +-512 in steps of about 1e-6 (the mask encoding multiplies
int64 values, so keep ``prime_number`` below ``2**30`` for up to 7 clients).
"""

from __future__ import annotations

import functools
import logging
import os
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from fl_adapters.fedml.payload import strip
from fl_aggregators import ClientUpdate

log = logging.getLogger(__name__)

#: Client -> server: sample count, validation loss and client id, in clear.
MSG_SCALARS = 101
#: Server -> client: the factor ``N * w_i`` the client scales its model by before masking.
MSG_SCALE = 102
KEY_NUM_SAMPLES = "fedbalance_num_samples"
KEY_VAL_LOSS = "fedbalance_val_loss"
KEY_CLIENT = "fedbalance_client"
KEY_SCALE = "fedbalance_scale"
PROTOCOL = "lightsecagg"


def _message(kind: int, sender: int, receiver: int) -> Any:
    from fedml.core.distributed.communication.message import Message

    return Message(kind, sender, receiver)


# -- server ---------------------------------------------------------------------------------------
def server_handlers(self: Any, original: Any) -> Any:
    """FedML's handlers, and the clients' scalars."""
    original(self)
    self._fedbalance_scalars = {}
    self.register_message_receive_handler(MSG_SCALARS, functools.partial(_receive_scalars, self))


def server_status(self: Any, original: Any, msg_params: Any) -> Any:
    """FedML's status handler, once: a repeated "online" would re-send the round's set-up."""
    if getattr(self, "is_initialized", False):
        return None
    return original(self, msg_params)


def _receive_scalars(self: Any, msg_params: Any) -> None:
    from fl_adapters.fedml.adapter import current

    sender = int(msg_params.get_sender_id())
    self._fedbalance_scalars[sender] = (
        msg_params.get(KEY_NUM_SAMPLES),
        msg_params.get(KEY_VAL_LOSS),
        msg_params.get(KEY_CLIENT),
    )
    waiting = [
        c for c in self.client_id_list_in_this_round if int(c) not in self._fedbalance_scalars
    ]
    if waiting:
        return
    senders = sorted(self._fedbalance_scalars)
    updates = []
    for sender in senders:
        n, loss, client = self._fedbalance_scalars[sender]
        updates.append(
            ClientUpdate(
                params=OrderedDict(),  # weigh() reads the scalars only
                num_samples=n,
                metrics={} if loss is None else {"val_loss": float(loss)},
                client_id=client if client is not None else f"rank{sender}",
            )
        )
    self._fedbalance_scalars = {}
    run = current()
    weighing = run.aggregator.weigh(updates, round=int(self.round_idx) + 1)
    run.lsa_weighing = weighing
    # FedML's reconstruction takes 1/N of the unmasked sum, N the round's clients.
    n_clients = len(senders)
    for sender, w in zip(senders, weighing.weights, strict=True):
        msg = _message(MSG_SCALE, self.get_sender_id(), sender)
        msg.add_params(KEY_SCALE, float(n_clients * w))
        self.send_message(msg)


def reconstruct(self: Any, original: Any, first: Any, second: Any) -> Any:
    """FedML's unmasking (``sum_i w_i x_i``), then the aggregator's step and record."""
    from fl_adapters.fedml.adapter import clean_params, current

    # A copy: FedML's reconstruction overwrites the model these tensors belong to.
    previous = OrderedDict(
        (k, v.clone()) for k, v in clean_params(self.get_global_model_params()).items()
    )
    summed = original(self, first, second)
    run = current()
    weighing, run.lsa_weighing = run.lsa_weighing, None
    if weighing is None:
        raise RuntimeError("LightSecAgg unmasked a round fedbalance never weighed")
    result = run.aggregator.finish(
        previous,
        OrderedDict((k, torch.as_tensor(v, dtype=torch.float64)) for k, v in summed.items()),
        weighing,
        host=run.host,
        protocol=PROTOCOL,
    )
    params = OrderedDict(result.params.items())
    self.set_global_model_params(params)
    return params


# -- client ---------------------------------------------------------------------------------------
def client_handlers(self: Any, original: Any) -> Any:
    original(self)
    self.register_message_receive_handler(MSG_SCALE, functools.partial(_receive_scale, self))


def client_offline(self: Any, original: Any) -> Any:
    """FedML's mask drawing and encoding, from a generator seeded from ``os.urandom``."""
    # FedML draws from numpy's legacy global generator: reseed it for this call only.
    saved = np.random.get_state()  # noqa: NPY002
    np.random.seed(np.frombuffer(os.urandom(32), dtype=np.uint32))  # noqa: NPY002
    try:
        return original(self)
    finally:
        np.random.set_state(saved)  # noqa: NPY002


def client_train(self: Any, original: Any) -> Any:
    """Train (fedbalance's split and loss), keep the model, report the scalars in clear."""
    weights, num_samples = self.trainer.train(self.round_idx)
    clean, client, loss = strip(weights)
    self._fedbalance_trained = (clean, num_samples)
    msg = _message(MSG_SCALARS, self.get_sender_id(), 0)
    msg.add_params(KEY_NUM_SAMPLES, int(num_samples))
    msg.add_params(KEY_VAL_LOSS, None if loss is None else float(loss))
    msg.add_params(KEY_CLIENT, client)
    self.send_message(msg)


def _receive_scale(self: Any, msg_params: Any) -> None:
    from fedml.core.mpc.lightsecagg import model_masking, transform_tensor_to_finite

    scale = float(msg_params.get(KEY_SCALE))
    clean, num_samples = self._fedbalance_trained
    self._fedbalance_trained = None
    scaled = OrderedDict((k, v.detach().cpu().double().numpy() * scale) for k, v in clean.items())
    finite = transform_tensor_to_finite(scaled, self.prime_number, self.precision_parameter)
    masked = model_masking(finite, self.dimensions, self.local_mask, self.prime_number)
    self.send_model_to_server(0, masked, num_samples)


LSA = "fedml.cross_silo.lightsecagg"
#: ``(module, class, method, replacement)`` for :mod:`fl_adapters.fedml.patches.cross_silo`.
TARGETS = (
    (
        f"{LSA}.lsa_fedml_server_manager",
        "FedMLServerManager",
        "register_message_receive_handlers",
        server_handlers,
    ),
    (
        f"{LSA}.lsa_fedml_server_manager",
        "FedMLServerManager",
        "handle_message_client_status_update",
        server_status,
    ),
    (
        f"{LSA}.lsa_fedml_aggregator",
        "LightSecAggAggregator",
        "aggregate_model_reconstruction",
        reconstruct,
    ),
    (
        f"{LSA}.lsa_fedml_client_manager",
        "FedMLClientManager",
        "register_message_receive_handlers",
        client_handlers,
    ),
    (
        f"{LSA}.lsa_fedml_client_manager",
        "FedMLClientManager",
        "_FedMLClientManager__offline",
        client_offline,
    ),
    (
        f"{LSA}.lsa_fedml_client_manager",
        "FedMLClientManager",
        "_FedMLClientManager__train",
        client_train,
    ),
)
