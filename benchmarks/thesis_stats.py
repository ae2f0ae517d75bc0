"""The statistics the thesis claims are judged by: differences of means and of spreads.

Our grid is a paired design: for a seed, every aggregator trains on the same partitions, client
sampling and initial model, so a comparison uses the per-seed differences (a paired t-test, and
the Pitman-Morgan test for two spreads). The thesis publishes only a mean and a std of 5 runs
per cell, so its columns use Welch's t-test and the F-test of two variances. Every std is the
sample std (n - 1).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

#: Two-sided significance level of every test.
ALPHA = 0.05


@dataclass(frozen=True)
class Estimate:
    """A difference (points) with its standard error and degrees of freedom; ``seeds`` holds
    the per-seed differences when it came from paired runs, ``ids`` which seeds they are."""

    diff: float
    se: float
    df: float
    seeds: tuple[float, ...] | None = None
    ids: tuple[int, ...] | None = None

    def on(self, ids: Sequence[int]) -> tuple[float, ...]:
        """The per-seed differences of seeds ``ids`` (all of which this estimate has)."""
        assert self.seeds is not None and self.ids is not None
        at = dict(zip(self.ids, self.seeds, strict=True))
        return tuple(at[i] for i in ids)

    @property
    def p(self) -> float:
        """Two-sided p-value of ``diff != 0``."""
        if self.se == 0 or not math.isfinite(self.df) or self.df <= 0:
            return 0.0 if self.diff != 0 and self.se == 0 else 1.0
        return float(2 * stats.t.sf(abs(self.diff) / self.se, self.df))

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        """Two-sided confidence interval of the difference."""
        if self.se == 0 or self.df <= 0:
            return self.diff, self.diff
        h = float(stats.t.ppf(0.5 + level / 2, self.df)) * self.se
        return self.diff - h, self.diff + h

    @property
    def sign(self) -> int:
        """+1 / -1 where the difference is significant at :data:`ALPHA`, else 0."""
        return 0 if self.p >= ALPHA else (1 if self.diff > 0 else -1)

    def text(self) -> str:
        lo, hi = self.ci()
        return f"{self.diff:+.2f} [{lo:+.2f}, {hi:+.2f}], p {_p(self.p)}"


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def paired(differences: Sequence[float], ids: Sequence[int] | None = None) -> Estimate:
    """The mean of per-seed differences (of seeds ``ids``, ``0..n-1`` by default), with the
    paired t-test's standard error."""
    d = [float(x) for x in differences]
    n = len(d)
    who = tuple(ids) if ids is not None else tuple(range(n))
    if n < 2:
        return Estimate(d[0] if d else float("nan"), float("nan"), 0.0, tuple(d), who)
    return Estimate(statistics.mean(d), statistics.stdev(d) / math.sqrt(n), n - 1, tuple(d), who)


def _shared_seeds(estimates: Sequence[Estimate]) -> list[int] | None:
    """The seeds every estimate was paired on (two or more), in order; None if any is not
    paired or fewer than two are shared."""
    if any(e.ids is None or e.seeds is None for e in estimates):
        return None
    shared = set.intersection(*(set(e.ids or ()) for e in estimates))
    return sorted(shared) if len(shared) >= 2 else None


def welch(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int) -> Estimate:
    """``mean_a - mean_b`` from summary statistics (Welch's unequal-variance t-test)."""
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1)) if va + vb > 0 else 0.0
    return Estimate(mean_a - mean_b, se, df)


def average(estimates: Sequence[Estimate]) -> Estimate:
    """The mean of several differences: per seed on the seeds all were paired on, else as
    independent estimates (standard errors in quadrature, Welch-Satterthwaite df)."""
    shared = _shared_seeds(estimates)
    if shared is not None:
        columns = zip(*(e.on(shared) for e in estimates), strict=True)
        return paired([statistics.mean(col) for col in columns], shared)
    k = len(estimates)
    var = sum(e.se**2 for e in estimates)
    df_den = sum(e.se**4 / e.df for e in estimates if e.df > 0)
    df = var**2 / df_den if df_den > 0 else 0.0
    return Estimate(statistics.mean(e.diff for e in estimates), math.sqrt(var) / k, df)


def difference(a: Estimate, b: Estimate) -> Estimate:
    """``a - b``: per seed on the seeds both were paired on, else independent."""
    shared = _shared_seeds([a, b])
    if shared is not None:
        return paired([x - y for x, y in zip(a.on(shared), b.on(shared), strict=True)], shared)
    var = a.se**2 + b.se**2
    den = sum(e.se**4 / e.df for e in (a, b) if e.df > 0)
    return Estimate(a.diff - b.diff, math.sqrt(var), var**2 / den if den > 0 else 0.0)


@dataclass(frozen=True)
class SpreadTest:
    """Whether ``a``'s spread differs from ``b``'s: the ratio of the stds and a p-value."""

    sd_a: float
    sd_b: float
    p: float

    @property
    def sign(self) -> int:
        """+1 if ``a`` is significantly more spread than ``b``, -1 if less, else 0."""
        return 0 if self.p >= ALPHA else (1 if self.sd_a > self.sd_b else -1)

    def text(self) -> str:
        return f"std {self.sd_a:.2f} vs {self.sd_b:.2f}, p {_p(self.p)}"


def pitman_morgan(a: Sequence[float], b: Sequence[float]) -> SpreadTest:
    """Equal variances of two *paired* samples (Pitman 1939, Morgan 1939): the correlation of
    ``a + b`` with ``a - b`` is zero exactly when the variances are equal."""
    n = len(a)
    sd_a, sd_b = statistics.stdev(a), statistics.stdev(b)
    s = [x + y for x, y in zip(a, b, strict=True)]
    d = [x - y for x, y in zip(a, b, strict=True)]
    if n < 3 or statistics.pstdev(s) == 0 or statistics.pstdev(d) == 0:
        return SpreadTest(sd_a, sd_b, 1.0)
    r = statistics.correlation(s, d)
    if abs(r) >= 1:
        return SpreadTest(sd_a, sd_b, 0.0)
    t = r * math.sqrt((n - 2) / (1 - r * r))
    return SpreadTest(sd_a, sd_b, float(2 * stats.t.sf(abs(t), n - 2)))


def f_test(sd_a: float, n_a: int, sd_b: float, n_b: int) -> SpreadTest:
    """Equal variances of two independent samples from their stds (two-sided F-test)."""
    if sd_a == 0 and sd_b == 0:
        return SpreadTest(sd_a, sd_b, 1.0)
    if sd_a == 0 or sd_b == 0:
        return SpreadTest(sd_a, sd_b, 0.0)
    f = sd_a**2 / sd_b**2
    one = stats.f.sf(f, n_a - 1, n_b - 1) if f > 1 else stats.f.cdf(f, n_a - 1, n_b - 1)
    return SpreadTest(sd_a, sd_b, float(min(1.0, 2 * one)))
