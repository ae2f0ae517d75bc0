"""Arms fedbalance's host adapters when FedLab or FedML is imported — no edit to host scripts.

fedbalance installs ``fedbalance_autoload.pth`` into site-packages; at interpreter start it
calls :func:`install`, which puts a tiny finder on ``sys.meta_path``. The finder does nothing
until a top-level ``fedlab`` or ``fedml`` import, then runs the adapter's ``arm()`` right after
that package's ``__init__``:

* FedLab: armed only when ``FEDBALANCE_AGGREGATOR`` is set (see
  :mod:`fl_adapters.fedlab.autoload`); inert otherwise.
* FedML: armed on every import, but inert unless the host's config names a fedbalance
  aggregator (see :mod:`fl_adapters.fedml.adapter`).

Turn it off with ``FEDBALANCE_DISABLE_HOST_AUTOLOAD=1``. This module imports nothing heavy:
it runs in every Python process of the environment.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

DISABLE_ENV = "FEDBALANCE_DISABLE_HOST_AUTOLOAD"
#: top-level host package -> module whose ``arm()`` adapts it
HOOKS = {"fedlab": "fl_adapters.fedlab.autoload", "fedml": "fl_adapters.fedml.adapter"}


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip() not in ("", "0")


class _ArmingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then arms the adapter once the package has executed."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        importlib.import_module(HOOKS[self.name]).arm()

    def __getattr__(self, item: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.loader, item)


class HostFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real spec of ``fedlab`` / ``fedml`` to arm them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in HOOKS or disabled():
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ArmingLoader(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (called from the ``.pth`` file)."""
    if disabled() or any(isinstance(f, HostFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, HostFinder())
