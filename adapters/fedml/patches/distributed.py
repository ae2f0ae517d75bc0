"""What FedML's two distributed modes share (MPI simulation and cross-silo, over MPI or gRPC):
the client process's training and Astraea data, the server's Astraea relay, its checkpoints
and resume, and the round number a resumed server's messages carry.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

from fl_adapters._training import evaluates
from fl_adapters.fedml import checkpoint
from fl_adapters.fedml.adapter import clean_params, current, evaluation, train_with_validation
from fl_adapters.fedml.astraea import SiloAstraea, seeded_training, silo_data, take_rad, with_rad
from fl_adapters.fedml.payload import KEY_ROUND


def train(self: Any, original: Any, round_idx: Any = None) -> Any:
    run = current()
    self.args.round_idx = round_idx
    client = int(self.client_index)
    data, n = self.train_local, self.local_sample_number
    seeding: Any = contextlib.nullcontext()
    if run.rad is not None:  # MPI Astraea: this client's data, rebalanced once
        data, n = silo_data(run.silo_data, client, data, run.rad, run.seed)
        round_number = run.astraea_round or int(round_idx or 0) + 1  # the server's
        seeding = seeded_training(run.seed, client, round_number, 0)
    with seeding:
        return train_with_validation(self.trainer, None, data, client, self.device, self.args), n


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


def tested(args: Any, round_idx: int) -> bool:
    """Whether the server tests round ``round_idx`` (from 0): ``eval_every``'s rounds, else
    FedML's ``frequency_of_the_test`` and the last."""
    rounds = int(args.comm_round)
    chosen = evaluation(args)
    if chosen is not None:
        return evaluates(round_idx + 1, chosen.every, rounds)
    every = int(getattr(args, "frequency_of_the_test", 1) or 1)
    return round_idx % every == 0 or round_idx == rounds - 1


def clients_figures(aggregator: Any) -> None:
    """The bias figures of the server's global model on every client's test split the server
    holds (``test_data_local_dict``), counted per class and client: one pass more than FedML's
    own test, which tests its global test set (or a sample of it) and has no per-client view."""
    from fl_adapters import bias
    from fl_adapters._training import evaluate_counts
    from fl_adapters.fedml.patches.sp import log_figures

    model = getattr(aggregator.aggregator, "model", None)
    held = getattr(aggregator, "test_data_local_dict", None) or {}
    if model is None or not held:
        return
    per: dict[int, bias.Counts] = {
        int(c): evaluate_counts(model, data) for c, data in sorted(held.items()) if data
    }
    log_figures(per)


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


def relay(self: Any, original: Any, msg_params: Any, keys: Any, pass_on: Any, count: int) -> Any:
    """A mediator's model came back to the server (MPI and cross-silo alike): the server plays
    the mediator and ``pass_on(hop, params)`` sends it to the chain's next client. Once every
    mediator is done, FedML's handler runs: it aggregates (our wrapper reads the mediators'
    models), tests and starts the next round; its all-received check wants one flag per client
    process (``count`` of them; FedML sets the sender's again)."""
    astraea = server_astraea(self)
    sender = int(msg_params.get(keys.MSG_ARG_KEY_SENDER))
    params = msg_params.get(keys.MSG_ARG_KEY_MODEL_PARAMS)
    nxt = astraea.received(sender, params, int(msg_params.get(keys.MSG_ARG_KEY_NUM_SAMPLES)))
    if nxt is not None:
        pass_on(nxt, with_rad(params, astraea.planner.rad, self.args.round_idx + 1))
        return None
    if not astraea.relay.done():
        return None
    self.aggregator.flag_client_model_uploaded_dict.update(dict.fromkeys(range(count), True))
    return original(self, msg_params)


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
    astraea = server_astraea(manager)
    model = clean_params(manager.aggregator.get_global_model_params())
    ckpt = checkpoint.resume(manager.args, model, run.aggregator, run.host, astraea)
    manager.aggregator.set_global_model_params(ckpt.model)
    manager.args.round_idx = run.first_round = ckpt.round


def uploads(aggregator: Any, count: int) -> list[tuple[Any, Any]]:
    """The round's ``(sample_num, params)`` for FedML's aggregator: one per mediator under
    Astraea, else one per client process (``count`` of them)."""
    run = current()
    if run.silo_astraea is not None:
        return run.silo_astraea.model_list()
    return [(aggregator.sample_num_dict[i], aggregator.model_dict[i]) for i in range(count)]


def server_checkpoint(aggregator: Any, params: Any) -> None:
    """MPI simulation / cross-silo: the server's checkpoint after the round it aggregated, and
    before it, in a tested round, the round's bias figures (a run stopped between the
    checkpoint and FedML's test keeps them)."""
    run = current()
    args = aggregator.args
    model = getattr(aggregator.aggregator, "model", None)
    if model is not None and tested(args, int(args.round_idx)):
        model.load_state_dict(params)  # what FedML sets as the global model next
        clients_figures(aggregator)
    checkpoint.save(args, args.round_idx + 1, params, run.aggregator, run.silo_astraea)


def tag_init(self: Any, original: Any, receive_id: Any, params: Any, *a: Any, **kw: Any) -> Any:
    """A resumed server's first messages carry its round: FedML's clients count rounds
    themselves (and stop on the count), from 0 unless told."""
    if current().first_round is not None and isinstance(params, dict) and KEY_ROUND not in params:
        params = OrderedDict(params)
        params[KEY_ROUND] = torch.tensor(self.args.round_idx + 1, dtype=torch.int64)
    return original(self, receive_id, params, *a, **kw)


def downlink_round(msg_params: Any) -> int | None:
    """The server's round number (from 1) a downlink carries, if it carries one."""

    params = msg_params.get("model_params")
    if isinstance(params, dict) and KEY_ROUND in params:
        return int(params[KEY_ROUND])
    return None
