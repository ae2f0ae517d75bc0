"""IID partition: equal-sized uniformly random split (NIID-Bench "homo")."""

from __future__ import annotations

import numpy as np

from fl_partitions._alloc import OwnerArray, assign_counts, even_counts, owners
from fl_partitions.base import IntArray, Partitioner


class IID(Partitioner):
    """Equal-sized uniformly random split; sizes differ by at most one sample."""

    name = "iid"

    def __init__(self) -> None:
        pass

    def assign(
        self, labels: IntArray, num_clients: int, num_classes: int, rng: np.random.Generator
    ) -> OwnerArray:
        owner = owners(len(labels), num_clients)
        clients = np.arange(num_clients)
        assign_counts(
            owner, np.arange(len(labels)), clients, even_counts(len(labels), num_clients), rng
        )
        return owner
