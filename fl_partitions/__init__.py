"""Non-IID partitioners for federated-learning simulation (numpy; torch only for transforms)."""

from fl_checks import FedbalanceError, ParameterError
from fl_partitions.base import Partitioner
from fl_partitions.builtin import BUILTIN_PARTITIONERS, make_partitioner
from fl_partitions.feature_noise import FeatureNoise
from fl_partitions.global_imbalance import GlobalImbalance, profile_proportions
from fl_partitions.iid import IID
from fl_partitions.label_dirichlet import LabelDirichlet
from fl_partitions.label_noise import LabelNoise
from fl_partitions.label_quantity import LabelQuantity
from fl_partitions.mixed import Mixed
from fl_partitions.partition import LabelFlips, Partition, PartitionFileError
from fl_partitions.quantity_dirichlet import QuantityDirichlet

__all__ = [
    "BUILTIN_PARTITIONERS",
    "FeatureNoise",
    "FedbalanceError",
    "GlobalImbalance",
    "IID",
    "LabelDirichlet",
    "LabelFlips",
    "LabelNoise",
    "LabelQuantity",
    "Mixed",
    "ParameterError",
    "Partition",
    "PartitionFileError",
    "Partitioner",
    "QuantityDirichlet",
    "make_partitioner",
    "profile_proportions",
]
