"""Label skew by Dirichlet proportions per class (NIID-Bench "noniid-labeldir").

Li, Diao, Chen, He, "Federated Learning on Non-IID Data Silos: An Experimental Study",
ICDE 2022, https://arxiv.org/abs/2102.02079 — and FedLab's ``hetero_dir_partition``.

For each class, proportions ``p ~ Dir(beta)`` over the clients are drawn; clients already
holding more than the average ``N / num_clients`` samples get no more (NIID-Bench's balancing
step); the class's shuffled samples are cut at the cumulative proportions.

Departure from NIID-Bench / FedLab: they redraw the whole partition until every client has
``min_size`` samples, with no bound — for 1,000 clients at beta 0.1 that loop does not end.
We redraw at most ``max_tries`` times (itself at most 1000), and stop earlier once the
redraws have drawn about ``2^23`` Dirichlet components (see
:func:`fl_partitions._limits.redraw_limit`; a count, not a time, so a seed gives the same
partition everywhere): with 10 classes the default 100 tries are always allowed up to 8,000
clients, so in the common case the result is distributed exactly like theirs. Otherwise the clients below ``min_size`` are topped up
constructively with samples drawn from the other clients' surplus. A ``min_size`` that no
partition can meet (``num_clients * min_size`` above the number of samples) is an immediate
``ParameterError``.
"""

from __future__ import annotations

import numpy as np

from fl_partitions._alloc import (
    OwnerArray,
    assign_counts,
    class_positions,
    counts_from_proportions,
    owners,
    top_up,
)
from fl_partitions._limits import redraw_limit
from fl_partitions.base import DirichletPartitioner, IntArray


def dirichlet_label_counts(
    class_sizes: IntArray, num_clients: int, beta: float, rng: np.random.Generator
) -> IntArray:
    """One NIID-Bench label-Dirichlet draw: classes x clients sample counts.

    Only the counts are random here; which samples a client gets is a uniform choice within
    each class given the counts, so redrawing for ``min_size`` needs the counts alone.
    """
    n = int(class_sizes.sum())
    counts = np.zeros((len(class_sizes), num_clients), dtype=np.int64)
    sizes = np.zeros(num_clients, dtype=np.int64)
    present = np.flatnonzero(class_sizes)
    # One call for every class: numpy draws the rows in order, so this is the same stream
    # (and the same values) as one dirichlet call per class, without the per-call overhead.
    draws = rng.dirichlet(np.full(num_clients, beta), size=len(present))
    for c, p in zip(present.tolist(), draws, strict=True):
        size = int(class_sizes[c])
        open_ = sizes < n / num_clients
        p = np.where(open_, p, 0.0)
        total = p.sum()
        # With tiny beta every open client may draw 0 (float underflow): share evenly then.
        p = p / total if total > 0 else open_ / open_.sum()
        counts[c] = counts_from_proportions(p, size)
        sizes += counts[c]
    return counts


class LabelDirichlet(DirichletPartitioner):
    """Label skew: per class, client shares ~ Dir(beta); smaller beta, stronger skew."""

    name = "label_dirichlet"

    def assign(
        self, labels: IntArray, num_clients: int, num_classes: int, rng: np.random.Generator
    ) -> OwnerArray:
        self.check_min_size(len(labels), num_clients)
        by_class = class_positions(labels, num_classes)
        class_sizes = np.array([len(p) for p in by_class], dtype=np.int64)
        tries = redraw_limit(self.max_tries, int(np.count_nonzero(class_sizes)), num_clients)
        for _ in range(tries):
            counts = dirichlet_label_counts(class_sizes, num_clients, self.beta, rng)
            met = counts.sum(axis=0).min() >= self.min_size
            if met:
                break
        owner = owners(len(labels), num_clients)
        clients = np.arange(num_clients)
        for positions, row in zip(by_class, counts, strict=True):
            assign_counts(owner, positions, clients, row, rng)
        if not met:  # top_up draws nothing when every client has min_size: skip its pass
            top_up(owner, num_clients, self.min_size, rng)
        return owner
