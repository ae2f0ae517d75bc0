"""Which ``prime_number`` and ``precision_parameter`` FedML 0.9.6's LightSecAgg can compute
with, for ``worker_num`` silos (pure functions; :mod:`fl_adapters.fedml.secure` applies them).

What FedML does with them (``fedml/core/mpc/lightsecagg.py``, ``cross_silo/lightsecagg/``):

* A silo's model ``x`` becomes field elements ``round(x * 2**q) mod p`` (``my_q``, in float64
  then ``astype("int64")``), masks are ``np.random.randint(p)``, and the server decodes the
  unmasked sum ``v`` as ``v - p`` when ``v > (p - 1) / 2`` (``my_q_inv``), then ``/ 2**q``. So
  the sum of the silos' quantised models must lie within ``±(p - 1) / 2``, or it wraps into
  garbage. fedbalance scales silo ``i``'s model by ``s_i = N w_i`` before masking (``sum s_i =
  N``), so with ``R`` the largest ``|value|`` of any silo's model the sum stays within
  ``N (2**q R + 1/2)``: the rule is ``N (2**q R + 1/2) <= (p - 1) / 2``.
* The mask encoding (``LCC_encoding_with_points``) and decoding (``LCC_decoding_with_points``)
  are ``np.dot`` products of int64 Lagrange coefficients (< p) with int64 masks (< p) over
  ``U = worker_num`` terms, reduced mod p only afterwards; ``gen_Lagrange_coeffs``,
  ``PI`` and ``divmod`` multiply two field elements in int64. numpy's int64 wraps silently,
  so ``N (p - 1)**2 <= 2**63 - 1``.
* ``compute_aggregate_encoded_mask`` adds the ``N`` encoded masks in float64 (``np.zeros``),
  exact while ``N (p - 1) < 2**53``.
* ``divmod`` / ``modular_inv`` invert modulo ``p``, which needs ``p`` prime.

Issue #61's hostile runs used p = 2**63 - 25 (int64 overflow), p = 10**9 (not prime) and q = 40
with p near 2**30 (the sum wraps): training went on to a loss of 8e14 or NaN, and exit 0.
"""

from __future__ import annotations

import math

from fl_checks import ParameterError

#: numpy's int64, which FedML's mask coding multiplies field elements in.
INT64_MAX = 2**63 - 1
#: float64 holds every integer below this exactly (FedML adds encoded masks in float64).
FLOAT64_EXACT = 2**53
#: Miller-Rabin with these bases is exact for every n < 3.3 * 10**24 (> 2**64).
_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def is_prime(n: int) -> bool:
    """Whether ``n`` is prime: deterministic Miller-Rabin, exact for ``n < 3.3 * 10**24``."""
    if n < 2:
        return False
    for b in _BASES:
        if n % b == 0:
            return n == b
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for b in _BASES:
        x = pow(b, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def largest_prime_field(silos: int) -> int:
    """The largest ``p`` FedML's arithmetic takes for ``silos`` silos (``N (p - 1)**2 <= 2**63
    - 1`` and ``N (p - 1) < 2**53``); the prime to use is the largest prime up to it."""
    return min(math.isqrt(INT64_MAX // silos), (FLOAT64_EXACT - 1) // silos) + 1


def largest_prime_below(limit: int) -> int:
    """The largest prime ``<= limit`` (``limit >= 2``)."""
    n = limit
    while not is_prime(n):
        n -= 1
    return n


def value_bound(prime: int, precision: int, silos: int) -> float:
    """The largest ``|value|`` a silo's (scaled) model may hold: ``((p - 1) / (2 N) - 1/2) /
    2**q``, so that ``N`` of them, quantised, sum within ``±(p - 1) / 2`` (negative: none)."""
    return ((prime - 1) / (2 * silos) - 0.5) / 2.0**precision


def field_rule(silos: int) -> str:
    """The rule, as the errors and docs state it."""
    top = largest_prime_below(largest_prime_field(silos))
    return (
        f"a prime p with worker_num * (p - 1)**2 <= 2**63 - 1 (FedML's mask coding multiplies "
        f"field elements in int64), so at most {top} for worker_num {silos}"
    )


def check_field(prime: object, precision: object, silos: int) -> None:
    """``prime_number`` and ``precision_parameter`` before anything trains (the model's range
    is :func:`check_range`'s, once the model exists)."""
    for key, value in (("prime_number", prime), ("precision_parameter", precision)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ParameterError(
                f"federated_optimizer: LSA needs {key} (a positive int; e.g. prime_number: "
                f"1073741789, precision_parameter: 20), got {value!r}"
            )
    assert isinstance(prime, int) and isinstance(precision, int)  # narrowed above
    top = largest_prime_field(silos)
    if not is_prime(prime) or prime > top:
        what = "is not prime" if not is_prime(prime) else "is too large"
        raise ParameterError(f"prime_number must be {field_rule(silos)}; got {prime}, which {what}")
    if prime < silos + 1:  # the quantised sum's rounding alone fills the field
        raise ParameterError(
            f"prime_number must be at least worker_num + 1 = {silos + 1} (the sum of "
            f"{silos} rounded values must fit in ±(p - 1) / 2); got {prime}"
        )
    if precision > 62:  # my_q's int64
        raise ParameterError(
            f"precision_parameter must be an int in [1, 62] (FedML quantises into int64), "
            f"got {precision}"
        )


def range_problem(largest: float, prime: int, precision: int, silos: int) -> str | None:
    """Why a model whose largest ``|value|`` is ``largest`` cannot go through the field
    (``None``: it can)."""
    if not math.isfinite(largest):
        return "the model holds NaN or Inf values, which no field can carry"
    bound = value_bound(prime, precision, silos)
    if largest <= bound:
        return None
    # The largest precision this model fits at with this prime.
    fits = [q for q in range(1, 63) if largest <= value_bound(prime, q, silos)]
    better = f"precision_parameter <= {fits[-1]}, or " if fits else ""
    return (
        f"the model's largest |value| is {largest:.4g}, but prime_number {prime} with "
        f"precision_parameter {precision} holds |value| <= ((p - 1) / (2 * worker_num) - 1/2) "
        f"/ 2**precision_parameter = {bound:.4g} for worker_num {silos} (beyond it the "
        f"unmasked sum wraps around the field): use {better}a larger prime_number (at most "
        f"{largest_prime_below(largest_prime_field(silos))})"
    )
