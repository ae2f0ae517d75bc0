"""fedbalance's strategy inside Flower 1.41's central-DP wrappers
(``DifferentialPrivacy{Server,Client}Side{Fixed,Adaptive}Clipping``).

Their noise ``z C / n`` is calibrated to a *uniform* mean; under other weights the heaviest
client of a round is protected as by a noise multiplier of

    z_eff = z / (n * server_lr * max_i w_i)

(``server_lr`` is FedAvgM's; 1 otherwise), which every round's train metrics carry as
``fedbalance-dp-z-effective``. What would void the noise is refused before the first round
(:func:`privacy_refusal`, and ``resume_from``). Why, and the app's run-config keys
(:func:`wrap_from_run_config`): docs/hosts/beside.md, "Differential privacy on Flower".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)
from flwr.serverapp.strategy.dp_adaptive_clipping import DifferentialPrivacyAdaptiveBase
from flwr.serverapp.strategy.dp_fixed_clipping import DifferentialPrivacyFixedClippingBase

from fl_adapters.config import ConfigError
from fl_adapters.flower.config import WHERE
from fl_aggregators import Aggregator, FedAvg

#: Flower's central-DP strategy wrappers (server- and client-side, fixed and adaptive).
DP_WRAPPERS = (DifferentialPrivacyFixedClippingBase, DifferentialPrivacyAdaptiveBase)

#: The train-metrics key of each round's effective noise multiplier.
Z_EFFECTIVE = "fedbalance-dp-z-effective"


def privacy_refusal(aggregator: Aggregator) -> str | None:
    """Why ``aggregator`` inside a DP wrapper would make the wrapper's noise meaningless."""
    from fl_adapters.flower.strategy import needs_mediators  # which imports this module

    if needs_mediators(aggregator):
        return (
            "Astraea's mediators train client chains, so the wrapper would clip a mediator's "
            "model, not one client's update"
        )
    if not isinstance(aggregator, FedAvg):
        return (
            f"{aggregator.name!r} is not a weighted mean of the client models: the wrapper's "
            "noise z*C/n is calibrated to a mean's sensitivity, which a coordinate median (or "
            "an aggregator fedbalance cannot inspect) does not have"
        )
    beta = float(getattr(aggregator, "beta", 0.0))
    if beta > 0:
        return (
            f"{aggregator.name!r} with beta={beta} (server momentum) adds earlier "
            "rounds' noise-free averages to every later model, outside the wrapper's noise; "
            "beta: 0 keeps the guarantee's form"
        )
    return None


def effective_noise_multiplier(
    wrapper: Any, aggregator: Aggregator, weights: Sequence[float]
) -> float:
    """``z / (n * server_lr * max_i w_i)``: the noise multiplier the heaviest client of the
    round got (see the module docstring); ``z`` itself for a uniform mean."""
    top = max(weights, default=0.0) * float(getattr(aggregator, "server_lr", 1.0))
    if top <= 0:
        return float("inf")
    return float(wrapper.noise_multiplier) / (int(wrapper.num_sampled_clients) * top)


#: Run-config keys of the app's DP option (``dp`` "" leaves the strategy unwrapped).
DP_KEY = "dp"
NOISE_KEY = "dp-noise-multiplier"
CLIP_KEY = "dp-clipping-norm"
#: ``dp`` values: the server-side wrappers, which need nothing on the ClientApp. The
#: client-side ones need ``fixedclipping_mod`` / ``adaptiveclipping_mod`` in the ClientApp's
#: mods: wrap the strategy in them in your own ServerApp (the same checks apply).
DP_KINDS = ("server-fixed", "server-adaptive")


def _positive(run_config: Mapping[str, Any], key: str, *, zero_ok: bool) -> float:
    value = run_config.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isfinite(value) and (value > 0 or (zero_ok and value == 0)):
            return float(value)
    want = "a finite float >= 0" if zero_ok else "a finite float > 0"
    raise ConfigError(f"{WHERE} {key} must be {want} when {DP_KEY} is set, got {value!r}")


def wrap_from_run_config(
    strategy: Strategy, run_config: Mapping[str, Any], clients_per_round: int
) -> Strategy:
    """``strategy`` in the DP wrapper the run config's ``dp`` names, or as is (``dp`` "").

    ``dp-noise-multiplier`` is the wrapper's ``z``; ``dp-clipping-norm`` its clipping norm
    (the initial one for ``server-adaptive``); ``clients_per_round`` its
    ``num_sampled_clients``. Drive the rounds with the returned strategy's ``start``.
    """
    kind = run_config.get(DP_KEY, "")
    if kind in ("", None):
        return strategy
    if kind not in DP_KINDS:
        raise ConfigError(
            f"{WHERE} {DP_KEY} must be one of {', '.join(map(repr, ('', *DP_KINDS)))}, got {kind!r}"
        )
    z = _positive(run_config, NOISE_KEY, zero_ok=True)
    clip = _positive(run_config, CLIP_KEY, zero_ok=False)
    try:
        if kind == "server-fixed":
            return DifferentialPrivacyServerSideFixedClipping(strategy, z, clip, clients_per_round)
        return DifferentialPrivacyServerSideAdaptiveClipping(
            strategy, z, clients_per_round, initial_clipping_norm=clip
        )
    except ValueError as e:  # Flower's own checks, e.g. adaptive clipping's noise budget
        raise ConfigError(f"{WHERE} {DP_KEY} = {kind!r} with {NOISE_KEY} = {z}: {e}") from e
