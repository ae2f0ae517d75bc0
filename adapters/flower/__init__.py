"""fedbalance for Flower 1.41 and 1.42's message API: strategies, client helpers, Astraea, partitioners.

Unlike FedLab and FedML, Flower needs no patching: a Flower app asks for fedbalance in its own
code (``strategy_from_run_config(context.run_config)`` in the ServerApp, :func:`train_reply` in
the ClientApp), so nothing is armed at import. Importing this package *is* asking for the
Flower adapter: it checks the installed flwr first and raises
:class:`~fl_adapters.autoload.HostNotSupported` naming the version it found, or an
``ImportError`` saying how to install it. Nothing else in fedbalance imports this package, so
fedbalance keeps working where flwr is absent or another release.

The names are re-exported lazily: importing the package checks flwr's version but imports
no flwr module until a name is used.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING, Any

from fl_adapters.autoload import FORCE_ENV, HostNotSupported, forced
from fl_adapters.hosts import FLOWER

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on use
    from fl_adapters.flower.astraea import (
        AstraeaStrategy,
        astraea_query_reply,
        astraea_train_reply,
    )
    from fl_adapters.flower.config import AppConfig, parse_run_config
    from fl_adapters.flower.datasets import FedBalancePartitioner
    from fl_adapters.flower.strategy import FedBalanceStrategy, strategy_from_run_config
    from fl_adapters.flower.trainer import (
        evaluate_reply,
        identify_reply,
        local_split,
        train_reply,
    )

#: The Flower releases (``major.minor``) this adapter was written and tested against.
RELEASES = FLOWER.releases
#: The oldest of them, as ``pip`` would be asked for it.
SUPPORTED = RELEASES[0]


def flwr_version() -> str | None:
    try:
        return importlib.metadata.version("flwr")
    except importlib.metadata.PackageNotFoundError:
        return None


def served(version: str) -> bool:
    """Whether flwr ``version`` is one of :data:`RELEASES` (any patch release of them)."""
    return any(version == r or version.startswith(r + ".") for r in RELEASES)


def require_flower() -> str:
    """The installed flwr version, if the adapter can serve it; else a clear error."""
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


require_flower()

_SOURCES = {
    "AppConfig": "config",
    "AstraeaStrategy": "astraea",
    "astraea_query_reply": "astraea",
    "astraea_train_reply": "astraea",
    "FedBalancePartitioner": "datasets",
    "FedBalanceStrategy": "strategy",
    "evaluate_reply": "trainer",
    "identify_reply": "trainer",
    "local_split": "trainer",
    "parse_run_config": "config",
    "strategy_from_run_config": "strategy",
    "train_reply": "trainer",
}

__all__ = [
    "AppConfig",
    "AstraeaStrategy",
    "FedBalancePartitioner",
    "FedBalanceStrategy",
    "RELEASES",
    "SUPPORTED",
    "astraea_query_reply",
    "astraea_train_reply",
    "evaluate_reply",
    "flwr_version",
    "identify_reply",
    "local_split",
    "parse_run_config",
    "require_flower",
    "strategy_from_run_config",
    "train_reply",
]


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
