"""The result of a partition: per-client indices, transforms, local splits and statistics.

Saved as JSON (small partitions) or JSON plus an ``.npz`` of index arrays (large ones). Never
pickle: ``.npz`` files are read with ``allow_pickle=False`` and every field is validated, so a
tampered file gives a clear :class:`PartitionFileError` instead of arbitrary behaviour.
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
from fl_partitions.stats import class_count_matrix, summarize

IntArray = NDArray[np.int64]
DEFAULT_SPLIT: tuple[float, float, float] = (0.7, 0.1, 0.2)
FORMAT = "fedbalance.partition/1"
SPLIT_NAMES = ("train", "val", "test")
# Salt for the split sub-stream, so it never collides with other per-client streams.
_SPLIT_STREAM = 1
# Above this many indices in total, ``save`` puts the arrays in a side ``.npz``.
INLINE_LIMIT = 200_000


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

    def stats(self) -> dict[str, Any]:
        """Sizes, per-client KL (uniform, global) and EMD, and their means."""
        return summarize(self.class_counts)

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
        return {
            "format": FORMAT,
            "num_samples": self.num_samples,
            "num_classes": self.num_classes,
            "seed": self.seed,
            "spec": self.spec,
            "split_fractions": list(self.split_fractions),
            "clients": clients,
            "stats": self.stats(),
        }

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
        if "arrays" in doc:
            npz_path = path.parent / Path(str(doc["arrays"])).name
            try:
                with np.load(npz_path, allow_pickle=False) as z:
                    indices = np.split(z["indices"], np.cumsum(z["sizes"])[:-1])
                    parts = {
                        p: np.split(z[p], np.cumsum(z[f"{p}_sizes"])[:-1]) for p in SPLIT_NAMES
                    }
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
        )
