"""FedAvg, FedAvgM, FedLoss and FedLoss-n under FedML 0.9.6's cross-silo LightSecAgg (``LSA``).

FedML's LightSecAgg server unmasks ``sum_i y_i`` and takes ``1/N`` of it, never calling a
server aggregator. With a fedbalance aggregator each round gets one more message pair between
training and masking: the client sends its sample count, validation loss and id in clear
(:data:`MSG_SCALARS`); the server weighs them (:meth:`~fl_aggregators.Aggregator.weigh`) and
sends each client ``N * w_i`` (:data:`MSG_SCALE`), by which it scales its model before masking,
so FedML's ``1/N`` average is ``sum_i w_i x_i`` for :meth:`~fl_aggregators.Aggregator.finish`.
The two FedML defects mended here (:func:`server_status`, :func:`client_offline`), the
protocol's limits and its fixed-point bounds: docs/hosts/beside.md.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from fl_adapters.fedml.adapter import clean_params, current, ending_the_job
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
    self._fedbalance_scalars[int(msg_params.get_sender_id())] = (
        msg_params.get(KEY_NUM_SAMPLES),
        msg_params.get(KEY_VAL_LOSS),
        msg_params.get(KEY_CLIENT),
    )
    if any(int(c) not in self._fedbalance_scalars for c in self.client_id_list_in_this_round):
        return
    scalars, self._fedbalance_scalars = sorted(self._fedbalance_scalars.items()), {}
    updates = [
        ClientUpdate(
            params=OrderedDict(),  # weigh() reads the scalars only
            num_samples=n,
            metrics={} if loss is None else {"val_loss": float(loss)},
            client_id=client if client is not None else f"rank{sender}",
        )
        for sender, (n, loss, client) in scalars
    ]
    run = current()
    run.lsa_weighing = weighing = run.aggregator.weigh(updates, round=int(self.round_idx) + 1)
    # FedML's reconstruction takes 1/N of the unmasked sum, N the round's clients.
    for (sender, _), w in zip(scalars, weighing.weights, strict=True):
        msg = _message(MSG_SCALE, self.get_sender_id(), sender)
        msg.add_params(KEY_SCALE, float(len(scalars) * w))
        self.send_message(msg)


def reconstruct(self: Any, original: Any, first: Any, second: Any) -> Any:
    """FedML's unmasking (``sum_i w_i x_i``), then the aggregator's step and record."""
    # A copy: FedML's reconstruction overwrites the model these tensors belong to.
    previous = OrderedDict(
        (k, v.clone()) for k, v in clean_params(self.get_global_model_params()).items()
    )
    summed = original(self, first, second)
    run = current()
    weighing, run.lsa_weighing = run.lsa_weighing, None
    if weighing is None:
        raise RuntimeError("LightSecAgg unmasked a round fedbalance never weighed")
    with ending_the_job(run):
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
SERVER = (f"{LSA}.lsa_fedml_server_manager", "FedMLServerManager")
AGGREGATOR = (f"{LSA}.lsa_fedml_aggregator", "LightSecAggAggregator")
CLIENT = (f"{LSA}.lsa_fedml_client_manager", "FedMLClientManager")
#: ``(module, class, method, replacement)`` for :mod:`fl_adapters.fedml.patches.cross_silo`.
TARGETS = (
    (*SERVER, "register_message_receive_handlers", server_handlers),
    (*SERVER, "handle_message_client_status_update", server_status),
    (*AGGREGATOR, "aggregate_model_reconstruction", reconstruct),
    (*CLIENT, "register_message_receive_handlers", client_handlers),
    (*CLIENT, "_FedMLClientManager__offline", client_offline),
    (*CLIENT, "_FedMLClientManager__train", client_train),
)
