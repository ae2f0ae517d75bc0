"""Astraea's host-independent pieces, one module a role (see ``docs/architecture.md``):
:mod:`.planner` (the server's plan and each round's mediators), :mod:`.rebalance` (the
clients' rebalanced data and its cache) and :mod:`.relay` (the mediators' chains). The plan
math and the aggregator are in :mod:`fl_aggregators.astraea_plan` and
:mod:`fl_aggregators.astraea`; each host's ``astraea`` module is the glue to its messages.

What the paper leaves open, and what we chose:

* Augmentation parameters. The paper names shift, rotation, shear and zoom (Keras's
  ``ImageDataGenerator``) without values; we use ``RandomAffine(degrees=15,
  translate=(0.1, 0.1), scale=(0.9, 1.1), shear=10)`` (:data:`AFFINE`).
* Rebalancing happens once, before the first round (the paper's initialisation); a client's
  rebalanced data is fixed by ``(seed, client)``.
* The server reschedules on each client's *expected* counts after rebalancing
  (``counts x Rad``): clients report their label counts once, and the expectation is what the
  server can know without a second report.
* Mediators are formed each round among that round's sampled clients; client ids in the plan
  are sorted before the greedy pass, so ties go to the lowest id.
"""

from fl_adapters.astraea.planner import AstraeaPlanner, model_digest, round_traffic
from fl_adapters.astraea.rebalance import (
    AFFINE,
    RebalancedCache,
    augment_images,
    dataset_tensors,
    label_counts,
    rebalance,
    rebalance_client,
)
from fl_adapters.astraea.relay import (
    Hop,
    MediatorRelay,
    MediatorResult,
    refuse_carried_optimizer,
    run_mediator,
)

__all__ = [
    "AFFINE",
    "AstraeaPlanner",
    "Hop",
    "MediatorRelay",
    "MediatorResult",
    "RebalancedCache",
    "augment_images",
    "dataset_tensors",
    "label_counts",
    "model_digest",
    "rebalance",
    "rebalance_client",
    "refuse_carried_optimizer",
    "round_traffic",
    "run_mediator",
]
