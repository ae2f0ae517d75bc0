"""fedbalance partitioners as Flower Datasets partitioners: the same partitions and noise."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from flwr_datasets import FederatedDataset

from fl_adapters.datasets import load_digits
from fl_adapters.flower.datasets import INDEX_COLUMN, FedBalancePartitioner
from fl_partitions import Partition
from fl_partitions.transforms import NoisyDataset

CLIENTS = 5


@pytest.fixture(scope="module")
def digits() -> Dataset:
    data = load_digits(train=True)  # normalised, as fedbalance's runs feed the model
    return Dataset.from_dict({"image": data.x.numpy(), "label": data.targets})


def fedbalance_partition(tmp_path: Path, scheme: str, *sets: str) -> Partition:
    """``fedbalance partition`` (the CLI's own entry, in this process) written and read back."""
    from fl_adapters.cli import main

    out = tmp_path / f"{scheme}.json"
    argv = ["partition", "--dataset", "digits", "--scheme", scheme, "--clients", str(CLIENTS)]
    argv += ["--seed", "3", "--out", str(out)]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    return Partition.load(out)


@pytest.mark.parametrize(
    ("scheme", "sets"),
    [("label_dirichlet", ("beta=0.3",)), ("mixed", ()), ("quantity_dirichlet", ("beta=0.5",))],
    ids=["label-dirichlet", "mixed", "quantity-dirichlet"],
)
def test_partitions_equal_fedbalance_partition_for_the_same_seed(
    tmp_path: Path, digits: Dataset, scheme: str, sets: tuple[str, ...]
) -> None:
    expected = fedbalance_partition(tmp_path, scheme, *sets)
    params = {k: float(v) for k, v in (s.split("=") for s in sets)}
    partitioner = FedBalancePartitioner(CLIENTS, {"name": scheme, **params}, seed=3)
    partitioner.dataset = digits
    for client in range(CLIENTS):
        rows = partitioner.load_partition(client)
        want = expected.client_indices[client]
        assert len(rows) == len(want)
        assert rows["label"] == digits.select(want.tolist())["label"]
        got_split = {s: len(partitioner.load_split(client, s)) for s in ("train", "val", "test")}
        assert got_split == {s: len(expected.splits[client][s]) for s in got_split}


def test_feature_noise_is_fedbalances_noise(digits: Dataset) -> None:
    # The image column holds digits normalised as fedbalance's loader does ((x - 0.5) / 0.5):
    # two column units per pixel unit, and the noise levels are pixel units.
    partitioner = FedBalancePartitioner(
        CLIENTS, {"name": "feature_noise", "sigma": 0.4}, seed=3, noise_by="image", pixel_scale=2.0
    )
    partitioner.dataset = digits
    part = partitioner.partition
    torch_digits = load_digits(train=True)
    last = CLIENTS - 1  # noise rises from 0 (client 0) to sigma (the last client)
    assert part.noise_std[0] == 0 and part.noise_std[last] == pytest.approx(0.4)
    rows = partitioner.load_partition(last)
    view = NoisyDataset(
        torch_digits, part.client_indices[last], std=float(part.noise_std[last]), seed=3,
        client=last,
    )  # fmt: skip
    for i in (0, 7, len(rows) - 1):
        assert np.allclose(rows[i]["image"], view[i][0].numpy(), atol=1e-6)
        assert rows[i][INDEX_COLUMN] == part.client_indices[last][i]
    clean = np.asarray(partitioner.load_partition(0)[0]["image"], dtype=np.float32)
    assert np.array_equal(clean, torch_digits.x[part.client_indices[0][0]].numpy())


def test_federated_dataset_serves_the_same_partitions(digits: Dataset, tmp_path: Path) -> None:
    """Through Flower Datasets' own entry point, from a local parquet file (no download).

    ``shuffle=False``: FederatedDataset shuffles the dataset before partitioning by default,
    which would renumber the rows the partition's indices point at.
    """
    path = tmp_path / "digits.parquet"
    digits.to_parquet(str(path))
    spec = {"name": "label_quantity", "k": 2}
    fds = FederatedDataset(
        dataset="parquet",
        data_files=str(path),
        cache_dir=str(tmp_path / "hf-cache"),
        shuffle=False,
        partitioners={"train": FedBalancePartitioner(CLIENTS, spec, seed=1)},
    )
    direct = FedBalancePartitioner(CLIENTS, spec, seed=1)
    direct.dataset = digits
    for client in range(CLIENTS):
        rows = fds.load_partition(client)
        assert rows["label"] == direct.load_partition(client)["label"]
        assert len(set(rows["label"])) <= 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_partitions": 0}, "num_partitions must be an int >= 1, got 0"),
        ({"num_partitions": True}, "num_partitions must be an int >= 1, got True"),
        ({"pixel_scale": 0}, "pixel_scale must be a finite float > 0, got 0"),
        ({"pixel_scale": float("inf")}, "pixel_scale must be a finite float > 0, got inf"),
        ({"partitioner": "dirichlet"}, "unknown partitioner 'dirichlet'"),
        (
            {"split": (0.7, 0.1, float("nan"))},
            "split must be 3 non-negative fractions [train, val, test] summing to 1, "
            "got (0.7, 0.1, nan)",
        ),
    ],
    ids=[
        "zero-partitions",
        "bool-partitions",
        "zero-scale",
        "infinite-scale",
        "unknown-scheme",
        "nan-split",
    ],
)
def test_bad_arguments_name_the_parameter(kwargs: dict[str, object], message: str) -> None:
    args = {"num_partitions": 3, "partitioner": "iid", **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        FedBalancePartitioner(args.pop("num_partitions"), args.pop("partitioner"), **args)  # type: ignore[arg-type]


def test_partition_id_out_of_range_is_an_error(digits: Dataset) -> None:
    partitioner = FedBalancePartitioner(3, "iid")
    partitioner.dataset = digits
    with pytest.raises(ValueError, match=r"partition_id must be in \[0, 3\), got 3"):
        partitioner.load_partition(3)
