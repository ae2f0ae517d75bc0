"""Seed handling shared by every partitioner: one helper, never the global RNG."""

from __future__ import annotations

import numpy as np

from fl_checks import ParameterError

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
            raise ParameterError(
                f"seed must be a non-negative int or a numpy Generator, got {seed!r}"
            )
        return np.random.default_rng(seed)
    raise ParameterError(f"seed must be an int, a numpy.random.Generator or None, got {seed!r}")


def derived_generator(seed: int, *path: int) -> np.random.Generator:
    """A generator for one sub-stream ``(seed, *path)``, independent of every other path.

    Used where a value must not depend on the order in which it is asked for, e.g. the
    noise of sample ``j`` of client ``i`` or the local split of client ``i``.
    """
    return np.random.default_rng(np.random.SeedSequence([int(seed), *(int(p) for p in path)]))


def seed_int(rng: np.random.Generator) -> int:
    """Draw a 63-bit integer from ``rng``, to seed derived sub-streams reproducibly."""
    return int(rng.integers(0, 2**63 - 1))
