"""Puts fedbalance aggregators into an unmodified FedML 0.9.6 deployment.

FedML has no aggregator registry, so :func:`arm` (run right after ``import fedml`` by
fedbalance's autoload, see :mod:`fl_adapters.autoload`) wraps the one aggregation point and the
client training of each mode. Every wrapper decides on each call from ``self.args``: when the
host's flattened args name a fedbalance aggregator (``aggregator: fedloss`` in any YAML
section, optional ``aggregator_args:`` mapping) it runs fedbalance's path, otherwise FedML's
own method, untouched. Deciding per call (not in ``FedMLRunner``) also covers scripts that
build FedML's simulators, ``Server`` or ``Client`` directly.

==================  ===========================================  ====================================
mode                client training                              aggregation
==================  ===========================================  ====================================
sp simulation       ``fedml.simulation.sp.fedavg.client.Client``  ``FedAvgAPI._aggregate``
MPI simulation      ``FedAVGTrainer.train``                       ``FedAVGAggregator.aggregate``
cross-silo          ``FedMLTrainer.train``                        ``FedMLAggregator.aggregate``
==================  ===========================================  ====================================

An unknown name stops the run in ``fedml.init()`` (and ``FedMLRunner(...)``), before any
training, with the registry's message. So does a ``federated_optimizer`` whose FedML code
path never reaches the wrapped aggregation point (:data:`BYPASSING`): the aggregator would be
silently unused there. Keep ``federated_optimizer: FedAvg`` in the config.

Clients hold out a validation split of their training data (``val_fraction``, default 0.1,
deterministic per client and ``random_seed``) when the aggregator needs ``val_loss``, train on
the rest with the host's trainer, and send the loss inside the params payload
(:mod:`.payload`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset

from fl_adapters._training import evaluate, stream_seed
from fl_adapters.autoload import PATCHES
from fl_adapters.checkpoint import check_plan
from fl_adapters.fedml.payload import attach, decode, strip
from fl_aggregators import Aggregator
from fl_partitions.params import ParameterError

log = logging.getLogger(__name__)

HOSTS = {
    ("simulation", "sp"): "fedml-sp",
    ("simulation", "MPI"): "fedml-mpi",
    ("cross_silo", "MPI"): "fedml-cross-silo",
    # FedML's own gRPC transport: one process per rank, started by hand or by `fedbalance run`.
    # The same host name as over MPI: the wrappers and the records are the same.
    ("cross_silo", "GRPC"): "fedml-cross-silo",
}
STATE: dict[str, Any] = {}
#: The ``federated_optimizer`` whose path runs through the wrapped aggregation point and client
#: training, in every mode.
WRAPPED_OPTIMIZER = "FedAvg"
#: Cross-silo LightSecAgg: the aggregators that work on a masked sum run there.
SECURE_OPTIMIZER = "LSA"
#: Why each other ``federated_optimizer`` of FedML 0.9.6 cannot take a fedbalance aggregator:
#: its code aggregates (or trains) in classes fedbalance does not wrap.
BYPASSING = {
    "FedProx": "FedML's FedProx aggregates in its own FedProxTrainer._aggregate (sp) and "
    "FedProxAggregator.aggregate (MPI), and its sp clients train in FedProx's own Client",
    "FedOpt": "FedML's FedOpt averages and then steps a server optimizer in FedOptAPI "
    "(sp) / FedOptAggregator (MPI), outside the wrapped aggregation point",
    "FedOpt_seq": "FedML's FedOpt_seq aggregates in its own FedOptSeq aggregator",
    "FedNova": "FedML's FedNova aggregates normalised updates in its own trainer/aggregator",
    "FedDyn": "FedML's FedDyn aggregates with its own server state in FedDynTrainer._aggregate",
    "SCAFFOLD": "FedML's SCAFFOLD aggregates updates and control variates in its own "
    "ScaffoldTrainer._aggregate",
    "Mime": "FedML's Mime aggregates with server statistics in MimeTrainer._aggregate",
    "HierarchicalFL": "FedML's HierarchicalFL trains clients in its own HFLClient (no "
    "validation loss) and aggregates twice a round (group and global)",
    "FedAvg_seq": "FedML's FedAvg_seq aggregates in its own fedavg_seq FedAVGAggregator",
    "Async_FedAvg": "FedML's Async_FedAvg applies each client's model as it arrives",
    "LSA": "FedML's LightSecAgg exists in cross-silo only (fedbalance runs it there)",
    "SA": "FedML's SecAgg server only ever sees masked models (and FedML 0.9.6 does not ship "
    "its cross_silo.secagg module)",
}


def check_optimizer(args: Any, host: str, name: str, agg: Aggregator | None = None) -> None:
    """Stop before training when ``federated_optimizer`` bypasses fedbalance's aggregation:
    the aggregator the user wrote would otherwise be silently unused. Cross-silo ``LSA`` runs
    the aggregators that can work on a masked sum (:mod:`fl_adapters.fedml.secure`)."""
    optimizer = str(getattr(args, "federated_optimizer", WRAPPED_OPTIMIZER) or WRAPPED_OPTIMIZER)
    if optimizer == WRAPPED_OPTIMIZER:
        return
    if optimizer == SECURE_OPTIMIZER and host == "fedml-cross-silo" and agg is not None:
        check_secure(args, name, agg)
        return
    why = BYPASSING.get(optimizer, f"FedML's {optimizer} does not aggregate through FedAvg's code")
    raise ParameterError(
        f"aggregator: {name} cannot take effect with federated_optimizer: {optimizer} in "
        f"{host}: {why}, so {name} would be silently unused. Use federated_optimizer: "
        f"{WRAPPED_OPTIMIZER} with aggregator: {name}, or remove aggregator to run {optimizer} "
        "stock (see the docs' table of host algorithms)"
    )


def check_secure(args: Any, name: str, agg: Aggregator) -> None:
    """``federated_optimizer: LSA`` with ``aggregator: name``: what it needs, or why not."""
    reason = agg.secure_refusal()
    if reason is not None:
        raise ParameterError(
            f"aggregator: {name} cannot run under federated_optimizer: LSA: {reason}. Those "
            "that can: fedavg, fedavgm, fedloss, fedloss_n (without update_clip)"
        )
    for key in ("checkpoint_dir", "resume_from"):
        if getattr(args, key, None):
            raise ParameterError(
                f"{key} cannot take effect with federated_optimizer: LSA (FedML's LightSecAgg "
                "server has no checkpoint of its own and fedbalance does not add one): remove it"
            )
    for key in ("prime_number", "precision_parameter"):
        value = getattr(args, key, None)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ParameterError(
                f"federated_optimizer: LSA needs {key} (a positive int; e.g. prime_number: "
                f"1073741789, precision_parameter: 20), got {value!r}"
            )


def settings(args: Any) -> tuple[str, dict[str, Any]] | None:
    name = getattr(args, "aggregator", None)
    if name is None or (isinstance(name, str) and not name.strip()):
        return None
    if not isinstance(name, str):
        raise ParameterError(f"aggregator must be a fedbalance plugin name, got {name!r}")
    extra = getattr(args, "aggregator_args", None) or {}
    # FedML read the YAML: bound what it built (aliases) before anything formats it.
    from fl_adapters.inputs import brief, check_tree

    check_tree(extra, "aggregator_args")
    if not isinstance(extra, dict):
        raise ParameterError(f"aggregator_args must be a mapping, got {brief(extra)}")
    return name.strip(), extra


# -- client side ---------------------------------------------------------------------------------
def split_train_val(data: Any, client: int, seed: int, fraction: float) -> tuple[Any, Any]:
    """A client's FedML training data split into (train, validation), deterministically."""
    if isinstance(data, DataLoader):
        n = len(data.dataset)  # type: ignore[arg-type]
        perm = torch.randperm(
            n, generator=torch.Generator().manual_seed(stream_seed("fedml-val", seed, client))
        )
        n_val = int(round(n * fraction)) if n > 1 else 0
        bs = data.batch_size or 1
        train = DataLoader(Subset(data.dataset, perm[n_val:].tolist()), batch_size=bs, shuffle=True)
        val = DataLoader(Subset(data.dataset, perm[:n_val].tolist()), batch_size=bs, shuffle=False)
        return train, val
    batches = list(data)  # FedML's own loaders also hand out lists of (x, y) batches
    n_val = int(round(len(batches) * fraction)) if len(batches) > 1 else 0
    return batches[: len(batches) - n_val], batches[len(batches) - n_val :]


def validation_loss(model_trainer: Any, val: Any, device: Any, args: Any) -> float | None:
    """Mean loss of the trainer's model on ``val`` (the trainer's ``test`` when it reports it)."""
    if not val or (isinstance(val, DataLoader) and len(val.dataset) == 0):  # type: ignore[arg-type]
        return None
    try:
        metrics = model_trainer.test(val, device, args)
        if isinstance(metrics, dict) and metrics.get("test_total"):
            return float(metrics["test_loss"]) / float(metrics["test_total"])
    except (NotImplementedError, TypeError, AttributeError):
        pass
    model = model_trainer.model
    if isinstance(val, DataLoader):
        return evaluate(model, val.dataset)[0]
    xs = torch.cat([x for x, _ in val])
    ys = torch.cat([y for _, y in val])
    return evaluate(model, torch.utils.data.TensorDataset(xs, ys))[0]


def train_with_validation(
    model_trainer: Any, w_global: Any, data: Any, client: int, device: Any, args: Any
) -> OrderedDict[str, Any]:
    """Host trainer's ``train`` on the train part, then the validation loss, into the payload."""
    need_val = STATE["need_val"]
    train, val = (
        split_train_val(data, client, STATE["seed"], STATE["val_fraction"])
        if need_val
        else (data, None)
    )
    if w_global is not None:
        model_trainer.set_model_params(w_global)
    model_trainer.train(train, device, args)
    weights = model_trainer.get_model_params()
    loss = validation_loss(model_trainer, val, device, args) if need_val else None
    return attach(weights, client, loss)


# -- server side ---------------------------------------------------------------------------------
def aggregate(model_list: list[tuple[Any, Any]], global_params: Any) -> OrderedDict[str, Any]:
    """fedbalance aggregation of FedML's ``[(sample_num, params), ...]``; returns clean params."""
    agg: Aggregator = STATE["aggregator"]
    updates = [decode(n, params, f"#{i}") for i, (n, params) in enumerate(model_list)]
    result = agg.aggregate(clean_params(global_params), updates, host=STATE["host"])
    params = result.params
    if isinstance(params, torch.Tensor):  # cannot happen for a state dict input
        raise ParameterError("FedML parameters must be a state dict")
    return OrderedDict(params.items())


def state_for(args: Any, host: str) -> dict[str, Any] | None:
    """fedbalance's aggregator and settings for ``args`` in ``host`` (``None``: stock FedML)."""
    chosen = settings(args)
    if chosen is None:
        return None
    name, extra = chosen
    key = (host, name, repr(sorted(extra.items())))
    if STATE.get("key") != key:  # one aggregator (and its state) per process and setting
        from fl_adapters.registry import get_registry

        registry = get_registry()
        cls = registry.aggregator(name)
        STATE.clear()
        STATE.update(
            key=key,
            name=name,
            host=host,
            aggregator=registry.make_aggregator(name, **extra),
            need_val="val_loss" in getattr(cls, "required_metrics", ()),
            val_fraction=float(getattr(args, "val_fraction", 0.1)),
            seed=int(getattr(args, "random_seed", 0) or 0),
        )
        log.info("fedbalance: FedML %s aggregates with %r %s", host, name, extra or "")
    return STATE


def validate(args: Any) -> None:
    """Fail fast on an unknown aggregator name or bad arguments (before any training)."""
    chosen = settings(args)
    if chosen is None:
        return
    from fl_adapters.registry import build_aggregator

    agg = build_aggregator(chosen[0], chosen[1])
    mode = (str(getattr(args, "training_type", "")), str(getattr(args, "backend", "")))
    if mode not in HOSTS:
        raise ParameterError(
            f"fedbalance aggregators run in FedML modes {sorted(HOSTS)}; got training_type/backend {mode}"
        )
    check_optimizer(args, HOSTS[mode], chosen[0], agg)
    check_world_size(args, mode)
    if mode[1] == "GRPC":
        from fl_adapters.fedml.ipconfig import check_grpc

        check_grpc(args)
    check_resume(args)
    if getattr(agg, "mediated", False) and HOSTS[mode] in ("fedml-cross-silo", "fedml-mpi"):
        if getattr(agg, "mediator_epochs", 1) != 1:
            raise ParameterError(
                f"aggregator_args: mediator_epochs must be 1 in FedML {HOSTS[mode]} (each "
                "process trains once a round, as FedML's client counts rounds), got "
                f"{agg.mediator_epochs}"
            )


def check_resume(args: Any) -> None:
    """``checkpoint_dir`` / ``resume_from``: well-formed, and (on the server) a checkpoint this
    run can continue, before any training."""
    from fl_adapters.checkpoint import CheckpointError
    from fl_adapters.fedml import checkpoint

    checkpoint.checkpoint_path(args)
    if checkpoint.resume_path(args) is None or int(getattr(args, "rank", 0) or 0) != 0:
        return
    ckpt = checkpoint.load(args)
    if ckpt.round >= int(args.comm_round):
        raise CheckpointError(
            f"nothing to resume: the checkpoint holds all {ckpt.round} rounds of comm_round "
            f"{int(args.comm_round)}; raise comm_round to train more"
        )


def check_world_size(args: Any, mode: tuple[str, str]) -> None:
    """MPI modes: the process count must be what FedML's config implies.

    With too few processes FedML 0.9.6's MPI simulation does not fail: with
    ``client_num_per_round: 2`` under ``mpirun -np 2`` it trains one client a round, silently.
    FedML's cross-silo init asserts ``worker_num + 1`` processes itself (before this runs);
    here it also needs ``worker_num == client_num_per_round``.
    """
    if mode[1] != "MPI":
        return
    comm = getattr(args, "comm", None)
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    world = int(comm.Get_size())
    per_round = int(args.client_num_per_round)
    if mode[0] == "simulation":
        expected, rule = per_round + 1, f"client_num_per_round + 1 = {per_round + 1}"
    else:
        workers = int(getattr(args, "worker_num", per_round))
        if workers != per_round:
            raise ParameterError(
                f"FedML cross-silo: worker_num ({workers}) must equal client_num_per_round "
                f"({per_round}); every silo trains every round"
            )
        expected, rule = workers + 1, f"worker_num + 1 = {workers + 1}"
    if world != expected:
        raise ParameterError(
            f"FedML {mode[0]} over MPI needs {rule} processes (one server + one per client), "
            f"but mpirun started {world}: run `mpirun -np {expected} ...` or change the config"
        )


def _wrapper(original: Any, host: str, replacement: Any) -> Any:
    """``original`` unless ``self.args`` names a fedbalance aggregator, then ``replacement``."""

    @functools.wraps(original)
    def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
        if state_for(self.args, host) is None:
            return original(self, *a, **kw)
        return replacement(self, original, *a, **kw)

    wrapper._fedbalance = True  # type: ignore[attr-defined]
    return wrapper


def _sp_client_train(self: Any, original: Any, w_global: Any) -> Any:
    if STATE.get("skipping"):  # a round the resumed checkpoint holds
        return w_global
    if "astraea" in STATE:
        # FedML's w_global aliases the shared model, which the previous mediator has trained:
        # every mediator starts from the round's global model, saved before any training.
        return STATE["astraea"].train_slot(self, copy.deepcopy(STATE["round_global"]))
    return train_with_validation(
        self.model_trainer,
        w_global,
        self.local_training_data,
        int(self.client_idx),
        self.device,
        self.args,
    )


def clean_params(params: Any) -> OrderedDict[str, Any]:
    """A FedML model's params without fedbalance's payload keys, on the CPU."""
    return OrderedDict((k, v.detach().cpu()) for k, v in strip(params)[0].items())


def _sp_train(self: Any, original: Any) -> Any:
    from fl_adapters.fedml import checkpoint

    if checkpoint.resume_path(self.args) is not None:
        ckpt = checkpoint.load(self.args)
        ckpt.check_model(
            clean_params(self.model_trainer.get_model_params()), checkpoint.resume_path(self.args)
        )
        self.model_trainer.set_model_params(ckpt.model)
        STATE["aggregator"].load_state_dict(ckpt.aggregator)
        STATE["resume"] = ckpt
        log.info(
            "fedbalance: FedML sp resumes after round %d of %d", ckpt.round, self.args.comm_round
        )
    result = original(self)
    _sp_checkpoint(self, int(self.args.comm_round))
    return result


def _sp_checkpoint(self: Any, rounds_done: int) -> None:
    """sp's checkpoint after ``rounds_done`` rounds, taken as the next round begins (after
    FedML's test, which draws from torch's RNG through its shuffling loaders)."""
    from fl_adapters.fedml import checkpoint

    astraea = STATE.get("astraea")
    checkpoint.save(
        self.args,
        rounds_done,
        self.model_trainer.get_model_params(),
        STATE["aggregator"],
        plan=astraea.planner.plan.as_dict() if astraea is not None else None,
        rng=checkpoint.rng_state(),
    )


def _sp_sampling(self: Any, original: Any, round_idx: Any, *a: Any, **kw: Any) -> Any:
    from fl_adapters.fedml import checkpoint

    ckpt = STATE.get("resume")
    done = int(round_idx)  # rounds completed before this one
    STATE["skipping"] = ckpt is not None and done < ckpt.round
    if ckpt is not None and done == ckpt.round and ckpt.rng is not None:
        checkpoint.restore_rng(ckpt.rng)  # where the checkpointed run stood at this point
    elif done > 0 and not STATE["skipping"]:
        _sp_checkpoint(self, done)
    # The round's global model, before the clients train the shared model object in place.
    STATE["round_global"] = copy.deepcopy(self.model_trainer.get_model_params())
    sampled = original(self, round_idx, *a, **kw)
    agg = STATE["aggregator"]
    if not getattr(agg, "mediated", False):
        return sampled
    if "astraea" not in STATE:
        from fl_adapters.fedml.astraea import SpAstraea

        STATE["astraea"] = SpAstraea(self, agg, STATE["seed"])
        if ckpt is not None:
            check_plan(ckpt.plan, STATE["astraea"].planner.plan.as_dict())
    return STATE["astraea"].sample(sampled)


def _sp_test(self: Any, original: Any, *a: Any, **kw: Any) -> Any:
    if STATE.get("skipping"):  # the checkpointed run tested this round
        return None
    return original(self, *a, **kw)


def _sp_aggregate(self: Any, original: Any, w_locals: list[tuple[Any, Any]]) -> Any:
    if STATE.get("skipping"):  # the model stays the checkpoint's
        return STATE["round_global"]
    if "astraea" in STATE:  # one update per mediator, not per client slot
        w_locals = STATE["astraea"].model_list()
    return aggregate(w_locals, STATE["round_global"])


def _dist_train(self: Any, original: Any, round_idx: Any = None) -> Any:
    self.args.round_idx = round_idx
    data, n = self.train_local, self.local_sample_number
    rad = STATE.get("rad")  # MPI Astraea: this client's data, rebalanced once
    if rad is None:
        params = train_with_validation(
            self.trainer, None, data, int(self.client_index), self.device, self.args
        )
        return params, n
    from fl_adapters.astraea import RebalancedCache
    from fl_adapters.fedml.astraea import seeded_training, silo_data

    cache = STATE.setdefault("silo_data", RebalancedCache())
    data, n = silo_data(cache, int(self.client_index), self.train_local, rad, STATE["seed"])
    round_number = STATE.get("astraea_round") or int(round_idx or 0) + 1  # the server's
    with seeded_training(STATE["seed"], int(self.client_index), round_number, 0):
        params = train_with_validation(
            self.trainer, None, data, int(self.client_index), self.device, self.args
        )
    return params, n


def _silo_update_model(self: Any, original: Any, weights: Any) -> Any:
    from fl_adapters.fedml.astraea import take_rad

    clean, rad, round_number = take_rad(weights)
    if rad is not None:
        STATE["rad"], STATE["astraea_round"] = rad, round_number
    return original(self, clean)


def _silo_astraea(manager: Any) -> Any:
    """The MPI server's Astraea state, built on first use (``None``: not mediated)."""
    if not getattr(STATE["aggregator"], "mediated", False):
        return None
    if "silo_astraea" not in STATE:
        from fl_adapters.fedml.astraea import SiloAstraea

        STATE["silo_astraea"] = SiloAstraea(
            STATE["aggregator"],
            manager.aggregator.train_data_local_dict,
            int(manager.args.client_num_in_total),
        )
    return STATE["silo_astraea"]


def _silo_send_init(self: Any, original: Any) -> Any:
    astraea = _silo_astraea(self)
    if astraea is None:
        return original(self)
    from fl_adapters.fedml.astraea import with_rad

    astraea.plan_round(self.client_id_list_in_this_round, self.data_silo_index_list)
    STATE["planned_round"] = "init"
    params = with_rad(
        self.aggregator.get_global_model_params(), astraea.planner.rad, self.args.round_idx + 1
    )
    for hop in astraea.first_hops():  # the round's model goes to each mediator's first silo
        self.send_message_init_config(hop.owner, params, hop.clients[0], None, None)
    return None


def _silo_receive(self: Any, original: Any, msg_params: Any) -> Any:
    astraea = _silo_astraea(self)
    if astraea is None:
        return original(self, msg_params)
    from fedml.cross_silo.server.message_define import MyMessage

    def pass_on(hop: Any, params: Any) -> None:
        with _forwarding():
            self.send_message_sync_model_to_client(hop.owner, params, hop.clients[0])

    sender = _relay(self, astraea, msg_params, MyMessage, pass_on)
    if sender is None:
        return None
    _all_uploaded(self.aggregator, self.aggregator.client_num, self.client_real_ids.index(sender))
    return original(self, msg_params)


def _relay(self: Any, astraea: Any, msg_params: Any, keys: Any, pass_on: Any) -> int | None:
    """A mediator's model came back to the server (MPI and cross-silo alike): the server plays
    the mediator and ``pass_on(hop, params)`` sends it to the chain's next client; ``None``
    until every mediator of the round is done, then the last sender."""
    from fl_adapters.fedml.astraea import with_rad

    sender = int(msg_params.get(keys.MSG_ARG_KEY_SENDER))
    params = msg_params.get(keys.MSG_ARG_KEY_MODEL_PARAMS)
    nxt = astraea.received(sender, params, int(msg_params.get(keys.MSG_ARG_KEY_NUM_SAMPLES)))
    if nxt is not None:
        pass_on(nxt, with_rad(params, astraea.planner.rad, self.args.round_idx + 1))
        return None
    return sender if astraea.done() else None


def _all_uploaded(aggregator: Any, count: int, sender: int) -> None:
    """Every mediator is done: FedML aggregates (our wrapper reads the mediators' models), tests
    and starts the next round. Its all-received check wants one flag per client process."""
    for i in range(count):
        if i != sender:
            aggregator.flag_client_model_uploaded_dict[i] = True


@contextlib.contextmanager
def _forwarding() -> Iterator[None]:
    """A model the server passes along a mediator's chain: the send wrappers let it through."""
    STATE["forwarding"] = True
    try:
        yield
    finally:
        STATE["forwarding"] = False


def _silo_send_sync(
    self: Any, original: Any, receive_id: Any, params: Any, client_index: Any, *a: Any, **kw: Any
) -> Any:
    astraea = _silo_astraea(self)
    if astraea is None or STATE.get("forwarding"):
        return original(self, receive_id, params, client_index, *a, **kw)
    if self.args.round_idx + 1 >= self.round_num:  # the final model: every silo, then finish
        return original(self, receive_id, params, client_index, *a, **kw)
    from fl_adapters.fedml.astraea import with_rad

    if STATE.get("planned_round") != self.args.round_idx:  # FedML has picked the next round
        astraea.plan_round(self.client_id_list_in_this_round, self.data_silo_index_list)
        STATE["planned_round"] = self.args.round_idx
    if int(receive_id) not in astraea.first_receivers():
        return None, None
    # FedML sends the next round's model before it counts the round it has just finished.
    params = with_rad(params, astraea.planner.rad, self.args.round_idx + 2)
    return original(self, receive_id, params, client_index, *a, **kw)


def _silo_connection_ready(self: Any, original: Any, msg_params: Any) -> Any:
    if str(getattr(self.args, "backend", "")) == "GRPC" and not self.has_sent_online_msg:
        from fl_adapters.fedml.ipconfig import wait_for_server

        wait_for_server(self.args)  # FedML's silo dies if its one status send finds no server
    return original(self, msg_params)


def _server_connection_ready(self: Any, original: Any, msg_params: Any) -> Any:
    if not self.is_initialized:
        _resume_server(self)  # before FedML picks the first round's silos
    if str(getattr(self.args, "backend", "")) == "GRPC" and not self.is_initialized:
        from fl_adapters.fedml.ipconfig import expect_silos

        expect_silos(self)  # FedML's server would wait forever for a silo never started
    return original(self, msg_params)


def _resume_server(manager: Any) -> None:
    """MPI simulation / cross-silo server: start at the checkpoint's round with its model."""
    from fl_adapters.fedml import checkpoint

    if "first_round" in STATE or checkpoint.resume_path(manager.args) is None:
        return
    ckpt = checkpoint.load(manager.args)
    astraea = _silo_astraea(manager)
    if astraea is not None:
        check_plan(ckpt.plan, astraea.planner.plan.as_dict())
    ckpt.check_model(
        clean_params(manager.aggregator.get_global_model_params()),
        checkpoint.resume_path(manager.args),
    )
    manager.aggregator.set_global_model_params(ckpt.model)
    STATE["aggregator"].load_state_dict(ckpt.aggregator)
    manager.args.round_idx = ckpt.round
    STATE["first_round"] = ckpt.round
    log.info(
        "fedbalance: FedML %s resumes after round %d of %d",
        STATE["host"],
        ckpt.round,
        manager.args.comm_round,
    )


def _server_checkpoint(aggregator: Any, params: Any) -> None:
    """MPI simulation / cross-silo: the server's checkpoint after the round it aggregated."""
    from fl_adapters.fedml import checkpoint

    astraea = STATE.get("silo_astraea")
    checkpoint.save(
        aggregator.args,
        aggregator.args.round_idx + 1,
        params,
        STATE["aggregator"],
        plan=astraea.planner.plan.as_dict() if astraea is not None else None,
    )


def _tag_init(self: Any, original: Any, receive_id: Any, params: Any, *a: Any, **kw: Any) -> Any:
    """A resumed server's first messages carry its round: FedML's clients count rounds
    themselves (and stop on the count), from 0 unless told."""
    if "first_round" in STATE and isinstance(params, dict):
        from fl_adapters.fedml.payload import KEY_ROUND

        if KEY_ROUND not in params:
            params = OrderedDict(params)
            params[KEY_ROUND] = torch.tensor(self.args.round_idx + 1, dtype=torch.int64)
    return original(self, receive_id, params, *a, **kw)


def _server_round(msg_params: Any) -> int | None:
    """The server's round number (from 1) a downlink carries, if it carries one."""
    from fl_adapters.fedml.payload import KEY_ROUND

    params = msg_params.get("model_params")
    if isinstance(params, dict) and KEY_ROUND in params:
        return int(params[KEY_ROUND])
    return None


def _mpi_client_init(self: Any, original: Any, msg_params: Any) -> Any:
    server_round = _server_round(msg_params)
    out = original(self, msg_params)  # counts from round 0 and trains it
    if server_round is not None:
        self.args.round_idx = server_round - 1
        if server_round >= int(self.num_rounds):  # a resumed run's only round: no sync follows,
            self.finish()  # and FedML's clients finish only after one
    return out


def _mpi_client_sync(self: Any, original: Any, msg_params: Any) -> Any:
    server_round = _server_round(msg_params)
    if server_round is not None:  # FedML adds one, trains, and stops after the last round
        self.args.round_idx = server_round - 2
    return original(self, msg_params)


def _silo_client_init(self: Any, original: Any, msg_params: Any) -> Any:
    server_round = _server_round(msg_params)
    out = original(self, msg_params)  # trains round 0 and counts it
    if server_round is not None:
        self.round_idx = server_round
    return out


def _silo_client_sync(self: Any, original: Any, msg_params: Any) -> Any:
    server_round = _server_round(msg_params)
    if server_round is not None:  # FedML trains while its count is below comm_round
        self.round_idx = server_round - 1
    return original(self, msg_params)


def _mpi_sampling(self: Any, original: Any, *a: Any, **kw: Any) -> Any:
    sampled = original(self, *a, **kw)
    STATE["mpi_sampled"] = [int(c) for c in sampled]  # the relay plans the round from it
    return sampled


def _mpi_plan(manager: Any) -> Any:
    """MPI simulation: the Astraea relay of the round FedML has just sampled (planned once)."""
    astraea = _silo_astraea(manager)
    if astraea is not None and STATE.get("planned_round") != manager.args.round_idx:
        workers = list(range(1, manager.size))  # worker w trains FedML's client_indexes[w-1]
        astraea.plan_round(workers, STATE["mpi_sampled"][: len(workers)])
        STATE["planned_round"] = manager.args.round_idx
    return astraea


def _mpi_send_init(self: Any, original: Any) -> Any:
    _resume_server(self)
    if not getattr(STATE["aggregator"], "mediated", False):
        return original(self)
    from fl_adapters.fedml.astraea import with_rad

    self.aggregator.client_sampling(
        self.args.round_idx, self.args.client_num_in_total, self.args.client_num_per_round
    )
    astraea = _mpi_plan(self)
    params = with_rad(
        self.aggregator.get_global_model_params(), astraea.planner.rad, self.args.round_idx + 1
    )
    for hop in astraea.first_hops():  # the round's model goes to each mediator's first worker
        self.send_message_init_config(hop.owner, params, hop.clients[0])
    return None


def _mpi_receive(self: Any, original: Any, msg_params: Any) -> Any:
    astraea = _silo_astraea(self)
    if astraea is None:
        return original(self, msg_params)
    from fedml.simulation.mpi.fedavg.message_define import MyMessage

    def pass_on(hop: Any, params: Any) -> None:
        if self.args.round_idx == STATE.get("first_round", 0):  # a worker's first message: init
            self.send_message_init_config(hop.owner, params, hop.clients[0])
        else:
            with _forwarding():
                self.send_message_sync_model_to_client(hop.owner, params, hop.clients[0])

    sender = _relay(self, astraea, msg_params, MyMessage, pass_on)
    if sender is None:
        return None
    _all_uploaded(self.aggregator, self.aggregator.worker_num, sender - 1)
    return original(self, msg_params)


def _mpi_send_sync(
    self: Any, original: Any, receive_id: Any, params: Any, client_index: Any
) -> Any:
    if not getattr(STATE["aggregator"], "mediated", False) or STATE.get("forwarding"):
        return original(self, receive_id, params, client_index)
    from fl_adapters.fedml.astraea import with_rad

    astraea = _mpi_plan(self)
    if int(receive_id) not in astraea.first_receivers():
        return None
    # FedML has counted the finished round before sending the next one's model.
    params = with_rad(params, astraea.planner.rad, self.args.round_idx + 1)
    return original(self, receive_id, params, client_index)


def _mpi_aggregate(self: Any, original: Any) -> Any:
    if "silo_astraea" in STATE:  # one update per mediator, not per worker
        model_list = STATE["silo_astraea"].model_list()
    else:
        model_list = [(self.sample_num_dict[i], self.model_dict[i]) for i in range(self.worker_num)]
    averaged = aggregate(model_list, self.get_global_model_params())
    self.set_global_model_params(averaged)
    _server_checkpoint(self, averaged)
    return averaged


def _cross_silo_aggregate(self: Any, original: Any) -> Any:
    if "silo_astraea" in STATE:  # one update per mediator, not per silo
        model_list = STATE["silo_astraea"].model_list()
    else:
        model_list = [(self.sample_num_dict[i], self.model_dict[i]) for i in range(self.client_num)]
    model_list, idxes = self.aggregator.on_before_aggregation(
        model_list
    )  # FedML's DP/defence hooks
    averaged = aggregate(model_list, self.get_global_model_params())
    averaged = self.aggregator.on_after_aggregation(averaged)
    self.set_global_model_params(averaged)
    _server_checkpoint(self, averaged)
    return averaged, model_list, idxes


#: (module, class, method, host, replacement)
TARGETS = (
    ("fedml.simulation.sp.fedavg.client", "Client", "train", "fedml-sp", _sp_client_train),
    (
        "fedml.simulation.sp.fedavg.fedavg_api",
        "FedAvgAPI",
        "_client_sampling",
        "fedml-sp",
        _sp_sampling,
    ),
    ("fedml.simulation.sp.fedavg.fedavg_api", "FedAvgAPI", "_aggregate", "fedml-sp", _sp_aggregate),
    # Checkpoints and resume (fl_adapters.fedml.checkpoint).
    ("fedml.simulation.sp.fedavg.fedavg_api", "FedAvgAPI", "train", "fedml-sp", _sp_train),
    *(
        ("fedml.simulation.sp.fedavg.fedavg_api", "FedAvgAPI", test, "fedml-sp", _sp_test)
        for test in ("_local_test_on_all_clients", "_local_test_on_validation_set")
    ),
    (
        "fedml.simulation.mpi.fedavg.FedAvgServerManager",
        "FedAVGServerManager",
        "send_message_init_config",
        "fedml-mpi",
        _tag_init,
    ),
    (
        "fedml.simulation.mpi.fedavg.FedAvgClientManager",
        "FedAVGClientManager",
        "handle_message_init",
        "fedml-mpi",
        _mpi_client_init,
    ),
    (
        "fedml.simulation.mpi.fedavg.FedAvgClientManager",
        "FedAVGClientManager",
        "handle_message_receive_model_from_server",
        "fedml-mpi",
        _mpi_client_sync,
    ),
    (
        "fedml.cross_silo.server.fedml_server_manager",
        "FedMLServerManager",
        "send_message_init_config",
        "fedml-cross-silo",
        _tag_init,
    ),
    (
        "fedml.cross_silo.client.fedml_client_master_manager",
        "ClientMasterManager",
        "handle_message_init",
        "fedml-cross-silo",
        _silo_client_init,
    ),
    (
        "fedml.cross_silo.client.fedml_client_master_manager",
        "ClientMasterManager",
        "handle_message_receive_model_from_server",
        "fedml-cross-silo",
        _silo_client_sync,
    ),
    (
        "fedml.simulation.mpi.fedavg.FedAVGTrainer",
        "FedAVGTrainer",
        "train",
        "fedml-mpi",
        _dist_train,
    ),
    (
        "fedml.simulation.mpi.fedavg.FedAVGAggregator",
        "FedAVGAggregator",
        "aggregate",
        "fedml-mpi",
        _mpi_aggregate,
    ),
    # MPI simulation Astraea: the server relays each mediator's model between workers.
    (
        "fedml.simulation.mpi.fedavg.FedAVGTrainer",
        "FedAVGTrainer",
        "update_model",
        "fedml-mpi",
        _silo_update_model,
    ),
    (
        "fedml.simulation.mpi.fedavg.FedAVGAggregator",
        "FedAVGAggregator",
        "client_sampling",
        "fedml-mpi",
        _mpi_sampling,
    ),
    (
        "fedml.simulation.mpi.fedavg.FedAvgServerManager",
        "FedAVGServerManager",
        "send_init_msg",
        "fedml-mpi",
        _mpi_send_init,
    ),
    (
        "fedml.simulation.mpi.fedavg.FedAvgServerManager",
        "FedAVGServerManager",
        "handle_message_receive_model_from_client",
        "fedml-mpi",
        _mpi_receive,
    ),
    (
        "fedml.simulation.mpi.fedavg.FedAvgServerManager",
        "FedAVGServerManager",
        "send_message_sync_model_to_client",
        "fedml-mpi",
        _mpi_send_sync,
    ),
    (
        "fedml.cross_silo.client.fedml_trainer",
        "FedMLTrainer",
        "train",
        "fedml-cross-silo",
        _dist_train,
    ),
    (
        "fedml.cross_silo.server.fedml_aggregator",
        "FedMLAggregator",
        "aggregate",
        "fedml-cross-silo",
        _cross_silo_aggregate,
    ),
    (
        "fedml.cross_silo.client.fedml_trainer",
        "FedMLTrainer",
        "update_model",
        "fedml-cross-silo",
        _silo_update_model,
    ),
    (
        "fedml.cross_silo.server.fedml_server_manager",
        "FedMLServerManager",
        "send_init_msg",
        "fedml-cross-silo",
        _silo_send_init,
    ),
    (
        "fedml.cross_silo.server.fedml_server_manager",
        "FedMLServerManager",
        "handle_message_receive_model_from_client",
        "fedml-cross-silo",
        _silo_receive,
    ),
    (
        "fedml.cross_silo.server.fedml_server_manager",
        "FedMLServerManager",
        "send_message_sync_model_to_client",
        "fedml-cross-silo",
        _silo_send_sync,
    ),
    (
        "fedml.cross_silo.client.fedml_client_master_manager",
        "ClientMasterManager",
        "handle_message_connection_ready",
        "fedml-cross-silo",
        _silo_connection_ready,
    ),
    (
        "fedml.cross_silo.server.fedml_server_manager",
        "FedMLServerManager",
        "handle_message_connection_ready",
        "fedml-cross-silo",
        _server_connection_ready,
    ),
)


def _secure_targets() -> tuple[tuple[str, str, str, str, Any], ...]:
    from fl_adapters.fedml import secure

    return tuple((m, c, meth, "fedml-cross-silo", r) for m, c, meth, r in secure.TARGETS)


def arm() -> None:
    """Wrap FedML's aggregation points and client training (called right after ``import fedml``).

    Every target is looked up before the first patch, so a FedML whose modules or methods have
    moved raises here with nothing patched (the autoload then leaves FedML stock).
    """
    import fedml
    from fedml.runner import FedMLRunner

    from fl_adapters.fedml import partition

    if getattr(fedml.init, "_fedbalance", False):
        return
    targets = []
    for module, cls_name, method, host, replacement in (*TARGETS, *_secure_targets()):
        cls = getattr(importlib.import_module(module), cls_name)
        targets.append((cls, method, _wrapper(getattr(cls, method), host, replacement)))
    original_init = fedml.init
    original_runner = FedMLRunner.__init__

    @functools.wraps(original_init)
    def init(*a: Any, **kw: Any) -> Any:
        args = original_init(*a, **kw)
        validate(args)
        return args

    @functools.wraps(original_runner)
    def runner_init(self: Any, args: Any, *a: Any, **kw: Any) -> None:
        validate(args)  # before FedML's __init__: the MPI modes train inside it
        original_runner(self, args, *a, **kw)

    init._fedbalance = True  # type: ignore[attr-defined]
    patches = PATCHES["fedml"]
    for cls, method, wrapper in targets:
        patches.set(cls, method, wrapper)
    partition.arm(patches)
    patches.set(fedml, "init", init)
    patches.set(FedMLRunner, "__init__", runner_init)


def disarm() -> None:
    """Undo :func:`arm` (stock FedML again in this process)."""
    PATCHES["fedml"].undo()
