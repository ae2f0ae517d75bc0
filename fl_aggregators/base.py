"""The aggregator interface and the checks every aggregator gets for free.

An aggregator turns the global parameters and a list of :class:`ClientUpdate` into new global
parameters. :meth:`Aggregator.aggregate` does what is common to all of them:

1. rejects clients that cannot be trusted this round — wrong form, shapes or dtypes, a sample
   count that is not a positive int, a required metric that is missing, non-finite or
   negative — with a warning naming the client and the reason;
2. calls the subclass's :meth:`Aggregator._combine` on the rest;
3. if the result is not finite, finds the clients with NaN/Inf parameters, rejects them and
   combines again (non-finite inputs are found from the output, so honest rounds pay no extra
   pass over the parameters; the compiled kernels report it while writing the output);
4. if no client is left, keeps the global model unchanged and reports the round as skipped;
5. records the aggregation (see :mod:`fl_aggregators.record`);
6. after :attr:`Aggregator.max_skipped_rounds` skipped rounds in a row, raises
   :class:`NothingAggregated`: a run whose every round keeps the model learns nothing, and
   must end as a failure naming why, not as a success (every host aggregates through here,
   so the rule is the same on FedLab, FedML and Flower).

Under secure aggregation the server never holds a client's model, only the sum of what the
clients masked. An aggregator whose result is ``step(sum_i w_i x_i)`` with weights computed from
scalars the clients report in clear (sample counts, validation losses) runs there in two halves:
:meth:`Aggregator.weigh` turns the scalars into each client's weight (the same checks and
bounds as :meth:`~Aggregator.aggregate`, on scalars), the clients scale their models by it
before masking, and :meth:`Aggregator.finish` takes the unmasked sum. Aggregators that need the
models themselves (the coordinate median, Astraea's mediators, ``update_clip``'s norms) say why
in :meth:`Aggregator.secure_refusal` and refuse.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from fl_aggregators._kernels import OutputPool
from fl_aggregators._tensors import placed_like, rebuild, structure_mismatch, tensors_of
from fl_aggregators.functional import all_finite_many, update_norm
from fl_aggregators.record import record
from fl_aggregators.update import ClientUpdate, Params
from fl_checks import FedbalanceError, ParameterError, check_int_range, shown

log = logging.getLogger(__name__)


#: Skipped rounds in a row after which an aggregator stops the run (a run whose clients all
#: fail stops within this many rounds, not after all of them).
MAX_SKIPPED_ROUNDS = 5
#: The largest ``max_skipped_rounds`` taken (rounds are counted in ints; any larger is "never").
MAX_SKIPPED_LIMIT = 1_000_000
#: The metric each client reports under secure aggregation: the L2 norm of its update (trained
#: model minus the round's global model, floating-point tensors only, in float64).
UPDATE_NORM = "update_norm"
#: A reported update norm counts up to this many times the median of the round's reports.
NORM_CAP = 4.0


class NothingAggregated(FedbalanceError, RuntimeError):
    """Raised when :attr:`Aggregator.max_skipped_rounds` rounds in a row aggregated nothing."""


@dataclass(frozen=True)
class Rejection:
    """A client left out of a round, and why."""

    client: Any
    reason: str


@dataclass
class AggregationResult:
    """New global parameters and how they were made.

    ``weights`` has one entry per update, in input order (0 for rejected clients), and sums to
    1 unless the round was ``skipped``.
    """

    params: Params
    weights: list[float]
    clients: list[Any] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    skipped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Weighing:
    """One round's weights computed from scalars alone (:meth:`Aggregator.weigh`).

    ``weights`` has one entry per update, in input order, 0 for a rejected client, and sums to
    1 over the accepted ones; ``updates`` are the scalar-only updates it was computed from.
    """

    round: int
    clients: list[Any]
    weights: list[float]
    updates: Sequence[ClientUpdate]
    rejected: dict[int, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    #: Each client's reported :data:`UPDATE_NORM` (``None``: not asked for, see :meth:`weigh`).
    norms: list[float] | None = None


class Aggregator(ABC):
    """Base class of every aggregator plugin (keyword-only parameters, stored as given)."""

    #: Public name, used in configs and the registry.
    name: ClassVar[str]
    #: Client metrics this aggregator needs; host adapters make clients compute them.
    required_metrics: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.round = 0
        #: Stop the run (:class:`NothingAggregated`) after this many skipped rounds in a row; a
        #: run setting, not a parameter of the method (set by :meth:`stop_after_skipped`).
        self.max_skipped_rounds = MAX_SKIPPED_ROUNDS
        #: Skipped rounds since the last aggregated one (in this process).
        self.skipped_in_a_row = 0
        #: When this aggregator was made (the host's server start): records carry the time since.
        self._started = time.monotonic()
        #: Recycles this aggregator's earlier outputs once the host has let go of them.
        self._pool = OutputPool()

    # -- subclass API -------------------------------------------------------------------------
    @abstractmethod
    def _combine(
        self,
        global_tensors: list[torch.Tensor],
        updates: Sequence[ClientUpdate],
        client_tensors: list[list[torch.Tensor]],
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """New global tensors from accepted clients, and the weights applied (summing to 1)."""

    def _take_extra(self) -> dict[str, Any]:
        """Aggregator-specific keys for this round's result and record (none by default)."""
        return {}

    def _commit(self) -> None:  # noqa: B027 - optional hook, a no-op unless state is kept
        """Called once a round's result is final (stateful aggregators update state here)."""

    def state_dict(self) -> dict[str, Any]:
        """Server-side state to checkpoint (tensors and plain values only)."""
        return {"round": self.round}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "round" not in state or not isinstance(state["round"], int) or state["round"] < 0:
            raise ParameterError(
                f"state must hold a non-negative int 'round', got {state.get('round')!r}"
            )
        self.round = int(state["round"])

    def stop_after_skipped(self, rounds: Any) -> None:
        """Stop the run after ``rounds`` skipped rounds in a row (1 to 10^6; see
        :class:`NothingAggregated`)."""
        self.max_skipped_rounds = check_int_range(
            "max_skipped_rounds",
            rounds,
            1,
            MAX_SKIPPED_LIMIT,
            note="rounds in a row that aggregate nothing before the run stops",
        )

    def _watch_skips(self, result: AggregationResult) -> None:
        """Count skipped rounds in a row; raise :class:`NothingAggregated` at the limit."""
        if not result.skipped:
            self.skipped_in_a_row = 0
            return
        self.skipped_in_a_row = getattr(self, "skipped_in_a_row", 0) + 1
        limit = getattr(self, "max_skipped_rounds", MAX_SKIPPED_ROUNDS)
        if self.skipped_in_a_row < limit:
            return
        first = self.round - self.skipped_in_a_row + 1
        rounds = f"round {self.round}" if first == self.round else f"rounds {first}-{self.round}"
        why = (
            f"client {result.rejected[0].client}: {result.rejected[0].reason}"
            if result.rejected
            else "no client update arrived"
        )
        raise NothingAggregated(
            f"{self.name}: {rounds} aggregated nothing ({self.skipped_in_a_row} in a row, "
            f"max_skipped_rounds {limit}), so the run learns nothing; the last round's first "
            f"cause: {why}"
        )

    # -- the common path --------------------------------------------------------------------
    def check(self, global_params: Params, update: ClientUpdate) -> str | None:
        """Why ``update`` must be left out this round (``None`` to accept it)."""
        return self.check_scalars(update) or structure_mismatch(global_params, update.params)

    def check_scalars(self, update: ClientUpdate) -> str | None:
        """The part of :meth:`check` that reads only the sample count and the metrics."""
        n = update.num_samples
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            return f"num_samples must be a positive int, got {n!r}"
        for key in self.required_metrics:
            if key not in update.metrics:
                return f"required metric {key!r} is missing"
            raw = update.metrics[key]
            # A number, not text or a flag that float() would also take ("5.0", True).
            if isinstance(raw, bool) or not isinstance(raw, numbers.Real):
                return f"metric {key!r} is not a number: {shown(raw)}"
            try:
                value = float(raw)
            except OverflowError:  # an int beyond a float's range
                value = math.inf
            if not math.isfinite(value) or value < 0:
                return f"metric {key!r} must be finite and >= 0, got {shown(raw)}"
        return None

    def aggregate(
        self,
        global_params: Params,
        updates: Sequence[ClientUpdate],
        *,
        round: int | None = None,
        host: str = "python",
        refused: Mapping[int, str] | None = None,
    ) -> AggregationResult:
        """Aggregate one round (see the module docstring for the steps).

        ``refused``: updates (by index) the host refuses before any check, with its reason
        (e.g. a sender that is not a member of the deployment); they are rejected, logged and
        recorded like any other rejection."""
        started = time.perf_counter()
        self.round = self.round + 1 if round is None else int(round)
        ids = [u.client_id if u.client_id is not None else i for i, u in enumerate(updates)]
        rejected: dict[int, str] = dict(refused or {})
        for i, u in enumerate(updates):
            reason = None if i in rejected else self.check(global_params, u)
            if reason is not None:
                rejected[i] = reason
        global_tensors = tensors_of(global_params)
        result_tensors, weights, skipped = (
            None,
            torch.zeros(len(updates), dtype=torch.float64),
            False,
        )
        for _attempt in range(2):
            accepted = [i for i in range(len(updates)) if i not in rejected]
            if not accepted:
                skipped = True
                break
            acc_updates = [updates[i] for i in accepted]
            result_tensors, w = self._combine(
                global_tensors,
                acc_updates,
                [placed_like(global_tensors, tensors_of(u.params)) for u in acc_updates],
            )
            finite = getattr(result_tensors, "finite", None)  # known if a kernel made them
            if finite is None:
                finite = all_finite_many(result_tensors)
            if finite:
                weights[accepted] = w.to(torch.float64)
                break
            bad = [i for i in accepted if not _finite(updates[i].params)]
            if not bad:  # finite inputs overflowed: nothing to blame, keep the model
                rejected.update({i: "aggregate overflowed to non-finite values" for i in accepted})
                skipped = True
                break
            rejected.update({i: "parameters contain NaN or Inf" for i in bad})
        else:
            skipped = True  # still non-finite after rejecting the culprits
        for i, reason in sorted(rejected.items()):
            log.warning(
                "%s round %s: rejected client %s: %s", self.name, self.round, ids[i], reason
            )
        if skipped:
            log.warning("%s round %s: no client accepted; global model kept", self.name, self.round)
            new_params = global_params
            weights.zero_()
        else:
            self._commit()
            assert result_tensors is not None
            new_params = rebuild(global_params, result_tensors)
        result = AggregationResult(
            params=new_params,
            weights=weights.tolist(),
            clients=ids,
            rejected=[Rejection(ids[i], r) for i, r in sorted(rejected.items())],
            skipped=skipped,
            extra=self._take_extra(),
        )
        self._record(host, ids, updates, result, time.perf_counter() - started)
        self._watch_skips(result)
        return result

    # -- secure aggregation -----------------------------------------------------------------
    def secure_refusal(self) -> str | None:
        """Why this aggregator cannot run on a masked sum (``None``: it can, see
        :meth:`weigh`). The default: it needs each client's model."""
        return (
            f"{self.name!r} needs each client's model, and under secure aggregation the server "
            "sees only their masked sum"
        )

    def client_weights(self, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        """Normalised weights of accepted clients from their scalars (linear aggregators)."""
        raise NotImplementedError(f"{self.name!r} has no scalar weights")

    def step(
        self, global_tensors: list[torch.Tensor], average: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """The new global tensors from the weighted average (identity unless overridden)."""
        return average

    def weigh(
        self,
        updates: Sequence[ClientUpdate],
        *,
        round: int | None = None,
        with_norms: bool = False,
        refused: Mapping[int, str] | None = None,
    ) -> Weighing:
        """This round's client weights from sample counts and metrics alone.

        ``updates`` need no parameters (``params`` is ignored). The checks and bounds are
        :meth:`aggregate`'s that read scalars; a client the scalars reject gets weight 0.
        ``with_norms``: each client must also report :data:`UPDATE_NORM` (a client that does
        not is rejected), and :meth:`finish` holds the unmasked sum to those reports.
        ``refused`` as in :meth:`aggregate`.
        """
        reason = self.secure_refusal()
        if reason is not None:
            raise ParameterError(f"secure aggregation: {reason}")
        self.round = self.round + 1 if round is None else int(round)
        self._take_extra()  # nothing left over from an earlier round
        ids = [u.client_id if u.client_id is not None else i for i, u in enumerate(updates)]
        rejected = dict(refused or {})
        rejected.update(
            (i, r)
            for i, u in enumerate(updates)
            if i not in rejected and (r := self.check_scalars(u)) is not None
        )
        norms: list[float] | None = None
        if with_norms:
            norms = [_reported_norm(u) for u in updates]
            for i, norm in enumerate(norms):
                if math.isnan(norm):
                    rejected.setdefault(
                        i,
                        f"metric {UPDATE_NORM!r} must be a finite number >= 0 (under secure "
                        f"aggregation it bounds the unmasked sum), got "
                        f"{shown(updates[i].metrics.get(UPDATE_NORM))}",
                    )
        accepted = [i for i in range(len(updates)) if i not in rejected]
        weights = torch.zeros(len(updates), dtype=torch.float64)
        if accepted:
            weights[accepted] = self.client_weights([updates[i] for i in accepted]).to(
                torch.float64
            )
        return Weighing(
            self.round,
            ids,
            weights.tolist(),
            updates,
            rejected,
            extra=self._take_extra(),
            norms=norms,
        )

    def finish(
        self,
        global_params: Params,
        weighted_sum: Params | None,
        weighing: Weighing,
        *,
        dropped: Sequence[int] | Mapping[int, str] = (),
        host: str = "python",
        protocol: str = "secure",
        resolution: float = 0.0,
    ) -> AggregationResult:
        """The round's result from ``sum_i w_i x_i`` over the clients that took part.

        ``dropped`` are the indices (into ``weighing.updates``) of clients weighed but missing
        from the sum (a mapping gives each one's reason): the others' weights are renormalised
        to sum to 1, so the result is their weighted average (the bounds stay as weighed, with
        every client). ``None`` or a non-finite sum keeps the global model (the round is
        skipped).

        When the weighing has the clients' update norms (``weigh(with_norms=True)``), the
        average may move the model no further than the longest update a client reported (each
        report counted up to :data:`NORM_CAP` times their median): a weighted average of honest
        updates cannot (triangle inequality), so a sum that does holds a misreported weight or
        model, and the round is skipped. ``resolution`` is the protocol's largest error per
        coordinate of the sum (its quantization), allowed on top.
        """
        started = time.perf_counter()
        rejected = dict(weighing.rejected)
        reasons = dropped if isinstance(dropped, Mapping) else dict.fromkeys(dropped, "")
        for i, why in reasons.items():
            rejected.setdefault(i, why or "dropped out after its weight was computed")
        w = torch.tensor(weighing.weights, dtype=torch.float64)
        keep = torch.tensor([i not in rejected for i in range(len(w))], dtype=torch.bool)
        w = torch.where(keep, w, torch.zeros_like(w))
        # Renormalised only when a weighed client is missing: otherwise the weights are
        # exactly the ones the clients applied.
        mass = float(w.sum()) if len(rejected) > len(weighing.rejected) else 1.0
        skipped = weighted_sum is None or float(w.sum()) <= 0
        new_params = global_params
        if not skipped:
            assert weighted_sum is not None
            g = tensors_of(global_params)
            average = [t.to(torch.float64) / mass for t in placed_like(g, tensors_of(weighted_sum))]
            out = [o.to(t.dtype) for o, t in zip(self.step(g, average), g, strict=True)]
            beyond = None
            if weighing.norms is not None:
                kept = [n for n, k in zip(weighing.norms, keep.tolist(), strict=True) if k]
                beyond = _beyond_reports(g, average, kept, resolution / mass)
            if beyond is not None:
                log.warning("%s round %s: %s; global model kept", self.name, weighing.round, beyond)
                skipped = True
            elif all_finite_many(out):
                self._commit()
                new_params = rebuild(global_params, out)
                w = w / mass
            else:
                log.warning(
                    "%s round %s: the unmasked sum is not finite; global model kept",
                    self.name,
                    weighing.round,
                )
                skipped = True
        if skipped:
            w.zero_()
        for i, reason in sorted(rejected.items()):
            log.warning(
                "%s round %s: rejected client %s: %s",
                self.name,
                weighing.round,
                weighing.clients[i],
                reason,
            )
        result = AggregationResult(
            params=new_params,
            weights=w.tolist(),
            clients=list(weighing.clients),
            rejected=[Rejection(weighing.clients[i], r) for i, r in sorted(rejected.items())],
            skipped=skipped,
            extra={**weighing.extra, "secure": protocol},
        )
        self._record(
            host, list(weighing.clients), weighing.updates, result, time.perf_counter() - started
        )
        self._watch_skips(result)
        return result

    def _record(
        self,
        host: str,
        ids: list[Any],
        updates: Sequence[ClientUpdate],
        result: AggregationResult,
        spent: float,
    ) -> None:
        record(
            {
                "host": host,
                "round": self.round,
                "aggregator": self.name,
                "clients": ids,
                "num_samples": [u.num_samples for u in updates],
                "metrics": [dict(u.metrics) for u in updates],
                "weights": result.weights,
                "rejected": [{"client": r.client, "reason": r.reason} for r in result.rejected],
                "skipped": result.skipped,
                "elapsed_s": round(time.monotonic() - self._started, 3),
                "aggregate_s": round(spent, 6),
                **result.extra,
            }
        )

    def get_params(self) -> dict[str, Any]:
        """Constructor arguments, as stored on the instance."""
        import inspect

        sig = inspect.signature(type(self).__init__)
        return {
            p.name: getattr(self, p.name)
            for p in sig.parameters.values()
            if p.kind is p.KEYWORD_ONLY
        }

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"


def _finite(params: Params) -> bool:
    return all_finite_many(tensors_of(params))


def _reported_norm(update: ClientUpdate) -> float:
    """``update``'s reported :data:`UPDATE_NORM`, NaN when it is missing or not a finite
    number >= 0."""
    raw = update.metrics.get(UPDATE_NORM)
    if isinstance(raw, bool) or not isinstance(raw, numbers.Real):
        return math.nan
    value = float(raw)
    return value if math.isfinite(value) and value >= 0 else math.nan


def _beyond_reports(
    global_tensors: list[torch.Tensor],
    average: list[torch.Tensor],
    norms: list[float],
    resolution: float,
) -> str | None:
    """Why ``average`` cannot be a weighted average of updates as long as ``norms`` (``None``:
    it can). Floating-point tensors only, as the clients measure them."""
    if not norms:
        return None
    cap = NORM_CAP * float(torch.tensor(norms, dtype=torch.float64).median())
    limit = max(min(n, cap) for n in norms)
    size = sum(t.numel() for t in global_tensors if t.is_floating_point())
    moved = update_norm(global_tensors, average)
    allowed = limit * (1 + 1e-9) + resolution * math.sqrt(size)
    if moved <= allowed:
        return None
    return (
        f"the unmasked average moves the model by {moved:.6g}, more than the longest update a "
        f"client reported ({limit:.6g}, each report counted up to {NORM_CAP:g}x their median; "
        f"{allowed:.6g} with the protocol's rounding): a client misreported its weight or its "
        "model"
    )
