"""Flower as fedbalance serves it: its host spec and the check of the installed flwr, light
(no flwr imported: this module is read where flwr is absent or another release).

Flower needs no arming: a Flower app asks for fedbalance in its own code, and any name of
:mod:`fl_adapters.flower` it uses checks flwr first (:func:`require_flower`).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fl_adapters.hosts import HostSpec, RunOptions

if TYPE_CHECKING:
    from fl_adapters.config import RunConfig

#: The Flower releases (``major.minor``) this adapter was written and tested against.
RELEASES = ("1.41", "1.42")
#: The oldest of them, as ``pip`` would be asked for it.
SUPPORTED = RELEASES[0]

#: How the simulation's engine finds the messages for its virtual nodes (``simulate``):
#: ``index`` (fedbalance's, one scan of the stored messages a pass, the default) or ``flower``
#: (Flower's, one query per node). Here, not in the app (``fl_adapters.flower.app``, which needs
#: flwr): fedbalance's environment sets them for Flower's.
POLLING_ENV, POLLING = "FEDBALANCE_FLOWER_POLLING", ("index", "flower")

#: How many ClientApp actors the simulation keeps: unset, Flower's default (one per CPU core Ray
#: finds, each client asking for one); ``N``, exactly ``N`` whatever the machine. Each actor is
#: a process that imports torch and the app and loads the data: on 2 cores a 2-node, 2-round
#: digits run took 33.8 CPU-s (23.5 s) with two actors and 20.6 CPU-s (20.6 s) with one.
ACTORS_ENV, MAX_ACTORS = "FEDBALANCE_FLOWER_ACTORS", 1024


def flwr_version() -> str | None:
    try:
        return importlib.metadata.version("flwr")
    except importlib.metadata.PackageNotFoundError:
        return None


def served(version: str) -> bool:
    """Whether flwr ``version`` is one of :data:`RELEASES` (any patch release of them)."""
    return any(version == r or version.startswith(r + ".") for r in RELEASES)


def require_flower() -> str:
    """The installed flwr version, if the adapter can serve it; else a clear error:
    :class:`~fl_adapters.autoload.HostNotSupported` naming the version found, or an
    ``ImportError`` saying how to install it."""
    from fl_adapters.autoload import FORCE_ENV, HostNotSupported, forced

    names = " or ".join(f"{r}.x" for r in RELEASES)
    version = flwr_version()
    if version is None:
        raise ImportError(
            f"fedbalance's Flower adapter needs flwr {names}, which is not installed: "
            f"pip install 'fedbalance[flower]' (in its own environment: flwr needs "
            f"protobuf>=5, FedML 0.9.6 protobuf<4)"
        )
    if not served(version) and not forced():
        raise HostNotSupported(
            f"found flwr {version}; fedbalance's Flower adapter supports flwr {names}. "
            f"Install one of those beside 'fedbalance[flower]', or set {FORCE_ENV}=1 to use "
            f"it anyway (at your risk)"
        )
    return version


def run(config: RunConfig, out: Path, options: RunOptions) -> dict[str, Any]:
    from fl_adapters.flower.runner import run_flower

    return run_flower(config, out, resume=options.resume)


def require() -> None:
    from fl_adapters.autoload import HostNotSupported

    try:
        require_flower()
    except ImportError as e:  # flwr absent: say what to install, exit 2 like a bad version
        raise HostNotSupported(str(e)) from e


def check(config: RunConfig) -> None:
    """Flower evaluates on the clients' test splits (``eval_data: clients``)."""
    from fl_adapters.config import ConfigError

    if config.eval_data != "clients":
        raise ConfigError(
            f"eval_data must be clients for {config.framework} (Flower evaluates on the "
            f"clients' test splits); got {config.eval_data!r}"
        )


FLOWER = HostSpec(
    name="flower",
    label="Flower",
    # Flower in its own environment: the simulation engine, or flower-superlink and one
    # flower-supernode per client on 127.0.0.1.
    frameworks=("flower", "flower-deployment"),
    releases=RELEASES,
    run=run,
    require=require,
    description="Flower: simulation and deployment engines (its own environment)",
    # The app's run config (evaluation draws from a stream of its own).
    may_change=(
        "num-server-rounds",
        "out-dir",
        "data-dir",
        "checkpoint-dir",
        "resume-from",
        "eval-every",
        "eval-fraction",
    ),  # fmt: skip
    check=check,
)
