"""FedAvg, FedAvgM, FedLoss and FedLoss-n under FedML 0.9.6's cross-silo LightSecAgg (``LSA``).

FedML's LightSecAgg server unmasks ``sum_i y_i`` and takes ``1/N`` of it, never calling a
server aggregator. With a fedbalance aggregator each round gets one more message pair between
training and masking: the client sends its sample count, validation loss and id in clear
(:data:`MSG_SCALARS`); the server weighs them (:meth:`~fl_aggregators.Aggregator.weigh`) and
sends each client ``N * w_i`` (:data:`MSG_SCALE`), by which it scales its model before masking,
so FedML's ``1/N`` average is ``sum_i w_i x_i`` for :meth:`~fl_aggregators.Aggregator.finish`.
Each silo also reports, in clear, the length of its update (``update_norm``, float64, over the
floating-point tensors). A silo whose scalars the aggregator rejects (a loss that is text, NaN
or a list) gets factor 0 and masks zeros: the round goes on with the others. What FedML's
field can hold is checked before round 1 and again on each silo before it masks
(:mod:`fl_adapters.fedml.field`); an error inside these handlers stops the job rather than
leave every process waiting. The two FedML defects mended here (:func:`server_status`,
:func:`client_offline`), the protocol's limits and its fixed-point bounds: docs/hosts/beside.md
and docs/hosts/fedml.md.
"""

from __future__ import annotations

import functools
import logging
import numbers
import os
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np
import torch

from fl_adapters.client_metrics import CLIENT_METRICS
from fl_adapters.fedml.adapter import (
    SECURE_OPTIMIZER,
    clean_params,
    current,
    ending_the_job,
    lsa_silos,
    settings,
)
from fl_adapters.fedml.field import range_problem
from fl_adapters.fedml.payload import strip
from fl_aggregators import UPDATE_NORM, ClientUpdate
from fl_aggregators.functional import update_norm
from fl_checks import ParameterError, shown

log = logging.getLogger(__name__)

#: Client -> server: sample count, client metrics, update norm and client id, in clear.
MSG_SCALARS = 101
#: Server -> client: the factor ``N * w_i`` the client scales its model by before masking.
MSG_SCALE = 102
KEY_NUM_SAMPLES = "fedbalance_num_samples"
#: Each client metric (:mod:`fl_adapters.client_metrics`) under a key of its own.
KEY_METRICS = {name: f"fedbalance_metric_{name}" for name in CLIENT_METRICS}
KEY_CLIENT = "fedbalance_client"
KEY_UPDATE_NORM = "fedbalance_update_norm"
KEY_SCALE = "fedbalance_scale"
PROTOCOL = "lightsecagg"
#: Longest text kept as it came in a clear-phase scalar (longer, or another kind: its repr, cut).
KEPT_TEXT = 200


def _message(kind: int, sender: int, receiver: int) -> Any:
    from fedml.core.distributed.communication.message import Message

    return Message(kind, sender, receiver)


# -- server ---------------------------------------------------------------------------------------
def stop_the_job(who: str, why: str) -> NoReturn:
    """End this process with ``why`` on stderr: FedML's message loop has no way out, and an
    exception inside a handler leaves every process waiting for the next message (mpirun, or
    fedbalance's supervisor over gRPC, then stops the others)."""
    message = f"fedbalance: FedML LightSecAgg {who} stops the job: {why}"
    log.error(message)
    print(message, file=sys.stderr, flush=True)
    os._exit(1)


def never_hangs(who: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A handler that stops the job (:func:`stop_the_job`) on any exception."""

    def wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(handler)
        def guarded(*a: Any, **kw: Any) -> Any:
            try:
                return handler(*a, **kw)
            except Exception as e:  # noqa: BLE001 - whatever it is, waiting forever is worse
                stop_the_job(who, f"{type(e).__name__}: {e}")

        return guarded

    return wrap


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


def kept(value: Any) -> Any:
    """A clear-phase scalar as the aggregator should judge it: a number or short text as it
    came; anything else (a list, an object, long text) as its repr, cut short, which no check
    takes for a number and every record can hold."""
    if value is None or isinstance(value, numbers.Real):
        return value
    if isinstance(value, str) and len(value) <= KEPT_TEXT:
        return value
    return Shown(shown(value))


class Shown:
    """A value shown by its (cut) repr: ``metric 'val_loss' is not a number: [1, 2]``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


def client_name(client: Any, sender: int) -> Any:
    """The client id a silo sent, when it is a plain int or short text; else ``rank<N>``."""
    if isinstance(client, bool) or not isinstance(client, (int, str)):
        return f"rank{sender}"
    return client if not isinstance(client, str) or len(client) <= KEPT_TEXT else f"rank{sender}"


@never_hangs("server")
def _receive_scalars(self: Any, msg_params: Any) -> None:
    sender = int(msg_params.get_sender_id())
    expected = {int(c) for c in self.client_id_list_in_this_round}
    if sender not in expected or sender in self._fedbalance_scalars:
        log.warning(
            "fedbalance: LightSecAgg round %d: scalars from rank %d ignored (%s)",
            int(self.round_idx) + 1,
            sender,
            "already received" if sender in expected else "not a silo of this round",
        )
        return
    self._fedbalance_scalars[sender] = (
        *(msg_params.get(k) for k in (KEY_NUM_SAMPLES, KEY_UPDATE_NORM, KEY_CLIENT)),
        {name: msg_params.get(key) for name, key in KEY_METRICS.items()},
    )
    if not expected <= set(self._fedbalance_scalars):
        return
    scalars, self._fedbalance_scalars = sorted(self._fedbalance_scalars.items()), {}
    updates = []
    for sender_rank, (n, norm, client, reported) in scalars:
        metrics = {k: kept(v) for k, v in (*reported.items(), (UPDATE_NORM, norm)) if v is not None}
        updates.append(
            ClientUpdate(
                params=OrderedDict(),  # weigh() reads the scalars only
                num_samples=kept(n),
                metrics=metrics,
                client_id=client_name(client, sender_rank),
            )
        )
    run = current()
    round_number = int(self.round_idx) + 1
    run.lsa_weighing = weighing = run.aggregator.weigh(updates, round=round_number, with_norms=True)
    for i, reason in sorted(weighing.rejected.items()):
        log.warning(
            "fedbalance: LightSecAgg round %d: silo rank %d (client %s) rejected, it masks "
            "zeros this round: %s",
            round_number,
            scalars[i][0],
            weighing.clients[i],
            reason,
        )
    # FedML's reconstruction takes 1/N of the unmasked sum, N the round's clients.
    for (sender_rank, _), w in zip(scalars, weighing.weights, strict=True):
        msg = _message(MSG_SCALE, self.get_sender_id(), sender_rank)
        msg.add_params(KEY_SCALE, float(len(scalars) * w))
        self.send_message(msg)


@never_hangs("server")
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
    as_sum = OrderedDict((k, torch.as_tensor(v, dtype=torch.float64)) for k, v in summed.items())
    # Each silo's values are rounded to 2**-q (FedML's fixed point) and FedML averages them;
    # the result comes back as float32, rounded once more relative to its size.
    largest = max((float(t.abs().max()) for t in as_sum.values() if t.numel()), default=0.0)
    resolution = 2.0 ** -(int(self.precision_parameter) + 1) + largest * 2.0**-23
    with ending_the_job(run):
        result = run.aggregator.finish(
            previous, as_sum, weighing, host=run.host, protocol=PROTOCOL, resolution=resolution
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


@never_hangs("silo")
def client_train(self: Any, original: Any) -> Any:
    """Train (fedbalance's split and loss), keep the model, report the scalars in clear."""
    # The round's global model, before training changes the tensors in place.
    given = OrderedDict(
        (k, v.detach().clone())
        for k, v in clean_params(self.trainer.trainer.get_model_params()).items()
    )
    weights, num_samples = self.trainer.train(self.round_idx)
    clean, client, metrics = strip(weights)
    self._fedbalance_trained = (clean, num_samples)
    norm = update_norm([given[k] for k in clean], [v.detach().cpu() for v in clean.values()])
    msg = _message(MSG_SCALARS, self.get_sender_id(), 0)
    msg.add_params(KEY_NUM_SAMPLES, int(num_samples))
    for name, key in KEY_METRICS.items():
        msg.add_params(key, metrics.get(name))
    msg.add_params(KEY_UPDATE_NORM, norm)
    msg.add_params(KEY_CLIENT, client)
    self.send_message(msg)


@never_hangs("silo")
def _receive_scale(self: Any, msg_params: Any) -> None:
    from fedml.core.mpc.lightsecagg import model_masking, transform_tensor_to_finite

    scale = float(msg_params.get(KEY_SCALE))
    clean, num_samples = self._fedbalance_trained
    self._fedbalance_trained = None
    if scale == 0:  # rejected this round: zeros (0 * NaN would not be)
        scaled = OrderedDict((k, np.zeros(tuple(v.shape))) for k, v in clean.items())
    else:
        scaled = OrderedDict(
            (k, v.detach().cpu().double().numpy() * scale) for k, v in clean.items()
        )
    largest = max((float(np.abs(a).max()) for a in scaled.values() if a.size), default=0.0)
    problem = range_problem(
        largest,
        self.prime_number,
        self.precision_parameter,
        int(self.targeted_number_active_clients),
    )
    if problem is not None:
        stop_the_job(
            f"silo rank {self.get_sender_id()}",
            f"round {int(self.round_idx) + 1}: its model times its weight factor {scale:.4g}: "
            f"{problem}",
        )
    finite = transform_tensor_to_finite(scaled, self.prime_number, self.precision_parameter)
    masked = model_masking(finite, self.dimensions, self.local_mask, self.prime_number)
    self.send_model_to_server(0, masked, num_samples)


def check_initial_model(args: Any, model: Any) -> None:
    """Before round 1 (``FedMLRunner``, every process): under ``LSA`` with a fedbalance
    aggregator, the initial model must fit FedML's field (:func:`~.field.range_problem`), as
    each silo's scaled model must later. FedML quantises every entry of the state dict."""
    if str(getattr(args, "federated_optimizer", "")) != SECURE_OPTIMIZER or settings(args) is None:
        return
    if str(getattr(args, "training_type", "")) != "cross_silo" or not hasattr(model, "state_dict"):
        return
    values = [v.detach().cpu().double().abs() for v in model.state_dict().values() if v.numel()]
    largest = max((float(v.max()) for v in values), default=0.0)
    problem = range_problem(
        largest, int(args.prime_number), int(args.precision_parameter), lsa_silos(args)
    )
    if problem is not None:
        raise ParameterError(f"federated_optimizer: LSA, before round 1: {problem}")


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
