"""Noisy clients (``label_noise``): who is noisy, what flips, where the flips go, and how a host
reads them.

The partitioner contract (``tests/test_partitions_contract.py``) runs over ``label_noise`` as
over every registered partitioner; these tests pin what is particular to it: exact counts
under the documented rounding, the two flip modes, flips fixed by the seed alone (the same
numbers on every numpy), composition in ``mixed``, the partition file, parameter errors, and
the labels a client's data view returns.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

from fl_adapters.registry import get_registry
from fl_partitions import (
    LabelNoise,
    ParameterError,
    Partition,
    PartitionFileError,
    make_partitioner,
)
from fl_partitions.label_noise import noisy_clients
from fl_partitions.transforms import NoisyDataset

PROPERTY = settings(max_examples=30, deadline=None, database=None, derandomize=True)
LABELS = np.random.default_rng(11).integers(0, 10, 3000)
NOISY_DIRICHLET = {
    "name": "mixed",
    "components": [
        {"name": "label_dirichlet", "beta": 0.5},
        {"name": "label_noise", "share": 0.3, "rate": 0.4},
    ],
}


def expect(*fragments: str) -> Any:
    """pytest.raises(ParameterError) matching every fragment of the message, in order."""
    return pytest.raises(ParameterError, match=".*".join(re.escape(f) for f in fragments))


def flips_of(p: Partition) -> dict[int, tuple[list[int], list[int]]]:
    return {c: (f.indices.tolist(), f.labels.tolist()) for c, f in (p.label_flips or {}).items()}


# ---------------------------------------------------------------------------------------------
# Fixed by the seed, on every numpy
# ---------------------------------------------------------------------------------------------
def test_same_seed_gives_the_same_flips_and_another_seed_others() -> None:
    part = make_partitioner(NOISY_DIRICHLET)
    a, b = (part.partition(LABELS, 30, seed=5) for _ in range(2))
    assert flips_of(a) == flips_of(b) and flips_of(a)
    assert flips_of(part.partition(LABELS, 30, seed=6)) != flips_of(a)


@pytest.mark.parametrize(
    ("seed", "num_clients", "share", "expected"),
    [(0, 10, 0.3, [0, 4, 6]), (12345, 30, 0.3, [0, 1, 3, 13, 14, 20, 23, 25, 26])],
    ids=["10-clients", "30-clients"],
)
def test_noisy_clients_are_fixed_numbers_of_the_seed(
    seed: int, num_clients: int, share: float, expected: list[int]
) -> None:
    # Raw PCG64 words of a SeedSequence, the bit stream numpy keeps across releases: these
    # numbers were computed once and must never change (the digests in
    # tests/data/partition_digests.json pin whole partitions on numpy 1.x and 2.x).
    assert noisy_clients(seed, num_clients, share).tolist() == expected


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("symmetric", {0: ([4, 32], [2, 1]), 1: ([1, 40], [4, 3])}),
        ("pair", {0: ([4, 32], [0, 3]), 1: ([1, 40], [2, 1])}),
    ],
    ids=["symmetric", "pair"],
)
def test_flips_of_a_small_case_are_fixed(
    mode: str, expected: dict[int, tuple[list[int], list[int]]]
) -> None:
    # 60 samples of 5 classes over 4 clients of 15 (10 train, 2 val, 3 test): clients 0 and 1
    # are noisy; round(0.25 * 10) = 2 train labels flip, round(0.25 * 2) = round(0.5) = 0 val.
    labels = np.arange(60) % 5
    p = LabelNoise(share=0.5, rate=0.25, mode=mode).partition(labels, 4, seed=7)
    assert flips_of(p) == expected


def test_docstring_example_holds() -> None:
    p = LabelNoise(share=0.5, rate=0.5).partition([0, 1, 2, 3] * 50, 4, seed=0)
    assert (p.stats()["noisy_clients"], p.stats()["noisy_flip_rate"]) == ([0, 3], 0.5)


# ---------------------------------------------------------------------------------------------
# Share and rate, exactly, under the documented rounding (half to even)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("share", "num_clients", "noisy"),
    [(0.3, 30, 9), (0.5, 3, 2), (0.5, 5, 2), (0.1, 5, 0), (0.0, 10, 0), (1.0, 7, 7)],
    ids=["30%-of-30", "half-of-3", "half-of-5-rounds-to-even", "0.5-rounds-down", "none", "all"],
)
def test_share_gives_round_share_times_clients_noisy_clients(
    share: float, num_clients: int, noisy: int
) -> None:
    p = LabelNoise(share=share).partition(LABELS, num_clients, seed=1)
    assert len(p.stats()["noisy_clients"]) == len(p.label_flips or {}) == noisy


@PROPERTY
@given(
    share=st.floats(0, 1),
    rate=st.floats(0, 1),
    num_clients=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    mode=st.sampled_from(["symmetric", "pair"]),
)
def test_rate_flips_round_rate_times_n_of_each_train_and_val_split(
    share: float, rate: float, num_clients: int, seed: int, mode: str
) -> None:
    p = LabelNoise(share=share, rate=rate, mode=mode).partition(LABELS, num_clients, seed=seed)
    assert p.label_flips is not None
    assert len(p.label_flips) == round(share * num_clients)
    for c, f in p.label_flips.items():
        for split in ("train", "val"):
            n = len(p.splits[c][split])
            assert np.isin(f.indices, p.splits[c][split]).sum() == round(rate * n), (c, split)
        assert not np.isin(f.indices, p.splits[c]["test"]).any()
        assert np.all(f.labels != LABELS[f.indices])
    per_client = [
        len(p.label_flips[c].indices) if c in p.label_flips else 0 for c in range(num_clients)
    ]
    assert p.stats()["flipped"] == per_client


def test_statistics_report_the_noise() -> None:
    p = make_partitioner(NOISY_DIRICHLET).partition(LABELS, 30, seed=0)
    s = p.stats()
    assert len(s["noisy_clients"]) == 9
    exposed = [len(p.splits[c]["train"]) + len(p.splits[c]["val"]) for c in range(30)]
    assert s["flipped_share"] == round(sum(s["flipped"]) / sum(exposed), 6)
    assert s["noisy_flip_rate"] == pytest.approx(0.4, abs=0.01)
    # The class counts stay those of the true labels.
    for c, ix in enumerate(p.client_indices):
        np.testing.assert_array_equal(p.class_counts[c], np.bincount(LABELS[ix], minlength=10))
    assert "noisy_clients" not in make_partitioner("iid").partition(LABELS, 30).stats()


# ---------------------------------------------------------------------------------------------
# The two modes
# ---------------------------------------------------------------------------------------------
def test_symmetric_never_keeps_a_label_and_reaches_every_other_class() -> None:
    p = LabelNoise(share=1.0, rate=1.0).partition(LABELS, 10, seed=3)
    assert p.label_flips is not None
    true = np.concatenate([LABELS[f.indices] for f in p.label_flips.values()])
    new = np.concatenate([f.labels for f in p.label_flips.values()])
    assert len(new) > 2000 and np.all(new != true)
    pairs = set(zip(true.tolist(), new.tolist(), strict=True))
    assert pairs == {(a, b) for a in range(10) for b in range(10) if a != b}


def test_pair_maps_each_class_to_the_next() -> None:
    p = LabelNoise(share=1.0, rate=0.5, mode="pair").partition(LABELS, 10, seed=3)
    assert p.label_flips is not None
    for f in p.label_flips.values():
        np.testing.assert_array_equal(f.labels, (LABELS[f.indices] + 1) % 10)


def test_one_class_cannot_flip() -> None:
    with expect("label_noise needs at least 2 classes", "got 1"):
        LabelNoise(share=1.0, rate=0.5).partition(np.zeros(50, int), 2)
    # Nothing to flip, nothing asked of the classes.
    assert LabelNoise(share=0.0).partition(np.zeros(50, int), 2).label_flips == {}


# ---------------------------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------------------------
def test_in_mixed_the_split_and_noise_are_those_of_the_other_components() -> None:
    spec = {
        "name": "mixed",
        "components": [
            {"name": "global_imbalance", "profile": "zipf"},
            {"name": "label_dirichlet", "beta": 0.5, "min_size": 0},
            {"name": "feature_noise", "sigma": 0.2},
            {"name": "label_noise", "share": 0.5, "rate": 0.3},
        ],
    }
    noisy = make_partitioner(spec).partition(LABELS, 12, seed=4)
    clean = make_partitioner({**spec, "components": spec["components"][:3]}).partition(
        LABELS, 12, seed=4
    )
    for a, b in zip(noisy.client_indices, clean.client_indices, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(noisy.noise_std, clean.noise_std)
    assert clean.label_flips is None and len(noisy.label_flips or {}) == 6
    # The flips are exactly label_noise's on that partition.
    assert flips_of(LabelNoise(share=0.5, rate=0.3).relabel(LABELS, clean)) == flips_of(noisy)


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        (
            {"name": "mixed", "components": [{"name": "label_noise"}, {"name": "label_noise"}]},
            ("mixed takes at most one 'relabel' component", "'label_noise' and 'label_noise'"),
        ),
        (
            {"name": "mixed", "components": [{"name": "iid"}] * 5},
            ("components must list at most 3 partitioners", "and one label_noise", "got 5"),
        ),
        (
            {"name": "mixed", "components": [{"name": "iid"}] * 4},
            ("components must list at most 3 partitioners", "and one label_noise", "got 4"),
        ),
        (
            {"name": "global_imbalance", "then": {"name": "label_noise"}},
            ("then must be a split scheme", "'label_noise' (relabel)"),
        ),
    ],
    ids=["two-label-noises", "five-components", "four-but-no-label-noise", "then-label-noise"],
)
def test_impossible_compositions_are_parameter_errors(
    spec: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    with expect(*fragments):
        make_partitioner(spec)


def test_registered_so_the_contract_runs_over_it() -> None:
    assert "label_noise" in get_registry().names("partitioners")
    assert isinstance(get_registry().make_partitioner({"name": "label_noise"}), LabelNoise)


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "fragments"),
    [
        ({"share": 1.5}, ("share must be a finite float in [0, 1]", "fraction of clients", "got 1.5")),
        ({"share": "0.3"}, ("share must be a finite float in [0, 1]", "got '0.3'")),
        ({"rate": -0.1}, ("rate must be a finite float in [0, 1]", "got -0.1")),
        ({"rate": float("nan")}, ("rate must be a finite float in [0, 1]", "got nan")),
        ({"rate": True}, ("rate must be a finite float in [0, 1]", "got True")),
        ({"mode": "random"}, ("mode must be one of symmetric, pair", "got 'random'")),
        ({"mode": None}, ("mode must be one of symmetric, pair", "got None")),
        ({"noise": 0.4}, ("label_noise: unknown parameter(s) noise", "accepted: share, rate, mode")),
    ],
    ids=["share-above-1", "share-string", "rate-negative", "rate-nan", "rate-bool", "mode-unknown",
         "mode-none", "unknown-parameter"],
)  # fmt: skip
def test_every_parameter_is_checked_with_its_name_range_and_value(
    params: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    with expect(*fragments):
        make_partitioner({"name": "label_noise", **params})


@pytest.mark.timeout(60)
def test_a_million_labels_all_clients_all_flipped_returns() -> None:
    labels = np.random.default_rng(0).integers(0, 10, 1_000_000)
    p = LabelNoise(share=1.0, rate=1.0).partition(labels, 10_000, seed=0)
    assert p.label_flips is not None and len(p.label_flips) == 10_000
    flipped = sum(len(f.indices) for f in p.label_flips.values())
    assert flipped == sum(len(s["train"]) + len(s["val"]) for s in p.splits)


# ---------------------------------------------------------------------------------------------
# The partition file
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inline", [True, False], ids=["inline", "npz"])
def test_save_load_round_trip_keeps_the_flips(tmp_path: Path, inline: bool) -> None:
    p = make_partitioner(NOISY_DIRICHLET).partition(LABELS, 30, seed=2)
    loaded = Partition.load(p.save(tmp_path / "p.json", inline=inline))
    assert flips_of(loaded) == flips_of(p) and flips_of(p)
    assert loaded.stats() == p.stats()
    assert all(
        f.indices.dtype == f.labels.dtype == np.int64 for f in (loaded.label_flips or {}).values()
    )


def test_files_without_label_noise_have_no_flips_key_and_load_as_clean(tmp_path: Path) -> None:
    path = (
        make_partitioner("label_dirichlet").partition(LABELS, 5, seed=0).save(tmp_path / "p.json")
    )
    assert "label_flips" not in json.loads(path.read_text())
    loaded = Partition.load(path)
    assert loaded.label_flips is None and loaded.client_flips(0) is None
    # share 0: label noise without a noisy client is recorded as such.
    path = LabelNoise(share=0.0).partition(LABELS, 5, seed=0).save(tmp_path / "q.json")
    assert json.loads(path.read_text())["label_flips"] == []
    assert Partition.load(path).label_flips == {}


def flip_a_test_sample(doc: dict[str, Any]) -> None:
    entry = doc["label_flips"][0]
    entry["indices"][0] = doc["clients"][entry["client"]]["split"]["test"][0]
    entry["indices"].sort()


def label_out_of_range(doc: dict[str, Any]) -> None:
    doc["label_flips"][0]["labels"][0] = doc["num_classes"]


def clients_out_of_order(doc: dict[str, Any]) -> None:
    doc["label_flips"].reverse()


def count_disagrees(doc: dict[str, Any]) -> None:
    doc["label_flips"][0]["num_flipped"] += 1


def not_a_list(doc: dict[str, Any]) -> None:
    doc["label_flips"] = {"0": []}


@pytest.mark.parametrize(
    ("tamper", "fragments"),
    [
        (flip_a_test_sample, ("flipped indices must be distinct, ascending and in its train or val",)),
        (label_out_of_range, ("flipped labels must be class ids in [0, 10)",)),
        (clients_out_of_order, ("label_flips clients must be distinct ids", "ascending")),
        (count_disagrees, ("label_flips disagree with num_flipped",)),
        (not_a_list, ("label_flips must be a list",)),
    ],
    ids=["test-sample", "label-out-of-range", "clients-unordered", "count", "not-a-list"],
)  # fmt: skip
def test_tampered_flips_are_a_partition_file_error(
    tmp_path: Path, tamper: Any, fragments: tuple[str, ...]
) -> None:
    path = LabelNoise(share=0.5, rate=0.5).partition(LABELS, 6, seed=0).save(tmp_path / "p.json")
    doc = json.loads(path.read_text())
    tamper(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(PartitionFileError, match=".*".join(map(re.escape, fragments))):
        Partition.load(path)


def test_npz_flips_that_disagree_with_the_counts_are_a_partition_file_error(tmp_path: Path) -> None:
    p = LabelNoise(share=0.5, rate=0.5).partition(LABELS, 6, seed=0)
    path = p.save(tmp_path / "p.json", inline=False)
    npz = tmp_path / "p.json.npz"
    with np.load(npz) as z:
        arrays = dict(z)
    with open(npz, "wb") as fh:
        np.savez(fh, **{**arrays, "flip_labels": arrays["flip_labels"][:-1]})
    with pytest.raises(PartitionFileError, match="flip_indices and flip_labels must be 1-d int"):
        Partition.load(path)


# ---------------------------------------------------------------------------------------------
# What a client's data view returns
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def noisy_partition() -> tuple[TensorDataset, Partition]:
    labels = np.arange(120) % 4
    data = TensorDataset(torch.zeros(120, 1, 2, 2), torch.as_tensor(labels))
    return data, LabelNoise(share=0.5, rate=0.5).partition(labels, 4, seed=1)


def test_noisy_dataset_returns_the_flipped_train_labels(
    noisy_partition: tuple[TensorDataset, Partition],
) -> None:
    data, p = noisy_partition
    client = min(p.label_flips or {})
    flips = p.client_flips(client)
    assert flips is not None
    train = p.splits[client]["train"]
    view = NoisyDataset(data, train, seed=p.seed, client=client, flips=flips)
    want = flips.relabel(train, data.tensors[1][train].numpy())
    assert (want != data.tensors[1][train].numpy()).sum() == round(0.5 * len(train))
    assert [int(view[i][1]) for i in range(len(view))] == want.tolist()
    assert all(view[i][1].dtype == torch.int64 for i in range(len(view)))
    _, y = view.get_batch(np.arange(len(view))[::-1])
    assert y.tolist() == want[::-1].tolist()
    # The same flips leave the test split as it is.
    test = p.splits[client]["test"]
    clean = NoisyDataset(data, test, seed=p.seed, client=client, flips=flips)
    assert clean.get_batch(np.arange(len(test)))[1].tolist() == data.tensors[1][test].tolist()


def test_fedlab_view_returns_the_flipped_train_labels(
    noisy_partition: tuple[TensorDataset, Partition],
) -> None:
    pytest.importorskip("fedlab")
    from fl_adapters.fedlab import PartitionedDataset

    data, p = noisy_partition
    fed = PartitionedDataset(data, p)
    for client in range(p.num_clients):
        flips = p.client_flips(client)
        for split in ("train", "val", "test"):
            ix = p.splits[client][split]
            true = data.tensors[1][ix].numpy()
            want = true if flips is None else flips.relabel(ix, true)
            view = fed.get_dataset(client, split)
            got = [int(view[i][1]) for i in range(len(view))]
            assert got == want.tolist(), (client, split)
            if split == "test":
                assert got == true.tolist()
    assert any(p.client_flips(c) is not None for c in range(p.num_clients))


def test_class_bars_mark_the_noisy_clients(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from fl_partitions.plots import plot_class_bars

    p = make_partitioner(NOISY_DIRICHLET).partition(LABELS, 10, seed=0)
    assert plot_class_bars(p, tmp_path / "bars.png").stat().st_size > 1000


def test_fedmls_own_loaders_refuse_label_noise_rather_than_drop_it() -> None:
    """FedML's loaders hand out their own labels: flips there could not take effect."""
    from types import SimpleNamespace

    from fl_adapters.fedml.partition import fedbalance_map

    args = SimpleNamespace(partition_args={"share": 0.5, "rate": 0.5}, random_seed=0)
    with pytest.raises(ParameterError, match="flips labels .* FedML's own loaders cannot"):
        fedbalance_map(np.arange(200) % 10, 4, "label_noise", args)
    assert len(fedbalance_map(np.arange(200) % 10, 4, "iid", SimpleNamespace())) == 4
