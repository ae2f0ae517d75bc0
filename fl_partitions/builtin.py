"""The built-in partitioners by name, and building one from a spec dict.

Framework-free: the plugin registry in ``fl_adapters`` exposes these same classes (and
third-party ones) through the ``fedbalance`` entry-point group; this table only lets
``mixed`` and ``global_imbalance`` resolve nested specs without importing the adapters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fl_partitions.base import Partitioner
from fl_partitions.feature_noise import FeatureNoise
from fl_partitions.global_imbalance import GlobalImbalance
from fl_partitions.iid import IID
from fl_partitions.label_dirichlet import LabelDirichlet
from fl_partitions.label_quantity import LabelQuantity
from fl_partitions.mixed import Mixed
from fl_partitions.params import ParameterError
from fl_partitions.quantity_dirichlet import QuantityDirichlet

BUILTIN_PARTITIONERS: tuple[type[Partitioner], ...] = (
    IID,
    LabelDirichlet,
    LabelQuantity,
    QuantityDirichlet,
    FeatureNoise,
    GlobalImbalance,
    Mixed,
)


def partitioner_class(
    spec: dict[str, Any] | str,
    lookup: Callable[[str], type[Partitioner]] | None = None,
) -> type[Partitioner]:
    """The class a spec names, without building it (so nesting can be refused first)."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ParameterError(f"a partitioner spec must be a mapping with a 'name', got {spec!r}")
    if lookup is not None:
        return lookup(spec["name"])
    table = {cls.name: cls for cls in BUILTIN_PARTITIONERS}
    name = spec["name"].lower()
    if name not in table:
        raise ParameterError(
            f"unknown partitioner {spec['name']!r}; available: {', '.join(sorted(table))}"
        )
    return table[name]


def make_partitioner(
    spec: dict[str, Any] | str,
    lookup: Callable[[str], type[Partitioner]] | None = None,
) -> Partitioner:
    """Build a partitioner from ``{"name": ..., **params}`` (or a bare name).

    ``lookup`` maps a name to a class (the plugin registry passes its own); by default only
    the built-ins are known. Unknown parameters are a ``ParameterError`` naming them and the
    accepted ones.
    """
    cls = partitioner_class(spec, lookup)
    if isinstance(spec, str):
        spec = {"name": spec}
    params = {k: v for k, v in spec.items() if k != "name"}
    if cls is Mixed and lookup is not None:
        params.setdefault("resolve", lambda s: make_partitioner(s, lookup))
    accepted = cls._param_names()
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ParameterError(
            f"{cls.name}: unknown parameter(s) {', '.join(unknown)}; accepted: "
            f"{', '.join(p for p in accepted if p != 'resolve') or '(none)'}"
        )
    return cls(**params)
