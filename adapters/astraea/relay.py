"""Astraea's mediators: the chain bookkeeping every host shares (:class:`MediatorRelay`) and a
chain run in one process (:func:`run_mediator`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fl_checks import ParameterError

P = TypeVar("P")


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
    hop: Hop | None = relay.start()[0]  # the relay refuses a mediator without members
    while hop is not None:
        (client,) = hop.clients
        params, n = train_one(client, params)
        hop = relay.received(0, params, n)
    return MediatorResult(params, relay.samples[0], [c for _, c in relay.trace])


def refuse_carried_optimizer(aggregator: Any, where: str, key: str = "aggregator_args") -> None:
    """Stop before training when ``aggregator`` asks for one optimizer carried along each
    mediator's chain (Astraea's ``carry_optimizer``) where it cannot take effect: ``where``
    says who trains the members there, ``key`` names where the user set it."""
    if getattr(aggregator, "carry_optimizer", False):
        raise ParameterError(
            f"{key}: carry_optimizer: true cannot take effect here: {where}. It runs "
            "in `fedbalance run` with framework: fedlab only, where fedbalance trains a "
            "mediator's members in one process; drop carry_optimizer"
        )
