"""fedbalance's errors for what a user gives it, and the checks every plugin parameter uses.

Every check names the parameter, the allowed values and what was given, and raises
:class:`ParameterError` (a ``ValueError``) whatever was wrong with the value, its type
included. Every error fedbalance raises about its input derives from :class:`FedbalanceError`:
the CLI turns those into one line and exit 2 and lets anything else (a bug) keep its traceback.
The module lives in the numpy-only core so both ``fl_partitions`` and ``fl_aggregators`` use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class FedbalanceError(Exception):
    """Base of the errors fedbalance raises about its input: configs, parameters, files, plugins."""


class ParameterError(FedbalanceError, ValueError):
    """A plugin parameter or an input value outside what it accepts."""


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def check_int_range(name: str, value: object, low: int, high: int) -> int:
    """An integer in ``[low, high]``."""
    if not _is_int(value) or not low <= value <= high:  # type: ignore[operator]
        raise ParameterError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    return int(value)  # type: ignore[call-overload]


def check_positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    """An integer of at least ``minimum``."""
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        raise ParameterError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)  # type: ignore[call-overload]


def check_positive_float(name: str, value: object, *, allow_zero: bool = False) -> float:
    """A finite number > 0 (or >= 0 with ``allow_zero``)."""
    bound = ">= 0" if allow_zero else "> 0"
    v = float(value) if _is_real(value) else math.nan  # type: ignore[arg-type]
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ParameterError(f"{name} must be a finite float {bound}, got {value!r}")
    return v


def check_fractions(name: str, values: Sequence[float], count: int) -> tuple[float, ...]:
    """``count`` non-negative fractions that sum to 1 (within rounding)."""
    try:
        vals = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        vals = ()
    if (
        len(vals) != count
        or any(not np.isfinite(v) or v < 0 for v in vals)
        or abs(sum(vals) - 1) > 1e-6
    ):
        raise ParameterError(
            f"{name} must be {count} non-negative fractions summing to 1, got {values!r}"
        )
    return vals
