"""Astraea's host-independent pieces: the server's planner and the clients' rebalancing.

The host adapters (:mod:`fl_adapters.fedlab.astraea`, :mod:`fl_adapters.fedml.astraea`) run
rounds in their framework's loop and call these:

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

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fl_adapters._training import stream_seed
from fl_aggregators.astraea import Astraea
from fl_aggregators.astraea_plan import (
    RebalancePlan,
    assign_mediators,
    check_counts,
    client_kl,
    expected_counts_after,
    mediator_kl,
    plan_rebalance,
)
from fl_partitions.params import ParameterError

log = logging.getLogger(__name__)

#: ``torchvision.transforms.RandomAffine`` arguments of the augmentation.
AFFINE: dict[str, Any] = {
    "degrees": 15.0,
    "translate": (0.1, 0.1),
    "scale": (0.9, 1.1),
    "shear": 10.0,
}

P = TypeVar("P")


class AstraeaPlanner:
    """The server's Astraea state: the rebalancing plan and each round's mediators.

    Parameters
    ----------
    counts : clients x classes label counts, as the clients report them (row = client id).
    aggregator : the run's :class:`~fl_aggregators.astraea.Astraea` (its ``tau_d``, ``gamma``,
        ``augment`` and ``mediators``).
    """

    def __init__(self, counts: Any, aggregator: Astraea) -> None:
        self.counts = check_counts(counts, "client label counts")
        self.aggregator = aggregator
        classes = self.counts.shape[1]
        if aggregator.augment:
            self.plan = plan_rebalance(
                self.counts, aggregator.tau_d, aggregator.count_clip, aggregator.augment_rule
            )
        else:  # mediators only: nothing is rescaled
            self.plan = RebalancePlan(
                z=np.zeros(classes),
                rad=np.ones(classes),
                augment=[],
                downsample=[],
                mu=float(self.counts.sum(axis=0).mean()),
                sigma=0.0,
                tau_d=aggregator.tau_d,
            )
        self.expected = expected_counts_after(self.counts, self.plan)
        if self.plan.augment or self.plan.downsample:
            log.info(
                "astraea: augment classes %s, downsample %s (rad %s)",
                self.plan.augment,
                self.plan.downsample,
                np.round(self.plan.rad, 3).tolist(),
            )

    @property
    def rad(self) -> NDArray[np.float64]:
        return self.plan.rad

    def mediators(self, sampled: Sequence[int]) -> list[list[int]]:
        """Algorithm 3 over this round's sampled clients: client ids per mediator, in order."""
        ids = sorted(int(c) for c in sampled)
        groups = assign_mediators(self.expected[ids], self.aggregator.group_size)
        return [[ids[i] for i in g] for g in groups]

    @classmethod
    def from_labels(cls, labels: Sequence[torch.Tensor], aggregator: Astraea) -> AstraeaPlanner:
        """The planner from each client's training labels (client id = position)."""
        classes = max(int(y.max()) for y in labels if len(y)) + 1
        return cls(np.stack([label_counts(y, classes) for y in labels]), aggregator)

    def bound_samples(self, members: Sequence[int], claimed: int) -> int:
        """A mediator's reported ``n_m``, held to what its members can hold after rebalancing.

        Rebalancing keeps each sample at most ``ceil(rad)`` times (downsampled classes at most
        once), so ``sum counts x max(1, ceil(rad))`` over the members' reported label counts
        bounds any honest ``n_m``: an honest mediator is never lowered, and a member inflating
        the sample count it reports after training gets no more than its own data's weight.
        """
        copies = np.maximum(1.0, np.ceil(self.plan.rad))
        ceiling = int((self.counts[[int(c) for c in members]] * copies).sum())
        if claimed <= ceiling:
            return claimed
        log.warning(
            "astraea: mediator of clients %s reported %d samples, at most %d after "
            "rebalancing; bounded to %d",
            list(members),
            claimed,
            ceiling,
            ceiling,
        )
        return ceiling

    def mediator_kl(self, mediators: list[list[int]]) -> list[float]:
        return mediator_kl(self.expected, mediators)

    def annotate(
        self,
        aggregator: Astraea,
        mediators: list[list[int]],
        param_bytes: int,
        extra_down: int = 0,
        models: Sequence[Any] | None = None,
    ) -> None:
        """Add the round's mediators, their KL and its traffic to ``aggregator``'s next record;
        with ``models`` (one per mediator), a ``digest`` of each (:func:`model_digest`)."""
        extra: dict[str, Any] = {}
        if models is not None:
            extra["digest"] = [model_digest(m) for m in models]
        aggregator.annotate(
            mediators=mediators,
            kl=self.mediator_kl(mediators),
            bytes=round_traffic(param_bytes, mediators, aggregator.mediator_epochs, extra_down),
            **extra,
        )

    def client_kl(self) -> dict[str, list[float]]:
        """Each client's KL to uniform before and (expected) after rebalancing."""
        return {"before": client_kl(self.counts), "after": client_kl(self.expected)}


def model_digest(params: Any) -> list[float]:
    """``[sum, L2 norm]`` of a model's parameters (a flat tensor or a state dict), in float64:
    what a mediator sent, comparable across hosts and processes to float-order tolerance."""
    tensors = (
        [t for t in params.values() if torch.is_tensor(t)] if isinstance(params, dict) else [params]
    )
    flat = torch.cat([t.detach().double().flatten().cpu() for t in tensors])
    return [float(flat.sum()), float(flat.norm())]


def rebalance(
    x: torch.Tensor, y: torch.Tensor, rad: Any, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's data rebalanced by ``rad`` (per class), deterministically from ``seed``.

    ``x`` is a batch of images ``(N, C, H, W)``; returns new ``(x, y)`` tensors, shuffled.
    """
    ratios = torch.as_tensor(np.asarray(rad, dtype=np.float64))
    if len(y) == 0:
        return x, y
    if int(y.max()) >= len(ratios) or int(y.min()) < 0:
        raise ParameterError(
            f"labels must lie in [0, {len(ratios)}), got [{int(y.min())}, {int(y.max())}]"
        )
    gen = torch.Generator().manual_seed(seed)
    r = ratios[y.long()]
    draw = torch.rand(len(y), generator=gen, dtype=torch.float64)
    keep = (r >= 1) | (draw < r)
    extra = (r - 1).clamp(min=0)
    copies = (
        extra.floor().long()
        + (torch.rand(len(y), generator=gen, dtype=torch.float64) < extra.frac()).long()
    )
    parts_x, parts_y = [x[keep]], [y[keep]]
    if int(copies.sum()) > 0:
        if x.dim() != 4:
            raise ParameterError(
                "Astraea's augmentation transforms images: client inputs must be (N, C, H, W), "
                f"got shape {tuple(x.shape)}; set augment: false to run mediators only"
            )
        source = torch.repeat_interleave(torch.arange(len(y)), copies)
        parts_x.append(augment_images(x[source], int(torch.randint(2**62, (1,), generator=gen))))
        parts_y.append(y[source])
    x2, y2 = torch.cat(parts_x), torch.cat(parts_y)
    order = torch.randperm(len(y2), generator=gen)
    return x2[order], y2[order]


def rebalance_client(
    x: torch.Tensor, y: torch.Tensor, rad: Any, seed: int, client: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rebalance` seeded by ``(seed, client)``: a client's data is the same in every host."""
    return rebalance(x, y, rad, stream_seed("astraea-rebalance", seed, client))


class RebalancedCache:
    """Each client's training data rebalanced by the plan's ``rad``, made once per client.

    One per process, in every host: FedLab's trainers and relay, FedML's sp, MPI and
    cross-silo clients, Flower's ClientApp (which used to rebalance again on every hop).
    :func:`rebalance_client` is a function of ``rad``, the seed and the client, so a cached
    dataset is the one a fresh call would make; a new ``rad`` or seed (another plan or run)
    starts over.
    """

    def __init__(self) -> None:
        self._key: tuple[bytes, int] | None = None
        self._data: dict[int, Any] = {}
        #: Label counts of the rebalanced data of each client built so far (what it trains on).
        self.trained_counts: dict[int, NDArray[np.int64]] = {}

    def get(
        self,
        client: int,
        rad: Any,
        seed: int,
        load: Callable[[], Any],
        wrap: Callable[[torch.Tensor, torch.Tensor, Any], Any] | None = None,
    ) -> Any:
        """Client ``client``'s rebalanced data: ``load()`` gives its training data the first
        time, and ``wrap(x, y, original)`` the form the host trains on (a ``TensorDataset``
        when ``None``)."""
        rad = np.asarray(rad, dtype=np.float64)
        key = (rad.tobytes(), int(seed))
        if key != self._key:
            self._key = key
            self._data.clear()
            self.trained_counts.clear()
        if client not in self._data:
            original = load()
            x, y = dataset_tensors(original)
            x2, y2 = rebalance_client(x, y, rad, seed, client)
            self._data[client] = TensorDataset(x2, y2) if wrap is None else wrap(x2, y2, original)
            self.trained_counts[client] = label_counts(y2, len(rad))
        return self._data[client]


def dataset_tensors(data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """All of a client's samples as ``(x, y)``: from a ``TensorDataset``, a dataset with
    ``get_batch``, a ``DataLoader`` over either, any map-style dataset, or a list of batches."""
    ds = data.dataset if isinstance(data, DataLoader) else data
    if isinstance(ds, TensorDataset):
        return ds.tensors[0], ds.tensors[1]
    get = getattr(ds, "get_batch", None)
    if get is not None:
        return get(np.arange(len(ds)))  # type: ignore[arg-type]
    if isinstance(ds, Dataset):
        data = DataLoader(ds, batch_size=1024, shuffle=False)
    xs, ys = [], []
    for x, y in data:
        xs.append(torch.as_tensor(x))
        ys.append(torch.as_tensor(y))
    if not xs:
        return torch.empty(0), torch.empty(0, dtype=torch.long)
    return torch.cat(xs), torch.cat(ys)


def augment_images(x: torch.Tensor, seed: int) -> torch.Tensor:
    """A random affine transform of each image in ``x`` (its own draw per image), seeded."""
    try:
        from torchvision.transforms import RandomAffine
    except ImportError as e:  # pragma: no cover - torchvision comes with the fedlab/bench extras
        raise ImportError(
            "Astraea's augmentation needs torchvision: pip install 'fedbalance[bench]'"
        ) from e
    transform = RandomAffine(**AFFINE)
    out = torch.empty_like(x)
    with torch.random.fork_rng(devices=[]):  # RandomAffine draws from torch's global RNG
        torch.manual_seed(seed)
        for i in range(len(x)):
            out[i] = transform(x[i])
    return out


def label_counts(y: torch.Tensor | NDArray[Any], num_classes: int) -> NDArray[np.int64]:
    return np.bincount(np.asarray(y, dtype=np.int64), minlength=num_classes)[:num_classes]


@dataclass
class MediatorResult:
    """A mediator's model after its pass, its sample count and the order it trained in."""

    params: Any
    num_samples: int
    trace: list[int]


@dataclass(frozen=True)
class Hop:
    """One leg of a mediator's chain: ``clients`` (in order) trained by one ``owner``.

    ``step`` counts the mediator's hops from 0; ``epoch`` is the pass over its members the hop
    belongs to (a hop never spans two passes).
    """

    mediator: int
    clients: tuple[int, ...]
    owner: Hashable
    step: int
    epoch: int


class MediatorRelay:
    """One round's mediator chains, relayed between whoever holds the members (host-free).

    Each mediator passes the model through its members in order, ``mediator_epochs`` times,
    each member starting from the previous member's result (Algorithm 1). ``owner(client)``
    says who trains a client (a process rank, a silo, or the client itself); consecutive
    members of one pass with the same owner form one :class:`Hop`, so an owner holding several
    members trains them in a row without a round trip. The relay only keeps the books — which
    hop comes next and what each mediator has produced — and the host moves the models:

    >>> relay = MediatorRelay([[4, 1], [7]], mediator_epochs=1)
    >>> [h.clients for h in relay.start()]
    [(4,), (7,)]
    >>> relay.received(0, "w4", 10).clients     # mediator 0 goes on to client 1
    (1,)
    >>> relay.received(1, "w7", 5), relay.received(0, "w41", 20), relay.done()
    (None, None, True)
    >>> relay.results()
    [('w41', 30), ('w7', 5)]

    ``num_samples`` of a hop is the samples its clients trained on; a mediator's ``n_m`` counts
    each member once (the first pass), as the paper's weights ``n_m / n`` do.
    """

    def __init__(
        self,
        mediators: Sequence[Sequence[int]],
        mediator_epochs: int,
        owner: Callable[[int], Hashable] | None = None,
    ) -> None:
        if mediator_epochs < 1:
            raise ParameterError(f"mediator_epochs must be >= 1, got {mediator_epochs}")
        owner_of = owner if owner is not None else (lambda c: c)
        self.mediators = [[int(c) for c in g] for g in mediators]
        if any(not g for g in self.mediators):
            raise ParameterError(f"every mediator needs at least one member, got {self.mediators}")
        self.hops: list[list[Hop]] = []
        for m, members in enumerate(self.mediators):
            hops: list[Hop] = []
            for epoch in range(mediator_epochs):
                for client in members:
                    who = owner_of(client)
                    last = hops[-1] if hops else None
                    if last is not None and last.epoch == epoch and last.owner == who:
                        hops[-1] = Hop(m, (*last.clients, client), who, last.step, epoch)
                    else:
                        hops.append(Hop(m, (client,), who, len(hops), epoch))
            self.hops.append(hops)
        self.position = [0] * len(self.mediators)
        self.samples = [0] * len(self.mediators)
        self.params: dict[int, Any] = {}
        self.trace: list[tuple[int, int]] = []  # (mediator, client) in the order trained

    def start(self) -> list[Hop]:
        """Every mediator's first hop (they run side by side; each starts from the global model)."""
        return [hops[0] for hops in self.hops]

    def expected(self, mediator: int) -> Hop:
        """The hop ``mediator`` is waiting for."""
        if not 0 <= mediator < len(self.hops) or mediator in self.params:
            raise ValueError(f"no hop of mediator {mediator} is outstanding in this round")
        return self.hops[mediator][self.position[mediator]]

    def received(self, mediator: int, params: Any, num_samples: int) -> Hop | None:
        """Record the result of ``mediator``'s current hop; its next hop, or ``None`` when the
        mediator's chain has ended (its model is then in :meth:`results`)."""
        hop = self.expected(mediator)
        self.trace += [(mediator, c) for c in hop.clients]
        if hop.epoch == 0:
            self.samples[mediator] += int(num_samples)
        self.position[mediator] += 1
        if self.position[mediator] < len(self.hops[mediator]):
            return self.hops[mediator][self.position[mediator]]
        self.params[mediator] = params
        return None

    def done(self) -> bool:
        return len(self.params) == len(self.hops)

    def results(self) -> list[tuple[Any, int]]:
        """``(params, n_m)`` per mediator, in mediator order."""
        if not self.done():
            raise RuntimeError(
                f"{len(self.params)} of {len(self.mediators)} mediators have finished"
            )
        return [(self.params[m], self.samples[m]) for m in range(len(self.mediators))]


def run_mediator(
    members: Sequence[int],
    start: P,
    train_one: Callable[[int, P], tuple[P, int]],
    mediator_epochs: int,
) -> MediatorResult:
    """Algorithm 1's mediator in one process: ``train_one(client, params) -> (params, n)`` for
    each client in order, each starting from the previous client's result, ``mediator_epochs``
    times (a :class:`MediatorRelay` whose every hop is one client)."""
    relay = MediatorRelay([members], mediator_epochs)
    params: P = start
    hop: Hop | None = relay.start()[0] if members else None
    while hop is not None:
        (client,) = hop.clients
        params, n = train_one(client, params)
        hop = relay.received(0, params, n)
    return MediatorResult(params, relay.samples[0], [c for _, c in relay.trace])


def round_traffic(
    param_bytes: int, mediators: list[list[int]], mediator_epochs: int, extra_down: int = 0
) -> dict[str, int]:
    """Bytes one Astraea round moves: server <-> mediators, and mediators <-> their clients.

    ``extra_down`` is what the downlink carries besides the parameters (plan, layout) per
    mediator. Each client visit moves the model to the client and back, except in a mediator
    of one client: that client is its own mediator (with ``mediators: false`` every client
    is, and the traffic is plain FedAvg's).
    """
    m = len(mediators)
    visits = mediator_epochs * sum(len(g) for g in mediators if len(g) > 1)
    return {
        "server_down": m * (param_bytes + extra_down),
        "server_up": m * param_bytes,
        "mediator_clients": 2 * param_bytes * visits,
    }
