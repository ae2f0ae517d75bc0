"""fedbalance inside an unmodified FedML 0.9.6: each mode's module (:mod:`.sp`, :mod:`.mpi`,
:mod:`.cross_silo`, with :mod:`.distributed` shared by the last two) lists in ``TARGETS`` the
methods it wraps. Each wrapper takes fedbalance's path only when ``self.args`` names a
fedbalance aggregator (:func:`~fl_adapters.fedml.adapter.state_for`); ``fedml.init`` checks
what the config alone decides before FedML's own init runs, and ``fedml.init`` and
``FedMLRunner`` check the rest before any training (:func:`~.adapter.validate`).
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

from fl_adapters.autoload import PATCHES
from fl_adapters.fedml.adapter import check_before_init, state_for, validate


def _wrapper(original: Any, host: str, replacement: Any) -> Any:
    """``original`` unless ``self.args`` names a fedbalance aggregator, then ``replacement``."""

    @functools.wraps(original)
    def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
        if state_for(self.args, host) is None:
            return original(self, *a, **kw)
        return replacement(self, original, *a, **kw)

    return wrapper


def arm() -> None:
    """Wrap FedML's aggregation points and client training (called right after ``import fedml``).

    Every target is looked up before the first patch, so a FedML whose modules or methods have
    moved raises here with nothing patched (the autoload then leaves FedML stock).
    """
    import fedml
    from fedml.runner import FedMLRunner

    from fl_adapters.fedml import partition
    from fl_adapters.fedml.patches import cross_silo, mpi, sp
    from fl_adapters.fedml.secure import check_initial_model

    if getattr(fedml.init, "_fedbalance", False):
        return
    wrapped = []
    for mode in (sp, mpi, cross_silo):
        for module, cls_name, method, replacement in mode.TARGETS:
            cls = getattr(importlib.import_module(module), cls_name)
            wrapped.append((cls, method, _wrapper(getattr(cls, method), mode.HOST, replacement)))
    original_init = fedml.init
    original_runner = FedMLRunner.__init__
    load_arguments = fedml.load_arguments  # what FedML's init calls when given no args

    @functools.wraps(original_init)
    def init(args: Any = None, *a: Any, **kw: Any) -> Any:
        if args is None:  # FedML's own first step, taken here so the config is checked first
            args = load_arguments(fedml._global_training_type, fedml._global_comm_backend)
        if hasattr(args, "training_type") and hasattr(args, "backend"):
            check_before_init(args)  # before FedML sets up the process and asks its MLOps server
        args = original_init(args, *a, **kw)
        # FedML's init makes a logger of its own (its format, its handlers) the module's
        # logging.root; loggers made before it still hand their records to the old root, which
        # has no handler, so fedbalance's INFO lines (what it armed, each sampled evaluation)
        # never showed in a FedML run.
        for name in ("fl_adapters", "fl_aggregators", "fl_partitions"):
            logging.getLogger(name).parent = logging.root
        validate(args)
        return args

    @functools.wraps(original_runner)
    def runner_init(self: Any, args: Any, *a: Any, **kw: Any) -> None:
        validate(args)  # before FedML's __init__: the MPI modes train inside it
        # FedMLRunner(args, device, dataset, model, ...): LightSecAgg's field and the model.
        check_initial_model(args, a[2] if len(a) > 2 else kw.get("model"))
        original_runner(self, args, *a, **kw)

    init._fedbalance = True  # type: ignore[attr-defined]
    patches = PATCHES["fedml"]
    for cls, method, wrapper in wrapped:
        patches.set(cls, method, wrapper)
    partition.arm(patches)
    patches.set(fedml, "init", init)
    patches.set(FedMLRunner, "__init__", runner_init)
