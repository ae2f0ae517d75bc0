"""fedbalance partitions in FedLab's data interfaces.

* :class:`PartitionedDataset` is a FedLab ``FedDataset``: ``get_dataset(id, "train"|"val"|"test")``
  and ``get_dataloader`` over a :class:`~fl_partitions.Partition`, with the client's feature
  noise and label flips applied.
* :class:`FedBalancePartitioner` is a FedLab ``DataPartitioner`` (``client_dict``, indexing,
  ``len``), so code written for ``CIFAR10Partitioner``-style objects takes any fedbalance scheme.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fedlab.contrib.dataset.basic_dataset import FedDataset
from fedlab.utils.dataset.partition import DataPartitioner
from torch.utils.data import DataLoader, Dataset

from fl_adapters.registry import get_registry
from fl_checks import ParameterError
from fl_partitions import Partition, Partitioner
from fl_partitions._rng import SeedLike
from fl_partitions.transforms import NoisyDataset

SPLITS = ("train", "val", "test")


class PartitionedDataset(FedDataset):
    """A FedLab ``FedDataset`` view of ``dataset`` split by ``partition``."""

    def __init__(self, dataset: Dataset[Any], partition: Partition) -> None:
        super().__init__()
        self.dataset = dataset
        self.partition = partition
        self.num = partition.num_clients
        self._views: dict[tuple[int, str], NoisyDataset] = {}

    def get_dataset(self, id: int, type: str = "train") -> NoisyDataset:
        if type not in SPLITS:
            raise ParameterError(f"type must be one of {', '.join(SPLITS)}, got {type!r}")
        if not 0 <= int(id) < self.num:
            raise ParameterError(f"client id must be in [0, {self.num}), got {id!r}")
        key = (int(id), type)
        if key not in self._views:  # one view per split, so its noise cache is reused
            p = self.partition
            self._views[key] = NoisyDataset(
                self.dataset,
                p.splits[key[0]][type],
                std=float(p.noise_std[key[0]]),
                seed=p.seed,
                client=key[0],
                flips=p.client_flips(key[0]),
            )
        return self._views[key]

    def get_dataloader(self, id: int, batch_size: int, type: str = "train") -> DataLoader[Any]:
        return DataLoader(
            self.get_dataset(id, type), batch_size=batch_size, shuffle=type == "train"
        )


class FedBalancePartitioner(DataPartitioner):
    """Any fedbalance partitioner behind FedLab's ``DataPartitioner`` interface.

    Parameters
    ----------
    targets : labels of the dataset.
    num_clients : number of clients.
    partitioner : a :class:`~fl_partitions.Partitioner` or a spec (``{"name": ..., **params}``).
    seed : every random choice derives from it.
    """

    def __init__(
        self,
        targets: Any,
        num_clients: int,
        partitioner: Partitioner | dict[str, Any] | str,
        seed: SeedLike = 0,
        **partition_kwargs: Any,
    ) -> None:
        super().__init__()
        part = (
            partitioner
            if isinstance(partitioner, Partitioner)
            else get_registry().make_partitioner(partitioner)
        )
        self.targets = np.asarray(targets)
        self.num_clients = num_clients
        self.partitioner = part
        self.partition = part.partition(self.targets, num_clients, seed=seed, **partition_kwargs)
        self.client_dict = self._perform_partition()

    def _perform_partition(self) -> dict[int, Any]:
        return dict(enumerate(self.partition.client_indices))

    def __getitem__(self, index: int) -> Any:
        return self.client_dict[index]

    def __len__(self) -> int:
        return len(self.client_dict)
