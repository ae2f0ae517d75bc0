"""What the Flower app's ServerApp and ClientApp share: its config, data, model and training.

The app's run-config keys mirror :class:`~fl_adapters.config.RunConfig`'s fields, so a client
builds its data exactly as ``fedbalance run`` does (:func:`fl_adapters.experiment.training_data`:
same dataset, partition, local 70/10/20 split, feature noise and label flips for the same seed),
and trains with fedbalance's local training seeded by ``(seed, client, round)``.

The ServerApp forwards these keys to the clients in every message's ``ConfigRecord``, so a
ClientApp needs nothing from its own context but its ``partition-id``: that works in the
deployment engine, in ``flwr run``'s simulation, and in ``flwr.simulation.run_simulation``
(which passes an empty run config).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from torch import nn
from torch.utils.data import Dataset

from fl_adapters._training import local_train, stream_seed
from fl_adapters.config import RunConfig
from fl_checks import ParameterError
from fl_partitions import Partition
from fl_partitions.transforms import NoisyDataset

#: Run-config keys the clients need, forwarded by the ServerApp in each message's config.
CLIENT_KEYS = (
    "seed",
    "num-partitions",
    "dataset",
    "data-dir",
    "split",
    "partition",
    "model",
    "local-epochs",
    "batch-size",
    "optimizer",
    "lr",
    "max-samples",
)


def run_config_of(config: Mapping[str, Any]) -> RunConfig:
    """The app's keys as a fedbalance :class:`RunConfig` (validated there, errors name fields)."""
    max_samples = int(config.get("max-samples", 0))
    return RunConfig(
        dataset=str(config["dataset"]),
        data_dir=str(config.get("data-dir", "")) or None,
        split=json.loads(str(config.get("split", "[0.7, 0.1, 0.2]"))),
        partition=json.loads(str(config["partition"])),
        model=str(config["model"]),
        num_clients=int(config["num-partitions"]),
        clients_per_round=int(config.get("clients-per-round", 0) or config["num-partitions"]),
        local_epochs=int(config["local-epochs"]),
        batch_size=int(config["batch-size"]),
        optimizer=str(config["optimizer"]),
        lr=float(config["lr"]),
        seed=int(config["seed"]),
        max_samples=max_samples or None,
    )


def model_of(config: Mapping[str, Any]) -> nn.Module:
    """The run's model, shaped for its dataset's images and classes."""
    from fl_adapters.models import model_for

    return model_for(
        str(config["model"]), str(config["dataset"]), str(config.get("data-dir", "")) or None
    )


@functools.lru_cache(maxsize=2)
def _data(key: str) -> tuple[Dataset[Any], Partition]:
    from fl_adapters.experiment import training_data

    train, _, partition = training_data(run_config_of(json.loads(key)))
    return train, partition


def client_data(config: Mapping[str, Any], client: int) -> dict[str, Dataset[Any]]:
    """Client ``client``'s train/val/test datasets, as FedLab's ``PartitionedDataset`` has them."""
    key = json.dumps({k: config[k] for k in CLIENT_KEYS if k in config}, sort_keys=True)
    train, partition = _data(key)  # built once per process, not once per message
    if not 0 <= client < partition.num_clients:
        raise ParameterError(f"partition-id must be in [0, {partition.num_clients}), got {client}")
    return {
        split: NoisyDataset(
            train,
            partition.splits[client][split],
            std=float(partition.noise_std[client]),
            seed=partition.seed,
            client=client,
            flips=partition.client_flips(client),
        )
        for split in ("train", "val", "test")
    }


def train_fn(config: Mapping[str, Any], client: int, server_round: int) -> Any:
    """The client's local training for this round: fedbalance's, seeded per client and round."""
    cfg = run_config_of(config)

    def train(model: nn.Module, data: Dataset[Any]) -> int:
        return local_train(
            model,
            data,
            epochs=cfg.local_epochs,
            batch_size=cfg.batch_size,
            optimizer=cfg.optimizer,
            lr=cfg.lr,
            seed=stream_seed("flower-train", cfg.seed, client, server_round),
        )

    return train
