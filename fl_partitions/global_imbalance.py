"""Global class imbalance: resample the dataset so class sizes follow a profile.

Duan et al., "Self-Balancing Federated Learning With Global Imbalanced Data in Mobile
Systems", IEEE TPDS 32(1), 2021, https://doi.org/10.1109/TPDS.2020.3009406 — Astraea builds its
imbalanced datasets by sampling class sizes from a profile. Profiles:

* ``zipf``: size of the class of rank ``r`` (class id order) proportional to ``1 / r**exponent``.
* ``half_normal``: size proportional to the half-normal density at ``3 * r / (C - 1)``
  (the classes span three standard deviations, ``scale`` stretches that), as Astraea's
  imbalanced CINIC-10.
* ``letters``: English letter frequencies (a, b, c, ... in class id order), as Astraea's LTRF
  EMNIST; needs at most 26 classes.
* ``proportions``: explicit per-class proportions.

The largest feasible dataset with those proportions is kept (no class is oversampled), capped
by ``max_samples`` (any size: the cap only ever lowers the work); the kept samples are then
split by ``then`` (default IID), a split scheme other than ``mixed``, so specs nest at most two
deep. Inside ``mixed``, give the split scheme as its own component instead of ``then``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fl_checks import ParameterError, check_positive_float, check_positive_int
from fl_partitions._alloc import OwnerArray, class_positions
from fl_partitions._limits import MAX_CLASSES
from fl_partitions.base import IntArray, Partitioner, Resolve, resolver
from fl_partitions.iid import IID
from fl_partitions.mixed import Mixed

# Relative frequency (%) of English letters in text, a..z (Lewand, "Cryptological Mathematics").
LETTER_FREQUENCIES = (
    8.167,
    1.492,
    2.782,
    4.253,
    12.702,
    2.228,
    2.015,
    6.094,
    6.966,
    0.153,
    0.772,
    4.025,
    2.406,
    6.749,
    7.507,
    1.929,
    0.095,
    5.987,
    6.327,
    9.056,
    2.758,
    0.978,
    2.360,
    0.150,
    1.974,
    0.074,
)
PROFILES = ("zipf", "half_normal", "letters", "proportions")


def profile_proportions(
    profile: str,
    num_classes: int,
    *,
    exponent: float = 1.0,
    scale: float = 1.0,
    proportions: Sequence[float] | None = None,
) -> NDArray[np.float64]:
    """Per-class target proportions (summing to 1) of a named profile."""
    ranks = np.arange(num_classes, dtype=np.float64)
    if profile == "zipf":
        with np.errstate(over="ignore"):  # log space: a huge exponent underflows to 0
            w = np.exp(-exponent * np.log(ranks + 1.0))
    elif profile == "half_normal":
        x = 3.0 * ranks / max(num_classes - 1, 1) / scale
        with np.errstate(over="ignore"):  # a tiny scale: x**2 overflows, the weight is 0
            w = np.exp(-0.5 * x**2)
    elif profile == "letters":
        if num_classes > len(LETTER_FREQUENCIES):
            raise ParameterError(
                f"profile 'letters' supports at most 26 classes, got {num_classes}"
            )
        w = np.asarray(LETTER_FREQUENCIES[:num_classes])
    elif profile == "proportions":
        if proportions is None or len(proportions) != num_classes:
            got = None if proportions is None else len(proportions)
            raise ParameterError(
                f"proportions must list one value per class ({num_classes}), got {got}"
            )
        w = np.asarray(proportions, dtype=np.float64)
    else:
        raise ParameterError(f"profile must be one of {', '.join(PROFILES)}; got {profile!r}")
    return w / w.sum()


def _split_scheme(
    then: Partitioner | dict[str, Any] | None, resolve: Resolve | None
) -> Partitioner | None:
    """``then`` as a partitioner: a split scheme, not ``mixed`` (a spec's name is checked
    before it is built, so a spec nested thousands deep is refused at the first level, not by
    recursion; its kind once built, with whatever lookup ``resolve`` carries)."""
    if then is None:
        return None
    if isinstance(then, dict):
        name = str(then.get("name", "")).lower()
        if name in (Mixed.name, GlobalImbalance.name):
            _check_then(Mixed if name == Mixed.name else GlobalImbalance)
        then = (resolve or resolver())(then)
    if not isinstance(then, Partitioner):
        raise ParameterError(f"then must be a partitioner or a spec dict, got {then!r}")
    _check_then(type(then))
    return then


def _check_then(cls: type[Partitioner]) -> None:
    if cls.kind != "split":
        raise ParameterError(f"then must be a split scheme, got {cls.name!r} ({cls.kind})")
    if issubclass(cls, Mixed):
        raise ParameterError(
            "then must be a split scheme other than 'mixed': list global_imbalance as a "
            "component of mixed instead"
        )


class GlobalImbalance(Partitioner):
    """Global class imbalance: subsample classes to a zipf/half_normal/letters profile."""

    name = "global_imbalance"
    kind = "resample"

    def __init__(
        self,
        *,
        profile: str = "zipf",
        exponent: float = 1.0,
        scale: float = 1.0,
        proportions: Sequence[float] | None = None,
        max_samples: int | None = None,
        then: Partitioner | dict[str, Any] | None = None,
        resolve: Resolve | None = None,
    ) -> None:
        if profile not in PROFILES:
            raise ParameterError(f"profile must be one of {', '.join(PROFILES)}; got {profile!r}")
        self.profile = profile
        self.exponent = check_positive_float("exponent", exponent, allow_zero=True)
        self.scale = check_positive_float("scale", scale)
        if proportions is not None:
            count = len(proportions) if hasattr(proportions, "__len__") else -1
            if isinstance(proportions, (str, bytes)) or not 1 <= count <= MAX_CLASSES:
                raise ParameterError(
                    f"proportions must be a list of 1 to {MAX_CLASSES} numbers, one per class, "
                    f"got {type(proportions).__name__} of length {count if count >= 0 else '?'}"
                )
            props = [check_positive_float("proportions[]", p, allow_zero=True) for p in proportions]
            if sum(props) <= 0:
                raise ParameterError(
                    f"proportions must have a positive sum, got {list(proportions)}"
                )
            proportions = props
        elif profile == "proportions":
            raise ParameterError("profile 'proportions' needs proportions=[...] (one per class)")
        self.proportions = proportions
        self.max_samples = (
            None if max_samples is None else check_positive_int("max_samples", max_samples)
        )
        self.then = _split_scheme(then, resolve)

    def get_params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._param_names() if k != "resolve"}

    def spec(self) -> dict[str, Any]:
        out = super().spec()
        out["then"] = None if self.then is None else self.then.spec()
        return out

    def target_counts(self, available: IntArray) -> IntArray:
        """Class sizes to keep: the largest with the profile's shape that fits ``available``."""
        p = profile_proportions(
            self.profile,
            len(available),
            exponent=self.exponent,
            scale=self.scale,
            proportions=self.proportions,
        )
        with np.errstate(divide="ignore"):
            total = float(np.min(np.where(p > 0, available / p, np.inf)))
        if self.max_samples is not None:
            total = min(total, self.max_samples)
        # ``p * total`` is an integer in exact arithmetic for the class that binds ``total``
        # (and for every class whose proportion is a rational multiple of it, as zipf's are),
        # but lands an ulp either side of it depending on how ``exp``/``log`` round, which
        # differs between numpy releases and CPUs (numpy 1.26 and 2.x gave 700 and 701 for one
        # class). A relative tolerance far above rounding error and far below one sample makes
        # the floor the same everywhere.
        return np.minimum(np.floor(p * total * (1 + 1e-9)).astype(np.int64), available)

    def select(self, labels: IntArray, num_classes: int, rng: np.random.Generator) -> IntArray:
        positions = class_positions(labels, num_classes)
        want = self.target_counts(np.array([len(p) for p in positions], dtype=np.int64))
        kept = [
            rng.choice(pos, size=int(w), replace=False)
            for pos, w in zip(positions, want, strict=True)
        ]
        return np.sort(np.concatenate(kept)).astype(np.int64)

    def assign(
        self, labels: IntArray, num_clients: int, num_classes: int, rng: np.random.Generator
    ) -> OwnerArray:
        return (self.then or IID()).assign(labels, num_clients, num_classes, rng)
