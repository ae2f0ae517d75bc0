"""The result of a partition: per-client indices, transforms, local splits and statistics.

Saved as JSON (small partitions) or JSON plus an ``.npz`` of index arrays (large ones). Never
pickle: ``.npz`` files are read with ``allow_pickle=False`` and every field is validated, so a
tampered file gives a clear :class:`PartitionFileError` instead of arbitrary behaviour.

A partition made with label noise (``label_noise``) also carries its flips as data: per noisy
client, the flipped dataset indices and their new labels (:class:`LabelFlips`), written under
the file's ``label_flips`` key, so every host reads the same wrong labels from the file instead
of redrawing them. Files without that key (every file written before it existed) load as
partitions without label noise.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fl_checks import FedbalanceError
from fl_partitions._rng import derived_generator
from fl_partitions.stats import class_count_matrix, flip_summary, summarize

IntArray = NDArray[np.int64]
DEFAULT_SPLIT: tuple[float, float, float] = (0.7, 0.1, 0.2)
FORMAT = "fedbalance.partition/1"
SPLIT_NAMES = ("train", "val", "test")
# Salt for the split sub-stream, so it never collides with other per-client streams.
_SPLIT_STREAM = 1
# Above this many indices in total, ``save`` puts the arrays in a side ``.npz``.
INLINE_LIMIT = 200_000
#: The local splits whose labels label noise may flip; the test split stays clean (see
#: :mod:`fl_partitions.label_noise`).
FLIPPED_SPLITS = ("train", "val")


class PartitionFileError(FedbalanceError, ValueError):
    """A partition file that is malformed, truncated or tampered with."""


def _int_array(values: Any, path: Path, what: str) -> IntArray:
    """A JSON list of ints as an int64 array; floats, strings or nesting are an error."""
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise PartitionFileError(f"{path}: {what} must be a list of ints")
    return np.asarray(values, dtype=np.int64)


def local_splits(
    client_indices: list[IntArray], fractions: Sequence[float], seed: int
) -> list[dict[str, IntArray]]:
    """Deterministic train/val/test split of every client's indices.

    Sizes are rounded per part (val and test) and train takes the rest, so a client with one
    sample trains on it. One sub-stream of ``seed`` shuffles the clients in order: one
    generator for all clients, since building one per client costs more than the split.
    The parts are views into one array of all clients' shuffled indices.
    """
    if not client_indices:
        return []
    sizes = np.fromiter((len(ix) for ix in client_indices), np.int64, len(client_indices))
    # numpy rounds half to even, as Python's round(): the sizes of the per-client formula
    # round(n * f), computed for every client at once.
    n_val = np.round(sizes * float(fractions[1])).astype(np.int64)
    n_test = np.minimum(np.round(sizes * float(fractions[2])).astype(np.int64), sizes - n_val)
    train_end = sizes - n_val - n_test
    val_end = sizes - n_test
    flat = np.concatenate(client_indices).astype(np.int64, copy=False)
    # Shuffling a client's slice in place draws exactly what rng.permutation(n) draws.
    shuffle = derived_generator(seed, _SPLIT_STREAM).shuffle
    out = []
    for shuffled, a, b in zip(
        np.split(flat, np.cumsum(sizes)[:-1]), train_end.tolist(), val_end.tolist(), strict=True
    ):
        shuffle(shuffled)
        out.append({"train": shuffled[:a], "val": shuffled[a:b], "test": shuffled[b:]})
    return out


@dataclass(frozen=True, eq=False)
class LabelFlips:
    """One client's flipped labels: dataset ``indices`` (ascending) and their new ``labels``."""

    indices: IntArray
    labels: IntArray

    def lookup(
        self, indices: NDArray[np.integer[Any]] | Sequence[int]
    ) -> tuple[IntArray, IntArray]:
        """Which of ``indices`` are flipped: their positions in ``indices`` and new labels."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if not len(self.indices):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        pos = np.minimum(np.searchsorted(self.indices, idx), len(self.indices) - 1)
        where = np.flatnonzero(self.indices[pos] == idx)
        return where, self.labels[pos[where]]

    def relabel(
        self,
        indices: NDArray[np.integer[Any]] | Sequence[int],
        labels: NDArray[Any] | Sequence[int],
    ) -> IntArray:
        """``labels`` (those of dataset ``indices``) with this client's flips applied."""
        out = np.array(labels, dtype=np.int64).reshape(-1)
        where, new = self.lookup(indices)
        out[where] = new
        return out


@dataclass(frozen=True, eq=False)
class Partition:
    """Per-client sample indices plus everything derived from them.

    Attributes
    ----------
    client_indices : list of int arrays, one per client (indices into the dataset).
    class_counts : clients x classes count matrix.
    noise_std : per-client standard deviation of Gaussian input noise (0 = none).
    splits : per-client ``{"train", "val", "test"}`` index arrays (subsets of its indices).
    num_samples : size of the dataset that was partitioned.
    seed, spec : what made the partition, to rebuild or audit it.
    label_flips : ``None`` without label noise; else noisy client -> its :class:`LabelFlips`
        (clients not in it keep their labels; a noisy client may have no flip at a low rate).
    """

    client_indices: list[IntArray]
    class_counts: IntArray
    noise_std: NDArray[np.float64]
    splits: list[dict[str, IntArray]]
    num_samples: int
    num_classes: int
    seed: int
    spec: dict[str, Any]
    split_fractions: tuple[float, ...] = DEFAULT_SPLIT
    label_flips: dict[int, LabelFlips] | None = None

    @classmethod
    def build(
        cls,
        *,
        client_indices: list[IntArray],
        labels: IntArray,
        num_classes: int,
        seed: int,
        spec: dict[str, Any],
        noise_std: NDArray[np.float64],
        split: Sequence[float] = DEFAULT_SPLIT,
        class_counts: IntArray | None = None,
    ) -> Partition:
        """Assemble a partition, computing local splits and (unless given) class counts."""
        client_indices = [np.asarray(ix, dtype=np.int64) for ix in client_indices]
        if class_counts is None:
            class_counts = class_count_matrix(labels, client_indices, num_classes)
        return cls(
            client_indices=client_indices,
            class_counts=np.asarray(class_counts, dtype=np.int64),
            noise_std=np.asarray(noise_std, dtype=np.float64),
            splits=local_splits(client_indices, split, seed),
            num_samples=len(labels),
            num_classes=num_classes,
            seed=seed,
            spec=spec,
            split_fractions=tuple(split),
        )

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def sizes(self) -> IntArray:
        return self.class_counts.sum(axis=1)

    def client_flips(self, client: int) -> LabelFlips | None:
        """Client ``client``'s label flips, ``None`` for a client whose labels are all true."""
        return None if self.label_flips is None else self.label_flips.get(int(client))

    def stats(self) -> dict[str, Any]:
        """Sizes, per-client KL (uniform, global) and EMD, and their means; with label noise
        also the noisy clients and how many labels each has flipped (:func:`flip_summary`).

        The class counts are of the true labels: label noise changes what a client is told,
        not what it holds.
        """
        out = summarize(self.class_counts)
        if self.label_flips is not None:
            noisy = sorted(self.label_flips)
            flipped = np.zeros(self.num_clients, np.int64)
            flipped[noisy] = [len(self.label_flips[c].indices) for c in noisy]
            exposed = np.array(
                [sum(len(s[p]) for p in FLIPPED_SPLITS) for s in self.splits], dtype=np.int64
            )
            out.update(flip_summary(flipped, np.array(noisy, np.int64), exposed))
        return out

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self, *, inline: bool = True) -> dict[str, Any]:
        """JSON-ready dict; with ``inline=False`` the index arrays are left out."""
        clients = []
        for i, ix in enumerate(self.client_indices):
            entry: dict[str, Any] = {}
            if inline:
                entry["indices"] = ix.tolist()
            entry["num_samples"] = len(ix)
            entry["class_counts"] = self.class_counts[i].tolist()
            entry["noise_std"] = round(float(self.noise_std[i]), 12)
            if inline:
                entry["split"] = {k: self.splits[i][k].tolist() for k in SPLIT_NAMES}
            clients.append(entry)
        doc: dict[str, Any] = {
            "format": FORMAT,
            "num_samples": self.num_samples,
            "num_classes": self.num_classes,
            "seed": self.seed,
            "spec": self.spec,
            "split_fractions": list(self.split_fractions),
            "clients": clients,
        }
        if self.label_flips is not None:
            doc["label_flips"] = [
                {"client": c, "num_flipped": len(f.indices)}
                | ({"indices": f.indices.tolist(), "labels": f.labels.tolist()} if inline else {})
                for c, f in sorted(self.label_flips.items())
            ]
        doc["stats"] = self.stats()
        return doc

    def save(
        self, path: str | Path, *, extra: dict[str, Any] | None = None, inline: bool | None = None
    ) -> Path:
        """Write the partition as JSON (and ``<path>.npz`` for large index arrays).

        ``extra`` keys (e.g. the dataset name) are written first. ``inline=None`` inlines the
        indices when there are at most ``INLINE_LIMIT`` of them.
        """
        path = Path(path)
        if inline is None:
            inline = sum(len(ix) for ix in self.client_indices) <= INLINE_LIMIT
        doc = {**(extra or {}), **self.to_dict(inline=inline)}
        if not inline:
            npz = path.with_suffix(path.suffix + ".npz")
            arrays = {
                "indices": np.concatenate(self.client_indices),
                "sizes": self.sizes.astype(np.int64),
            }
            for part in SPLIT_NAMES:
                arrays[part] = np.concatenate([s[part] for s in self.splits])
                arrays[f"{part}_sizes"] = np.array([len(s[part]) for s in self.splits], np.int64)
            if self.label_flips is not None:
                flips = [f for _, f in sorted(self.label_flips.items())]
                arrays["flip_indices"] = np.concatenate(
                    [np.zeros(0, np.int64)] + [f.indices for f in flips]
                )
                arrays["flip_labels"] = np.concatenate(
                    [np.zeros(0, np.int64)] + [f.labels for f in flips]
                )
            with open(npz, "wb") as fh:
                np.savez_compressed(fh, **arrays)
            doc["arrays"] = npz.name
        path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Partition:
        """Read a partition written by :meth:`save`, validating every field."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PartitionFileError(f"{path}: not a readable partition JSON file ({e})") from e
        try:
            return cls._from_doc(doc, path)
        except PartitionFileError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise PartitionFileError(
                f"{path}: malformed partition file ({type(e).__name__}: {e})"
            ) from e

    @classmethod
    def _from_doc(cls, doc: dict[str, Any], path: Path) -> Partition:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise PartitionFileError(
                f"{path}: format must be {FORMAT!r}, got {doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r}"
            )
        clients = doc["clients"]
        num_samples, num_classes = int(doc["num_samples"]), int(doc["num_classes"])
        flip_entries = doc.get("label_flips")
        flip_arrays: tuple[NDArray[Any], NDArray[Any]] | None = None
        if "arrays" in doc:
            npz_path = path.parent / Path(str(doc["arrays"])).name
            try:
                with np.load(npz_path, allow_pickle=False) as z:
                    indices = np.split(z["indices"], np.cumsum(z["sizes"])[:-1])
                    parts = {
                        p: np.split(z[p], np.cumsum(z[f"{p}_sizes"])[:-1]) for p in SPLIT_NAMES
                    }
                    if flip_entries is not None:
                        flip_arrays = (z["flip_indices"], z["flip_labels"])
            except (OSError, EOFError, zipfile.BadZipFile) as e:
                raise PartitionFileError(
                    f"{path}: cannot read its index arrays {npz_path.name} ({e})"
                ) from e
            splits = [{p: parts[p][i] for p in SPLIT_NAMES} for i in range(len(clients))]
        else:
            indices = [
                _int_array(c["indices"], path, f"client {i} indices") for i, c in enumerate(clients)
            ]
            splits = [
                {p: _int_array(c["split"][p], path, f"client {i} split {p}") for p in SPLIT_NAMES}
                for i, c in enumerate(clients)
            ]
        if len(indices) != len(clients):
            raise PartitionFileError(
                f"{path}: {len(clients)} clients but {len(indices)} index arrays"
            )
        counts = np.asarray([c["class_counts"] for c in clients], dtype=np.int64)
        for i, ix in enumerate(indices):
            ix = np.asarray(ix)
            if ix.ndim != 1 or not np.issubdtype(ix.dtype, np.integer):
                raise PartitionFileError(f"{path}: client {i} indices are not a 1-d int array")
            if len(ix) and (ix.min() < 0 or ix.max() >= num_samples):
                raise PartitionFileError(
                    f"{path}: client {i} has indices outside [0, {num_samples})"
                )
            if counts[i].sum() != len(ix) or len(ix) != clients[i]["num_samples"]:
                raise PartitionFileError(f"{path}: client {i} sizes disagree with its indices")
            merged = np.sort(np.concatenate([splits[i][p] for p in SPLIT_NAMES]))
            if not np.array_equal(merged, np.sort(ix)):
                raise PartitionFileError(
                    f"{path}: client {i} local split is not a split of its indices"
                )
        if counts.shape != (len(clients), num_classes):
            raise PartitionFileError(f"{path}: class_counts must be {len(clients)} x {num_classes}")
        flat = np.concatenate(indices) if indices else np.zeros(0, np.int64)
        if len(np.unique(flat)) != len(flat):
            raise PartitionFileError(f"{path}: a sample index is held by more than one client")
        noise = np.asarray([float(c["noise_std"]) for c in clients])
        if not np.all(np.isfinite(noise)) or np.any(noise < 0):
            raise PartitionFileError(f"{path}: noise_std must be finite and >= 0 for every client")
        flips = (
            None
            if flip_entries is None
            else _read_flips(flip_entries, flip_arrays, splits, num_classes, path)
        )
        return cls(
            client_indices=[np.asarray(ix, dtype=np.int64) for ix in indices],
            class_counts=counts,
            noise_std=noise,
            splits=splits,
            num_samples=num_samples,
            num_classes=num_classes,
            seed=int(doc["seed"]),
            spec=dict(doc["spec"]),
            split_fractions=tuple(float(f) for f in doc["split_fractions"]),
            label_flips=flips,
        )


def _read_flips(
    entries: Any,
    arrays: tuple[NDArray[Any], NDArray[Any]] | None,
    splits: list[dict[str, IntArray]],
    num_classes: int,
    path: Path,
) -> dict[int, LabelFlips]:
    """A file's ``label_flips``, checked: one entry per noisy client in ascending order, each
    flipping distinct samples of that client's train or validation split to a class id.

    ``arrays`` are the npz's concatenated ``flip_indices`` and ``flip_labels`` (``None`` when
    the entries carry their arrays inline).
    """
    if not isinstance(entries, list):
        raise PartitionFileError(f"{path}: label_flips must be a list of per-client entries")
    counts = []
    for e in entries:
        if not isinstance(e, dict) or not all(
            isinstance(e.get(k), int) and not isinstance(e.get(k), bool)
            for k in ("client", "num_flipped")
        ):
            raise PartitionFileError(
                f"{path}: each label_flips entry needs an int 'client' and 'num_flipped'"
            )
        counts.append(e["num_flipped"])
    clients = [e["client"] for e in entries]
    if clients != sorted(set(clients)) or (
        clients and not 0 <= clients[0] <= clients[-1] < len(splits)
    ):
        raise PartitionFileError(
            f"{path}: label_flips clients must be distinct ids in [0, {len(splits)}), ascending"
        )
    if arrays is None:
        flat_idx = [
            _int_array(e.get("indices"), path, f"client {e['client']} flipped indices")
            for e in entries
        ]
        flat_lab = [
            _int_array(e.get("labels"), path, f"client {e['client']} flipped labels")
            for e in entries
        ]
    else:
        idx, lab = (np.asarray(a) for a in arrays)
        if (
            idx.ndim != 1
            or lab.shape != idx.shape
            or not np.issubdtype(idx.dtype, np.integer)
            or not np.issubdtype(lab.dtype, np.integer)
            or any(n < 0 for n in counts)
            or sum(counts) != len(idx)
        ):
            raise PartitionFileError(
                f"{path}: flip_indices and flip_labels must be 1-d int arrays of "
                f"sum(num_flipped) = {sum(counts)} entries"
            )
        cuts = np.cumsum(counts)[:-1]
        flat_idx = [a.astype(np.int64) for a in np.split(idx, cuts)] if entries else []
        flat_lab = [a.astype(np.int64) for a in np.split(lab, cuts)] if entries else []
    out = {}
    for c, n, ix, lab in zip(clients, counts, flat_idx, flat_lab, strict=True):
        exposed = np.concatenate([splits[c][p] for p in FLIPPED_SPLITS])
        if len(ix) != n or len(lab) != n:
            raise PartitionFileError(f"{path}: client {c} label_flips disagree with num_flipped")
        if np.any(ix[1:] <= ix[:-1]) or not np.all(np.isin(ix, exposed)):
            raise PartitionFileError(
                f"{path}: client {c} flipped indices must be distinct, ascending and in its "
                f"train or val split"
            )
        if n and (lab.min() < 0 or lab.max() >= num_classes):
            raise PartitionFileError(
                f"{path}: client {c} flipped labels must be class ids in [0, {num_classes})"
            )
        out[c] = LabelFlips(ix, lab)
    return out
