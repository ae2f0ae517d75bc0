"""What fedbalance's FedML 0.9.6 patches share, in every mode: the settings, the checks that
stop a run before training, the run state, client training with validation and aggregation
(how the patches use them: docs/hosts/fedml.md). The wrappers decide on each call from
``self.args``, not in ``FedMLRunner``, so scripts that build FedML's simulators, ``Server`` or
``Client`` directly are covered too.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Subset

from fl_adapters import client_metrics
from fl_adapters._training import evaluate, stream_seed, training_clock
from fl_adapters.astraea import RebalancedCache, refuse_carried_optimizer
from fl_adapters.checkpoint import Checkpoint, CheckpointError
from fl_adapters.client_metrics import measure, requested, splits
from fl_adapters.config import check_eval_keys
from fl_adapters.fedml import checkpoint
from fl_adapters.fedml.field import check_field
from fl_adapters.fedml.ipconfig import check_grpc
from fl_adapters.fedml.payload import attach, decode, strip
from fl_adapters.inputs import brief, check_tree
from fl_adapters.registry import build_aggregator
from fl_aggregators import Aggregator, NothingAggregated
from fl_checks import ParameterError, shown

if TYPE_CHECKING:
    from fl_adapters.fedml.astraea import SiloAstraea, SpAstraea
    from fl_aggregators.base import Weighing

log = logging.getLogger(__name__)

HOSTS = {
    ("simulation", "sp"): "fedml-sp",
    ("simulation", "MPI"): "fedml-mpi",
    ("cross_silo", "MPI"): "fedml-cross-silo",
    # FedML's own gRPC transport: one process per rank, started by hand or by `fedbalance run`.
    # The same host name as over MPI: the wrappers and the records are the same.
    ("cross_silo", "GRPC"): "fedml-cross-silo",
}
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


@dataclass
class RunState:
    """What fedbalance holds for the FedML run of this process: one aggregator (with its state
    across rounds) per host and setting, and where each mode's patches stand in the run."""

    key: tuple[str, str, str]  #: (host, aggregator name, its arguments): a new one starts afresh
    host: str
    aggregator: Aggregator
    metrics: tuple[str, ...]  #: the client metrics the aggregator asks for
    val_fraction: float
    seed: int
    # sp simulation
    resume: Checkpoint | None = None  #: the checkpoint the run resumes from
    skipping: bool = False  #: this round is one the checkpoint holds: nothing trains
    round_global: Any = None  #: the round's global model, before the clients train it in place
    astraea: SpAstraea | None = None
    # MPI simulation and cross-silo: a client process
    rad: Any = None  #: Astraea: this client's rebalancing, sent once by the server
    astraea_round: int | None = None  #: the server's round the rebalancing came with
    silo_data: RebalancedCache = field(default_factory=RebalancedCache)
    # MPI simulation and cross-silo: the server process
    silo_astraea: SiloAstraea | None = None
    planned_round: int | str | None = None  #: the round the Astraea relay is planned for
    forwarding: bool = False  #: a mediator's model is being passed along its chain
    told_second_pass: bool = False  #: said that the server's figures cost a pass more
    first_round: int | None = None  #: a resumed server's first round
    mpi_sampled: list[int] = field(default_factory=list)  #: FedML's clients of the MPI round
    lsa_weighing: Weighing | None = None  #: LightSecAgg: the weights of the round being masked


_RUN: RunState | None = None


def current() -> RunState:
    """The run state :func:`state_for` made (patches call it once fedbalance's path is taken)."""
    if _RUN is None:
        raise RuntimeError("no fedbalance FedML run in this process (state_for never ran)")
    return _RUN


def check_optimizer(args: Any, host: str, name: str, agg: Aggregator) -> None:
    """Stop before training when ``federated_optimizer`` bypasses fedbalance's aggregation:
    the aggregator the user wrote would otherwise be silently unused. Cross-silo ``LSA`` runs
    the aggregators that can work on a masked sum (:mod:`fl_adapters.fedml.secure`)."""
    optimizer = str(getattr(args, "federated_optimizer", WRAPPED_OPTIMIZER) or WRAPPED_OPTIMIZER)
    if optimizer == WRAPPED_OPTIMIZER:
        return
    if optimizer == SECURE_OPTIMIZER and host == "fedml-cross-silo":
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
    check_field(
        getattr(args, "prime_number", None),
        getattr(args, "precision_parameter", None),
        lsa_silos(args),
    )


def lsa_silos(args: Any) -> int:
    """How many silos FedML's LightSecAgg codes masks for (its ``worker_num``)."""
    silos = getattr(args, "worker_num", None) or getattr(args, "client_num_per_round", 1)
    if isinstance(silos, bool) or not isinstance(silos, int) or silos < 1:
        raise ParameterError(f"worker_num must be a positive int, got {silos!r}")
    return silos


def settings(args: Any) -> tuple[str, dict[str, Any]] | None:
    name = getattr(args, "aggregator", None)
    if name is None or (isinstance(name, str) and not name.strip()):
        return None
    if not isinstance(name, str):
        raise ParameterError(f"aggregator must be a fedbalance plugin name, got {name!r}")
    extra = getattr(args, "aggregator_args", None) or {}
    # FedML read the YAML: bound what it built (aliases) before anything formats it.
    check_tree(extra, "aggregator_args")
    if not isinstance(extra, dict):
        raise ParameterError(f"aggregator_args must be a mapping, got {brief(extra)}")
    return name.strip(), extra


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


def validation(
    model_trainer: Any, val: Any, device: Any, args: Any
) -> client_metrics.Evaluation | None:
    """The trainer's model on ``val`` (the trainer's own ``test`` when it reports its loss and
    count; ``None`` for an empty ``val``)."""
    if not val or (isinstance(val, DataLoader) and len(val.dataset) == 0):  # type: ignore[arg-type]
        return None
    try:
        metrics = model_trainer.test(val, device, args)
        if isinstance(metrics, dict) and metrics.get("test_total"):
            n = float(metrics["test_total"])
            correct = float(metrics.get("test_correct", math.nan))
            return client_metrics.Evaluation(float(metrics["test_loss"]) / n, correct / n, int(n))
    except (NotImplementedError, TypeError, AttributeError):
        pass
    if isinstance(val, DataLoader):
        return evaluate(model_trainer.model, val.dataset)
    xs = torch.cat([x for x, _ in val])
    ys = torch.cat([y for _, y in val])
    return evaluate(model_trainer.model, torch.utils.data.TensorDataset(xs, ys))


def train_with_validation(
    model_trainer: Any, w_global: Any, data: Any, client: int, device: Any, args: Any
) -> OrderedDict[str, Any]:
    """Host trainer's ``train`` on the train part, then the client metrics the aggregator asks
    for (on the validation part), into the payload."""
    run = current()
    need_val = "val" in splits(run.metrics)
    train, val = (
        split_train_val(data, client, run.seed, run.val_fraction) if need_val else (data, None)
    )
    if w_global is not None:
        model_trainer.set_model_params(w_global)
    with training_clock(client):
        model_trainer.train(train, device, args)
    weights = model_trainer.get_model_params()
    metrics = measure(run.metrics, lambda: validation(model_trainer, val, device, args), client)
    return attach(weights, client, metrics)


def aggregate(model_list: list[tuple[Any, Any]], global_params: Any) -> OrderedDict[str, Any]:
    """fedbalance aggregation of FedML's ``[(sample_num, params), ...]``; returns clean params."""
    run = current()
    updates = [decode(n, params, f"#{i}") for i, (n, params) in enumerate(model_list)]
    with ending_the_job(run):
        result = run.aggregator.aggregate(clean_params(global_params), updates, host=run.host)
    params = result.params
    if isinstance(params, torch.Tensor):  # cannot happen for a state dict input
        raise ParameterError("FedML parameters must be a state dict")
    return OrderedDict(params.items())


@contextlib.contextmanager
def ending_the_job(run: RunState) -> Iterator[None]:
    """A run that learns nothing (:class:`~fl_aggregators.NothingAggregated`) ends the FedML job.

    In the sp simulation the error simply propagates. In MPI and cross-silo the server
    aggregates inside FedML's message loop, where an exception leaves every process waiting
    forever: the server says why on stderr and exits 1, and mpirun (or fedbalance's supervisor)
    stops the rest, as for any dead rank.
    """
    try:
        yield
    except NothingAggregated as e:
        if run.host == "fedml-sp":
            raise
        log.error("fedbalance: FedML %s server stops the job: %s", run.host, e)
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)


def clean_params(params: Any) -> OrderedDict[str, Any]:
    """A FedML model's params without fedbalance's payload keys, on the CPU."""
    return OrderedDict((k, v.detach().cpu()) for k, v in strip(params)[0].items())


def state_for(args: Any, host: str) -> RunState | None:
    """fedbalance's aggregator and settings for ``args`` in ``host`` (``None``: stock FedML)."""
    chosen = settings(args)
    if chosen is None:
        return None
    name, extra = chosen
    key = (host, name, repr(sorted(extra.items())))
    global _RUN
    if _RUN is None or _RUN.key != key:  # one aggregator (and its state) per process and setting
        agg = build_aggregator(name, extra)
        _RUN = RunState(
            key=key,
            host=host,
            aggregator=agg,
            metrics=requested(agg),
            val_fraction=float(getattr(args, "val_fraction", 0.1)),
            seed=int(getattr(args, "random_seed", 0) or 0),
        )
        log.info("fedbalance: FedML %s aggregates with %r %s", host, name, extra or "")
    return _RUN


def check_before_init(args: Any) -> tuple[str, str] | None:
    """What the config alone decides: the aggregator and its arguments, the mode, the
    optimizer and evaluation keys beside it. The mode; ``None`` without an ``aggregator`` key.

    The patched ``fedml.init`` runs this before FedML's own init, so a refused config stops
    before FedML sets up the process and asks its MLOps server for settings (offline, five
    tries half a second apart)."""
    chosen = settings(args)
    if chosen is None:
        return None
    agg = build_aggregator(chosen[0], chosen[1])
    mode = (str(getattr(args, "training_type", "")), str(getattr(args, "backend", "")))
    if mode not in HOSTS:
        raise ParameterError(
            f"fedbalance aggregators run in FedML modes {sorted(HOSTS)}; got training_type/backend {mode}"
        )
    check_optimizer(args, HOSTS[mode], chosen[0], agg)
    refuse_carried_optimizer(
        agg, f"FedML {HOSTS[mode]} trains each client with its ModelTrainer's own optimizer"
    )
    check_evaluation(args, HOSTS[mode])
    if getattr(agg, "mediated", False) and HOSTS[mode] in ("fedml-cross-silo", "fedml-mpi"):
        if getattr(agg, "mediator_epochs", 1) != 1:
            raise ParameterError(
                f"aggregator_args: mediator_epochs must be 1 in FedML {HOSTS[mode]} (each "
                "process trains once a round, as FedML's client counts rounds), got "
                f"{agg.mediator_epochs}"
            )
    return mode


def validate(args: Any) -> None:
    """Fail fast on an unknown aggregator name or bad arguments (before any training):
    :func:`check_before_init`, then what needs FedML's init (the processes, the gRPC ranks, the
    checkpoint on the server)."""
    mode = check_before_init(args)
    if mode is None:
        return
    check_world_size(args, mode)
    if mode[1] == "GRPC":
        check_grpc(args)
    check_resume(args)


@dataclass(frozen=True)
class Evaluation:
    """Which rounds and clients a run evaluates, with the meaning these keys have on every
    host (``fl_adapters._training.evaluates`` and ``evaluated_clients``): rounds ``every``,
    ``2 every``, ... and the last; a ``fraction`` of the clients, drawn per round from the seed.
    """

    every: int
    fraction: float


def evaluation(args: Any) -> Evaluation | None:
    """``validation_args: {eval_every, eval_fraction}`` (fedbalance's keys, which ``fedbalance
    run`` writes), or ``None`` when neither is set and FedML's ``frequency_of_the_test`` rules.
    """
    every, fraction = getattr(args, "eval_every", None), getattr(args, "eval_fraction", None)
    if every is None and fraction is None:
        return None
    every, fraction = 1 if every is None else every, 1.0 if fraction is None else fraction
    check_eval_keys(every, fraction)
    return Evaluation(every, float(fraction))


def check_evaluation(args: Any, host: str) -> None:
    """``eval_every`` / ``eval_fraction`` before any training: each takes effect, or the run
    stops saying why."""
    chosen = evaluation(args)
    if chosen is None:
        return
    freq = getattr(args, "frequency_of_the_test", 1)
    if freq != 1:
        raise ParameterError(
            f"eval_every replaces FedML's frequency_of_the_test (which tests rounds 1, 1 + f, "
            f"..., not f, 2f, ...): set frequency_of_the_test: 1 beside it, got {shown(freq)}"
        )
    if chosen.fraction < 1 and host != "fedml-sp":
        raise ParameterError(
            f"eval_fraction must be 1 in FedML {host}: its server tests the global test set "
            f"(one evaluation, not the clients' splits); got {chosen.fraction!r}"
        )


def check_resume(args: Any) -> None:
    """``checkpoint_dir`` / ``resume_from``: well-formed, and (on the server) a checkpoint this
    run can continue, before any training."""
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
