"""The compiled screen behind :func:`fl_aggregators.astraea_plan.assign_mediators`.

Astraea's greedy step takes, among the unassigned clients, the one whose data added to the
mediator's pool gives the smallest ``round(KL(pool + counts[i] || uniform), 12)`` as numpy's
``_kl_uniform`` computes it, the lowest id on ties. Doing that with numpy for every candidate
is O(n^2 C) numpy work (10^4 clients x 47 classes: ~30 s). The screen finds a short list that
provably holds that pick, and only the short list goes through numpy's expression:

1. **float32 screen** of every candidate, 8 SIMD lanes of candidates at a time (the counts
   are stored classes x candidates): ``KL = (1/C) sum_j r_j log r_j`` with
   ``r_j = (pool_j + c_j) * C / T``, ``T = sum_j (pool_j + c_j)`` from precomputed row sums,
   and a branch-free polynomial log (exponent bits + ``2 atanh(s)`` on the significand).
2. **float64 check** of the survivors (``x / T``, ``log(x / T * C)``, as numpy's order of
   operations), after keeping one candidate per set of bitwise-identical rows (the lowest id:
   identical rows give numpy identical values, so only the lowest id can be the pick).
3. **numpy decides**: one survivor is the pick; otherwise the caller runs today's expression
   on the survivors (ascending ids) and takes the first minimum after rounding.

Why the pick survives. Let ``v_i`` be numpy's unrounded value for candidate ``i``, ``K_i`` the
exact KL of the same float inputs ``x = pool + c_i`` (both computations add the same float64
pool and row, so they see the same ``x``), and ``h`` a bound on ``|round(v, 12) - v|``
(:func:`round_error`). The pick ``i*`` has the smallest rounded value, so
``v_i* <= v_k + 2h`` for every ``k``. A stage whose values ``f`` satisfy ``|f_i - K_i| <= E``
and ``|v_i - K_i| <= E_np`` then gives ``f_i* <= f_k + 2(E + E_np) + 2h`` for every ``k``:
keeping every candidate within that margin of the stage's minimum keeps ``i*``. Stage 2 only
looks at stage 1's survivors, which hold ``i*``, so the same argument applies there; and
``i*`` is first in ascending ids among the survivors with its rounded value, since it is among
all candidates. The one property of numpy this rests on: ``_kl_uniform`` computes each row
on its own (elementwise operations and a sum along the row), so a row's value does not depend
on the rows passed with it (``test_astraea_plan`` checks it). The bounds, with unit roundoff
``u`` and ``gamma_k = k u / (1 - k u)``:

* numpy (:func:`numpy_error`): the row sum, ``x / T`` and ``* C`` carry a relative error of at
  most ``gamma_{C+1}``, the log adds ``LOG_ULPS`` ulps, the products and the sum of the terms
  ``gamma_{C+1}`` relative to ``sum_j q_j |log(C q_j)| <= log C + 1`` (``q = x / T``). Stage 2
  is the same computation in numba, with the same bound.
* the float32 screen (:func:`screen_error`): each ``r_j`` is within ``gamma_{C+7}`` (relative)
  of ``C x_j / T`` (the scaling by a power of two is exact; rounding the pool, the row and
  their sum to float32, the row sums and ``C / T`` make up the rest); the polynomial log is
  within ``TAU + 8.2u + 3.1u |log r|`` of ``log r`` (series truncated after ``s^7``,
  ``|s| <= 0.1716``, with the roundings of ``s``, Horner and the exponent term); the products
  and the sum of ``C`` terms add ``gamma_{C+8}`` relative to ``sum_j r_j |log r_j|``, which is
  ``C`` times the sum above. Both bounds are doubled before use.

The bounds assume no overflow or underflow: the screen is used only when the total count is
in ``[2^-900, 2^900]`` and within ``2^100`` of the smallest non-zero count (see
:func:`scale`); other inputs take the numpy code. Without numba, or with
``FEDBALANCE_KERNELS=0``, the caller takes the numpy code too (same result, slower).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fl_aggregators import _kernels

try:
    import numba
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover - numba is a dependency; the numpy code is the fallback
    numba = None  # type: ignore[assignment]

#: Unit roundoff of float32 and float64.
U32 = 2.0**-24
U64 = 2.0**-53
#: Accuracy assumed of the float64 ``log`` of numpy and of numba (libm): glibc documents at
#: most 1 ulp on x86-64, numpy's SIMD loops at most 4; the margin costs nothing.
LOG_ULPS = 8
#: Largest ``|s|`` of the polynomial log (``s = (m - 1) / (m + 1)``, ``m`` in
#: ``[fl32(sqrt(2) / 2), 2 fl32(sqrt(2) / 2))``), and the truncation error of ``2 atanh(s)``
#: after the ``s^7`` term: ``2 |s|^9 / (9 (1 - s^2))``.
S_MAX = 0.17158
TAU = 2 * S_MAX**9 / (9 * (1 - S_MAX**2))
#: Candidates per block of the float32 screen: the block's accumulators and ``C / T`` stay in L1.
BLOCK = 512
#: Total counts the screen takes, and how far below the total the smallest non-zero count may
#: lie: scaled so that the total is at most 2^60, every value then stays a normal float32
#: (>= 2^-41 before the ``C / T`` scaling, >= 2^-102 after it).
MAX_EXPONENT = 900
MAX_RANGE = 2.0**100


def available() -> bool:
    """Whether the screen runs (numba importable and the compiled kernels not turned off)."""
    return _kernels.available()


def _gamma(k: float, u: float) -> float:
    return k * u / (1 - k * u)


def numpy_error(classes: int) -> float:
    """Bound on ``|v - K|``: numpy's ``_kl_uniform`` of a row (and stage 2's) against the
    exact KL of the same float64 inputs (doubled)."""
    g = _gamma(classes + 1, U64)
    return 2 * (1.02 * g + 1.02 * (LOG_ULPS * U64 + 2 * g) * (math.log(classes) + 1))


def screen_error(classes: int) -> float:
    """Bound on ``|f - K|`` of the float32 screen (doubled)."""
    u = U32
    log_term = 8.2 * u + 1.02 * _gamma(classes + 7, u)
    spread = 3.1 * u + _gamma(classes + 8, u) + _gamma(classes - 1, u)
    return 2 * (
        1.01 * (TAU + log_term)
        + 1.02 * spread * (math.log(classes) + 1)
        + 2.01 * u * (math.log(classes) + 1)
    )


def round_error(classes: int) -> float:
    """Bound on ``|round(v, 12) - v|`` for a KL value ``v <= log C`` (numpy rounds
    ``v * 1e12`` to an integer and divides by ``1e12``)."""
    return 0.5e-12 + 4 * U64 * (math.log(classes) + 1)


def scale(counts: NDArray[np.float64]) -> float | None:
    """The power of two that brings the total count to (2^59, 2^60], or ``None`` when the
    counts fall outside the range the bounds cover (1.0 for all-zero counts)."""
    total = float(counts.sum())
    if total == 0:
        return 1.0
    smallest = float(counts[counts > 0].min())
    if not 2.0**-MAX_EXPONENT <= total <= 2.0**MAX_EXPONENT or total > smallest * MAX_RANGE:
        return None
    return 2.0 ** (60 - math.frexp(total)[1])


if numba is not None:

    @intrinsic
    def _split32(typingctx: Any, x: Any) -> Any:
        """A positive float32 as ``(k, m)`` with ``x = 2^k m`` exactly, ``m`` in
        ``[c, 2c)``, ``c = 0x3F3504F3`` (fl32(sqrt(2) / 2)); branch-free, as musl's ``logf``."""
        sig = types.UniTuple(types.float32, 2)(types.float32)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            i32 = ir.IntType(32)
            low = ir.Constant(i32, 0x3F3504F3)
            ix = builder.sub(builder.bitcast(args[0], i32), low)
            k = builder.sitofp(builder.ashr(ix, ir.Constant(i32, 23)), ir.FloatType())
            iy = builder.add(builder.and_(ix, ir.Constant(i32, 0x7FFFFF)), low)
            m = builder.bitcast(iy, ir.FloatType())
            return context.make_tuple(builder, signature.return_type, (k, m))

        return sig, codegen

    _F = np.float32
    _ONE, _LN2 = _F(1), _F(math.log(2))
    _K1, _K3, _K5, _K7 = _F(2), _F(2 / 3), _F(2 / 5), _F(2 / 7)

    @numba.njit(inline="always", error_model="numpy")
    def _log32(x):
        """``log(x)`` for a positive normal float32: ``k log 2 + 2 atanh(s)``,
        ``s = (m - 1) / (m + 1)``, the series to ``s^7``. Branch-free, so that it vectorises;
        0 gives a finite value, so ``0 * _log32(0)`` is 0."""
        k, m = _split32(x)
        s = (m - _ONE) / (m + _ONE)
        z = s * s
        return k * _LN2 + s * (((_K7 * z + _K5) * z + _K3) * z + _K1)

    @numba.njit(cache=True, inline="always", error_model="numpy")
    def _kl64(pool, row):
        """numpy's ``_kl_uniform`` of ``pool + row``: the same operations on each term (the
        terms summed in another order)."""
        total = 0.0
        for j in range(row.shape[0]):
            total += pool[j] + row[j]
        if total == 0:
            return 0.0
        c = np.float64(row.shape[0])
        kl = 0.0
        for j in range(row.shape[0]):
            p = (pool[j] + row[j]) / total
            if p > 0:
                kl += p * math.log(p * c)
        return kl

    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def _shortlist(
        pool,
        factor,
        lanes,
        sums,
        lane_id,
        m,
        counts,
        group,
        stamp,
        best,
        tick,
        margin32,
        margin64,
        f,
        g,
        p32,
        found,
        kl,
        out,
    ):
        """Stages 1 and 2 over the candidates ``lane_id[:m]``; writes the ids that may be the
        pick to ``out`` (ascending) and returns how many."""
        classes = lanes.shape[0]
        total = 0.0
        for j in range(classes):
            v = pool[j] * factor  # exact: a power of two, in range
            p32[j] = np.float32(v)
            total += v
        total32 = np.float32(total)
        c32 = np.float32(classes)
        inv_c = np.float32(1.0 / classes)
        for k in range(m):
            t = total32 + sums[k]
            g[k] = c32 / t if t > 0 else np.float32(0)  # an empty row and pool: KL 0
        low = np.inf
        for b in range(0, m, BLOCK):
            size = min(BLOCK, m - b)
            acc = f[b : b + size]
            norm = g[b : b + size]
            acc[:] = 0
            for j in range(classes):
                pj = p32[j]
                row = lanes[j, b : b + size]
                for k in range(size):  # the SIMD loop: one lane per candidate
                    r = (pj + row[k]) * norm[k]
                    acc[k] += r * _log32(r)
            for k in range(size):
                acc[k] *= inv_c
                low = min(low, acc[k])
        # Stage 2 on the survivors, one per set of identical rows (its lowest id).
        cut = low + margin32
        groups = 0
        for k in range(m):
            if f[k] <= cut:
                i = lane_id[k]
                gi = group[i]
                if stamp[gi] != tick:
                    stamp[gi] = tick
                    best[gi] = i
                    found[groups] = gi
                    groups += 1
                elif i < best[gi]:
                    best[gi] = i
        ids = np.sort(best[found[:groups]])
        low = np.inf
        for k in range(groups):
            kl[k] = _kl64(pool, counts[ids[k]])
            low = min(low, kl[k])
        cut = low + margin64
        n = 0
        for k in range(groups):
            if kl[k] <= cut:
                out[n] = ids[k]
                n += 1
        return n

    @numba.njit(cache=True, nogil=True)
    def _remove(lanes, sums, lane_id, lane_of, i, m):
        """Drop candidate ``i`` from ``lane_id[:m]`` (the last lane takes its place)."""
        k = lane_of[i]
        last = m - 1
        if k != last:
            for j in range(lanes.shape[0]):
                lanes[j, k] = lanes[j, last]
            sums[k] = sums[last]
            moved = lane_id[last]
            lane_id[k] = moved
            lane_of[moved] = k


class Screen:
    """The unassigned candidates of the greedy, as the compiled stages read them.

    ``shortlist(pool)`` returns the ids (ascending) one of which is numpy's pick for this
    pool: exactly one means it is the pick. ``remove(i)`` takes a candidate out.
    """

    def __init__(self, counts: NDArray[np.float64], factor: float) -> None:
        n, classes = counts.shape
        self.counts = np.ascontiguousarray(counts)
        self.factor = factor
        scaled = self.counts * factor  # exact: a power of two, in range (see scale())
        self.lanes = np.ascontiguousarray(scaled.T, dtype=np.float32)
        self.sums = scaled.sum(axis=1).astype(np.float32)
        self.lane_id = np.arange(n, dtype=np.int64)
        self.lane_of = np.arange(n, dtype=np.int64)
        self.m = n
        rows = self.counts.view(np.uint64)  # bitwise-identical rows, not merely equal ones
        self.group = np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
        groups = int(self.group.max()) + 1
        self.stamp = np.full(groups, -1, dtype=np.int64)
        self.best = np.zeros(groups, dtype=np.int64)
        self.tick = 0
        e_np = numpy_error(classes)
        h = round_error(classes)
        self.margin32 = 2 * (screen_error(classes) + e_np) + 2 * h
        self.margin64 = 2 * (e_np + e_np) + 2 * h
        self.f = np.empty(n, dtype=np.float32)
        self.g = np.empty(n, dtype=np.float32)
        self.p32 = np.empty(classes, dtype=np.float32)
        self.found = np.empty(n, dtype=np.int64)
        self.kl = np.empty(n, dtype=np.float64)
        self.out = np.empty(n, dtype=np.int64)

    def shortlist(self, pool: NDArray[np.float64]) -> NDArray[np.int64]:
        self.tick += 1
        n = _shortlist(
            pool, self.factor, self.lanes, self.sums, self.lane_id, self.m, self.counts,
            self.group, self.stamp, self.best, self.tick, self.margin32, self.margin64,
            self.f, self.g, self.p32, self.found, self.kl, self.out,
        )  # fmt: skip
        return self.out[:n]

    def remove(self, i: int) -> None:
        _remove(self.lanes, self.sums, self.lane_id, self.lane_of, i, self.m)
        self.m -= 1
