"""The built-in partitioners, listed into :data:`fl_partitions.base.BUILTIN_TABLE`.

Framework-free: the plugin registry in ``fl_adapters`` exposes these same classes (and
third-party ones) through the ``fedbalance`` entry-point group; the table only lets ``mixed``
and ``global_imbalance`` resolve nested specs when no registry lookup is given.
"""

from __future__ import annotations

from fl_partitions.base import BUILTIN_TABLE, Partitioner, make_partitioner, partitioner_class
from fl_partitions.feature_noise import FeatureNoise
from fl_partitions.global_imbalance import GlobalImbalance
from fl_partitions.iid import IID
from fl_partitions.label_dirichlet import LabelDirichlet
from fl_partitions.label_noise import LabelNoise
from fl_partitions.label_quantity import LabelQuantity
from fl_partitions.mixed import Mixed
from fl_partitions.quantity_dirichlet import QuantityDirichlet

BUILTIN_PARTITIONERS: tuple[type[Partitioner], ...] = (
    IID,
    LabelDirichlet,
    LabelQuantity,
    QuantityDirichlet,
    FeatureNoise,
    LabelNoise,
    GlobalImbalance,
    Mixed,
)
BUILTIN_TABLE.update({cls.name: cls for cls in BUILTIN_PARTITIONERS})

__all__ = ["BUILTIN_PARTITIONERS", "make_partitioner", "partitioner_class"]
