"""Any fedbalance partitioner as a Flower Datasets ``Partitioner`` (``flwr-datasets`` 0.6).

Flower Datasets has Dirichlet, pathological, shard and size partitioners, but no feature noise
and no composition. :class:`FedBalancePartitioner` serves every fedbalance scheme -- label and
quantity skew, global class imbalance, feature noise, noisy clients, ``mixed`` compositions --
through Flower Datasets' interface::

    partitioner = FedBalancePartitioner(30, {"name": "mixed"}, seed=0, noise_by="image")
    fds = FederatedDataset(dataset=..., partitioners={"train": partitioner}, shuffle=False)
    client_data = fds.load_partition(partition_id)

(``shuffle=False``: ``FederatedDataset`` shuffles rows before partitioning by default, which
renumbers the rows the partition's indices point at.)

The partition is computed once, from the dataset's ``partition_by`` column, by the same
partitioner with the same seed as ``fedbalance partition``, so partition ``i`` holds exactly
client ``i``'s indices there (and in FedLab and FedML runs). :meth:`load_split` gives a
client's train/validation/test part (70/10/20 by default, the partition's local split).

Feature noise: a client whose partition assigns a noise level gets, in column ``noise_by``,
the values plus the same fixed Gaussian noise fedbalance's
:class:`~fl_partitions.transforms.NoisyDataset` adds (a function of seed, client and dataset
index, see :func:`~fl_partitions.transforms.noise_block`). It is added on access, as float32,
to the column's values as stored. The partition's noise levels are in pixel units
(intensities in [0, 1], where NIID-Bench adds its noise); ``pixel_scale`` says how many of the
column's units one pixel unit is: 1 for [0, 1] pixels (the default), 255 for raw 0-255 pixels,
``1 / std`` for a column normalised with ``std``. Without ``noise_by`` the noise levels are
ignored, with a warning.

Label noise (``label_noise``): a noisy client's rows read their flipped labels in column
``partition_by``, the labels the partition lists for them (on access, as the noise), so its
train and validation rows carry the same wrong labels as in FedLab and FedML runs; its test rows
keep their true labels.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import Partitioner as FlowerPartitioner

from fl_adapters.registry import get_registry
from fl_checks import (
    ParameterError,
    check_fractions,
    check_positive_float,
    check_positive_int,
)
from fl_partitions import Partition, Partitioner
from fl_partitions.partition import DEFAULT_SPLIT, SPLIT_NAMES
from fl_partitions.transforms import noise_block

log = logging.getLogger(__name__)

#: The column that carries each row's index in the full dataset (the noise's key).
INDEX_COLUMN = "fedbalance_index"


class FedBalancePartitioner(FlowerPartitioner):
    """A fedbalance partitioner behind Flower Datasets' ``Partitioner`` interface.

    Parameters
    ----------
    num_partitions : number of clients.
    partitioner : a :class:`~fl_partitions.Partitioner`, a spec (``{"name": ..., **params}``)
        or a registered name.
    partition_by : the label column the partitioner reads.
    seed : every random choice of the partition (same seed, same partition).
    split : train/validation/test fractions of each client's local split.
    noise_by : the feature column that gets the partition's feature noise (see above).
    pixel_scale : the column's units per pixel unit (see above).
    """

    def __init__(
        self,
        num_partitions: int,
        partitioner: Partitioner | dict[str, Any] | str,
        *,
        partition_by: str = "label",
        seed: int = 0,
        split: Sequence[float] = DEFAULT_SPLIT,
        noise_by: str | None = None,
        pixel_scale: float = 1.0,
    ) -> None:
        super().__init__()
        check_positive_float("pixel_scale", pixel_scale)
        check_positive_int("num_partitions", num_partitions)
        if isinstance(partitioner, Partitioner):
            self.partitioner = partitioner
        else:
            self.partitioner = get_registry().make_partitioner(partitioner)
        self._num_partitions = num_partitions
        self.partition_by = partition_by
        self.seed = seed
        self.split = check_fractions("split", split, 3, labels=SPLIT_NAMES)
        self.noise_by = noise_by
        self.pixel_scale = float(pixel_scale)
        self._partition: Partition | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    @property
    def partition(self) -> Partition:
        """The fedbalance partition of the assigned dataset (computed on first use)."""
        if self._partition is None:
            labels = np.asarray(self.dataset[self.partition_by])
            self._partition = self.partitioner.partition(
                labels, self._num_partitions, seed=self.seed, split=self.split
            )
            noisy = int(np.count_nonzero(self._partition.noise_std))
            if noisy and self.noise_by is None:
                log.warning(
                    "%d of %d clients have feature noise, but noise_by names no column: "
                    "their partitions come without it",
                    noisy,
                    self._num_partitions,
                )
        return self._partition

    def _check_id(self, partition_id: int) -> int:
        if not 0 <= int(partition_id) < self._num_partitions:
            raise ParameterError(
                f"partition_id must be in [0, {self._num_partitions}), got {partition_id!r}"
            )
        return int(partition_id)

    def load_partition(self, partition_id: int) -> Dataset:
        """Client ``partition_id``'s rows (all of its local splits), noise included."""
        client = self._check_id(partition_id)
        return self._rows(client, self.partition.client_indices[client])

    def load_split(self, partition_id: int, split: str) -> Dataset:
        """One of client ``partition_id``'s local splits: ``train``, ``val`` or ``test``."""
        if split not in SPLIT_NAMES:
            raise ParameterError(f"split must be one of {', '.join(SPLIT_NAMES)}, got {split!r}")
        client = self._check_id(partition_id)
        return self._rows(client, self.partition.splits[client][split])

    def _rows(self, client: int, indices: np.ndarray) -> Dataset:
        rows = self.dataset.select(indices.tolist())
        std = float(self.partition.noise_std[client]) * self.pixel_scale
        column = self.noise_by if std > 0 else None
        flips = self.partition.client_flips(client)
        if flips is not None and not len(flips.lookup(indices)[0]):
            flips = None  # none of these rows is flipped (a test split, a low rate)
        if column is None and flips is None:
            return rows
        rows = rows.add_column(INDEX_COLUMN, indices.tolist())
        label, seed = self.partition_by, self.partition.seed

        def transform(batch: dict[str, Any]) -> dict[str, Any]:
            if column is not None:
                x = np.asarray(batch[column], dtype=np.float32)
                batch[column] = x + noise_block(x.shape[1:], std, seed, client, batch[INDEX_COLUMN])
            if flips is not None:
                batch[label] = flips.relabel(batch[INDEX_COLUMN], batch[label]).tolist()
            return batch

        return rows.with_transform(transform)
