"""FedML sp simulation (``FedAvgAPI``): fedbalance's client training, aggregation, Astraea's
mediators, and checkpoints with resume.

FedML trains the sampled clients one after another on one shared model object, then calls
``FedAvgAPI._aggregate``; the wrappers save the round's global model before that, train each
client (or each mediator) from it, and aggregate the round's updates with fedbalance. A
resumed run replays FedML's loop without training the rounds the checkpoint holds, so every
random draw after them is the one the checkpointed run made.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

from fl_adapters import bias
from fl_adapters._training import evaluate_counts, evaluated_clients, evaluates
from fl_adapters.checkpoint import check_plan
from fl_adapters.fedml import checkpoint
from fl_adapters.fedml.adapter import (
    aggregate,
    clean_params,
    current,
    evaluation,
    train_with_validation,
)
from fl_adapters.fedml.astraea import SpAstraea
from fl_aggregators.record import jsonable

log = logging.getLogger(__name__)

HOST = "fedml-sp"


def client_train(self: Any, original: Any, w_global: Any) -> Any:
    run = current()
    if run.skipping:  # a round the resumed checkpoint holds
        return w_global
    if run.astraea is not None:
        # FedML's w_global aliases the shared model, which the previous mediator has trained:
        # every mediator starts from the round's global model, saved before any training.
        return run.astraea.train_slot(self, copy.deepcopy(run.round_global))
    return train_with_validation(
        self.model_trainer,
        w_global,
        self.local_training_data,
        int(self.client_idx),
        self.device,
        self.args,
    )


def train(self: Any, original: Any) -> Any:
    run = current()
    if checkpoint.resume_path(self.args) is not None:
        model = clean_params(self.model_trainer.get_model_params())
        run.resume = checkpoint.resume(self.args, model, run.aggregator, "sp")
        self.model_trainer.set_model_params(run.resume.model)
    result = original(self)
    save_checkpoint(self, int(self.args.comm_round))
    return result


def save_checkpoint(self: Any, rounds_done: int) -> None:
    """sp's checkpoint after ``rounds_done`` rounds, taken as the next round begins (after
    FedML's test, which draws from torch's RNG through its shuffling loaders)."""
    run = current()
    params = self.model_trainer.get_model_params()
    rng = checkpoint.rng_state()
    checkpoint.save(self.args, rounds_done, params, run.aggregator, run.astraea, rng)


def client_sampling(self: Any, original: Any, round_idx: Any, *a: Any, **kw: Any) -> Any:
    run = current()
    ckpt = run.resume
    done = int(round_idx)  # rounds completed before this one
    run.skipping = ckpt is not None and done < ckpt.round
    if ckpt is not None and done == ckpt.round and ckpt.rng is not None:
        checkpoint.restore_rng(ckpt.rng)  # where the checkpointed run stood at this point
    elif done > 0 and not run.skipping:
        save_checkpoint(self, done)
    # The round's global model, before the clients train the shared model object in place.
    run.round_global = copy.deepcopy(self.model_trainer.get_model_params())
    sampled = original(self, round_idx, *a, **kw)
    if not getattr(run.aggregator, "mediated", False):
        return sampled
    if run.astraea is None:
        run.astraea = SpAstraea(self, run.aggregator, run.seed)
        if ckpt is not None:
            check_plan(ckpt.plan, run.astraea.planner.plan.as_dict())
    return run.astraea.sample(sampled)


def local_test(self: Any, original: Any, *a: Any, **kw: Any) -> Any:
    if current().skipping:  # the checkpointed run tested this round
        return None
    return original(self, *a, **kw)


def test_on_all_clients(self: Any, original: Any, round_idx: Any) -> Any:
    """FedML's test of every client, or with ``eval_every`` / ``eval_fraction`` (see
    :func:`~fl_adapters.fedml.adapter.evaluation`) the rounds and clients they pick."""
    run = current()
    if run.skipping:  # the checkpointed run tested this round
        return None
    total = int(self.args.client_num_in_total)
    chosen = evaluation(self.args)
    if chosen is None:  # FedML's frequency_of_the_test picked this round: every client
        return test_clients(self, round_idx, list(range(total)))
    rnd = int(round_idx) + 1
    if not evaluates(rnd, chosen.every, int(self.args.comm_round)):
        return None
    return test_clients(self, round_idx, evaluated_clients(total, chosen.fraction, run.seed, rnd))


def report_test(args: Any, round_idx: Any, name: str, shown: str, acc: float, loss: float) -> None:
    """One of FedML's test lines, where FedML's own test sends it (its log, wandb, mlops)."""
    from fedml import mlops

    if getattr(args, "enable_wandb", False):
        import wandb

        wandb.log({f"{shown}/Acc": acc, "round": round_idx})
        wandb.log({f"{shown}/Loss": loss, "round": round_idx})
    mlops.log({f"{shown}/Acc": acc, "round": round_idx})
    mlops.log({f"{shown}/Loss": loss, "round": round_idx})
    log.info({f"{name}_acc": acc, f"{name}_loss": loss})


#: What the log line of a round's bias figures starts with (``fedbalance run`` reads it).
FIGURES = "fedbalance bias figures: "


def test_clients(self: Any, round_idx: Any, clients: list[int]) -> None:
    """FedML's ``_local_test_on_all_clients`` over ``clients``: the same metrics in the same
    log lines (each client's train split by FedML's own test, summed), the test split counted
    per class and client in the same pass (:func:`~fl_adapters._training.evaluate_counts`), and
    one more line with the bias figures (:mod:`fl_adapters.bias`), which ``fedbalance run``
    reads."""
    log.info("################local_test_on_all_clients : %s (%d clients)", round_idx, len(clients))
    client = self.client_list[0]
    # FedML's own trainers test with cross-entropy and argmax, as the counting pass does; a
    # user's trainer keeps its own test for FedML's lines (the figures then cost a pass more).
    stock = type(client.model_trainer).__module__.startswith("fedml.")
    train, test = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]  # correct, loss, samples
    per: dict[int, bias.Counts] = {}
    for c in clients:
        if self.test_data_local_dict[c] is None:
            continue
        client.update_local_dataset(
            0,
            self.train_data_local_dict[c],
            self.test_data_local_dict[c],
            self.train_data_local_num_dict[c],
        )
        for on_test, sums in ((False, train), (True, test)):
            if on_test and stock:
                continue
            m = client.local_test(on_test)
            for i, key in enumerate(("test_correct", "test_loss", "test_total")):
                sums[i] += m[key]
        per[c] = evaluate_counts(client.model_trainer.model, self.test_data_local_dict[c])
    counts = bias.total(list(per.values()))
    if stock:
        test = [float(counts.correct.sum()), counts.loss_sum, float(counts.n)]
    for (correct, loss, n), name, shown in ((train, "training", "Train"), (test, "test", "Test")):
        if n:
            report_test(self.args, round_idx, name, shown, correct / n, loss / n)
    log_figures(per)


def log_figures(per: dict[int, bias.Counts]) -> None:
    """The line of a round's bias figures (with the accuracy and loss they come with) that
    ``fedbalance run`` reads from FedML's log; nothing when no client had test samples."""
    counts = bias.total(list(per.values()))
    if counts.n:
        figures = {"accuracy": counts.accuracy, "loss": counts.loss}
        figures |= bias.class_figures(counts) | bias.client_figures(per)
        figures["client_accuracy"] = bias.client_accuracies(per)
        log.info("%s%s", FIGURES, json.dumps(jsonable(figures), allow_nan=False))


def aggregate_round(self: Any, original: Any, w_locals: list[tuple[Any, Any]]) -> Any:
    run = current()
    if run.skipping:  # the model stays the checkpoint's
        return run.round_global
    if run.astraea is not None:  # one update per mediator, not per client slot
        w_locals = run.astraea.model_list()
    return aggregate(w_locals, run.round_global)


SP = "fedml.simulation.sp.fedavg"
API = (f"{SP}.fedavg_api", "FedAvgAPI")
#: ``(module, class, method, replacement)``
TARGETS = (
    (f"{SP}.client", "Client", "train", client_train),
    (*API, "_client_sampling", client_sampling),
    (*API, "_aggregate", aggregate_round),
    (*API, "train", train),  # checkpoints and resume
    (*API, "_local_test_on_all_clients", test_on_all_clients),
    (*API, "_local_test_on_validation_set", local_test),
)
