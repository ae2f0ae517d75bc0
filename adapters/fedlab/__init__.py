"""fedbalance for FedLab 1.3.0: handler, trainers, datasets and partitioners (imports FedLab)."""

from fl_adapters.fedlab.data import FedBalancePartitioner, PartitionedDataset
from fl_adapters.fedlab.handler import FedBalanceServerHandler
from fl_adapters.fedlab.trainer import FedBalanceClientTrainer, FedBalanceSerialTrainer, LocalConfig

__all__ = [
    "FedBalanceClientTrainer",
    "FedBalancePartitioner",
    "FedBalanceSerialTrainer",
    "FedBalanceServerHandler",
    "LocalConfig",
    "PartitionedDataset",
]
