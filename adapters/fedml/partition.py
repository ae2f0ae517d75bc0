"""fedbalance partitioners inside FedML's own dataset loaders (``partition_method:`` any
fedbalance partitioner name, optional ``partition_args:``; docs/hosts/fedml.md): the
``partition_data`` of FedML's CIFAR-10 (both loaders), CIFAR-100 and CINIC-10 modules, which
also serve unknown dataset names, splits with fedbalance, seeded by ``random_seed``. Feature
noise (``feature_noise``, ``mixed``) is not applied here: FedML's loaders own the transforms,
so only the label/quantity part of a spec takes effect (logged); label noise (``label_noise``)
is refused, as those loaders hand out their own labels.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

import numpy as np

from fl_adapters.autoload import Patches
from fl_adapters.registry import get_registry
from fl_checks import ParameterError

log = logging.getLogger(__name__)

FEDML_METHODS = ("homo", "hetero", "hetero-fix")
MODULES = (
    "fedml.data.cifar10.efficient_loader",
    "fedml.data.cifar10.data_loader",
    "fedml.data.cifar100.data_loader",
    "fedml.data.cinic10.data_loader",
)
CURRENT: dict[str, Any] = {}


def fedbalance_map(y_train: Any, num_clients: int, method: str, args: Any) -> dict[int, np.ndarray]:
    """The client -> indices map of fedbalance partitioner ``method`` on ``y_train``."""
    spec = {"name": method, **(getattr(args, "partition_args", None) or {})}
    part = (
        get_registry()
        .make_partitioner(spec)
        .partition(np.asarray(y_train), num_clients, seed=int(getattr(args, "random_seed", 0) or 0))
    )
    if part.label_flips:  # the setting itself, not a detail: refused rather than dropped
        raise ParameterError(
            f"partition {method!r} flips labels (label_noise), which FedML's own loaders cannot "
            "apply (they hand out their own labels): use the bundled example's data module "
            "(fedbalance run, fl_adapters/fedml/example) or a partition without label_noise"
        )
    if part.noise_std.any():
        log.warning(
            "partition %r adds feature noise; FedML's loaders own the transforms, so only "
            "its split is used",
            method,
        )
    return dict(enumerate(part.client_indices))


def _wrap_partition_data(module: Any, patches: Patches) -> None:
    original = getattr(module, "partition_data", None)
    if original is None:
        return

    @functools.wraps(original)
    def partition_data(
        dataset: Any, datadir: Any, partition: Any, n_nets: int, alpha: Any, *rest: Any
    ) -> Any:
        if partition in FEDML_METHODS or not isinstance(partition, str):
            return original(dataset, datadir, partition, n_nets, alpha, *rest)
        get_registry().partitioner(partition)  # unknown: the registry's message, listing names
        out = list(original(dataset, datadir, "homo", n_nets, alpha, *rest))
        y_train = out[1]
        net_dataidx_map = fedbalance_map(y_train, n_nets, partition, CURRENT.get("args"))
        out[4] = net_dataidx_map
        out[5] = module.record_net_data_stats(y_train, net_dataidx_map)
        return tuple(out)

    patches.set(module, "partition_data", partition_data)


def arm(patches: Patches) -> None:
    """Wrap FedML's loaders' ``partition_data`` and remember the args of ``fedml.data.load``."""
    import fedml.data

    for name in MODULES:
        try:
            _wrap_partition_data(importlib.import_module(name), patches)
        except ImportError as e:  # a loader FedML could not import (optional dependency)
            log.debug("fedbalance: FedML loader %s not patched: %s", name, e)
    original = fedml.data.load

    @functools.wraps(original)
    def load(args: Any, *a: Any, **kw: Any) -> Any:
        CURRENT["args"] = args
        try:
            return original(args, *a, **kw)
        finally:
            CURRENT.pop("args", None)

    patches.set(fedml.data, "load", load)
