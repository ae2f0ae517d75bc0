"""What the client helpers take as data: (x, y) pairs or dicts (Flower Datasets' samples), as
datasets or DataLoaders, batches already collated included; and the one line an unusable
sample gets before any training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fl_adapters._training import as_xy, batches, check_sample, evaluate, num_samples
from fl_checks import ParameterError

X = torch.randn(10, 4)
Y = torch.arange(10) % 3


class DictData(Dataset):
    """Samples as Flower Datasets serves them after ``with_transform``: one dict each."""

    def __init__(self, keys: tuple[str, str] = ("img", "label"), x: object = None) -> None:
        self.keys, self.x = keys, x

    def __len__(self) -> int:
        return len(Y)

    def __getitem__(self, i: int) -> dict[str, object]:
        return {self.keys[0]: X[i] if self.x is None else self.x, self.keys[1]: int(Y[i])}


@pytest.mark.parametrize(
    "data",
    [
        TensorDataset(X, Y),
        DataLoader(TensorDataset(X, Y), batch_size=3),
        DictData(),
        DictData(("image", "label")),
        DictData(("x", "y")),
        DataLoader(DictData(), batch_size=4),  # dict batches, collated by the loader
    ],
    ids=["pairs", "pair-loader", "img-label", "image-label", "x-y", "dict-loader"],
)
def test_every_form_gives_the_same_evaluation(data: object) -> None:
    model = torch.nn.Linear(4, 3)
    assert evaluate(model, data) == pytest.approx(evaluate(model, TensorDataset(X, Y)))
    assert num_samples(data) == 10  # samples, not a DataLoader's batches


def test_other_keys_are_given_once() -> None:
    data = DictData(("pixel_values", "labels"))
    model = torch.nn.Linear(4, 3)
    with pytest.raises(ParameterError, match=r"keys \['labels', 'pixel_values'\] has no inputs"):
        evaluate(model, data)
    check_sample(data, keys=("pixel_values", "labels"))
    got = evaluate(model, data, keys=("pixel_values", "labels"))
    assert got == pytest.approx(evaluate(model, TensorDataset(X, Y)))


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (DictData(("pixels", "target")), "a dict sample with keys ['pixels', 'target'] has no"),
        (DictData(x="a.png"), "the samples' inputs are str, not tensors"),
        ([(1, 2, 3)], "a batch must be an (inputs, labels) pair, or a dict"),
    ],
    ids=["unknown-keys", "strings", "triples"],
)
def test_an_unusable_sample_is_refused_naming_what_it_holds(data: object, words: str) -> None:
    with pytest.raises(ParameterError) as info:
        check_sample(data)
    assert words in str(info.value)
    assert "'img'/'label'" in str(info.value) or "tensors" in str(info.value)


def test_a_loaders_own_batching_is_kept() -> None:
    loader = DataLoader(DictData(), batch_size=4)
    sizes = [len(y) for _, y in batches(loader, batch_size=1024)]
    assert sizes == [4, 4, 2]
    x, y = as_xy({"img": np.zeros(2), "label": np.ones(2)})
    assert x.shape == (2,) and y.shape == (2,)
