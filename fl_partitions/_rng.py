"""Seed handling shared by every partitioner: one helper, never the global RNG."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SeedLike = int | np.random.Generator | None


def as_generator(seed: SeedLike) -> np.random.Generator:
    """Return a ``numpy.random.Generator`` for ``seed``.

    An ``int`` (or ``None`` for fresh OS entropy) builds a new PCG64 generator; a
    ``Generator`` is used as it is, so callers can thread one stream through several steps.
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
        if seed is not None and seed < 0:
            raise ValueError(f"seed must be a non-negative int or a numpy Generator, got {seed!r}")
        return np.random.default_rng(seed)
    raise TypeError(f"seed must be an int, a numpy.random.Generator or None, got {seed!r}")


def derived_generator(seed: int, *path: int) -> np.random.Generator:
    """A generator for one sub-stream ``(seed, *path)``, independent of every other path.

    Used where a value must not depend on the order in which it is asked for, e.g. the
    noise of sample ``j`` of client ``i`` or the local split of client ``i``.
    """
    return np.random.default_rng(np.random.SeedSequence([int(seed), *(int(p) for p in path)]))


def seed_int(rng: np.random.Generator) -> int:
    """Draw a 63-bit integer from ``rng``, to seed derived sub-streams reproducibly."""
    return int(rng.integers(0, 2**63 - 1))


def check_positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    """Validate an integer parameter, naming it, its allowed range and the value given."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_positive_float(name: str, value: object, *, allow_zero: bool = False) -> float:
    """Validate a float parameter that must be > 0 (or >= 0 with ``allow_zero``)."""
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a finite float {bound}, got {value!r}")
    v = float(value)
    if not np.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite float {bound}, got {value!r}")
    return v


def check_fractions(name: str, values: Sequence[float], count: int) -> tuple[float, ...]:
    """Validate ``count`` non-negative fractions that sum to 1 (within rounding)."""
    try:
        vals = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        vals = ()
    if (
        len(vals) != count
        or any(not np.isfinite(v) or v < 0 for v in vals)
        or abs(sum(vals) - 1) > 1e-6
    ):
        raise ValueError(
            f"{name} must be {count} non-negative fractions summing to 1, got {values!r}"
        )
    return vals
