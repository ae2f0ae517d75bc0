"""Astraea's client side: each client's data rebalanced by the plan's ratios (``Rad``), and the
cache that makes it once per client in every host."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fl_adapters._training import stream_seed
from fl_checks import ParameterError

#: ``torchvision.transforms.RandomAffine`` arguments of the augmentation.
AFFINE: dict[str, Any] = {
    "degrees": 15.0,
    "translate": (0.1, 0.1),
    "scale": (0.9, 1.1),
    "shear": 10.0,
}


def rebalance(
    x: torch.Tensor, y: torch.Tensor, rad: Any, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's data rebalanced by ``rad`` (per class), deterministically from ``seed``.

    ``x`` is a batch of images ``(N, C, H, W)``; returns new ``(x, y)`` tensors, shuffled.
    """
    ratios = torch.as_tensor(np.asarray(rad, dtype=np.float64))
    if len(y) == 0:
        return x, y
    if int(y.max()) >= len(ratios) or int(y.min()) < 0:
        raise ParameterError(
            f"labels must lie in [0, {len(ratios)}), got [{int(y.min())}, {int(y.max())}]"
        )
    gen = torch.Generator().manual_seed(seed)
    r = ratios[y.long()]
    draw = torch.rand(len(y), generator=gen, dtype=torch.float64)
    keep = (r >= 1) | (draw < r)
    extra = (r - 1).clamp(min=0)
    copies = (
        extra.floor().long()
        + (torch.rand(len(y), generator=gen, dtype=torch.float64) < extra.frac()).long()
    )
    parts_x, parts_y = [x[keep]], [y[keep]]
    if int(copies.sum()) > 0:
        if x.dim() != 4:
            raise ParameterError(
                "Astraea's augmentation transforms images: client inputs must be (N, C, H, W), "
                f"got shape {tuple(x.shape)}; set augment: false to run mediators only"
            )
        source = torch.repeat_interleave(torch.arange(len(y)), copies)
        parts_x.append(augment_images(x[source], int(torch.randint(2**62, (1,), generator=gen))))
        parts_y.append(y[source])
    x2, y2 = torch.cat(parts_x), torch.cat(parts_y)
    order = torch.randperm(len(y2), generator=gen)
    return x2[order], y2[order]


def rebalance_client(
    x: torch.Tensor, y: torch.Tensor, rad: Any, seed: int, client: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rebalance` seeded by ``(seed, client)``: a client's data is the same in every host."""
    return rebalance(x, y, rad, stream_seed("astraea-rebalance", seed, client))


class RebalancedCache:
    """Each client's training data rebalanced by the plan's ``rad``, made once per client.

    One per process, in every host: FedLab's trainers and relay, FedML's sp, MPI and
    cross-silo clients, Flower's ClientApp (where a mediator's chain visits a client on every
    hop, and each visit must not rebalance again).
    :func:`rebalance_client` is a function of ``rad``, the seed and the client, so a cached
    dataset is the one a fresh call would make; a new ``rad`` or seed (another plan or run)
    starts over.
    """

    def __init__(self) -> None:
        self._key: tuple[bytes, int, Hashable] | None = None
        self._data: dict[int, Any] = {}
        #: Label counts of the rebalanced data of each client built so far (what it trains on).
        self.trained_counts: dict[int, NDArray[np.int64]] = {}

    def get(
        self,
        client: int,
        rad: Any,
        seed: int,
        load: Callable[[], Any],
        wrap: Callable[[torch.Tensor, torch.Tensor, Any], Any] | None = None,
        scope: Hashable = None,
    ) -> Any:
        """Client ``client``'s rebalanced data: ``load()`` gives its training data the first
        time, and ``wrap(x, y, original)`` the form the host trains on (a ``TensorDataset``
        when ``None``). ``scope`` names the run where one process may serve several (Flower's
        run id): another scope starts over, like another ``rad`` or seed."""
        rad = np.asarray(rad, dtype=np.float64)
        key = (rad.tobytes(), int(seed), scope)
        if key != self._key:
            self._key = key
            self._data.clear()
            self.trained_counts.clear()
        if client not in self._data:
            original = load()
            x, y = dataset_tensors(original)
            x2, y2 = rebalance_client(x, y, rad, seed, client)
            self._data[client] = TensorDataset(x2, y2) if wrap is None else wrap(x2, y2, original)
            self.trained_counts[client] = label_counts(y2, len(rad))
        return self._data[client]


def dataset_tensors(data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """All of a client's samples as ``(x, y)``: from a ``TensorDataset``, a dataset with
    ``get_batch``, a ``DataLoader`` over either, any map-style dataset, or a list of batches."""
    ds = data.dataset if isinstance(data, DataLoader) else data
    if isinstance(ds, TensorDataset):
        return ds.tensors[0], ds.tensors[1]
    get = getattr(ds, "get_batch", None)
    if get is not None:
        return get(np.arange(len(ds)))  # type: ignore[arg-type]
    if isinstance(ds, Dataset):
        data = DataLoader(ds, batch_size=1024, shuffle=False)
    xs, ys = [], []
    for x, y in data:
        xs.append(torch.as_tensor(x))
        ys.append(torch.as_tensor(y))
    if not xs:
        return torch.empty(0), torch.empty(0, dtype=torch.long)
    return torch.cat(xs), torch.cat(ys)


def augment_images(x: torch.Tensor, seed: int) -> torch.Tensor:
    """A random affine transform of each image in ``x`` (its own draw per image), seeded."""
    try:
        from torchvision.transforms import RandomAffine
    except ImportError as e:  # pragma: no cover - torchvision comes with the fedlab/bench extras
        raise ImportError(
            "Astraea's augmentation needs torchvision: pip install 'fedbalance[bench]'"
        ) from e
    transform = RandomAffine(**AFFINE)
    out = torch.empty_like(x)
    with torch.random.fork_rng(devices=[]):  # RandomAffine draws from torch's global RNG
        torch.manual_seed(seed)
        for i in range(len(x)):
            out[i] = transform(x[i])
    return out


def label_counts(y: torch.Tensor | NDArray[Any], num_classes: int) -> NDArray[np.int64]:
    return np.bincount(np.asarray(y, dtype=np.int64), minlength=num_classes)[:num_classes]
