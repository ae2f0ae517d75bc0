"""Astraea's host-independent pieces, one module a role:

* the pure plan math (z-scores, ``Rad``, the greedy mediator grouping) and the aggregator are
  in the numpy/torch core: :mod:`fl_aggregators.astraea_plan`, :mod:`fl_aggregators.astraea`;
* :mod:`.planner`: the server's plan and each round's mediators (:class:`AstraeaPlanner`);
* :mod:`.rebalance`: the clients' rebalanced data and its cache (:class:`RebalancedCache`);
* :mod:`.relay`: the mediators' chains (:class:`MediatorRelay`, :func:`run_mediator`);
* each host's glue to its own messages: :mod:`fl_adapters.fedlab.astraea`,
  :mod:`fl_adapters.fedml.astraea`, :mod:`fl_adapters.flower.astraea`.

The hosts run rounds in their framework's loop and call these:

* :class:`AstraeaPlanner` (server): from the clients' reported label counts, the z-score plan
  (:func:`~fl_aggregators.astraea_plan.plan_rebalance`) and, each round, the mediators of the
  sampled clients (:func:`~fl_aggregators.astraea_plan.assign_mediators`) with their KL values.
* :func:`rebalance` (client): keeps a majority-class sample with probability ``Rad[y]`` and
  adds ``Rad[y] - 1`` augmented copies of each minority-class sample (in expectation: the
  integer part always, the fractional part with that probability), made with torchvision's
  ``RandomAffine`` (shift, rotation, shear, zoom), then shuffles.
* :class:`MediatorRelay` (mediator): the chain bookkeeping every host shares — which member
  trains next, on whom, how many passes (``mediator_epochs``), and one result per mediator with
  its sample count. :func:`run_mediator` runs a chain in one process; FedLab cross-process and
  FedML's MPI modes relay each hop's model between processes through the server.

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
from fl_adapters.astraea.relay import Hop, MediatorRelay, MediatorResult, run_mediator

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
    "round_traffic",
    "run_mediator",
]
