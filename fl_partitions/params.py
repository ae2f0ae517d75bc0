"""fedbalance's errors and parameter checks, as :mod:`fl_checks` defines them: third-party
partitioner and aggregator plugins import them from here, so the names stay."""

from fl_checks import (
    FedbalanceError,
    ParameterError,
    check_flag,
    check_float,
    check_fractions,
    check_int_range,
    check_positive_float,
    check_positive_int,
    shown,
)

__all__ = [
    "FedbalanceError",
    "ParameterError",
    "check_flag",
    "check_float",
    "check_fractions",
    "check_int_range",
    "check_positive_float",
    "check_positive_int",
    "shown",
]
