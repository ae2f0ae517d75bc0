"""Offline-first dataset loaders for the benchmarks and the command line.

* ``fmnist`` — Fashion-MNIST from the Debian package ``dataset-fashion-mnist``
  (``/usr/share/datasets/fashion-mnist``), ``$FEDBALANCE_DATA``/``--data-dir``, or a torchvision
  ``FashionMNIST/raw`` cache below them. Read straight from the IDX files: no download.
* ``digits`` — scikit-learn's bundled 8x8 digits (1,797 images), always available offline.
* ``cifar10``, ``svhn``, ``emnist`` — through torchvision, from ``--data-dir`` or
  ``$FEDBALANCE_DATA``; downloaded only when the caller asks (``download=True``).
* ``npy:PATH`` — arrays a user brings (read without pickle): a ``.npy`` labels array, which
  partitions, or an ``.npz`` archive of images and labels, which also trains
  (:mod:`fl_adapters.user_data`).

A missing dataset raises :class:`DatasetUnavailable`, saying where it was looked for and how to
get it. Nothing here downloads unless asked.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from fl_adapters import user_data
from fl_checks import FedbalanceError, ParameterError

DATASETS = ("fmnist", "digits", "cifar10", "svhn", "emnist")
DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
# Fashion-MNIST's normalisation constants (mean, std of the training pixels).
FMNIST_MEAN, FMNIST_STD = 0.2860, 0.3530


class DatasetUnavailable(FedbalanceError, FileNotFoundError):
    """The dataset is not on this machine; the message says how to get it."""


@dataclass(frozen=True)
class ArrayDataset(torch.utils.data.Dataset):
    """Images and labels held in memory as tensors; ``x`` float (N, C, H, W), ``y`` int64.

    ``pixel_scale``: tensor units per pixel unit (``1 / std`` of the normalisation), so that
    feature noise given in pixel units lands in the tensors' units
    (:class:`fl_partitions.transforms.NoisyDataset`)."""

    x: torch.Tensor
    y: torch.Tensor
    name: str = ""
    pixel_scale: float = 1.0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    def get_batch(self, indices: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Many samples at once (one gather instead of a Python loop per sample)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.x[idx], self.y[idx]

    @property
    def targets(self) -> NDArray[np.int64]:
        return self.y.numpy()

    @property
    def num_classes(self) -> int:
        return int(self.y.max()) + 1


def data_roots(data_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where datasets are looked for, in order."""
    roots = [Path(p) for p in (data_dir, os.environ.get("FEDBALANCE_DATA")) if p]
    return [*roots, Path.home() / ".cache" / "fedbalance"]


def _read_idx(path: Path) -> NDArray[np.uint8]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ParameterError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = np.frombuffer(data, dtype=">i4", count=ndim, offset=4)
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ParameterError(
            f"{path}: truncated IDX file ({arr.size} of {int(np.prod(dims))} values)"
        )
    return arr.reshape(tuple(int(d) for d in dims))


def _find_fmnist(stem: str, data_dir: str | os.PathLike[str] | None) -> Path:
    candidates = []
    for root in [*data_roots(data_dir), DEBIAN_FMNIST]:
        for folder in (root, root / "fashion-mnist", root / "FashionMNIST" / "raw"):
            candidates += [folder / f"{stem}.gz", folder / stem]
    for c in candidates:
        if c.is_file():
            return c
    raise DatasetUnavailable(
        f"Fashion-MNIST file {stem}[.gz] not found (looked in {DEBIAN_FMNIST}, $FEDBALANCE_DATA, "
        f"--data-dir and ~/.cache/fedbalance). Install it with `apt-get install "
        f"dataset-fashion-mnist` (Debian/Ubuntu), or put the four IDX files in --data-dir."
    )


def load_fmnist(
    train: bool = True, data_dir: str | os.PathLike[str] | None = None, normalize: bool = True
) -> ArrayDataset:
    """Fashion-MNIST as (N, 1, 28, 28) float tensors (normalised) and int64 labels."""
    prefix = "train" if train else "t10k"
    images = _read_idx(_find_fmnist(f"{prefix}-images-idx3-ubyte", data_dir))
    labels = _read_idx(_find_fmnist(f"{prefix}-labels-idx1-ubyte", data_dir))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    if normalize:
        x = (x - FMNIST_MEAN) / FMNIST_STD
    scale = 1.0 / FMNIST_STD if normalize else 1.0
    return ArrayDataset(x, torch.from_numpy(labels.astype(np.int64)), "fmnist", scale)


def digits_arrays() -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """scikit-learn's bundled digits: ``(images (1797, 8, 8), targets)``, as its
    ``load_digits`` returns them.

    Read from the file that function reads (``sklearn/datasets/data/digits.csv.gz``), without
    importing scikit-learn: the import takes about 1.3 s in a Flower process or a fresh one
    and 0.5 s in a FedML one (FedLab imports scikit-learn itself). Where the file is not at
    that place, scikit-learn's own function reads it.
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    if spec is None or spec.origin is None:
        raise DatasetUnavailable("digits needs scikit-learn: pip install 'fedbalance[bench]'")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if path.is_file():
        with gzip.open(path, mode="rt", encoding="utf-8") as fh:
            data = np.loadtxt(fh, delimiter=",")
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    return bunch.images, bunch.target.astype(np.int64)


def load_digits(train: bool = True, test_fraction: float = 0.2, seed: int = 0) -> ArrayDataset:
    """scikit-learn's bundled digits (10 classes, upsampled 8x8 -> 28x28), split by ``seed``."""
    images, targets = digits_arrays()
    x = torch.from_numpy((images / 16.0).astype(np.float32)).unsqueeze(1)
    # Upsampled to 28x28 so the same models run on digits as on (Fashion-)MNIST.
    x = torch.nn.functional.interpolate(x, size=(28, 28), mode="bilinear", align_corners=False)
    y = torch.from_numpy(targets)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    keep = perm[n_test:] if train else perm[:n_test]
    return ArrayDataset((x[keep] - 0.5) / 0.5, y[keep], "digits", pixel_scale=2.0)


def load_torchvision(
    name: str,
    train: bool = True,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
) -> torch.utils.data.Dataset:
    """CIFAR-10, SVHN or EMNIST (balanced split, 47 classes) through torchvision."""
    try:
        import torchvision
        from torchvision import transforms as T
    except ImportError as e:  # pragma: no cover
        raise DatasetUnavailable(
            f"{name} needs torchvision: pip install 'fedbalance[bench]'"
        ) from e
    root = data_roots(data_dir)[0]
    tf = T.Compose([T.ToTensor(), T.Normalize((0.5,), (0.5,))])
    try:
        if name == "cifar10":
            ds = torchvision.datasets.CIFAR10(
                str(root), train=train, transform=tf, download=download
            )
        elif name == "svhn":
            ds = torchvision.datasets.SVHN(
                str(root), split="train" if train else "test", transform=tf, download=download
            )
        elif name == "emnist":
            ds = torchvision.datasets.EMNIST(
                str(root), split="balanced", train=train, transform=tf, download=download
            )
        else:
            raise ParameterError(f"dataset must be one of {', '.join(DATASETS)}, got {name!r}")
    except (RuntimeError, OSError) as e:
        raise DatasetUnavailable(
            f"{name} not found under {root} ({e}). Run once with download enabled on a machine "
            f"with internet (`--download`), or copy torchvision's {name} files into --data-dir."
        ) from e
    ds.pixel_scale = 2.0  # Normalize((0.5,), (0.5,))
    return ds


def dataset_targets(ds: torch.utils.data.Dataset) -> NDArray[np.int64]:
    """Labels of a dataset without reading its images."""
    for attr in ("targets", "labels"):
        if hasattr(ds, attr):
            return np.asarray(getattr(ds, attr), dtype=np.int64)
    return np.asarray([int(ds[i][1]) for i in range(len(ds))], dtype=np.int64)  # type: ignore[arg-type]


def load_labels(
    name: str, data_dir: str | os.PathLike[str] | None = None, download: bool = False
) -> NDArray[np.int64]:
    """The training labels of dataset ``name`` (or of ``npy:PATH``)."""
    if user_data.is_user_data(name):
        return user_data.read_labels(user_data.path_of(name))
    if name == "fmnist":
        prefix = _find_fmnist("train-labels-idx1-ubyte", data_dir)
        return _read_idx(prefix).astype(np.int64)
    if name == "digits":
        return load_digits(train=True).targets
    return dataset_targets(load_torchvision(name, True, data_dir, download))


@functools.lru_cache(maxsize=4)
def load_dataset(
    name: str,
    train: bool = True,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
) -> torch.utils.data.Dataset:
    """A training or test dataset by name (see the module docstring); cached per process.

    The benchmarks run many experiments in one worker process; decoding Fashion-MNIST anew
    for each would cost more than a short run.
    """
    if name == "fmnist":
        return load_fmnist(train, data_dir)
    if name == "digits":
        return load_digits(train)
    if user_data.is_user_data(name):
        x, y, scale = user_data.read_npz(user_data.path_of(name), train)
        return ArrayDataset(x, y, name, pixel_scale=scale)
    return load_torchvision(name, train, data_dir, download)


#: (channels, image side, classes) of the named datasets, known without loading them.
IMAGE_SPECS = {
    "fmnist": (1, 28, 10),
    "digits": (1, 28, 10),
    "cifar10": (3, 32, 10),
    "svhn": (3, 32, 10),
    "emnist": (1, 28, 47),
}


def image_spec(name: str, data_dir: str | os.PathLike[str] | None = None) -> tuple[int, int, int]:
    """``(channels, image side, classes)`` of dataset ``name``'s training images: what a
    model is built for, the same in every process and host of a run."""
    if name in IMAGE_SPECS:
        return IMAGE_SPECS[name]
    train = load_dataset(name, train=True, data_dir=None if data_dir is None else str(data_dir))
    x = train.x  # type: ignore[attr-defined]
    return int(x.shape[1]), int(x.shape[-1]), int(train.y.max()) + 1  # type: ignore[attr-defined]


def bench_dataset(name: str, quick: bool) -> str:
    """The dataset a benchmark runs on: Fashion-MNIST if installed; a ``--quick`` run falls
    back to scikit-learn's digits (and says so), a full run stops with how to install it."""
    if name != "fmnist" or fmnist_available():
        return name
    if not quick:
        raise SystemExit(
            "Fashion-MNIST is not installed (apt install dataset-fashion-mnist); "
            "--dataset digits runs on scikit-learn's digits"
        )
    print("Fashion-MNIST not found: --quick runs on scikit-learn's digits")
    return "digits"


def fmnist_available(data_dir: str | os.PathLike[str] | None = None) -> bool:
    try:
        _find_fmnist("train-labels-idx1-ubyte", data_dir)
    except DatasetUnavailable:
        return False
    return True
