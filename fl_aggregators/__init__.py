"""Server-side aggregation for federated learning (torch; no FL framework imported)."""

from fl_aggregators.astraea import Astraea
from fl_aggregators.base import (
    UPDATE_NORM,
    AggregationResult,
    Aggregator,
    NothingAggregated,
    Rejection,
)
from fl_aggregators.fedavg import FedAvg
from fl_aggregators.fedavgm import FedAvgM
from fl_aggregators.fedloss import FedLoss
from fl_aggregators.fedloss_n import FedLossN
from fl_aggregators.fedmedian import FedMedian
from fl_aggregators.update import ClientUpdate, Params

BUILTIN_AGGREGATORS: tuple[type[Aggregator], ...] = (
    FedAvg,
    FedAvgM,
    FedMedian,
    FedLoss,
    FedLossN,
    Astraea,
)

__all__ = [
    "Astraea",
    "BUILTIN_AGGREGATORS",
    "AggregationResult",
    "Aggregator",
    "ClientUpdate",
    "FedAvg",
    "FedAvgM",
    "FedLoss",
    "FedLossN",
    "FedMedian",
    "NothingAggregated",
    "Params",
    "Rejection",
    "UPDATE_NORM",
]
