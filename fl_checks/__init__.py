"""fedbalance's errors for what a user gives it, and the checks every plugin parameter uses.

Every check names the parameter, the allowed values and what was given, and raises
:class:`ParameterError` (a ``ValueError``) whatever was wrong with the value, its type
included. Every error fedbalance raises about its input derives from :class:`FedbalanceError`:
the CLI turns those into one line and exit 2 and lets anything else (a bug) keep its traceback.

A leaf: it imports nothing of fedbalance, so ``fl_aggregators`` and ``fl_partitions`` (which
are independent of each other) both build on it, and the adapters above them.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Sequence
from typing import cast

import numpy as np


class FedbalanceError(Exception):
    """Base of the errors fedbalance raises about its input: configs, parameters, files, plugins."""


class ParameterError(FedbalanceError, ValueError):
    """A plugin parameter or an input value outside what it accepts."""


#: How a given value is shown in an error: bounded, so a huge or deeply nested value (a YAML
#: alias bomb) costs no more to name than a small one.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 3, 8, 8, 8
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 80, 80, 40


def shown(value: object) -> str:
    """``repr(value)``, cut short for a large value."""
    return _SHOWN.repr(value)


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def _note(note: str) -> str:
    return f" ({note})" if note else ""


def check_int_range(name: str, value: object, low: int, high: int, *, note: str = "") -> int:
    """An integer in ``[low, high]``; ``note`` says what it counts."""
    if not _is_int(value) or not low <= value <= high:  # type: ignore[operator]
        raise ParameterError(
            f"{name} must be an int in [{low}, {high}]{_note(note)}, got {shown(value)}"
        )
    return int(value)  # type: ignore[call-overload]


def check_positive_int(name: str, value: object, *, minimum: int = 1, note: str = "") -> int:
    """An integer of at least ``minimum``; ``note`` says what it counts."""
    if not _is_int(value) or value < minimum:  # type: ignore[operator]
        raise ParameterError(f"{name} must be an int >= {minimum}{_note(note)}, got {shown(value)}")
    return int(value)  # type: ignore[call-overload]


def check_positive_float(name: str, value: object, *, allow_zero: bool = False) -> float:
    """A finite number > 0 (or >= 0 with ``allow_zero``)."""
    bound = ">= 0" if allow_zero else "> 0"
    v = _as_float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ParameterError(f"{name} must be a finite float {bound}, got {shown(value)}")
    return v


def check_flag(name: str, value: object) -> bool:
    """``True`` or ``False`` (not a truthy value: ``"false"`` is a typo, not a yes)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ParameterError(f"{name} must be true or false, got {shown(value)}")
    return bool(value)


def check_float(
    name: str,
    value: object,
    low: float,
    high: float | None = None,
    *,
    high_open: bool = False,
    optional: bool = False,
    note: str = "",
) -> float:
    """A finite number in ``[low, high]`` (``[low, high)`` with ``high_open``; ``>= low``
    without ``high``). With ``optional``, ``None`` (the feature off) is returned as is: the
    type says float for the callers that do not pass it."""
    if value is None and optional:
        return None  # type: ignore[return-value]
    v = _as_float(value)
    inside = low <= v and (high is None or (v < high if high_open else v <= high))
    if not (math.isfinite(v) and inside):
        where = (
            f">= {low:g}" if high is None else f"in [{low:g}, {high:g}{')' if high_open else ']'}"
        )
        none = "None or " if optional else ""
        raise ParameterError(
            f"{name} must be {none}a finite float {where}{_note(note)}, got {shown(value)}"
        )
    return v


def _as_float(value: object) -> float:
    """``value`` as a float; NaN for anything not a real number, inf beyond a float's range."""
    if not _is_real(value):
        return math.nan
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond a float's range
        return math.inf


def check_fractions(
    name: str,
    values: object,
    count: int,
    *,
    labels: Sequence[str] = (),
    first_positive: bool = False,
) -> tuple[float, ...]:
    """``count`` finite, non-negative fractions that sum to 1 (within rounding), given as a list,
    tuple or array of numbers; with ``first_positive`` the first is > 0. ``labels`` name them
    in the error."""
    listed = isinstance(values, (list, tuple)) or (
        isinstance(values, np.ndarray) and values.ndim == 1
    )
    seq = cast("Sequence[object]", values)
    vals = tuple(_as_float(v) for v in seq) if listed and len(seq) == count else ()
    if (
        len(vals) != count
        or any(not math.isfinite(v) or v < 0 for v in vals)
        or abs(sum(vals) - 1) > 1e-6
        or (first_positive and vals[0] <= 0)
    ):
        named = f" [{', '.join(labels)}]" if labels else ""
        positive = f" with {labels[0] if labels else 'the first'} > 0" if first_positive else ""
        raise ParameterError(
            f"{name} must be {count} non-negative fractions{named} summing to 1{positive}, "
            f"got {shown(values)}"
        )
    return vals
