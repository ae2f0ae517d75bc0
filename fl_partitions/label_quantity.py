"""Label skew by number of classes: each client holds ``k`` classes (NIID-Bench "#C=k").

Li et al., ICDE 2022, https://arxiv.org/abs/2102.02079; FedLab's
``label_skew_quantity_based_partition`` (``partition="noniid-#label"``). Client ``i`` first
takes class ``i mod C``, then ``k - 1`` other distinct classes at random; each class's samples
are split evenly among the clients that hold it.

Departure: NIID-Bench silently drops the samples of a class no client drew. We first give
the classes nobody holds to clients with free slots, so every sample is assigned; when
``k * num_clients < C`` that cannot be done and is a ``ParameterError``.
"""

from __future__ import annotations

import numpy as np

from fl_checks import ParameterError, check_int_range
from fl_partitions._alloc import OwnerArray, assign_counts, class_positions, even_counts, owners
from fl_partitions._limits import MAX_CLASSES
from fl_partitions.base import IntArray, Partitioner


def class_sets(num_clients: int, num_classes: int, k: int, rng: np.random.Generator) -> IntArray:
    """The ``k`` distinct classes of every client: one row per client.

    Client ``i`` first takes class ``i mod C``; with fewer clients than classes it also takes
    ``i + num_clients``, ``i + 2 num_clients``, ... (the round-robin that gives every class a
    holder; ``k * num_clients >= C`` leaves room for it). The rest of its ``k`` are drawn at
    random from the classes it does not hold, one client after the other.
    """
    held = np.empty((num_clients, k), dtype=np.int64)
    taken = np.zeros(num_classes, dtype=bool)
    for i in range(num_clients):
        first = np.arange(i, num_classes, num_clients) if i < num_classes else [i % num_classes]
        taken[first] = True
        free = np.flatnonzero(~taken)  # what setdiff1d(arange(C), first) gives, in O(C)
        taken[first] = False
        held[i, : len(first)] = first
        held[i, len(first) :] = rng.choice(free, size=k - len(first), replace=False)
    return held


def class_holders(held: IntArray, num_classes: int) -> list[IntArray]:
    """For every class, the clients holding it, in ascending order."""
    # A classes x clients membership matrix (at most 10^7 bools): nonzero() reads it class by
    # class, clients ascending, with no sort.
    member = np.zeros((num_classes, len(held)), dtype=bool)
    member[held, np.arange(len(held))[:, None]] = True
    classes, clients = np.nonzero(member)
    return np.split(clients, np.cumsum(np.bincount(classes, minlength=num_classes))[:-1])


class LabelQuantity(Partitioner):
    """Label skew: each client holds exactly ``k`` classes, split evenly among holders."""

    name = "label_quantity"

    def __init__(self, *, k: int = 2) -> None:
        self.k = check_int_range("k", k, 1, MAX_CLASSES)

    def assign(
        self, labels: IntArray, num_clients: int, num_classes: int, rng: np.random.Generator
    ) -> OwnerArray:
        if self.k > num_classes:
            raise ParameterError(f"k must be between 1 and num_classes={num_classes}, got {self.k}")
        if self.k * num_clients < num_classes:
            raise ParameterError(
                f"k={self.k} x num_clients={num_clients} < num_classes={num_classes}: some "
                f"classes would belong to no client; raise k or num_clients"
            )
        holders = class_holders(class_sets(num_clients, num_classes, self.k, rng), num_classes)
        owner = owners(len(labels), num_clients)
        for positions, who in zip(class_positions(labels, num_classes), holders, strict=True):
            if len(positions) == 0:
                continue
            assign_counts(owner, positions, who, even_counts(len(positions), len(who)), rng)
        return owner
