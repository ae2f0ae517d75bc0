"""Quantity skew: client sizes ~ Dir(beta), labels IID (NIID-Bench "iid-diff-quantity").

Li et al., ICDE 2022, https://arxiv.org/abs/2102.02079; FedLab's ``dirichlet_unbalance_split``
(``partition="unbalance"``). Proportions ``q ~ Dir(beta)`` over clients; the shuffled dataset
is cut at the cumulative proportions.

Departure: NIID-Bench redraws ``q`` until every client has ``min_size`` samples, unbounded.
We redraw at most ``max_tries`` times (itself at most 1000; fewer once the redraws have drawn
about ``2^23`` Dirichlet components, see :func:`fl_partitions._limits.redraw_limit` — 100
tries are allowed for any number of clients up to the 10,000 limit) and otherwise give each client
``min_size`` first and share the rest by ``q`` — never a hang; an impossible ``min_size`` is a
``ParameterError``.
"""

from __future__ import annotations

import numpy as np

from fl_partitions._alloc import OwnerArray, assign_counts, counts_from_proportions, owners
from fl_partitions._limits import redraw_limit
from fl_partitions.base import DirichletPartitioner, IntArray


class QuantityDirichlet(DirichletPartitioner):
    """Quantity skew: client sizes ~ Dir(beta), each client's labels IID."""

    name = "quantity_dirichlet"

    def assign(
        self, labels: IntArray, num_clients: int, num_classes: int, rng: np.random.Generator
    ) -> OwnerArray:
        n = len(labels)
        self.check_min_size(n, num_clients)
        for _ in range(redraw_limit(self.max_tries, 1, num_clients)):
            q = rng.dirichlet(np.full(num_clients, self.beta))
            counts = counts_from_proportions(q, n)
            if counts.min() >= self.min_size:
                break
        else:
            rest = n - num_clients * self.min_size
            counts = self.min_size + counts_from_proportions(q, rest)
        owner = owners(n, num_clients)
        assign_counts(owner, np.arange(n), np.arange(num_clients), counts, rng)
        return owner
