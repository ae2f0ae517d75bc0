"""The partitioner interface every skew scheme implements.

A partitioner answers three questions about a labels array, each a vectorised numpy step:

* ``select`` — which samples exist at all (only resampling schemes such as
  ``global_imbalance`` drop samples; the default keeps every index);
* ``assign`` — which client holds each kept sample (an int array, one client id per sample);
* ``noise_std`` — the per-client standard deviation of the Gaussian input noise (zeros unless
  the scheme skews features).

``partition()`` runs the three steps and builds a :class:`~fl_partitions.partition.Partition`
with per-client indices, local train/validation/test splits and statistics. ``mixed``
composes the steps of several partitioners.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from fl_checks import (
    ParameterError,
    check_fractions,
    check_int_range,
    check_positive_float,
    check_positive_int,
)
from fl_partitions._alloc import OwnerArray, group_order
from fl_partitions._limits import MAX_CELLS, MAX_CLASSES, MAX_CLIENTS, MAX_TRIES
from fl_partitions._rng import SeedLike, as_generator, seed_int
from fl_partitions.partition import DEFAULT_SPLIT, SPLIT_NAMES, Partition

IntArray = NDArray[np.int64]
#: The kinds of partitioner, in the order ``partition`` applies them.
KINDS = ("resample", "split", "noise")


def validate_labels(labels: NDArray[Any] | Sequence[int]) -> tuple[IntArray, int]:
    """Return labels as a 1-d int64 array and the number of classes (max label + 1).

    Class ids must lie in ``[0, MAX_CLASSES)``: every per-class step is bounded by it.
    """
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ParameterError(f"labels must be a 1-d array of class ids, got shape {arr.shape}")
    if arr.size == 0:
        raise ParameterError("labels must not be empty")
    if not np.issubdtype(arr.dtype, np.integer) and not (
        np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0)
    ):
        raise ParameterError(f"labels must be integer class ids, got dtype {arr.dtype}")
    low, high = arr.min(), arr.max()
    if low < 0:
        raise ParameterError(f"labels must be non-negative class ids, got minimum {low}")
    if high >= MAX_CLASSES:  # checked before the cast: a float 1e300 must not wrap around
        raise ParameterError(
            f"labels must be class ids in [0, {MAX_CLASSES}) (at most {MAX_CLASSES} classes), "
            f"got a maximum of {high}"
        )
    return arr.astype(np.int64, copy=False), int(high) + 1


class Partitioner(ABC):
    """Base class of every partitioner plugin.

    Subclasses set ``name`` and ``kind`` and take only keyword arguments, stored under the
    same names (scikit-learn's ``get_params`` contract).
    """

    #: Public name, used in specs, configs and the registry.
    name: ClassVar[str]
    #: ``"split"`` decides who holds what, ``"noise"`` adds per-client input noise on an IID
    #: split, ``"resample"`` changes which samples exist before a split. ``mixed`` takes at most
    #: one component of each kind.
    kind: ClassVar[str] = "split"

    # -- parameters -----------------------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY]

    def get_params(self) -> dict[str, Any]:
        """Constructor arguments, as stored on the instance."""
        return {k: getattr(self, k) for k in self._param_names()}

    def spec(self) -> dict[str, Any]:
        """A JSON-ready spec that rebuilds this partitioner: ``{"name": ..., **params}``."""
        return {"name": self.name, **self.get_params()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # -- the three steps ------------------------------------------------------------------
    def select(self, labels: IntArray, num_classes: int, rng: np.random.Generator) -> IntArray:
        """Indices (into ``labels``) of the samples to keep; all of them by default."""
        return np.arange(len(labels), dtype=np.int64)

    @abstractmethod
    def assign(
        self, labels: IntArray, num_clients: int, num_classes: int, rng: np.random.Generator
    ) -> OwnerArray:
        """Client id of every sample in ``labels`` (``labels`` are the kept samples only).

        Any integer dtype; the built-ins use the narrowest unsigned one that holds the ids.
        """

    def noise_std(self, num_clients: int) -> NDArray[np.float64]:
        """Per-client standard deviation of Gaussian input noise (zeros: no feature skew)."""
        return np.zeros(num_clients)

    # -- the whole partition --------------------------------------------------------------
    def partition(
        self,
        labels: NDArray[Any] | Sequence[int],
        num_clients: int,
        *,
        seed: SeedLike = 0,
        split: Sequence[float] = DEFAULT_SPLIT,
        num_classes: int | None = None,
    ) -> Partition:
        """Partition ``labels`` over ``num_clients`` clients.

        Parameters
        ----------
        labels : array of int
            Class id of every sample of the dataset, in ``[0, 10000)``.
        num_clients : int
            Number of clients, in ``[1, 10000]`` and at most the number of samples;
            ``num_clients x num_classes`` at most ``10^7``.
        seed : int or numpy.random.Generator
            Every random choice derives from it: same seed, same partition.
        split : three fractions
            Each client's local train / validation / test split (default 70/10/20, the
            FedLoss thesis's setting).
        num_classes : int, optional
            Number of classes when some classes are absent from ``labels`` (at most 10000).

        Returns
        -------
        Partition
        """
        labels_arr, found_classes = validate_labels(labels)
        num_clients = check_int_range("num_clients", num_clients, 1, MAX_CLIENTS)
        if num_classes is None:
            num_classes = found_classes
        elif check_int_range("num_classes", num_classes, 1, MAX_CLASSES) < found_classes:
            raise ParameterError(
                f"num_classes must cover every label (>= {found_classes}), got {num_classes}"
            )
        if num_clients * num_classes > MAX_CELLS:
            raise ParameterError(
                f"num_clients x num_classes must be at most {MAX_CELLS:,} (the partition's "
                f"count matrix), got {num_clients} x {num_classes}; lower num_clients"
            )
        fractions = check_fractions("split", split, 3, labels=SPLIT_NAMES)
        rng = as_generator(seed)
        base_seed = int(seed) if isinstance(seed, (int, np.integer)) else seed_int(rng)

        kept = self.select(labels_arr, num_classes, rng)
        if num_clients > len(kept):
            raise ParameterError(
                f"num_clients must be at most the number of samples ({len(kept)}), got {num_clients}"
            )
        # Keeping every sample (all but resampling schemes) needs no gather through ``kept``:
        # at 10^7 samples each such gather is a quarter of a second of random reads.
        keeps_all = _is_identity(kept, len(labels_arr))
        kept_labels = labels_arr if keeps_all else labels_arr[kept]
        owner = self.assign(kept_labels, num_clients, num_classes, rng)
        # Group kept samples by client; the stable sort leaves each client's indices in
        # ascending order, a canonical form (``assign`` already chose them at random).
        order = group_order(owner, num_clients)
        flat = order if keeps_all else kept[order]
        # Class counts from the owners in sample order: a sequential pass, not a gather.
        cell = owner.astype(np.int64)
        cell *= num_classes
        cell += kept_labels
        counts = np.bincount(cell, minlength=num_clients * num_classes).reshape(
            num_clients, num_classes
        )
        del cell
        built = Partition.build(
            client_indices=np.split(flat, np.cumsum(counts.sum(axis=1))[:-1]),
            labels=labels_arr,
            num_classes=num_classes,
            seed=base_seed,
            spec=self.spec(),
            noise_std=self.noise_std(num_clients),
            split=fractions,
            class_counts=counts,
        )
        return self.relabel(labels_arr, built)

    def relabel(self, labels: NDArray[Any] | Sequence[int], partition: Partition) -> Partition:
        """The last step of :meth:`partition`: ``partition`` with label flips (``label_noise``);
        as it is for every scheme that flips none."""
        return partition


class DirichletPartitioner(Partitioner):
    """A split by Dirichlet proportions (``beta``) that redraws, at most ``max_tries`` times,
    until every client holds ``min_size`` samples."""

    def __init__(self, *, beta: float = 0.5, min_size: int = 10, max_tries: int = 100) -> None:
        self.beta = check_positive_float("beta", beta)
        self.min_size = check_positive_int("min_size", min_size, minimum=0)
        self.max_tries = check_int_range("max_tries", max_tries, 1, MAX_TRIES)

    def check_min_size(self, num_samples: int, num_clients: int) -> None:
        """A ``min_size`` no partition can meet is a :class:`ParameterError` before any draw."""
        if num_clients * self.min_size > num_samples:
            raise ParameterError(
                f"min_size={self.min_size} cannot be met: {num_clients} clients x {self.min_size} "
                f"> {num_samples} samples; lower min_size or num_clients"
            )


def _is_identity(kept: IntArray, n: int) -> bool:
    """Whether ``kept`` is ``0, 1, ..., n - 1`` (n strictly increasing ints in [0, n))."""
    return (
        len(kept) == n
        and int(kept[0]) == 0
        and int(kept[-1]) == n - 1
        and bool(np.all(kept[1:] > kept[:-1]))
    )


#: A name -> class lookup for nested specs (the plugin registry passes its own).
Lookup = Callable[[str], type[Partitioner]]
#: The built-in partitioners by name. :mod:`fl_partitions.builtin` fills it when the package is
#: imported; nested specs (``mixed``'s components, ``global_imbalance``'s ``then``) built
#: without a registry's lookup resolve here. A table filled from above, so that the
#: partitioners that nest specs never import the module that lists them.
BUILTIN_TABLE: dict[str, type[Partitioner]] = {}
#: Spec -> partitioner, as :func:`make_partitioner` with a lookup bound.
Resolve = Callable[[dict[str, Any] | str], Partitioner]


def partitioner_class(
    spec: dict[str, Any] | str, lookup: Lookup | None = None
) -> type[Partitioner]:
    """The class a spec names, without building it (so nesting can be refused first)."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ParameterError(f"a partitioner spec must be a mapping with a 'name', got {spec!r}")
    if lookup is not None:
        return lookup(spec["name"])
    name = spec["name"].lower()
    if name not in BUILTIN_TABLE:
        raise ParameterError(
            f"unknown partitioner {spec['name']!r}; available: {', '.join(sorted(BUILTIN_TABLE))}"
        )
    return BUILTIN_TABLE[name]


def make_partitioner(spec: dict[str, Any] | str, lookup: Lookup | None = None) -> Partitioner:
    """Build a partitioner from ``{"name": ..., **params}`` (or a bare name).

    ``lookup`` maps a name to a class (the plugin registry passes its own); by default only
    the built-ins are known. A partitioner that nests specs (it takes ``resolve``) resolves
    them with the same lookup. Unknown parameters are a ``ParameterError`` naming them and the
    accepted ones.
    """
    cls = partitioner_class(spec, lookup)
    if isinstance(spec, str):
        spec = {"name": spec}
    params = {k: v for k, v in spec.items() if k != "name"}
    accepted = cls._param_names()
    if "resolve" in accepted:
        params.setdefault("resolve", resolver(lookup))
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ParameterError(
            f"{cls.name}: unknown parameter(s) {', '.join(unknown)}; accepted: "
            f"{', '.join(p for p in accepted if p != 'resolve') or '(none)'}"
        )
    return cls(**params)


def resolver(lookup: Lookup | None = None) -> Resolve:
    """:func:`make_partitioner` with ``lookup`` bound (the built-ins when ``None``)."""
    return lambda spec: make_partitioner(spec, lookup)
