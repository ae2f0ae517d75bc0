"""What FedML's two distributed modes share (MPI simulation and cross-silo, over MPI or gRPC):
the client process's training and Astraea data, the server's Astraea relay, its checkpoints
and resume, and the round number a resumed server's messages carry.

In both modes a client process trains one FedML client a round and a server process aggregates.
Under Astraea the server plays the mediators: a mediator's model goes from client to client
through the server (:func:`relay`), and FedML aggregates once every mediator is back.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

from fl_adapters._training import evaluates
from fl_adapters.astraea import RebalancedCache
from fl_adapters.checkpoint import check_plan
from fl_adapters.fedml import checkpoint
from fl_adapters.fedml.adapter import clean_params, current, evaluation, train_with_validation
from fl_adapters.fedml.astraea import SiloAstraea, seeded_training, silo_data, take_rad, with_rad
from fl_adapters.fedml.payload import KEY_ROUND

log = logging.getLogger(__name__)


def train(self: Any, original: Any, round_idx: Any = None) -> Any:
    run = current()
    self.args.round_idx = round_idx
    data, n = self.train_local, self.local_sample_number
    rad = run.rad  # MPI Astraea: this client's data, rebalanced once
    if rad is None:
        params = train_with_validation(
            self.trainer, None, data, int(self.client_index), self.device, self.args
        )
        return params, n

    if run.silo_data is None:
        run.silo_data = RebalancedCache()
    cache = run.silo_data
    data, n = silo_data(cache, int(self.client_index), self.train_local, rad, run.seed)
    round_number = run.astraea_round or int(round_idx or 0) + 1  # the server's
    with seeded_training(run.seed, int(self.client_index), round_number, 0):
        params = train_with_validation(
            self.trainer, None, data, int(self.client_index), self.device, self.args
        )
    return params, n


def test_round(self: Any, original: Any, round_idx: Any, *a: Any, **kw: Any) -> Any:
    """The server's test, in the rounds ``eval_every`` picks (see
    :func:`~fl_adapters.fedml.adapter.evaluation`; FedML's ``frequency_of_the_test`` is then
    1, checked before training)."""
    chosen = evaluation(self.args)
    if chosen is not None and not evaluates(
        int(round_idx) + 1, chosen.every, int(self.args.comm_round)
    ):
        return None
    return original(self, round_idx, *a, **kw)


def update_model(self: Any, original: Any, weights: Any) -> Any:
    run = current()
    clean, rad, round_number = take_rad(weights)
    if rad is not None:
        run.rad, run.astraea_round = rad, round_number
    return original(self, clean)


def server_astraea(manager: Any) -> Any:
    """The MPI server's Astraea state, built on first use (``None``: not mediated)."""
    run = current()
    if not getattr(run.aggregator, "mediated", False):
        return None
    if run.silo_astraea is None:
        run.silo_astraea = SiloAstraea(
            run.aggregator,
            manager.aggregator.train_data_local_dict,
            int(manager.args.client_num_in_total),
        )
    return run.silo_astraea


def relay(self: Any, astraea: Any, msg_params: Any, keys: Any, pass_on: Any) -> int | None:
    """A mediator's model came back to the server (MPI and cross-silo alike): the server plays
    the mediator and ``pass_on(hop, params)`` sends it to the chain's next client; ``None``
    until every mediator of the round is done, then the last sender."""

    sender = int(msg_params.get(keys.MSG_ARG_KEY_SENDER))
    params = msg_params.get(keys.MSG_ARG_KEY_MODEL_PARAMS)
    nxt = astraea.received(sender, params, int(msg_params.get(keys.MSG_ARG_KEY_NUM_SAMPLES)))
    if nxt is not None:
        pass_on(nxt, with_rad(params, astraea.planner.rad, self.args.round_idx + 1))
        return None
    return sender if astraea.done() else None


def all_uploaded(aggregator: Any, count: int, sender: int) -> None:
    """Every mediator is done: FedML aggregates (our wrapper reads the mediators' models), tests
    and starts the next round. Its all-received check wants one flag per client process."""
    for i in range(count):
        if i != sender:
            aggregator.flag_client_model_uploaded_dict[i] = True


@contextlib.contextmanager
def forwarding() -> Iterator[None]:
    """A model the server passes along a mediator's chain: the send wrappers let it through."""
    run = current()
    run.forwarding = True
    try:
        yield
    finally:
        run.forwarding = False


def resume_server(manager: Any) -> None:
    """MPI simulation / cross-silo server: start at the checkpoint's round with its model."""
    run = current()
    if run.first_round is not None or checkpoint.resume_path(manager.args) is None:
        return
    ckpt = checkpoint.load(manager.args)
    astraea = server_astraea(manager)
    if astraea is not None:
        check_plan(ckpt.plan, astraea.planner.plan.as_dict())
    ckpt.check_model(
        clean_params(manager.aggregator.get_global_model_params()),
        checkpoint.resume_path(manager.args),
    )
    manager.aggregator.set_global_model_params(ckpt.model)
    run.aggregator.load_state_dict(ckpt.aggregator)
    manager.args.round_idx = ckpt.round
    run.first_round = ckpt.round
    log.info(
        "fedbalance: FedML %s resumes after round %d of %d",
        run.host,
        ckpt.round,
        manager.args.comm_round,
    )


def server_checkpoint(aggregator: Any, params: Any) -> None:
    """MPI simulation / cross-silo: the server's checkpoint after the round it aggregated."""
    run = current()
    astraea = run.silo_astraea
    checkpoint.save(
        aggregator.args,
        aggregator.args.round_idx + 1,
        params,
        run.aggregator,
        plan=astraea.planner.plan.as_dict() if astraea is not None else None,
    )


def tag_init(self: Any, original: Any, receive_id: Any, params: Any, *a: Any, **kw: Any) -> Any:
    """A resumed server's first messages carry its round: FedML's clients count rounds
    themselves (and stop on the count), from 0 unless told."""
    run = current()
    if run.first_round is not None and isinstance(params, dict):
        if KEY_ROUND not in params:
            params = OrderedDict(params)
            params[KEY_ROUND] = torch.tensor(self.args.round_idx + 1, dtype=torch.int64)
    return original(self, receive_id, params, *a, **kw)


def downlink_round(msg_params: Any) -> int | None:
    """The server's round number (from 1) a downlink carries, if it carries one."""

    params = msg_params.get("model_params")
    if isinstance(params, dict) and KEY_ROUND in params:
        return int(params[KEY_ROUND])
    return None
