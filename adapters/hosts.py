"""A host is one spec (:class:`HostSpec`, its fields below), registered through the
``fedbalance_hosts`` hook: ``docs/architecture.md``, "Hosts as specs". Each built-in host's
spec lives in its own subpackage (``fl_adapters.fedlab.spec``, ``fl_adapters.fedml.spec``,
``fl_adapters.flower.spec``), importable without the host installed, and
:func:`builtin_hosts` gathers them.

This module imports no host and nothing heavy: the autoload reads it at interpreter start.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

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
    #: ``check(config)``: the host's own rules over a run config of one of its frameworks,
    #: raising :class:`~fl_adapters.config.ConfigError`; called when the config is read.
    check: Callable[[RunConfig], None] = lambda config: None
    #: The frameworks in which fedbalance itself trains each mediator's members in one process,
    #: so that an Astraea ``carry_optimizer: true`` takes effect (a config asking for it
    #: anywhere else stops when read).
    carries_optimizer: tuple[str, ...] = ()
    #: ``(framework, backend)``: the ``backend`` values its frameworks take besides ``mpi``,
    #: the default.
    backends: tuple[tuple[str, str], ...] = ()
    #: ``asked()``: with :attr:`arm`, why this process asked for fedbalance before the host's
    #: import (e.g. an environment variable set), or ``None``. A host that is asked is armed
    #: (or refused) on import; one that is not is armed only where :attr:`guard` is set.
    asked: Callable[[], str | None] | None = None
    #: ``guard(module, reason)``: where fedbalance cannot arm the host (``reason``), what
    #: stops a run that asks for it later while the host otherwise runs stock (``None``: the
    #: host is armed on import only when :attr:`asked`).
    guard: Callable[[ModuleType, str], None] | None = None
    #: ``commands(subparsers)``: the host's own ``fedbalance`` subcommands. This field and
    #: ``arm``, ``asked`` and ``guard`` are read before any plugin loads: a plugin's host
    #: leaves them unset (the registry refuses it), arms itself in its own import, and runs
    #: through ``fedbalance run``.
    commands: Callable[[argparse._SubParsersAction[Any]], None] | None = None


@functools.cache
def builtin_hosts() -> tuple[HostSpec, ...]:
    """The built-in hosts' specs, each from its own subpackage (light modules: no host is
    imported)."""
    from fl_adapters.fedlab.spec import FEDLAB
    from fl_adapters.fedml.spec import FEDML
    from fl_adapters.flower.spec import FLOWER

    return (FEDLAB, FEDML, FLOWER)
