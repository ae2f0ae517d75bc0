"""A host is one spec (:class:`HostSpec`, its fields below), registered through the
``fedbalance_hosts`` hook, the three built-in ones directly (:data:`BUILTIN_HOSTS`):
``docs/architecture.md``, "Hosts as specs".

This module imports no host and nothing heavy: the autoload reads it at interpreter start. The
built-in specs live here rather than in their subpackages because importing
``fl_adapters.flower`` *is* the check of the installed flwr (it raises where flwr is absent).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fl_adapters.config import RunConfig

#: ``fedbalance run`` config fields a resumed run may change (a longer run continues a
#: shorter one), on every host: what a spec's ``may_change`` is unless it says otherwise.
MAY_CHANGE = ("rounds", "eval_every", "eval_fraction", "data_dir")


@dataclass(frozen=True)
class RunOptions:
    """How ``fedbalance run`` was asked to run, beyond the config."""

    progress: bool = True
    resume: bool = False
    #: Client processes of a multi-process mode that takes the count from the command line.
    processes: int = 2
    #: The config file, for modes that start processes reading it.
    config_path: Path | None = None


@dataclass(frozen=True)
class HostSpec:
    """One host fedbalance serves (see the module docstring)."""

    #: Registry name, also what a checkpoint records as its host.
    name: str
    #: How messages name it.
    label: str
    #: The ``framework`` values of a run config this host serves.
    frameworks: tuple[str, ...]
    #: The releases it supports, as its version strings start.
    releases: tuple[str, ...]
    #: ``run(config, out, options) -> summary``: one ``fedbalance run`` in the claimed ``out``
    #: (a host whose rounds run in this process: :func:`fl_adapters.run.lifecycle.in_process`).
    run: Callable[[RunConfig, Path, RunOptions], dict[str, Any]]
    #: Raises ``HostNotSupported`` (or ``ImportError``) where the installed host cannot be served.
    require: Callable[[], None] = lambda: None
    #: The module whose ``arm()`` adapts the host when it is imported (``None``: nothing to arm).
    arm: str | None = None
    #: One line for ``fedbalance list``.
    description: str = ""
    #: The keys of the host's own config (the ``fedbalance run`` config for FedLab) that a
    #: resumed run may change; every other key must be the checkpoint's.
    may_change: tuple[str, ...] = MAY_CHANGE


def _run_fedlab(config: RunConfig, out: Path, options: RunOptions) -> dict[str, Any]:
    if config.framework == "fedlab-distributed":  # the launcher alone: no FedLab, no torch
        from fl_adapters.fedlab.launch import run_distributed

        return run_distributed(
            config,
            out,
            client_processes=options.processes,
            config_path=options.config_path,
            resume=options.resume,
        )
    from fl_adapters.fedlab.runner import run_standalone

    return run_standalone(config, out, progress=options.progress, resume=options.resume)


def _run_fedml(config: RunConfig, out: Path, options: RunOptions) -> dict[str, Any]:
    from fl_adapters.fedml.runner import run_fedml

    return run_fedml(config, out, resume=options.resume)


def _run_flower(config: RunConfig, out: Path, options: RunOptions) -> dict[str, Any]:
    from fl_adapters.flower.runner import run_flower

    return run_flower(config, out, resume=options.resume)


def _require(host: str) -> None:
    from fl_adapters.autoload import require_host

    require_host(host)


def _require_flower() -> None:
    from fl_adapters.autoload import HostNotSupported

    try:
        import fl_adapters.flower  # noqa: F401 - the import checks flwr's version
    except ImportError as e:  # flwr absent: say what to install, exit 2 like a bad version
        raise HostNotSupported(str(e)) from e


FEDLAB = HostSpec(
    name="fedlab",
    label="FedLab",
    frameworks=("fedlab", "fedlab-distributed"),
    releases=("1.3.0",),
    run=_run_fedlab,
    require=lambda: _require("fedlab"),
    arm="fl_adapters.fedlab.patches",
    description="FedLab: standalone pipeline and DistNetwork processes",
)
FEDML = HostSpec(
    name="fedml",
    label="FedML",
    frameworks=("fedml-sp", "fedml-mpi", "fedml-cross-silo"),
    releases=("0.9.6",),
    run=_run_fedml,
    require=lambda: _require("fedml"),
    arm="fl_adapters.fedml.patches",
    description="FedML: sp simulation, MPI simulation, cross-silo over MPI or gRPC",
    may_change=("comm_round", "frequency_of_the_test", "eval_every", "eval_fraction"),
)
FLOWER = HostSpec(
    name="flower",
    label="Flower",
    # Flower in its own environment: the simulation engine, or flower-superlink and one
    # flower-supernode per client on 127.0.0.1.
    frameworks=("flower", "flower-deployment"),
    releases=("1.41", "1.42"),
    run=_run_flower,
    require=_require_flower,
    description="Flower: simulation and deployment engines (its own environment)",
    # The app's run config (evaluation draws from a stream of its own).
    may_change=(
        "num-server-rounds",
        "out-dir",
        "data-dir",
        "checkpoint-dir",
        "resume-from",
        "eval-every",
        "eval-fraction",
    ),  # fmt: skip
)
BUILTIN_HOSTS = (FEDLAB, FEDML, FLOWER)

#: How the simulation's engine finds the messages for its virtual nodes (``simulate``):
#: ``index`` (fedbalance's, one scan of the stored messages a pass, the default) or ``flower``
#: (Flower's, one query per node). Here, not in the app (``fl_adapters.flower.app``, which needs flwr):
#: fedbalance's environment sets them for Flower's.
POLLING_ENV, POLLING = "FEDBALANCE_FLOWER_POLLING", ("index", "flower")

#: How many ClientApp actors the simulation keeps: unset, Flower's default (one per CPU core Ray
#: finds, each client asking for one); ``N``, exactly ``N`` whatever the machine. Each actor is
#: a process that imports torch and the app and loads the data: on 2 cores a 2-node, 2-round
#: digits run took 33.8 CPU-s (23.5 s) with two actors and 20.6 CPU-s (20.6 s) with one.
ACTORS_ENV, MAX_ACTORS = "FEDBALANCE_FLOWER_ACTORS", 1024
