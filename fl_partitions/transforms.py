"""Per-client dataset views: a client's subset of a dataset, with its feature and label noise.

The noise of element ``e`` of sample ``j`` on client ``i`` is a function of
``(seed, i, j, e)`` alone — a counter-based generator (SplitMix64 hashing, then Box-Muller) —
so it is the same in every epoch, process and host (FedLab cross-process, FedML MPI)
whatever order samples are read in, as NIID-Bench's fixed per-client noise intends, and a
whole batch of it is drawn in one vectorised step.

Units: a partition's noise standard deviations are in *pixel* units (intensities in [0, 1]),
as NIID-Bench adds its noise right after ``ToTensor()``, before any normalisation. A dataset
whose tensors are normalised says by how much through a ``pixel_scale`` attribute (tensor units
per pixel unit, ``1 / std`` of its ``Normalize``), and the noise is scaled by it: adding
``N(0, s^2)`` to pixels and then normalising gives exactly the normalised image plus
``N(0, (s * pixel_scale)^2)``, since normalising is affine and NIID-Bench does not clip.

Label noise is data, not a stream: a partition lists each noisy client's flipped samples and
their new labels (:class:`~fl_partitions.partition.LabelFlips`), and a view given them returns
those labels in place of the dataset's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import Dataset

from fl_checks import ParameterError
from fl_partitions.partition import LabelFlips

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """SplitMix64's finaliser, elementwise (uint64 arithmetic wraps, as intended)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return x ^ (x >> np.uint64(31))


def noise_block(
    shape: Sequence[int],
    std: float,
    seed: int,
    client: int,
    indices: Sequence[int] | NDArray[np.integer[Any]],
) -> NDArray[np.float32]:
    """Fixed Gaussian noise ``std * N(0, 1)`` for samples ``indices`` of ``client``.

    Returns an array of shape ``(len(indices), *shape)``; row ``r`` depends only on
    ``(seed, client, indices[r])``.
    """
    idx = np.asarray(indices, dtype=np.uint64).reshape(-1, 1)
    size = int(np.prod(shape))
    with np.errstate(over="ignore"):
        key = _splitmix64(
            np.asarray(seed & 0xFFFFFFFFFFFFFFFF, np.uint64)
            ^ _splitmix64(np.asarray(client, np.uint64))
        )
        base = _splitmix64(key ^ (idx * np.uint64(0xD1B54A32D192ED03)))
        counter = np.arange(size, dtype=np.uint64).reshape(1, -1) * np.uint64(2)
        bits1 = _splitmix64(base + counter)
        bits2 = _splitmix64(base + counter + np.uint64(1))
    # 53-bit uniforms in (0, 1], then Box-Muller.
    u1 = ((bits1 >> np.uint64(11)).astype(np.float64) + 1.0) / 9007199254740992.0
    u2 = (bits2 >> np.uint64(11)).astype(np.float64) / 9007199254740992.0
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return (z * std).astype(np.float32).reshape(len(idx), *shape)


def sample_noise(
    shape: Sequence[int], std: float, seed: int, client: int, index: int
) -> torch.Tensor:
    """The fixed noise of one sample (the same values ``noise_block`` gives it)."""
    return torch.from_numpy(noise_block(shape, std, seed, client, [index])[0])


class NoisyDataset(Dataset[Any]):
    """A client's view of ``dataset``: the given indices, inputs plus fixed Gaussian noise,
    labels with the client's flips.

    Parameters
    ----------
    dataset : torch Dataset returning ``(x, y)`` with ``x`` a float tensor. If it also has
        ``get_batch(indices) -> (x, y)`` (as the benchmarks' in-memory datasets do), whole
        batches are read and noised in one step.
    indices : the dataset indices this client holds.
    std : noise standard deviation in pixel units (0 returns samples unchanged).
    seed, client : identify the noise stream.
    pixel_scale : tensor units per pixel unit; by default the dataset's ``pixel_scale``
        attribute, else 1 (the tensors hold [0, 1] pixels).
    flips : the client's label flips (:meth:`Partition.client_flips
        <fl_partitions.partition.Partition.client_flips>`); a sample of the view among them
        gets its new label, the others keep the dataset's. A partition flips only train and
        validation samples, so the client's test view, given the same flips, stays clean.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        indices: Sequence[int] | NDArray[np.integer[Any]],
        *,
        std: float = 0.0,
        seed: int = 0,
        client: int = 0,
        pixel_scale: float | None = None,
        flips: LabelFlips | None = None,
    ) -> None:
        if not np.isfinite(std) or std < 0:
            raise ParameterError(f"std must be a finite float >= 0, got {std!r}")
        if pixel_scale is None:
            pixel_scale = float(getattr(dataset, "pixel_scale", 1.0))
        if not np.isfinite(pixel_scale) or pixel_scale <= 0:
            raise ParameterError(f"pixel_scale must be a finite float > 0, got {pixel_scale!r}")
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)
        self.std = float(std)
        self.pixel_scale = float(pixel_scale)
        self.seed = int(seed)
        self.client = int(client)
        self._noise: torch.Tensor | None = None  # all of this view's noise, drawn on first use
        # The new label of each position of the view, -1 where the dataset's stands; None
        # when no sample of the view is flipped.
        self._labels: NDArray[np.int64] | None = None
        if flips is not None:
            where, new = flips.lookup(self.indices)
            if len(where):
                self._labels = np.full(len(self.indices), -1, dtype=np.int64)
                self._labels[where] = new

    def __len__(self) -> int:
        return len(self.indices)

    def _noise_for(self, positions: NDArray[np.int64], shape: Sequence[int]) -> torch.Tensor:
        if self._noise is None:
            # One vectorised draw for the whole view (a 2,000-sample 28x28 client: 6 MB),
            # reused by every epoch and round.
            std = self.std * self.pixel_scale
            self._noise = torch.from_numpy(
                noise_block(shape, std, self.seed, self.client, self.indices)
            )
        return self._noise[torch.as_tensor(positions)]

    def __getitem__(self, item: int) -> tuple[Any, Any]:
        x, y = self.dataset[int(self.indices[item])]
        if self.std > 0:
            x = x + self._noise_for(np.array([item]), tuple(x.shape))[0].to(x.dtype)
        if self._labels is not None and self._labels[item] >= 0:
            new = int(self._labels[item])  # in the type the dataset gives its labels in
            y = torch.tensor(new, dtype=y.dtype) if isinstance(y, torch.Tensor) else new
        return x, y

    def get_batch(
        self, positions: Sequence[int] | NDArray[np.integer[Any]] | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples at ``positions`` of this view, stacked: ``(x, y)``."""
        pos = np.asarray(positions, dtype=np.int64)
        get = getattr(self.dataset, "get_batch", None)
        if get is not None:
            x, y = get(self.indices[pos])
        else:
            items = [self.dataset[int(i)] for i in self.indices[pos]]
            x = torch.stack([torch.as_tensor(a) for a, _ in items])
            y = torch.as_tensor([int(b) for _, b in items])
        if self.std > 0:
            x = x + self._noise_for(pos, tuple(x.shape[1:])).to(x.dtype)
        if self._labels is not None:
            y = torch.as_tensor(y)
            new = torch.from_numpy(self._labels[pos])
            y = torch.where(new >= 0, new.to(y.dtype), y)
        return x, y
