"""Noisy clients: a share of the clients whose labels are flipped at a rate.

The noise model of federated label-noise studies such as FedCorr (Xu et al., CVPR 2022,
https://arxiv.org/abs/2204.04677): some clients are noisy, the others clean. A flipped label
goes to another class by one of the two standard flips of Co-teaching (Han et al., NeurIPS
2018, https://arxiv.org/abs/1804.06872):

* ``symmetric``: to a class drawn uniformly from the ``C - 1`` other classes;
* ``pair``: class ``c`` to ``(c + 1) mod C`` (Co-teaching's pair flipping, the mistakes of a
  labeller who confuses neighbouring classes).

Either way a flipped label never equals the true one. Departures, each for a reason:

* FedCorr draws each noisy client's noise level at random; here every noisy client flips at the
  same ``rate``, so a setting is two numbers ("30 % of clients at 40 %").
* Co-teaching flips each label independently with probability ``rate``; here exactly
  ``round(rate * n)`` labels flip in each of a noisy client's train and validation splits of
  ``n`` samples, and ``round(share * N)`` of the ``N`` clients are noisy (Python's and numpy's
  round, half to even, as the local split sizes are rounded), so the rate a table reports is
  the rate that was run, with no sampling spread on small clients.
* Only the train and validation splits flip; every client's test split keeps its true labels.
  A client cannot tell its labels are wrong, so all it computes from them is noisy: its
  training and its validation loss (what FedLoss weighs clients by). Its test split stands for
  ground truth instead: evaluation on the clients' test data (``eval_data: clients``) scores
  the model against the true labels, as evaluation on a clean global test set does.

Which clients are noisy, which of their samples flip and (``symmetric``) to which class are
drawn from the partition's seed through raw 64-bit outputs of
:func:`~fl_partitions._rng.derived_generator` (SeedSequence + PCG64, bit streams numpy
guarantees across releases) with integer arithmetic only -- no Generator distribution method,
whose algorithms numpy may change -- so a seed gives the same flips on every host and numpy.
The flips are saved in the partition (:class:`~fl_partitions.partition.LabelFlips`) and hosts
apply them where they build a client's data (:class:`~fl_partitions.transforms.NoisyDataset`).

Alone, ``label_noise`` splits the data IID, as ``feature_noise`` does; inside ``mixed`` it adds
noisy clients to any split, e.g. ``{"name": "mixed", "components": [{"name":
"label_dirichlet", "beta": 0.5}, {"name": "label_noise", "share": 0.3, "rate": 0.4}]}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fl_checks import ParameterError, check_float, shown
from fl_partitions._rng import derived_generator
from fl_partitions.base import IntArray, validate_labels
from fl_partitions.iid import IID
from fl_partitions.partition import FLIPPED_SPLITS, LabelFlips, Partition

MODES = ("symmetric", "pair")
# Salt of the label-noise sub-streams (the local splits use 1): 0 picks the noisy clients,
# 1 the flipped samples and their new classes.
_STREAM = 2


def rounded_count(fraction: float, n: NDArray[np.int64] | int) -> NDArray[np.int64]:
    """``round(fraction * n)``, half to even, elementwise (the local splits' rounding)."""
    return np.round(fraction * np.asarray(n, dtype=np.float64)).astype(np.int64)


def noisy_clients(seed: int, num_clients: int, share: float) -> IntArray:
    """The ``round(share * num_clients)`` noisy clients, ascending: those with the smallest
    raw 64-bit key of the seed's client stream."""
    keys = derived_generator(seed, _STREAM, 0).bit_generator.random_raw(num_clients)
    chosen = np.argsort(keys, kind="stable")[: int(rounded_count(share, num_clients))]
    return np.sort(chosen).astype(np.int64)


def smallest_per_segment(
    keys: NDArray[np.uint64], sizes: NDArray[np.int64], counts: NDArray[np.int64]
) -> IntArray:
    """Positions, ascending, of the ``counts[s]`` smallest ``keys`` within each of the
    consecutive segments of ``sizes`` (``counts <= sizes``)."""
    segment = np.repeat(np.arange(len(sizes)), sizes)
    order = np.lexsort((keys, segment))  # by segment, then key
    rank = np.arange(len(keys)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return np.sort(order[rank < np.repeat(counts, sizes)]).astype(np.int64)


def flip_labels(
    labels: IntArray,
    splits: Sequence[dict[str, IntArray]],
    clients: IntArray,
    *,
    rate: float,
    mode: str,
    num_classes: int,
    seed: int,
) -> dict[int, LabelFlips]:
    """The flips of ``clients``: ``round(rate * n)`` samples of each of their train and
    validation splits (``n`` samples each), relabelled by ``mode``."""
    if not len(clients):
        return {}
    parts = [np.asarray(splits[c][p], np.int64) for c in clients for p in FLIPPED_SPLITS]
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    counts = rounded_count(rate, sizes)
    if counts.sum() and num_classes < 2:
        raise ParameterError(
            f"label_noise needs at least 2 classes to flip a label to another, got {num_classes}"
        )
    flat = np.concatenate([np.zeros(0, np.int64), *parts])
    stream = derived_generator(seed, _STREAM, 1).bit_generator
    # Flipped positions ascend, so they come grouped by (client, split) in order.
    flipped = flat[smallest_per_segment(stream.random_raw(len(flat)), sizes, counts)]
    true = labels[flipped]
    if mode == "symmetric":
        # One of the C - 1 other classes; the modulo of a 64-bit draw is biased by at most
        # C / 2**64, far below anything a run could show.
        raw = stream.random_raw(len(flipped)) % np.uint64(max(num_classes - 1, 1))
        offset = 1 + raw.astype(np.int64)
    else:
        offset = np.ones(len(flipped), np.int64)
    new = (true + offset) % num_classes
    per_client = counts.reshape(-1, len(FLIPPED_SPLITS)).sum(axis=1)
    out = {}
    for c, ix, lab in zip(
        clients.tolist(),
        np.split(flipped, np.cumsum(per_client)[:-1]),
        np.split(new, np.cumsum(per_client)[:-1]),
        strict=True,
    ):
        order = np.argsort(ix, kind="stable")
        out[int(c)] = LabelFlips(ix[order], lab[order])
    return out


class LabelNoise(IID):
    """Noisy clients: IID split, a share of clients with labels flipped at a rate.

    Parameters
    ----------
    share : fraction of the clients that are noisy, in [0, 1]; ``round(share * N)`` of them.
    rate : fraction of a noisy client's train and validation labels that flip, in [0, 1];
        ``round(rate * n)`` in each of the two splits.
    mode : ``"symmetric"`` (to a uniformly drawn other class) or ``"pair"`` (class ``c`` to
        ``(c + 1) mod C``).

    Examples
    --------
    >>> p = LabelNoise(share=0.5, rate=0.5).partition([0, 1, 2, 3] * 50, 4, seed=0)
    >>> p.stats()["noisy_clients"], p.stats()["noisy_flip_rate"]
    ([0, 3], 0.5)
    """

    name = "label_noise"
    #: Not one of :data:`fl_partitions.base.KINDS`: it changes no sample and no owner, only the
    #: labels of a built partition, so ``mixed`` applies it last, beside the other three.
    kind = "relabel"

    def __init__(self, *, share: float = 0.3, rate: float = 0.4, mode: str = "symmetric") -> None:
        self.share = check_float("share", share, 0.0, 1.0, note="fraction of clients")
        self.rate = check_float("rate", rate, 0.0, 1.0, note="fraction of a noisy client's labels")
        if not isinstance(mode, str) or mode not in MODES:
            raise ParameterError(f"mode must be one of {', '.join(MODES)}, got {shown(mode)}")
        self.mode = mode

    def relabel(self, labels: NDArray[Any] | Sequence[int], partition: Partition) -> Partition:
        """``partition`` (of ``labels``) with this noise's label flips."""
        flips = flip_labels(
            validate_labels(labels)[0],
            partition.splits,
            noisy_clients(partition.seed, partition.num_clients, self.share),
            rate=self.rate,
            mode=self.mode,
            num_classes=partition.num_classes,
            seed=partition.seed,
        )
        return dataclasses.replace(partition, label_flips=flips)
