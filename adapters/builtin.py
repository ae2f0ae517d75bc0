"""fedbalance's own plugins, registered directly by :class:`fl_adapters.registry.Registry`
(no entry point: they work from a plain source checkout)."""

from __future__ import annotations

from fl_adapters.hookspecs import hookimpl
from fl_adapters.hosts import builtin_hosts
from fl_partitions.builtin import BUILTIN_PARTITIONERS


@hookimpl
def fedbalance_aggregators() -> list[type]:
    from fl_aggregators import BUILTIN_AGGREGATORS

    return list(BUILTIN_AGGREGATORS)


@hookimpl
def fedbalance_partitioners() -> list[type]:
    return list(BUILTIN_PARTITIONERS)


@hookimpl
def fedbalance_hosts() -> list[object]:
    return list(builtin_hosts())
