"""Label skew by number of classes: each client holds ``k`` classes (NIID-Bench "#C=k").

Li et al., ICDE 2022, https://arxiv.org/abs/2102.02079; FedLab's
``label_skew_quantity_based_partition`` (``partition="noniid-#label"``). Client ``i`` first
takes class ``i mod C``, then ``k - 1`` other distinct classes at random; each class's samples
are split evenly among the clients that hold it.

Departure: NIID-Bench silently drops the samples of a class no client drew. We first give
the classes nobody holds to clients with free slots, so every sample is assigned; when
``k * num_clients < C`` that cannot be done and is a ``ValueError``.
"""

from __future__ import annotations

import numpy as np

from fl_partitions._alloc import assign_counts, class_positions, even_counts
from fl_partitions._rng import check_positive_int
from fl_partitions.base import IntArray, Partitioner


def class_sets(
    num_clients: int, num_classes: int, k: int, rng: np.random.Generator
) -> list[list[int]]:
    """The ``k`` distinct classes of every client."""
    held = [[i % num_classes] for i in range(num_clients)]
    missing = list(range(num_clients, num_classes))  # only when num_clients < num_classes
    slot = 0
    for cls in missing:  # round-robin over clients' free slots
        while len(held[slot % num_clients]) >= k:
            slot += 1
        held[slot % num_clients].append(cls)
        slot += 1
    for classes in held:
        free = np.setdiff1d(np.arange(num_classes), classes)
        extra = rng.choice(free, size=k - len(classes), replace=False)
        classes.extend(int(c) for c in extra)
    return held


class LabelQuantity(Partitioner):
    """Label skew: each client holds exactly ``k`` classes, split evenly among holders."""

    name = "label_quantity"

    def __init__(self, *, k: int = 2) -> None:
        self.k = check_positive_int("k", k)

    def assign(
        self, labels: IntArray, num_clients: int, num_classes: int, rng: np.random.Generator
    ) -> IntArray:
        if self.k > num_classes:
            raise ValueError(f"k must be between 1 and num_classes={num_classes}, got {self.k}")
        if self.k * num_clients < num_classes:
            raise ValueError(
                f"k={self.k} x num_clients={num_clients} < num_classes={num_classes}: some "
                f"classes would belong to no client; raise k or num_clients"
            )
        held = class_sets(num_clients, num_classes, self.k, rng)
        holders: list[list[int]] = [[] for _ in range(num_classes)]
        for client, classes in enumerate(held):
            for c in classes:
                holders[c].append(client)
        owner = np.empty(len(labels), dtype=np.int64)
        for c, positions in enumerate(class_positions(labels, num_classes)):
            if len(positions) == 0:
                continue
            who = np.asarray(holders[c], dtype=np.int64)
            assign_counts(owner, positions, who, even_counts(len(positions), len(who)), rng)
        return owner
