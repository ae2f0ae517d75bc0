"""FedML as fedbalance serves it: its host spec and its rules over a run config, light (no
FedML, no torch imported).

The autoload arms FedML on ``import fedml`` in every process; the adapter acts only when the
config names an aggregator. Where fedbalance cannot serve the installed FedML, FedML runs
stock and :func:`guard` stops only a run whose config names one.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from fl_adapters.collector import paused_collector
from fl_adapters.hosts import HostSpec, RunOptions

if TYPE_CHECKING:
    from fl_adapters.config import RunConfig


def run(config: RunConfig, out: Path, options: RunOptions) -> dict[str, Any]:
    with paused_collector():  # FedML and torch: see fl_adapters.collector
        from fl_adapters.fedml.runner import run_fedml

    return run_fedml(config, out, resume=options.resume)


def require() -> None:
    from fl_adapters.autoload import require_host

    require_host("fedml")


def check(config: RunConfig) -> None:
    """What FedML's modes can run: FedML reports its own test metrics (``eval_data:
    clients``), its MPI and cross-silo servers test one global set (``eval_fraction`` 1), and
    each of their processes trains once a round (Astraea's ``mediator_epochs`` 1)."""
    from fl_adapters.config import ConfigError

    if config.eval_data != "clients":
        raise ConfigError(
            f"eval_data: {config.eval_data} is for the FedLab frameworks; {config.framework} "
            "reports FedML's own test metrics"
        )
    if config.eval_fraction < 1.0 and config.framework in ("fedml-mpi", "fedml-cross-silo"):
        raise ConfigError(
            f"eval_fraction must be 1 for {config.framework}: FedML's server tests the global "
            f"test set there (one evaluation, not the clients' splits); got "
            f"{config.eval_fraction!r}"
        )
    epochs = config.aggregator_args.get("mediator_epochs", 1)  # a mediated aggregator's
    if config.framework != "fedml-sp" and epochs != 1:
        raise ConfigError(
            f"aggregator_args: mediator_epochs must be 1 in {config.framework} (each FedML "
            f"process trains once a round, as FedML's client counts rounds), got {epochs!r}"
        )


def guard(fedml: ModuleType, reason: str) -> None:
    """Stock FedML, except that ``fedml.init()`` stops a config naming ``aggregator:``."""
    from fl_adapters.autoload import PATCHES, HostNotSupported, refusal

    init = getattr(fedml, "init", None)
    if not callable(init):
        return

    def guarded_init(*a: Any, **kw: Any) -> Any:
        args = init(*a, **kw)
        name = getattr(args, "aggregator", None)
        if isinstance(name, str) and name.strip():
            raise HostNotSupported(f"aggregator: {name.strip()}: {refusal('fedml', reason)}")
        return args

    try:
        guarded_init.__wrapped__ = init  # type: ignore[attr-defined]
        PATCHES["fedml"].set(fedml, "init", guarded_init)
    except Exception:  # an init we cannot wrap: the host stays exactly stock
        pass


FEDML = HostSpec(
    name="fedml",
    label="FedML",
    frameworks=("fedml-sp", "fedml-mpi", "fedml-cross-silo"),
    releases=("0.9.6",),
    run=run,
    require=require,
    arm="fl_adapters.fedml.patches",
    description="FedML: sp simulation, MPI simulation, cross-silo over MPI or gRPC",
    may_change=("comm_round", "frequency_of_the_test", "eval_every", "eval_fraction"),
    check=check,
    backends=(("fedml-cross-silo", "grpc"),),
    guard=guard,
)
