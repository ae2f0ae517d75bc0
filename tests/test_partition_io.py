"""Saving and loading partitions: exact round trips, reproducible bytes, tamper-proof loading.

A partition file is JSON, with the index arrays inline (small partitions) or in a side
``.npz`` (large ones). Loading validates every field and never unpickles: a tampered or
truncated file is a :class:`PartitionFileError` whose message names the file and the problem.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fl_partitions import BUILTIN_PARTITIONERS, Partition, PartitionFileError, make_partitioner
from fl_partitions.partition import FORMAT, INLINE_LIMIT

LABELS = np.random.default_rng(5).integers(0, 6, 1200)
SPLIT_NAMES = ("train", "val", "test")


def make(spec: dict[str, Any] | str = "label_dirichlet", seed: int = 0, n: int = 8) -> Partition:
    return make_partitioner(spec).partition(LABELS, n, seed=seed)


def assert_same_partition(a: Partition, b: Partition) -> None:
    assert a.num_clients == b.num_clients
    for x, y in zip(a.client_indices, b.client_indices, strict=True):
        np.testing.assert_array_equal(x, y)
        assert y.dtype == np.int64
    np.testing.assert_array_equal(a.class_counts, b.class_counts)
    # noise_std is written rounded to 12 decimals.
    np.testing.assert_allclose(a.noise_std, b.noise_std, rtol=0, atol=1e-12)
    for sa, sb in zip(a.splits, b.splits, strict=True):
        for key in SPLIT_NAMES:
            np.testing.assert_array_equal(sa[key], sb[key])
    assert (a.num_samples, a.num_classes, a.seed) == (b.num_samples, b.num_classes, b.seed)
    assert a.spec == b.spec
    assert tuple(a.split_fractions) == tuple(b.split_fractions)
    assert a.stats() == b.stats()


def raises_file_error(*fragments: str) -> Any:
    return pytest.raises(PartitionFileError, match=".*".join(re.escape(f) for f in fragments))


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------
SPECS: list[dict[str, Any]] = [{"name": cls.name} for cls in BUILTIN_PARTITIONERS] + [
    {"name": "feature_noise", "sigma": 0.3},
    {"name": "global_imbalance", "profile": "letters", "then": {"name": "label_quantity"}},
    {
        "name": "mixed",
        "components": [
            {
                "name": "global_imbalance",
                "profile": "proportions",
                "proportions": [1, 2, 3, 3, 2, 1],
            },
            {"name": "quantity_dirichlet", "beta": 0.3},
            {"name": "feature_noise", "sigma": 0.7},
        ],
    },
]
SPEC_IDS = [str(s["name"]) + ("-defaults" if len(s) == 1 else "-custom") for s in SPECS]


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "npz"])
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_save_load_round_trip(tmp_path: Path, spec: dict[str, Any], inline: bool) -> None:
    original = make(spec, seed=3)
    path = original.save(tmp_path / "part.json", inline=inline)
    assert path == tmp_path / "part.json"
    npz = tmp_path / "part.json.npz"
    doc = json.loads(path.read_text())
    assert doc["format"] == FORMAT
    if inline:
        assert not npz.exists()
        assert "indices" in doc["clients"][0] and "arrays" not in doc
    else:
        assert npz.exists()
        assert doc["arrays"] == "part.json.npz"
        assert "indices" not in doc["clients"][0] and "split" not in doc["clients"][0]
    assert_same_partition(original, Partition.load(path))
    assert_same_partition(original, Partition.load(str(path)))


def test_loaded_spec_rebuilds_the_same_partition(tmp_path: Path) -> None:
    original = make({"name": "mixed"}, seed=17)
    loaded = Partition.load(original.save(tmp_path / "p.json"))
    again = make_partitioner(loaded.spec).partition(LABELS, loaded.num_clients, seed=loaded.seed)
    assert_same_partition(original, again)


def test_large_partitions_go_to_npz_by_default(tmp_path: Path) -> None:
    labels = np.arange(INLINE_LIMIT + 1) % 3
    big = make_partitioner("iid").partition(labels, 4, seed=0)
    path = big.save(tmp_path / "big.json")
    assert (tmp_path / "big.json.npz").exists()
    assert "arrays" in json.loads(path.read_text())
    assert_same_partition(big, Partition.load(path))

    small = make("iid")
    small.save(tmp_path / "small.json")
    assert not (tmp_path / "small.json.npz").exists()


def test_extra_keys_are_written_first_and_ignored_on_load(tmp_path: Path) -> None:
    p = make()
    path = p.save(tmp_path / "p.json", extra={"dataset": "cifar10", "note": "run 3"})
    doc = json.loads(path.read_text())
    assert list(doc)[:2] == ["dataset", "note"]
    assert doc["dataset"] == "cifar10"
    assert_same_partition(p, Partition.load(path))


def test_saved_stats_agree_with_the_partition(tmp_path: Path) -> None:
    p = make("label_dirichlet")
    doc = json.loads(p.save(tmp_path / "p.json").read_text())
    assert doc["stats"] == json.loads(json.dumps(p.stats()))
    assert [c["num_samples"] for c in doc["clients"]] == p.sizes.tolist()


# ---------------------------------------------------------------------------------------------
# Reproducible bytes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inline", [True, False], ids=["inline", "npz"])
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_same_seed_gives_byte_identical_json(
    tmp_path: Path, spec: dict[str, Any], inline: bool
) -> None:
    # Same file name in two directories: the npz mode records the side file's name.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make(spec, seed=11).save(tmp_path / "a" / "p.json", inline=inline)
    b = make(spec, seed=11).save(tmp_path / "b" / "p.json", inline=inline)
    assert a.read_bytes() == b.read_bytes()
    if not inline:
        # Zip members carry a timestamp, so compare the arrays rather than the bytes.
        with np.load(str(a) + ".npz") as za, np.load(str(b) + ".npz") as zb:
            assert sorted(za.files) == sorted(zb.files)
            for key in za.files:
                np.testing.assert_array_equal(za[key], zb[key])


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_different_seed_gives_different_json(tmp_path: Path, spec: dict[str, Any]) -> None:
    a = make(spec, seed=11).save(tmp_path / "a.json")
    b = make(spec, seed=12).save(tmp_path / "b.json")
    assert a.read_bytes() != b.read_bytes()


def test_json_is_compact_and_ends_with_a_newline(tmp_path: Path) -> None:
    text = make().save(tmp_path / "p.json").read_text()
    assert text.endswith("}\n") and text.count("\n") == 1
    assert ", " not in text and '": ' not in text


# ---------------------------------------------------------------------------------------------
# Tampered files
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """An inline partition file (2 clients) and its parsed JSON, ready to be tampered with."""
    p = make_partitioner("iid").partition(np.arange(40) % 4, 2, seed=1)
    path = p.save(tmp_path / "p.json")
    return path, json.loads(path.read_text())


def rewrite(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc))


def replace_index(client: dict[str, Any], new: Any) -> None:
    """Replace the client's first index by ``new`` in its indices and in its split alike."""
    old = client["indices"][0]
    client["indices"][0] = new
    for part in SPLIT_NAMES:
        client["split"][part] = [new if i == old else i for i in client["split"][part]]


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        (b"{not json", ("not a readable partition JSON file", "Expecting property name")),
        (b"", ("not a readable partition JSON file",)),
        (b"\xff\xfe\x00\x01", ("not a readable partition JSON file", "utf-8")),
        (b"[1, 2, 3]", ("format must be 'fedbalance.partition/1'", "got 'list'")),
        (b"null", ("format must be 'fedbalance.partition/1'", "NoneType")),
    ],
    ids=["bad-json", "empty", "binary", "json-list", "json-null"],
)
def test_unreadable_file_is_a_partition_file_error(
    tmp_path: Path, content: bytes, fragments: tuple[str, ...]
) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(content)
    with raises_file_error(str(path), *fragments):
        Partition.load(path)


def test_missing_file_is_a_partition_file_error(tmp_path: Path) -> None:
    with raises_file_error("nope.json", "not a readable partition JSON file", "No such file"):
        Partition.load(tmp_path / "nope.json")


def test_partition_file_error_is_a_value_error() -> None:
    assert issubclass(PartitionFileError, ValueError)


Tamper = Callable[[dict[str, Any]], None]


def set_format(value: Any) -> Tamper:
    return lambda doc: doc.__setitem__("format", value)


def drop(key: str) -> Tamper:
    return lambda doc: doc.pop(key)


def out_of_range_high(doc: dict[str, Any]) -> None:
    replace_index(doc["clients"][0], doc["num_samples"])


def out_of_range_negative(doc: dict[str, Any]) -> None:
    replace_index(doc["clients"][1], -1)


def split_drops_an_index(doc: dict[str, Any]) -> None:
    doc["clients"][0]["split"]["test"].pop()


def split_adds_a_foreign_index(doc: dict[str, Any]) -> None:
    doc["clients"][0]["split"]["val"].append(doc["clients"][1]["indices"][0])


def split_repeats_an_index(doc: dict[str, Any]) -> None:
    split = doc["clients"][0]["split"]
    split["val"].append(split["train"][0])
    split["test"].pop()


def size_disagrees(doc: dict[str, Any]) -> None:
    doc["clients"][0]["num_samples"] += 1


def counts_disagree(doc: dict[str, Any]) -> None:
    doc["clients"][0]["class_counts"][0] += 1


def counts_wrong_width(doc: dict[str, Any]) -> None:
    for c in doc["clients"]:
        c["class_counts"] = c["class_counts"] + [0]


def nested_indices(doc: dict[str, Any]) -> None:
    doc["clients"][0]["indices"] = [doc["clients"][0]["indices"]]


def string_index(doc: dict[str, Any]) -> None:
    replace_index(doc["clients"][0], "seven")


@pytest.mark.parametrize(
    ("tamper", "fragments"),
    [
        (
            set_format("fedbalance.partition/2"),
            ("format must be 'fedbalance.partition/1'", "got 'fedbalance.partition/2'"),
        ),
        (drop("format"), ("format must be 'fedbalance.partition/1'", "got None")),
        (drop("clients"), ("malformed partition file", "KeyError", "clients")),
        (drop("seed"), ("malformed partition file", "KeyError", "seed")),
        (drop("num_samples"), ("malformed partition file", "num_samples")),
        (out_of_range_high, ("client 0 has indices outside [0, 40)",)),
        (out_of_range_negative, ("client 1 has indices outside [0, 40)",)),
        (split_drops_an_index, ("client 0 local split is not a split of its indices",)),
        (split_adds_a_foreign_index, ("client 0 local split is not a split of its indices",)),
        (split_repeats_an_index, ("client 0 local split is not a split of its indices",)),
        (size_disagrees, ("client 0 sizes disagree with its indices",)),
        (counts_disagree, ("client 0 sizes disagree with its indices",)),
        (counts_wrong_width, ("class_counts must be 2 x 4",)),
        (nested_indices, ("client 0 indices must be a list of ints",)),
        (string_index, ("client 0 indices must be a list of ints",)),
    ],
    ids=[
        "wrong-format-tag",
        "no-format-tag",
        "no-clients",
        "no-seed",
        "no-num_samples",
        "index-too-large",
        "index-negative",
        "split-drops-index",
        "split-foreign-index",
        "split-repeats-index",
        "size-mismatch",
        "class-counts-mismatch",
        "class-counts-width",
        "nested-indices",
        "string-index",
    ],
)
def test_tampered_json_is_a_partition_file_error(
    saved: tuple[Path, dict[str, Any]], tamper: Tamper, fragments: tuple[str, ...]
) -> None:
    path, doc = saved
    tamper(doc)
    rewrite(path, doc)
    with raises_file_error(str(path), *fragments):
        Partition.load(path)


def test_untampered_fixture_loads(saved: tuple[Path, dict[str, Any]]) -> None:
    # Control for the tamper tests: rewriting the JSON unchanged still loads.
    path, doc = saved
    rewrite(path, doc)
    assert Partition.load(path).num_clients == 2


def test_fractional_index_is_rejected_not_truncated(saved: tuple[Path, dict[str, Any]]) -> None:
    # 3.5 is no sample id; silently reading it as 3 would hand a client the wrong sample.
    path, doc = saved
    client = doc["clients"][0]
    replace_index(client, client["indices"][0] + 0.5)
    rewrite(path, doc)
    with raises_file_error(str(path), "client 0"):
        Partition.load(path)


def test_sample_held_by_two_clients_is_rejected(saved: tuple[Path, dict[str, Any]]) -> None:
    # Client 1 claims client 0's first sample too: no longer a partition of the dataset.
    path, doc = saved
    c0, c1 = doc["clients"]
    stolen, dropped = c0["indices"][0], c1["indices"][0]
    replace_index(c1, stolen)
    label_of = dict(zip(range(40), (np.arange(40) % 4).tolist(), strict=True))
    c1["class_counts"][label_of[dropped]] -= 1
    c1["class_counts"][label_of[stolen]] += 1
    rewrite(path, doc)
    with raises_file_error(str(path)):
        Partition.load(path)


# -- the npz side file ------------------------------------------------------------------------
@pytest.fixture
def saved_npz(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """A partition saved in npz mode: JSON path, npz path, and the npz's arrays."""
    p = make_partitioner("label_dirichlet").partition(np.arange(300) % 4, 5, seed=1)
    path = p.save(tmp_path / "p.json", inline=False)
    npz = tmp_path / "p.json.npz"
    with np.load(npz) as z:
        arrays = dict(z)
    return path, npz, arrays


def write_npz(npz: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(npz, "wb") as fh:  # np.savez on a path would append ".npz" again
        np.savez(fh, **arrays)


class Tripwire:
    """Unpickling this creates a directory: proof that a loader ran pickle on our data."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (str(self.marker),)


def test_npz_with_an_object_array_is_rejected_without_unpickling(
    saved_npz: tuple[Path, Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    path, npz, arrays = saved_npz
    marker = tmp_path / "unpickled"
    evil = np.empty(len(arrays["indices"]), dtype=object)
    evil[:] = [Tripwire(marker)] * len(evil)
    write_npz(npz, {**arrays, "indices": evil})
    # Control: the tripwire does fire when pickle is allowed.
    with np.load(npz, allow_pickle=True) as z:
        z["indices"]
    assert marker.exists()
    marker.rmdir()

    with raises_file_error(str(path), "malformed partition file", "Object arrays cannot be loaded"):
        Partition.load(path)
    assert not marker.exists(), "loading a partition file ran pickle"


def test_npz_that_is_a_pickle_is_rejected(
    saved_npz: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    path, npz, _ = saved_npz
    import pickle

    npz.write_bytes(pickle.dumps({"indices": [1, 2, 3]}))
    with raises_file_error(str(path), "malformed partition file", "pickled data"):
        Partition.load(path)


def missing_key(key: str) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    return lambda a: {k: v for k, v in a.items() if k != key}


def index_out_of_range(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {k: v.copy() for k, v in a.items()}
    old = out["indices"][0]
    out["indices"][0] = 300
    for part in SPLIT_NAMES:
        out[part][out[part] == old] = 300
    return out


def split_mismatch(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {k: v.copy() for k, v in a.items()}
    # Swap a training sample of the first client with one of the last client.
    out["train"][0], out["train"][-1] = out["train"][-1], out["train"][0]
    return out


def fewer_clients(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = dict(a)
    # Clients 0 and 1 merged: 4 index arrays for the 5 clients the JSON lists.
    out["sizes"] = np.array([out["sizes"][:2].sum(), *out["sizes"][2:]])
    return out


def float_indices(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**a, "indices": a["indices"].astype(np.float64)}


@pytest.mark.parametrize(
    ("tamper", "fragments"),
    [
        (missing_key("val"), ("malformed partition file", "val")),
        (missing_key("sizes"), ("malformed partition file", "sizes")),
        (index_out_of_range, ("has indices outside [0, 300)",)),
        (split_mismatch, ("local split is not a split of its indices",)),
        (fewer_clients, ("5 clients but 4 index arrays",)),
        (float_indices, ("client 0 indices are not a 1-d int array",)),
    ],
    ids=[
        "no-val",
        "no-sizes",
        "index-out-of-range",
        "split-mismatch",
        "fewer-clients",
        "float-indices",
    ],
)
def test_tampered_npz_is_a_partition_file_error(
    saved_npz: tuple[Path, Path, dict[str, np.ndarray]],
    tamper: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
    fragments: tuple[str, ...],
) -> None:
    path, npz, arrays = saved_npz
    write_npz(npz, tamper(arrays))
    with raises_file_error(str(path), *fragments):
        Partition.load(path)


def test_untampered_npz_loads(saved_npz: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    path, npz, arrays = saved_npz
    write_npz(npz, arrays)
    assert Partition.load(path).num_clients == 5


def test_missing_npz_is_a_partition_file_error(
    saved_npz: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    path, npz, _ = saved_npz
    npz.unlink()
    with raises_file_error(str(path)):
        Partition.load(path)


def test_truncated_npz_is_a_partition_file_error(
    saved_npz: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    path, npz, _ = saved_npz
    data = npz.read_bytes()
    npz.write_bytes(data[: len(data) // 2])
    with raises_file_error(str(path)):
        Partition.load(path)


def test_npz_reference_cannot_leave_the_json_directory(
    saved_npz: tuple[Path, Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    # The JSON names its side file; only the name counts, so "../x" stays beside the JSON.
    path, npz, arrays = saved_npz
    sub = tmp_path / "sub"
    sub.mkdir()
    doc = json.loads(path.read_text())
    doc["arrays"] = "../elsewhere.npz"
    (sub / "p.json").write_text(json.dumps(doc))
    write_npz(sub / "elsewhere.npz", arrays)  # the legitimate one, beside the JSON
    write_npz(tmp_path / "elsewhere.npz", fewer_clients(arrays))  # a decoy outside it
    assert Partition.load(sub / "p.json").num_clients == 5
