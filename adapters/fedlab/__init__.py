"""fedbalance for FedLab 1.3.0: handler, trainers, datasets and partitioners (imports FedLab).

The names are re-exported lazily: :mod:`fl_adapters.fedlab.patches` runs inside
``import fedlab`` and must not import FedLab's classes (or fail on a FedLab without them)
before it has checked the FedLab version.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on use
    from fl_adapters.fedlab.data import FedBalancePartitioner, PartitionedDataset
    from fl_adapters.fedlab.handler import FedBalanceServerHandler
    from fl_adapters.fedlab.trainer import (
        FedBalanceClientTrainer,
        FedBalanceSerialTrainer,
        LocalConfig,
    )

_SOURCES = {
    "FedBalanceClientTrainer": "trainer",
    "FedBalancePartitioner": "data",
    "FedBalanceSerialTrainer": "trainer",
    "FedBalanceServerHandler": "handler",
    "LocalConfig": "trainer",
    "PartitionedDataset": "data",
}

__all__ = [
    "FedBalanceClientTrainer",
    "FedBalancePartitioner",
    "FedBalanceSerialTrainer",
    "FedBalanceServerHandler",
    "LocalConfig",
    "PartitionedDataset",
]


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
