"""fedbalance's Flower app: ServerApp and ClientApp on fedbalance's strategy and client helper.

``pyproject.toml`` beside this file makes the folder a Flower app (``flwr run
benchmarks/flower_app ...``); its components are this installed package's modules, so they
import fedbalance like any user's app would. Needs Flower's environment (``fedbalance[flower,
bench]``).
"""

from __future__ import annotations

from typing import Any

#: How the simulation's engine finds the messages for its virtual nodes (``simulate``):
#: ``index`` (fedbalance's, one scan of the stored messages a pass, the default) or ``flower``
#: (Flower's, one query per node). Here, not in ``simulate``: read without flwr installed.
POLLING_ENV, POLLING = "FEDBALANCE_FLOWER_POLLING", ("index", "flower")

#: How many ClientApp actors the simulation keeps: unset, Flower's default (one per CPU core Ray
#: finds, each client asking for one); ``N``, exactly ``N`` whatever the machine. Each actor is
#: a process that imports torch and the app and loads the data: on 2 cores a 2-node, 2-round
#: digits run took 33.8 CPU-s (23.5 s) with two actors and 20.6 CPU-s (20.6 s) with one.
ACTORS_ENV, MAX_ACTORS = "FEDBALANCE_FLOWER_ACTORS", 1024


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
