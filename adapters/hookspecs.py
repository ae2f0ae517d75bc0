"""pluggy hook specifications of the ``fedbalance`` plugin system.

A plugin is a module (or object) with ``@hookimpl`` functions, advertised under the
``fedbalance`` entry-point group::

    [project.entry-points.fedbalance]
    myplugin = "my_package.fedbalance_plugin"

Each discovery hook returns a list of classes (hosts: of :class:`~fl_adapters.hosts.HostSpec`
objects); the registry merges them into a name -> plugin table and rejects duplicate names.
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "fedbalance"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def fedbalance_aggregators() -> list[type]:  # type: ignore[empty-body]
    """Return aggregator classes (each with a class attribute ``name`` and a docstring)."""


@hookspec
def fedbalance_partitioners() -> list[type]:  # type: ignore[empty-body]
    """Return partitioner classes (subclasses of ``fl_partitions.Partitioner``)."""


@hookspec
def fedbalance_hosts() -> list[Any]:  # type: ignore[empty-body]
    """Return host specs (``fl_adapters.hosts.HostSpec``), one per framework served."""
