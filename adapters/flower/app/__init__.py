"""fedbalance's Flower app: ServerApp and ClientApp on fedbalance's strategy and client helper.

``pyproject.toml`` beside this file makes the folder a Flower app (``flwr run
adapters/flower/app ...``); its components are this installed package's modules, so they
import fedbalance like any user's app would. Needs Flower's environment (``fedbalance[flower,
bench]``).
"""

from __future__ import annotations

from typing import Any

from fl_adapters.flower.spec import ACTORS_ENV, MAX_ACTORS, POLLING, POLLING_ENV

__all__ = ["ACTORS_ENV", "MAX_ACTORS", "POLLING", "POLLING_ENV", "backend_config"]


def backend_config(actors: str | None) -> dict[str, Any]:
    """Flower's ``backend_config`` for the app's simulations: one CPU per client and, with
    ``actors`` (:data:`ACTORS_ENV`'s value), Ray given that many CPUs, so as many actors.
    Raises ``ValueError`` naming the variable for anything but a whole number in
    [1, MAX_ACTORS] or unset/empty."""
    config: dict[str, Any] = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    if actors is None or actors == "":
        return config
    if not (actors.strip().isdecimal() and 1 <= int(actors) <= MAX_ACTORS):
        raise ValueError(
            f"{ACTORS_ENV} must be a whole number of ClientApp actors in [1, {MAX_ACTORS}] (or "
            f"unset for one per CPU core), got {actors!r}"
        )
    return config | {"init_args": {"num_cpus": int(actors)}}
