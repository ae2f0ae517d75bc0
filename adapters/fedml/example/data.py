"""The example's data module: Fashion-MNIST (or digits) partitioned by fl_partitions, in FedML's
8-tuple ``[train_num, test_num, train_global, test_global, train_num_dict, train_dict,
test_dict, class_num]``.

The partition comes from the config's ``partition_spec`` (any fedbalance partitioner spec,
default the thesis's mixed skew); each client's local split is train + validation (FedML trains
on both, fedbalance's adapter holds the validation part out when the aggregator needs it) and
test. Feature noise and label flips (``label_noise``: train labels only, test stays true) are
applied per client.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from fl_adapters.datasets import dataset_targets, image_spec, load_dataset
from fl_adapters.models import model_for
from fl_partitions import make_partitioner
from fl_partitions.transforms import NoisyDataset


def _tensors(ds: NoisyDataset) -> TensorDataset:
    x, y = ds.get_batch(np.arange(len(ds)))
    return TensorDataset(x, y)


def load(args: Any) -> tuple[list[Any], int]:
    name = getattr(args, "dataset", "fmnist")
    # A missing dataset fails here, saying how to get it.
    train = load_dataset(name, train=True, data_dir=_data_dir(args))
    labels = dataset_targets(train)
    pixel_scale = float(getattr(train, "pixel_scale", 1.0))  # noise is in pixel units
    max_samples = getattr(args, "max_samples", None)
    if max_samples:
        keep = np.sort(
            np.random.default_rng(int(args.random_seed)).permutation(len(labels))[
                : int(max_samples)
            ]
        )
        train = torch.utils.data.Subset(train, keep.tolist())
        labels = labels[keep]
        base = TensorDataset(*_stack(train))
    else:
        base = train
    spec = getattr(args, "partition_spec", None) or {"name": "mixed"}
    part = make_partitioner(spec).partition(
        labels, int(args.client_num_in_total), seed=int(args.random_seed), split=(0.8, 0.0, 0.2)
    )
    bs = int(args.batch_size)
    train_dict, test_dict, num_dict = {}, {}, {}
    for c in range(part.num_clients):
        views = {
            split: NoisyDataset(
                base,
                part.splits[c][split],
                std=float(part.noise_std[c]),
                seed=part.seed,
                client=c,
                pixel_scale=pixel_scale,
                flips=part.client_flips(c),
            )
            for split in ("train", "test")
        }
        train_dict[c] = DataLoader(_tensors(views["train"]), batch_size=bs, shuffle=True)
        test_dict[c] = DataLoader(_tensors(views["test"]), batch_size=bs, shuffle=False)
        num_dict[c] = len(part.splits[c]["train"])
    train_global: DataLoader[Any] = DataLoader(
        torch.utils.data.ConcatDataset([d.dataset for d in train_dict.values()]), batch_size=bs
    )
    test_global: DataLoader[Any] = DataLoader(
        torch.utils.data.ConcatDataset([d.dataset for d in test_dict.values()]), batch_size=bs
    )
    num_classes = image_spec(name, _data_dir(args))[2]
    dataset = [
        sum(num_dict.values()),
        sum(len(part.splits[c]["test"]) for c in range(part.num_clients)),
        train_global,
        test_global,
        num_dict,
        train_dict,
        test_dict,
        num_classes,
    ]
    return dataset, num_classes


def _stack(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)
    return torch.stack(list(xs)), torch.as_tensor([int(y) for y in ys])


def model(args: Any, num_classes: int) -> torch.nn.Module:
    """The config's ``model`` (``thesis_cnn`` or ``astraea_cnn``) for the dataset's images,
    seeded by ``random_seed``; ``num_classes`` (what :func:`load` returned) is the same."""
    return model_for(
        getattr(args, "model", "thesis_cnn"),
        getattr(args, "dataset", "fmnist"),
        _data_dir(args),
        seed=int(args.random_seed),
    )


def _data_dir(args: Any) -> str | None:
    """The run config's ``data_dir`` (FedML's ``data_cache_dir``; its default is no choice)."""
    path = getattr(args, "data_cache_dir", None)
    return None if path in (None, "", "/tmp/fedml_data") else str(path)
