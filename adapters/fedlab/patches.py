"""Makes a stock FedLab script aggregate with a fedbalance plugin, chosen by environment
(``FEDBALANCE_AGGREGATOR``, ``FEDBALANCE_AGGREGATOR_ARGS``, as FedLab has no config files).

What :func:`arm` patches when FedLab is imported, and how to turn it off, is in
``docs/hosts/fedlab.md`` (item 1): the handler aggregates with one stateful aggregator instead
of FedLab's unweighted ``fedavg_aggregate``, the trainers append ``[client_id, num_samples,
*metrics]`` (the client metrics the aggregator asks for, :mod:`fl_adapters.client_metrics`). With ``astraea`` the trainers train
each mediator's chain on rebalanced data, ``SyncServerHandler.load`` waits for one package per
mediator, and over ``DistNetwork`` the managers exchange label counts once and relay the chains
(``docs/astraea.md``, FedLab rows).

A handler or trainer class whose own code bypasses the patched methods is refused when it is
constructed (:func:`check_class`; the list is in ``docs/hosts/beside.md``): the aggregator
would otherwise be silently unused. fedbalance's own classes (``_fedbalance_native``)
aggregate themselves and pass.
Client ids in the records are the ids FedLab hands the trainer (local ids in a cross-process
run with serial trainers).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

from fl_adapters._training import evaluate, stream_seed
from fl_adapters.astraea import (
    AstraeaPlanner,
    RebalancedCache,
    dataset_tensors,
    refuse_carried_optimizer,
    run_mediator,
)
from fl_adapters.autoload import PATCHES
from fl_adapters.client_metrics import measure, requested
from fl_adapters.fedlab.payload import encode, pack_meta
from fl_adapters.fedlab.spec import AGGREGATOR_ENV
from fl_adapters.inputs import brief, load_json
from fl_adapters.registry import get_registry
from fl_checks import ParameterError

log = logging.getLogger(__name__)

ENV_AGGREGATOR = AGGREGATOR_ENV
ENV_ARGS = "FEDBALANCE_AGGREGATOR_ARGS"
ENV_SEED = "FEDBALANCE_SEED"
VAL_FRACTION = 0.1
_armed: dict[str, Any] = {}


def settings() -> tuple[str, dict[str, Any]] | None:
    """``(aggregator name, args)`` from the environment, or ``None`` when unset."""
    name = os.environ.get(ENV_AGGREGATOR, "").strip()
    if not name:
        return None
    raw = os.environ.get(ENV_ARGS, "").strip() or "{}"
    args = load_json(raw, ENV_ARGS)  # InputError (a ValueError) names the variable
    if not isinstance(args, dict):
        raise ParameterError(f"{ENV_ARGS} must be a JSON object, got {brief(args)}")
    return name, args


def train_val(dataset: Any, client: int) -> tuple[Any, Any]:
    """A client's training and validation data from a FedLab ``FedDataset``."""
    train = dataset.get_dataset(client, "train")
    try:
        val = dataset.get_dataset(client, "val")
        if val is not None and len(val) > 0:
            return train, val
    except (NotImplementedError, KeyError, ValueError, IndexError, FileNotFoundError, TypeError):
        pass
    n = len(train)
    seed = stream_seed("fedlab-autoload-val", int(os.environ.get(ENV_SEED, "0")), client)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, int(round(n * VAL_FRACTION))) if n > 1 else 0
    return Subset(train, perm[n_val:]), Subset(train, perm[:n_val])


def _owner(cls: type, attr: str) -> str:
    """Where ``cls`` gets ``attr`` from: ``module.Class``."""
    for klass in cls.__mro__:
        if attr in vars(klass):
            return f"{klass.__module__}.{klass.__qualname__}"
    return "nowhere"


def _refuse(cls: type, name: str, why: str, works: str) -> ValueError:
    return ValueError(
        f"{ENV_AGGREGATOR}={name} cannot take effect with FedLab's {cls.__qualname__}: {why}, "
        f"so {name} would be silently unused. Use {works}, or unset {ENV_AGGREGATOR} to run "
        f"{cls.__qualname__} stock"
    )


def check_class(
    cls: type, name: str, patched: dict[type, dict[str, Any]], works: str, other: str
) -> None:
    """Refuse a handler or trainer class whose own code bypasses the patches (``patched``:
    base -> method name -> the patch; a trainer's attach the metadata the aggregator needs):
    one that overrides a patched method, or derives from none of the bases (``other``)."""
    if getattr(cls, "_fedbalance_native", False):
        return
    for base, methods in patched.items():
        if issubclass(cls, base):
            for method, patch in methods.items():
                if getattr(cls, method) is not patch:
                    why = f"its {method} ({_owner(cls, method)}) replaces {base.__qualname__}'s"
                    raise _refuse(cls, name, why, works)
            return
    raise _refuse(cls, name, other, works)


def _checked_init(original: Any, check: Any) -> Any:
    """``original`` (an ``__init__``), after ``check`` of the class being built."""

    def __init__(self: Any, *a: Any, **kw: Any) -> None:
        check(type(self))
        original(self, *a, **kw)

    return __init__


def _on(method: Any) -> Any:
    """A FedLab method (its object first) that runs ``method`` of a :class:`FedLabArming`."""
    return functools.wraps(method)(lambda obj, *a, **kw: method(obj, *a, **kw))


class FedLabArming:
    """What :func:`arm` puts into FedLab for one aggregator, and what the patches share.

    Each patch is a method taking the FedLab object first (the handler, trainer or manager it
    replaces a method of). The standalone process's Astraea state lives here: the planner,
    the round's mediators, and each client's rebalanced data (made once, seeded by the run's
    ``FEDBALANCE_SEED`` and the client's global id, whichever path trains it).
    """

    def __init__(self, name: str, args: dict[str, Any]) -> None:
        self.registry = get_registry()
        # An unknown name or bad arguments fail here, at import, naming the options.
        cls = self.registry.aggregator(name)
        refuse_carried_optimizer(
            self.registry.make_aggregator(name, **args),
            f"{ENV_AGGREGATOR} arms a FedLab script, whose trainer trains each client with its "
            "own optimizer",
            key=ENV_ARGS,
        )
        self.name, self.args = name, args
        self.metrics = requested(cls)
        self.mediated = bool(getattr(cls, "mediated", False))
        self.planner: Any = None  # fl_adapters.astraea.AstraeaPlanner, once the counts are in
        self.mediators: list[list[int]] | None = None
        self.data = RebalancedCache()
        self.stock: dict[str, Any] = {}  # FedLab's own methods that the patches call

    def aggregator(self) -> Any:
        return self.registry.make_aggregator(self.name, **self.args)

    # -- the server handler ----------------------------------------------------------------------
    def global_update(self, handler: Any, buffer: list[list[torch.Tensor]]) -> None:
        from fl_adapters.fedlab.handler import aggregate_into

        agg = handler.__dict__.get("_fedbalance_aggregator")
        if agg is None:
            agg = handler._fedbalance_aggregator = self.aggregator()
        if self.mediated:  # n_m is reported: held to what the plan allows, as standalone
            from fl_adapters.fedlab.astraea import bound_counts, param_bytes

            bound_counts(self.planner, self.mediators, buffer)
            self.planner.annotate(
                agg, self.mediators, param_bytes(handler._model), models=[p[0] for p in buffer]
            )
        aggregate_into(handler._model, agg, buffer, handler.round + 1, "fedlab")

    def astraea_load(self, handler: Any, payload: list[torch.Tensor]) -> bool:
        """One package per mediator, not per sampled client."""
        if self.mediators is None:
            raise RuntimeError(
                f"{ENV_AGGREGATOR}={self.name}: this process has no mediator plan (run FedLab's "
                "standalone pipeline, or SynchronousServerManager over DistNetwork)"
            )
        from fl_adapters.fedlab.astraea import load_per_mediator

        return load_per_mediator(handler, payload, len(self.mediators))

    # -- the client trainers ---------------------------------------------------------------------
    def rebalanced(self, trainer: Any, local: int, client: int, rad: Any) -> TensorDataset:
        """Client ``client``'s training data (``local`` in ``trainer``'s dataset), rebalanced."""
        load = lambda: trainer.dataset.get_dataset(int(local), "train")  # noqa: E731
        return self.data.get(client, rad, int(os.environ.get(ENV_SEED, "0")), load)

    def relay_hop(self, trainer: Any, payload: list[torch.Tensor], id_list: list[int]) -> list[Any]:
        """Cross-process: train one hop's members (local ids, in order); ``[params, meta]``."""
        from fedlab.contrib.algorithm.basic_client import SGDSerialClientTrainer

        from fl_adapters.fedlab.astraea import decode_hop

        hop = decode_hop(payload)
        assert hop is not None  # the caller checked
        mediator, clients = hop
        params, n = payload[0], 0
        for local, client in zip(id_list, clients, strict=True):
            data = self.rebalanced(trainer, local, client, payload[1])
            loader = DataLoader(data, batch_size=trainer.batch_size, shuffle=True)
            if isinstance(trainer, SGDSerialClientTrainer):
                params = trainer.train(params, loader)[0]
            else:
                trainer.train(params, loader)
                params = trainer.model_parameters
            n += len(data)
        return encode(params, mediator, n)

    def astraea_local_process(
        self, trainer: Any, payload: list[torch.Tensor], id_list: list[int]
    ) -> None:
        from fl_adapters.fedlab.astraea import decode_hop

        if decode_hop(payload) is not None:
            trainer.cache.append(self.relay_hop(trainer, payload, id_list))
            return
        if self.planner is None:  # the clients report their label counts once
            labels = [
                dataset_tensors(trainer.dataset.get_dataset(c, "train"))[1]
                for c in range(trainer.num_clients)
            ]
            self.planner = AstraeaPlanner.from_labels(labels, self.aggregator())
        planner = self.planner
        self.mediators = planner.mediators(id_list)

        def train_one(client: int, params: torch.Tensor) -> tuple[torch.Tensor, int]:
            data = self.rebalanced(trainer, client, client, planner.rad)
            loader = DataLoader(data, batch_size=trainer.batch_size, shuffle=True)
            return trainer.train(params, loader)[0], len(data)

        for m, members in enumerate(self.mediators):
            result = run_mediator(
                members, payload[0], train_one, planner.aggregator.mediator_epochs
            )
            trainer.cache.append(encode(result.params, m, result.num_samples))

    def train_one(self, trainer: Any, params: torch.Tensor, client: int) -> list[torch.Tensor]:
        train, val = train_val(trainer.dataset, client)
        loader = DataLoader(train, batch_size=trainer.batch_size, shuffle=True)
        pack = trainer.train(params, loader)
        pack = list(pack) if pack is not None else [trainer.model_parameters]
        metrics = measure(self.metrics, lambda: evaluate(trainer._model, val), client)
        return [*pack, pack_meta(client, len(train), metrics)]

    def serial_local_process(
        self, trainer: Any, payload: list[torch.Tensor], id_list: list[int]
    ) -> None:
        for client in id_list:
            trainer.cache.append(self.train_one(trainer, payload[0], int(client)))

    def client_local_process(self, trainer: Any, payload: list[torch.Tensor], id: int) -> None:
        trainer._fedbalance_package = self.train_one(trainer, payload[0], int(id))

    def client_uplink(self, trainer: Any) -> list[torch.Tensor]:
        package = trainer.__dict__.get("_fedbalance_package")
        return package if package is not None else self.stock["uplink"].fget(trainer)

    def astraea_client_process(self, trainer: Any, payload: list[torch.Tensor], id: int) -> None:
        from fl_adapters.fedlab.astraea import decode_hop

        if decode_hop(payload) is None:
            raise RuntimeError(
                f"{ENV_AGGREGATOR}={self.name} trains mediator chains: an SGDClientTrainer needs "
                "the relay of an armed SynchronousServerManager over DistNetwork"
            )
        trainer._fedbalance_package = self.relay_hop(trainer, payload, [id])

    # -- the managers over DistNetwork (Astraea) ------------------------------------------------
    def astraea_server_setup(self, manager: Any) -> None:
        from fl_adapters.fedlab.astraea import receive_counts

        self.stock["server_setup"](manager)
        counts = receive_counts(manager._network)  # every client process reports once
        self.planner = AstraeaPlanner(counts, self.aggregator())

    def astraea_main_loop(self, manager: Any) -> None:
        from fl_adapters.fedlab.astraea import relay_rounds

        def plan() -> list[list[int]]:
            self.mediators = self.planner.mediators(manager._handler.sample_clients())
            return self.mediators

        relay_rounds(manager, self.planner, plan)

    def astraea_client_setup(self, manager: Any) -> None:
        from fl_adapters.fedlab.astraea import report_counts, trainer_counts

        self.stock["client_setup"](manager)
        report_counts(manager._network, trainer_counts(manager._trainer))

    # -- arming ----------------------------------------------------------------------------------
    def apply(self, patches: Any) -> None:
        """Patch FedLab's classes, and check every handler and trainer when it is built: one
        whose own code bypasses the patches stops, naming itself."""
        from fedlab.contrib.algorithm.basic_client import SGDClientTrainer, SGDSerialClientTrainer
        from fedlab.contrib.algorithm.basic_server import SyncServerHandler
        from fedlab.core.client.manager import PassiveClientManager
        from fedlab.core.client.trainer import ClientTrainer, SerialClientTrainer
        from fedlab.core.server.handler import ServerHandler
        from fedlab.core.server.manager import SynchronousServerManager

        self.stock = {
            "uplink": SGDClientTrainer.uplink_package,
            "server_setup": SynchronousServerManager.setup,
            "client_setup": PassiveClientManager.setup,
        }
        serial = self.astraea_local_process if self.mediated else self.serial_local_process
        single = self.astraea_client_process if self.mediated else self.client_local_process
        # Class -> method -> its patch: what is set, and what the checks below expect to find.
        server = {"global_update": _on(self.global_update)}
        if self.mediated:  # Astraea also waits for one package per mediator in load
            server["load"] = _on(self.astraea_load)
            patches.set(SynchronousServerManager, "setup", _on(self.astraea_server_setup))
            patches.set(SynchronousServerManager, "main_loop", _on(self.astraea_main_loop))
            patches.set(PassiveClientManager, "setup", _on(self.astraea_client_setup))
        trainers = {
            SGDSerialClientTrainer: {"local_process": _on(serial)},
            SGDClientTrainer: {
                "local_process": _on(single),
                "uplink_package": property(_on(self.client_uplink)),
            },
        }
        for cls, methods in {SyncServerHandler: server, **trainers}.items():
            for method, patch in methods.items():
                patches.set(cls, method, patch)
        handlers = functools.partial(
            check_class,
            name=self.name,
            patched={SyncServerHandler: server},
            works="SyncServerHandler or a subclass that keeps its global_update (e.g. "
            "FedAvgServerHandler)",
            other="it is not a SyncServerHandler (synchronous rounds)",
        )
        clients = functools.partial(
            check_class,
            name=self.name,
            patched=trainers,
            works="SGDSerialClientTrainer or SGDClientTrainer (or FedAvgSerialClientTrainer)",
            other="it is neither an SGDSerialClientTrainer nor an SGDClientTrainer",
        )
        checks = {ServerHandler: handlers, ClientTrainer: clients, SerialClientTrainer: clients}
        for base, check in checks.items():
            patches.set(base, "__init__", _checked_init(base.__init__, check))


def arm() -> None:
    """Patch FedLab's stock handler and trainers if ``FEDBALANCE_AGGREGATOR`` is set."""
    chosen = settings()
    if chosen is None or _armed:
        return
    name, args = chosen
    FedLabArming(name, args).apply(PATCHES["fedlab"])
    _armed.update(aggregator=name, args=args)
    log.info("fedbalance: FedLab armed with aggregator %r %s", name, args or "")
