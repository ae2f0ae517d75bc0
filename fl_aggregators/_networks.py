"""Sizes and sorting networks that both the kernels' dispatch (:mod:`fl_aggregators._kernels`)
and their numba code (:mod:`fl_aggregators._compiled`) are built on: a module below both, so
that neither imports the other's module to read them."""

from __future__ import annotations

import functools

#: Values per block of the weighted sum: the float64 accumulator (32 KiB) stays in L1/L2.
BLOCK = 4096
#: Up to this many clients the median's comparators run in registers (no buffer); above it,
#: groups of this many are sorted in registers, then merged on rows of lanes in L1. A power
#: of two (the groups that Batcher's sort sorts first).
REGISTER_CLIENTS = 16


@functools.lru_cache(maxsize=256)
def _batcher(k: int) -> tuple[tuple[int, int, int], ...]:
    """Batcher's odd-even merge sort of ``k`` wires, as comparators ``(a, b, p)``, ``a < b``,
    where ``p`` is the size of the sorted runs that the comparator's pass merges."""
    # Built on the next power of two of wires. Every comparator puts the smaller value on the
    # lower wire, so pads above wire k - 1 (think +inf) never move: comparators touching one
    # are no-ops and are dropped. The first passes sort aligned groups of 2, 4, 8, ... wires.
    p2 = 1 << max(0, (k - 1).bit_length())
    net = []
    p = 1
    while p < p2:
        step = p
        while step >= 1:
            j = step % p
            while j <= p2 - 1 - step:
                for i in range(min(step, p2 - j - step)):
                    a, b = i + j, i + j + step
                    if a // (2 * p) == b // (2 * p) and b < k:
                        net.append((a, b, p))
                j += 2 * step
            step //= 2
        p *= 2
    return tuple(net)


@functools.lru_cache(maxsize=256)
def _network(k: int, after: int = 0) -> tuple[tuple[int, int, int], ...]:
    # Backwards from the two middle wires: keep what can reach them, and of a comparator only
    # the half (min or max) whose output is read later. ``after``: only the passes that merge
    # runs of at least that many wires (the earlier ones sort aligned groups of ``after``).
    need = {(k - 1) // 2, k // 2}
    kept = []
    for a, b, p in reversed(_batcher(k)):
        if a in need or b in need:
            if p >= after:
                kept.append((a, b, 0 if a in need and b in need else 1 if a in need else 2))
            need |= {a, b}
    return tuple(reversed(kept))
