"""Which clients train in a round: one seeded sampler every host uses.

FedLab's handler, the Flower strategy and ``fedbalance astraea plan`` all draw a round's
clients with :func:`sample_round` from a ``random.Random(seed)`` kept for the run, so the same
seed gives the same clients in every host and mode, and the plan preview shows a run's round 1.
(FedML samples with its own ``np.random.seed(round)`` draw; fedbalance leaves it alone.)
"""

from __future__ import annotations

import random


def sample_round(rng: random.Random, num_clients: int, k: int) -> list[int]:
    """``k`` of the client positions ``0..num_clients-1``, drawn by ``rng.sample``, sorted."""
    return sorted(rng.sample(range(num_clients), min(k, num_clients)))
