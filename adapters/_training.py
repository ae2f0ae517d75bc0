"""Client-side helpers shared by the host adapters: local training steps and evaluation.

The hosts (FedLab, FedML) own the federated loop; these are the per-client pieces their
trainer classes call: a few local epochs, and the loss/accuracy of a model on a dataset.
"""

from __future__ import annotations

import contextlib
import hashlib
import numbers
import os
import random
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from fl_adapters.bias import Counts, total
from fl_adapters.client_metrics import Evaluation
from fl_checks import ParameterError

OPTIMIZERS = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}

#: Names a file that receives one ``start end client`` line (``time.time()`` seconds, so the
#: processes of one machine agree) for every local training a client of the run does: the
#: host's or the user's training step alone, without loading the model, the validation loss or
#: packing the update. ``fedbalance bench scale`` reads it to split a round's seconds.
TRAIN_CLOCK = "FEDBALANCE_TRAIN_CLOCK"


@contextlib.contextmanager
def training_clock(client: Any) -> Iterator[None]:
    """Times the local training inside it into the :data:`TRAIN_CLOCK` file, when one is set."""
    path = os.environ.get(TRAIN_CLOCK)
    if not path:
        yield
        return
    start = time.time()
    try:
        yield
    finally:
        end = time.time()
        with open(path, "a") as f:  # one short append: whole lines, even from several processes
            f.write(f"{start:.6f} {end:.6f} {client}\n")


def stream_seed(*parts: Any) -> int:
    """A 63-bit seed from any tuple of values, stable across processes and hosts."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def evaluates(round_number: int, every: int, rounds: int | None) -> bool:
    """Whether round ``round_number`` (from 1) is evaluated: every ``every`` rounds, and the
    run's last (``rounds``; ``None`` when the driver does not say how many there are)."""
    return round_number % every == 0 or round_number == rounds


def evaluated_clients(num_clients: int, fraction: float, seed: int, round_number: int) -> list[int]:
    """The clients (ids ``0..num_clients-1``, ascending) that evaluate round ``round_number``:
    all of them at ``fraction`` 1, else ``max(1, round(fraction * num_clients))`` drawn from a
    stream of their own (seed and round), so sampling for evaluation never moves the draws of
    training, and every host evaluates the same clients."""
    if fraction >= 1.0:
        return list(range(num_clients))
    size = min(num_clients, max(1, round(fraction * num_clients)))
    rng = random.Random(stream_seed("fedbalance-eval", seed, round_number))
    return sorted(rng.sample(range(num_clients), size))


#: Key pairs a dict sample or batch is read by when no ``keys`` are given: Flower Datasets'
#: image sets (``quickstart-pytorch``'s CIFAR-10 and MNIST), and plain ``x``/``y``.
KNOWN_KEYS: tuple[tuple[str, str], ...] = (("img", "label"), ("image", "label"), ("x", "y"))
#: What a batch may be, said once wherever one is refused.
BATCH_FORMS = (
    "an (inputs, labels) pair, or a dict with the inputs and labels under keys such as "
    + ", ".join(f"{x!r}/{y!r}" for x, y in KNOWN_KEYS)
    + " (other names: keys=(INPUTS, LABELS))"
)


def find_keys(sample: Mapping[str, Any], keys: tuple[str, str] | None = None) -> tuple[str, str]:
    """The (inputs, labels) keys of a dict sample: ``keys`` when given, else the first pair of
    :data:`KNOWN_KEYS` it holds; a :class:`ParameterError` naming its keys otherwise."""
    pairs = [keys] if keys is not None else KNOWN_KEYS
    for pair in pairs:
        if all(k in sample for k in pair):
            return pair
    wanted = f"keys {keys!r}" if keys is not None else BATCH_FORMS
    raise ParameterError(
        f"a dict sample with keys {sorted(map(str, sample))[:10]} has no inputs and labels: "
        f"expected {wanted}"
    )


def as_xy(batch: Any, keys: tuple[str, str] | None = None) -> tuple[Any, Any]:
    """``(inputs, labels)`` of one batch (or sample): a pair as it is, a dict by its keys."""
    if isinstance(batch, Mapping):
        kx, ky = find_keys(batch, keys)
        return batch[kx], batch[ky]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ParameterError(f"a batch must be {BATCH_FORMS}; got {type(batch).__name__}")


def check_sample(data: Any, keys: tuple[str, str] | None = None) -> None:
    """Refuse ``data`` (a dataset or ``DataLoader``) whose first sample is no (inputs, labels)
    pair of tensors, numbers or arrays: one :class:`ParameterError` naming what it holds, before
    any training, instead of a failure deep in the first batch."""
    if isinstance(data, DataLoader):
        data = data.dataset
    get = getattr(data, "get_batch", None)
    try:
        if len(data) == 0:
            return
        sample = get(np.arange(1)) if get is not None else data[0]
    except (TypeError, IndexError, KeyError):
        return  # an iterable-style dataset: its first batch says it
    x, y = as_xy(sample, keys)
    for what, value in (("inputs", x), ("labels", y)):
        if not isinstance(value, (torch.Tensor, np.ndarray, numbers.Number)):
            raise ParameterError(
                f"the samples' {what} are {type(value).__name__}, not tensors: give a dataset "
                f"or DataLoader whose samples are {BATCH_FORMS}, with tensors (e.g. a "
                "ToTensor transform, or Flower Datasets' with_transform)"
            )


def num_samples(data: Any) -> int:
    """The samples in ``data``: a dataset's length, or a ``DataLoader``'s dataset's (its own
    ``len`` counts batches)."""
    if isinstance(data, DataLoader):
        # what it draws from: the sampler its batches are made of (a custom one may skip rows)
        sampler = getattr(data.batch_sampler, "sampler", data.sampler)
        return len(sampler)  # type: ignore[arg-type]
    return len(data)


def batches(
    data: Any,
    batch_size: int,
    *,
    shuffle: bool = False,
    generator: torch.Generator | None = None,
    keys: tuple[str, str] | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(inputs, labels)`` mini-batches of ``data``: a ``DataLoader`` as it batches (its own
    batch size and order), a dataset with ``get_batch`` vectorised, any other dataset through a
    ``DataLoader``. Dict batches are read by ``keys`` (see :func:`as_xy`)."""
    if isinstance(data, DataLoader):
        source: Any = data
    elif (get := getattr(data, "get_batch", None)) is not None:
        n = len(data)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        source = (get(order[s : s + batch_size].numpy()) for s in range(0, n, batch_size))
    else:
        source = DataLoader(data, batch_size=batch_size, shuffle=shuffle, generator=generator)
    for batch in source:
        x, y = as_xy(batch, keys)
        yield torch.as_tensor(x), torch.as_tensor(y)


def device_of(model: nn.Module) -> torch.device:
    """Where ``model``'s parameters live (the CPU for a model without any): batches follow the
    model, so a host that put it on a GPU (FedLab's ``cuda=True`` trainers) trains and
    evaluates there."""
    first = next(model.parameters(), None)
    return torch.device("cpu") if first is None else first.device


def local_train(
    model: nn.Module,
    dataset: Dataset[Any],
    *,
    epochs: int,
    batch_size: int,
    optimizer: str,
    lr: float,
    seed: int,
    carry: dict[str, Any] | None = None,
) -> int:
    """Train ``model`` in place for ``epochs`` on ``dataset``; returns the sample count.

    A fresh optimizer per call (Adam state must not leak between clients) unless ``carry`` is
    given: then the optimizer starts from the state ``carry["state"]`` holds (if any) and
    leaves its own there, so the calls of one mediator chain share one optimizer (Astraea's
    ``carry_optimizer``). A data order fixed by ``seed``, and torch's global RNG (dropout)
    seeded from ``seed`` for the call and restored after it: the same client in the same
    participation trains identically in any process, and a resumed run continues exactly.
    """
    n = len(dataset)  # type: ignore[arg-type]
    if n == 0:
        return 0
    if optimizer not in OPTIMIZERS:
        raise ParameterError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    gen = torch.Generator().manual_seed(seed)
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=lr)
    if carry is not None and "state" in carry:
        opt.load_state_dict(carry["state"])
    criterion = nn.CrossEntropyLoss()
    device = device_of(model)
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed ^ 0x5EED)
        for _ in range(epochs):
            for x, y in batches(dataset, batch_size, shuffle=True, generator=gen):
                opt.zero_grad(set_to_none=True)
                criterion(model(x.to(device)), y.to(device)).backward()
                opt.step()
    if carry is not None:
        carry["state"] = opt.state_dict()
    return n


@torch.no_grad()
def evaluate_counts(
    model: nn.Module,
    data: Any,
    batch_size: int = 1024,
    *,
    keys: tuple[str, str] | None = None,
) -> Counts:
    """The summed cross-entropy loss and, per class, the samples and correct predictions of
    ``model`` over ``data`` (a dataset or ``DataLoader`` of pairs or dicts, see
    :func:`batches`): one pass, from which accuracy and every bias figure follow
    (:mod:`fl_adapters.bias`). The class vectors cover the model's outputs; a label beyond
    them is refused by the loss, as in training."""
    model.eval()
    loss_sum = 0.0
    # One count vector a pass, two cells a class: 2c for a miss, 2c + 1 for a hit.
    cells = torch.zeros(0, dtype=torch.int64)
    criterion = nn.CrossEntropyLoss(reduction="sum")
    device = device_of(model)
    for x, y in batches(data, batch_size, keys=keys):
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss_sum += float(criterion(out, y))
        tally = torch.bincount(2 * y + (out.argmax(dim=1) == y), minlength=2 * out.shape[1])
        k = max(len(cells), len(tally))
        cells = _grown(cells, k) + _grown(tally.cpu(), k)
    total, correct = cells[0::2] + cells[1::2], cells[1::2]
    return Counts(loss_sum, total.numpy(), correct.numpy())


@torch.no_grad()
def evaluate_counts_in_parts(model: nn.Module, data: Any, sizes: list[int]) -> list[Counts]:
    """:func:`evaluate_counts` of each part of ``data``, in one pass over it: ``data`` (a
    ``DataLoader`` that keeps its order, or a dataset) holds the parts one after the other,
    ``sizes[i]`` samples of part ``i``, as a ``ConcatDataset`` of the parts does. The batches
    are ``data``'s own, so a pass that served one figure for the whole serves every part."""
    model.eval()
    bounds = torch.tensor(np.cumsum(sizes), dtype=torch.int64)
    criterion = nn.CrossEntropyLoss(reduction="none")
    device = device_of(model)
    parts, seen, expected = len(sizes), 0, int(sum(sizes))
    cells = torch.zeros(0, dtype=torch.int64)
    losses = torch.zeros(parts, dtype=torch.float64)
    for x, y in batches(data, 1024):
        out = model(x.to(device))
        y = y.to(device)
        if seen + len(y) > expected:
            raise ValueError(f"data holds more samples than the parts' sizes ({expected})")
        part = torch.bucketize(torch.arange(seen, seen + len(y)), bounds, right=True)
        seen += len(y)
        losses.index_add_(0, part, criterion(out, y).double().cpu())
        k = 2 * out.shape[1]  # two cells a class, as in evaluate_counts
        cell = part.to(device) * k + 2 * y + (out.argmax(dim=1) == y)
        tally = torch.bincount(cell, minlength=parts * k).view(parts, k).cpu()
        cells = tally if len(cells) == 0 else cells + tally
    if seen != expected:
        raise ValueError(f"data holds {seen} samples, the parts' sizes {expected}")
    if len(cells) == 0:
        return [Counts() for _ in sizes]
    return [
        Counts(float(loss), (c[0::2] + c[1::2]).numpy(), c[1::2].numpy())
        for loss, c in zip(losses, cells, strict=True)
    ]


def _grown(v: torch.Tensor, k: int) -> torch.Tensor:
    return torch.nn.functional.pad(v, (0, k - len(v))) if len(v) < k else v


def evaluate(
    model: nn.Module,
    datasets: Any,
    batch_size: int = 1024,
    *,
    keys: tuple[str, str] | None = None,
) -> Evaluation:
    """Mean cross-entropy loss, accuracy and sample count of ``model`` over ``datasets``.

    A dataset or ``DataLoader`` (of pairs or dicts, see :func:`batches`), or a list of them
    (e.g. every client's test split), which count as their union, so the result is weighted by
    their sizes.
    """
    parts = datasets if isinstance(datasets, (list, tuple)) else [datasets]
    counts = total([evaluate_counts(model, ds, batch_size, keys=keys) for ds in parts])
    if counts.n == 0:
        return Evaluation(float("nan"), float("nan"), 0)
    return Evaluation(counts.loss, counts.accuracy, counts.n)
