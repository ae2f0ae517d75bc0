"""Mixed skew: a composition of partitioners (FedLoss thesis: label + feature skew).

Tagarakis, "FedLoss", NTUA diploma thesis, 2023, mixes label skew ``Dir(0.5)`` with feature
noise ``sigma = 0.1``; that is the default. Any composition of at most one component of each
kind (so at most three, none of them ``mixed``) works: a ``resample`` (``global_imbalance``)
picks the samples, a ``split`` scheme (``iid``, ``label_dirichlet``, ``label_quantity``,
``quantity_dirichlet``; IID when absent) assigns them, a ``noise`` component
(``feature_noise``) sets the per-client input noise. Beside them, one ``label_noise`` (kind
``relabel``: not a step of partitioning, it changes no sample and no owner) flips some
clients' labels once the partition is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from fl_checks import ParameterError
from fl_partitions._alloc import OwnerArray
from fl_partitions.base import KINDS, IntArray, Partitioner, Resolve, resolver
from fl_partitions.iid import IID
from fl_partitions.label_noise import LabelNoise
from fl_partitions.partition import Partition

THESIS_MIXED: tuple[dict[str, Any], ...] = (
    {"name": "label_dirichlet", "beta": 0.5},
    {"name": "feature_noise", "sigma": 0.1},
)
#: The kinds a component may have: the three steps of every partitioner, then label noise.
COMPONENT_KINDS = (*KINDS, LabelNoise.kind)
_TOO_MANY = (
    f"components must list at most {len(KINDS)} partitioners (one of each kind: "
    f"{', '.join(KINDS)}) and one label_noise"
)


class Mixed(Partitioner):
    """Mixed skew: resample + split + noise (+ label noise) components; default label+feature."""

    name = "mixed"
    kind = "split"

    def __init__(
        self,
        *,
        components: Sequence[Partitioner | dict[str, Any]] = THESIS_MIXED,
        resolve: Resolve | None = None,
    ) -> None:
        if (
            isinstance(components, (str, bytes))
            or not isinstance(components, Sequence)
            or not components
        ):
            raise ParameterError(
                f"components must be a non-empty list of partitioner specs, got {components!r}"
            )
        if len(components) > len(COMPONENT_KINDS):  # refused before anything is built
            raise ParameterError(f"{_TOO_MANY}, got {len(components)}")
        if resolve is None:
            resolve = resolver()
        built = []
        for c in components:
            # Refused before it is built: a mixed spec nested thousands deep stops here.
            if isinstance(c, Mixed) or (
                isinstance(c, dict) and str(c.get("name", "")).lower() == self.name
            ):
                raise ParameterError("components of mixed cannot themselves be mixed")
            built.append(c if isinstance(c, Partitioner) else resolve(c))
        if sum(part.kind != LabelNoise.kind for part in built) > len(KINDS):
            raise ParameterError(f"{_TOO_MANY}, got {len(components)}")
        by_kind: dict[str, Partitioner] = {}
        for part in built:
            if isinstance(part, Mixed):
                raise ParameterError("components of mixed cannot themselves be mixed")
            if part.kind in by_kind:
                raise ParameterError(
                    f"mixed takes at most one {part.kind!r} component; got "
                    f"{by_kind[part.kind].name!r} and {part.name!r}"
                )
            if part.kind == "resample" and getattr(part, "then", None) is not None:
                raise ParameterError(
                    f"inside mixed, give {part.name!r} no 'then': list the split scheme as its own component"
                )
            if part.kind not in COMPONENT_KINDS or (
                part.kind == LabelNoise.kind and not isinstance(part, LabelNoise)
            ):
                raise ParameterError(
                    f"mixed composes components of the kinds {', '.join(COMPONENT_KINDS)} "
                    f"(a relabel one is label_noise); got {part.name!r} of kind {part.kind!r}"
                )
            by_kind[part.kind] = part
        self.components = built
        self._by_kind = by_kind

    def get_params(self) -> dict[str, Any]:
        return {"components": self.components}

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "components": [c.spec() for c in self.components]}

    def select(self, labels: IntArray, num_classes: int, rng: np.random.Generator) -> IntArray:
        resample = self._by_kind.get("resample")
        return (
            super().select(labels, num_classes, rng)
            if resample is None
            else resample.select(labels, num_classes, rng)
        )

    def assign(
        self, labels: IntArray, num_clients: int, num_classes: int, rng: np.random.Generator
    ) -> OwnerArray:
        return self._by_kind.get("split", IID()).assign(labels, num_clients, num_classes, rng)

    def noise_std(self, num_clients: int) -> NDArray[np.float64]:
        noise = self._by_kind.get("noise")
        return super().noise_std(num_clients) if noise is None else noise.noise_std(num_clients)

    def relabel(self, labels: NDArray[Any] | Sequence[int], partition: Partition) -> Partition:
        """The label noise component's flips, applied last."""
        relabel = self._by_kind.get(LabelNoise.kind)
        return (
            partition if relabel is None else cast(LabelNoise, relabel).relabel(labels, partition)
        )
