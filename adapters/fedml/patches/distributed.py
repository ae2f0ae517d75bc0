"""What FedML's two distributed modes share (MPI simulation and cross-silo, over MPI or gRPC):
the client process's training and Astraea data, the server's Astraea relay, its checkpoints
and resume, the round number a resumed server's messages carry, and a message loop that waits
for messages instead of polling its queue.
"""

from __future__ import annotations

import contextlib
import logging
import queue
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

from fl_adapters._training import evaluates
from fl_adapters.fedml import checkpoint
from fl_adapters.fedml.adapter import clean_params, current, evaluation, train_with_validation
from fl_adapters.fedml.astraea import SiloAstraea, seeded_training, silo_data, take_rad, with_rad
from fl_adapters.fedml.payload import KEY_ROUND

log = logging.getLogger(__name__)

#: How long an empty receive queue's ``qsize`` waits for a message: FedML's receive loop sees
#: a stop request at most this late.
RECEIVE_WAIT_S = 0.05


class WaitingQueue(queue.Queue):
    """A ``queue.Queue`` whose ``qsize`` waits up to :data:`RECEIVE_WAIT_S` for a message when
    it is empty, and returns as soon as one is put.

    FedML 0.9.6's receive loops poll their queue's ``qsize``: over gRPC the loop's ``sleep``
    sits after its ``while``, so an idle silo or server spins a whole core; over MPI it sleeps
    0.1 ms between polls, about an eighth of a core per idle process (measured here), the
    server's and every client's while the others train. The loop waits here instead; messages,
    their order and their handling stay FedML's.
    """

    def qsize(self) -> int:
        with self.not_empty:  # put() notifies it
            if not self._qsize():
                self.not_empty.wait(RECEIVE_WAIT_S)
            return self._qsize()


def quiet_run(self: Any, original: Any) -> Any:
    """A server's or client's message loop (its ``run``) without the busy wait: the receive
    queue (FedML's gRPC servicer's, or its MPI manager's) becomes a :class:`WaitingQueue` (the
    same object, its class changed; only a plain ``queue.Queue``)."""
    com = getattr(self, "com_manager", None)
    servicer = getattr(com, "grpc_servicer", None)
    q, kind = getattr(servicer, "message_q", None), "gRPC"
    if q is None:
        q, kind = getattr(com, "q_receiver", None), "MPI"
    if type(q) is queue.Queue:
        q.__class__ = WaitingQueue
        log.info("fedbalance: FedML's %s receive loop waits for messages instead of spinning", kind)
    return original(self)


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
    holds (``test_data_local_dict``), counted per class and client.

    Where FedML's server test would pass over the union of those splits (:func:`tests_union`,
    as in fedbalance's FedML example), the counts come from that very pass, over FedML's own
    global test set and batches, each sample counted for its client; FedML's test then reads
    its figures from them (:func:`answer_test`): one pass, as before the figures. Elsewhere
    (a server aggregator with a test of its own, a test set of other samples) the figures cost
    a pass of their own over the splits, which the server says once."""
    from fl_adapters import bias
    from fl_adapters._training import evaluate_counts, evaluate_counts_in_parts
    from fl_adapters.fedml.patches.sp import log_figures

    model = getattr(aggregator.aggregator, "model", None)
    held = getattr(aggregator, "test_data_local_dict", None) or {}
    if model is None or not held:
        return
    test_global = getattr(aggregator, "test_global", None)
    if tests_union(aggregator.aggregator, test_global, held):
        order = sorted(held)
        sizes = [len(held[c].dataset) for c in order]
        counts = evaluate_counts_in_parts(model, test_global, sizes)
        per = {int(c): n for c, n in zip(order, counts, strict=True) if n.n}
        answer_test(aggregator, test_global, bias.total(counts))
    else:
        if not current().told_second_pass:
            current().told_second_pass = True
            log.info(
                "fedbalance: the bias figures cost one evaluation pass more than FedML's server "
                "test here (its server aggregator tests in its own way, or its global test set "
                "is not the union of the clients' test splits)"
            )
        per = {int(c): evaluate_counts(model, data) for c, data in sorted(held.items()) if data}
    log_figures(per)


def tests_union(server: Any, test_global: Any, held: dict[Any, Any]) -> bool:
    """Whether FedML's server test is its stock ``DefaultServerAggregator`` pass over a global
    test set that holds exactly the clients' test splits ``held``, in client order: their
    datasets concatenated, each once, read in order."""
    from fedml.ml.aggregator.default_aggregator import DefaultServerAggregator

    stock = all(
        getattr(type(server), m, None) is getattr(DefaultServerAggregator, m)
        for m in ("test", "_test")
    )
    dataset = getattr(test_global, "dataset", None)
    parts = getattr(dataset, "datasets", None)
    mine = [getattr(held[c], "dataset", None) for c in sorted(held)]
    return (
        stock
        and isinstance(dataset, torch.utils.data.ConcatDataset)
        and isinstance(getattr(test_global, "sampler", None), torch.utils.data.SequentialSampler)
        and parts is not None
        and len(parts) == len(mine)
        and all(a is b for a, b in zip(parts, mine, strict=True))
    )


def answer_test(aggregator: Any, test_global: Any, counts: Any) -> None:
    """FedML's server test of this round (``DefaultServerAggregator._test`` on ``test_global``)
    answered from ``counts``, which a pass over that same set made: its correct count, total
    and summed loss, as FedML's pass would sum them. Another round, or another set, runs
    FedML's pass."""
    server = aggregator.aggregator
    round_idx = int(aggregator.args.round_idx)
    metrics = {
        "test_correct": int(counts.correct.sum()),
        "test_loss": counts.loss_sum,  # FedML's: the batches' mean loss times their size
        "test_precision": 0,
        "test_recall": 0,
        "test_total": counts.n,
    }
    fedml_test = type(server)._test.__get__(server)

    def answered(data: Any, device: Any, args: Any) -> Any:
        if data is test_global and int(args.round_idx) == round_idx:
            return dict(metrics)
        return fedml_test(data, device, args)

    server._test = answered  # this round's; the next tested round sets its own


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
