"""Imports made with Python's cyclic garbage collector paused, and what they leave frozen.

A fresh process that imports torch, FedML or Flower builds 10^5 to 10^6 objects that live as
long as it does. While they import, the collector walks them again each time the heap has grown
by a quarter, and once more at exit: a third of the CPU of ``import fedml`` in a fresh process
(``fedbalance bench host-import``). Inside :func:`paused_collector` the collector is off; at
the end the imports' cyclic garbage is collected once and what survives is frozen
(``gc.freeze``), so no later collection, the one at exit included, walks it again.

It wraps what a fresh process imports before a little work: the hosts' packages in the import
hook (:mod:`fl_adapters.autoload`); the FedLab and FedML runners that ``fedbalance run`` and
FedLab's server and client processes import (the hosts' specs); and the ClientApp and ServerApp
of fedbalance's Flower app, which Flower starts in a process of their own for every message. A
process that turned its collector off keeps it off; ``FEDBALANCE_FREEZE_IMPORTS=0`` leaves the
collector alone.

Imports nothing heavy: the import hook runs it in every Python process of the environment.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "FEDBALANCE_FREEZE_IMPORTS"
#: What :data:`ENV` reads as off (case-insensitive); unset or anything else is on.
OFF = ("0", "false", "no", "off")


@contextmanager
def paused_collector() -> Iterator[None]:
    """Run the block's imports with the collector off, then collect once and freeze."""
    if not gc.isenabled() or os.environ.get(ENV, "").strip().lower() in OFF:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()
