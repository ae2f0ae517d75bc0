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
    the per-seed differences when it came from paired runs."""

    diff: float
    se: float
    df: float
    seeds: tuple[float, ...] | None = None

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


def paired(differences: Sequence[float]) -> Estimate:
    """The mean of per-seed differences, with the paired t-test's standard error."""
    d = [float(x) for x in differences]
    n = len(d)
    if n < 2:
        return Estimate(d[0] if d else float("nan"), float("nan"), 0.0, tuple(d))
    return Estimate(statistics.mean(d), statistics.stdev(d) / math.sqrt(n), n - 1, tuple(d))


def welch(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int) -> Estimate:
    """``mean_a - mean_b`` from summary statistics (Welch's unequal-variance t-test)."""
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1)) if va + vb > 0 else 0.0
    return Estimate(mean_a - mean_b, se, df)


def average(estimates: Sequence[Estimate]) -> Estimate:
    """The mean of several differences: per seed where all are paired on the same seeds, else
    as independent estimates (standard errors in quadrature, Welch-Satterthwaite df)."""
    seeds = [e.seeds for e in estimates]
    if all(s is not None for s in seeds) and len({len(s) for s in seeds if s is not None}) == 1:
        per_seed = [statistics.mean(col) for col in zip(*seeds, strict=True)]  # type: ignore[arg-type]
        return paired(per_seed)
    k = len(estimates)
    var = sum(e.se**2 for e in estimates)
    df_den = sum(e.se**4 / e.df for e in estimates if e.df > 0)
    df = var**2 / df_den if df_den > 0 else 0.0
    return Estimate(statistics.mean(e.diff for e in estimates), math.sqrt(var) / k, df)


def difference(a: Estimate, b: Estimate) -> Estimate:
    """``a - b``: per seed if both are paired on the same seeds, else independent."""
    if a.seeds is not None and b.seeds is not None and len(a.seeds) == len(b.seeds):
        return paired([x - y for x, y in zip(a.seeds, b.seeds, strict=True)])
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
