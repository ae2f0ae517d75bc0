"""fedbalance for Flower 1.41 and 1.42's message API: strategies, client helpers, Astraea, partitioners.

Unlike FedLab and FedML, Flower needs no patching: a Flower app asks for fedbalance in its own
code (``strategy_from_run_config(context.run_config)`` in the ServerApp, :func:`train_reply` in
the ClientApp), so nothing is armed at import. Using any name of this package is asking for
the Flower adapter: it checks the installed flwr first
(:func:`~fl_adapters.flower.spec.require_flower`) and raises
:class:`~fl_adapters.autoload.HostNotSupported` naming the version it found, or an
``ImportError`` saying how to install it. Importing the package itself checks nothing, so that
its host spec (:mod:`fl_adapters.flower.spec`) is read where flwr is absent or another
release, and fedbalance keeps working there.

The names are re-exported lazily: no flwr module is imported until a name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fl_adapters.flower.spec import RELEASES, SUPPORTED, flwr_version, require_flower

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
    require_flower()
    return getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
