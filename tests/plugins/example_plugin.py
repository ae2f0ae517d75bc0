"""A fedbalance plugin: one aggregator and one partitioner (the plugin page's example)."""

import numpy as np
import torch

from fl_adapters.hookspecs import hookimpl
from fl_aggregators import FedAvg
from fl_partitions import Partitioner


class EqualWeights(FedAvg):
    """Every accepted client weighs the same, whatever its sample count."""

    name = "equal_weights"

    def client_weights(self, updates):
        return torch.full((len(updates),), 1.0 / len(updates), dtype=torch.float64)


class RoundRobin(Partitioner):
    """Round-robin split: sample i goes to client i mod N."""

    name = "round_robin"

    def assign(self, labels, num_clients, num_classes, rng):
        return np.arange(len(labels)) % num_clients


@hookimpl
def fedbalance_aggregators():
    return [EqualWeights]


@hookimpl
def fedbalance_partitioners():
    return [RoundRobin]
