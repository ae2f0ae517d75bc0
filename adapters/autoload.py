"""Arms fedbalance's host adapters when FedLab or FedML is imported — no edit to host scripts.

``fedbalance_autoload.pth`` calls :func:`install` at interpreter start: a finder on
``sys.meta_path`` that, right after the import of a built-in host that arms (its spec's
``arm``: FedLab, FedML), runs the adapter's ``arm()`` through :func:`arm_host`: when the
process asked for it before the import (the spec's ``asked``: FedLab's
``FEDBALANCE_AGGREGATOR``), or always where the spec has a ``guard`` (FedML, inert unless its
config names a fedbalance aggregator). On a release outside :data:`SUPPORTED`, or any error
while arming, every patch is undone and the host runs stock; only a run that names a
fedbalance aggregator stops, with :class:`HostNotSupported` (``docs/install.md``, "Your host
stays yours"). A third-party host arms itself.

This module imports nothing heavy: it runs in every Python process of the environment.
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

from fl_adapters.collector import paused_collector
from fl_adapters.hosts import builtin_hosts

DISABLE_ENV = "FEDBALANCE_DISABLE_HOST_AUTOLOAD"
FORCE_ENV = "FEDBALANCE_FORCE_HOST"
#: top-level host package -> its spec, for the built-in hosts that arm
SPECS = {h.name: h for h in builtin_hosts() if h.arm is not None}
#: top-level host package -> module whose ``arm()`` adapts it
HOOKS = {name: h.arm for name, h in SPECS.items()}
#: host -> the releases whose internals the adapters were written against
SUPPORTED = {name: h.releases for name, h in SPECS.items()}
LABELS = {h.name: h.label for h in builtin_hosts()}
#: host -> why it runs stock in this process (set when fedbalance did not arm it)
NOT_ARMED: dict[str, str] = {}
_MISSING = object()


class HostNotSupported(RuntimeError):
    """A run names a fedbalance aggregator, but fedbalance cannot serve this host version."""


#: What a boolean environment switch reads as off (case-insensitive); anything else is on.
OFF = ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """Whether the boolean environment switch ``name`` is on (see :data:`OFF`)."""
    return os.environ.get(name, "").strip().lower() not in OFF


def disabled() -> bool:
    return env_flag(DISABLE_ENV)


def forced() -> bool:
    return env_flag(FORCE_ENV)


class Patches:
    """Attribute replacements on one host, undone together: armed completely or not at all."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, attr: str, new: Any) -> None:
        self._undo.append((owner, attr, vars(owner).get(attr, _MISSING)))
        setattr(owner, attr, new)

    def undo(self) -> None:
        while self._undo:
            owner, attr, old = self._undo.pop()
            if old is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)


#: host -> the patches its adapter made in this process
PATCHES = {host: Patches() for host in HOOKS}


def host_version(host: str, module: ModuleType) -> str | None:
    """The imported host's ``__version__`` (the distribution's metadata as a fallback)."""
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        import importlib.metadata  # only here: this module runs in every interpreter

        return importlib.metadata.version(host)
    except Exception:
        return None


def unsupported(host: str, version: str | None) -> str | None:
    """Why fedbalance will not arm ``host`` at ``version`` (``None``: it will)."""
    if version in SUPPORTED[host] or forced():
        return None
    return (
        f"found {LABELS[host]} {version or '(version unknown)'}; fedbalance's {LABELS[host]} "
        f"adapter supports {LABELS[host]} {', '.join(SUPPORTED[host])}"
    )


ADVICE = (
    f"{FORCE_ENV}=1 arms it anyway (at your risk), {DISABLE_ENV}=1 turns fedbalance's autoload off"
)


def refusal(host: str, reason: str) -> str:
    """The message that stops a run naming a fedbalance aggregator on a host it cannot serve."""
    return (
        f"this run names a fedbalance aggregator, but {reason}; fedbalance cannot serve it. "
        f"Install {LABELS[host]} {' or '.join(SUPPORTED[host])}, or {ADVICE}"
    )


def _tell_once(host: str, reason: str) -> None:
    if host in NOT_ARMED:
        return
    NOT_ARMED[host] = reason
    try:
        sys.stderr.write(
            f"fedbalance: {reason}; {LABELS[host]} runs stock in this process. {ADVICE}.\n"
        )
    except Exception:  # a closed or odd stderr must not break the host's import either
        pass


def arm_host(host: str, module: ModuleType) -> None:
    """Arm ``host``'s adapter; any failure leaves the host stock (see the module docstring)."""
    spec = SPECS[host]
    reason = unsupported(host, host_version(host, module))
    asked = spec.asked() if spec.asked is not None else None
    if asked is None and spec.guard is None:  # not asked for: nothing to arm
        if reason is not None:  # say once that nothing would be
            _tell_once(host, reason)
        return
    if reason is None:
        try:
            importlib.import_module(HOOKS[host]).arm()
            return
        except Exception as e:
            PATCHES[host].undo()
            # A process that asked for an unknown plugin or bad arguments made the user's
            # error; a host that lacks what the adapter patches (moved module, renamed
            # method) is not.
            if asked is not None and not lacks(e):
                raise
            reason = (
                f"arming fedbalance's adapter for {LABELS[host]} {host_version(host, module)} "
                f"failed ({type(e).__name__}: {e})"
            )
    if asked is not None:
        raise HostNotSupported(f"{asked}: {refusal(host, reason)}")
    _tell_once(host, reason)
    if spec.guard is not None:
        spec.guard(module, reason)


def lacks(error: BaseException) -> bool:
    """Whether ``error``, raised while arming, says the host lacks what the adapter patches
    (an import or attribute error from outside fedbalance)."""
    return isinstance(error, (ImportError, AttributeError)) and not type(
        error
    ).__module__.startswith("fl_adapters")


def require_host(host: str) -> None:
    """For a run that names a fedbalance aggregator: stop if ``host`` cannot be served here.

    Imports the host (a missing host raises its own ``ImportError``).
    """
    module = importlib.import_module(host)
    reason = NOT_ARMED.get(host) or unsupported(host, host_version(host, module))
    if reason is not None:
        raise HostNotSupported(refusal(host, reason))


class _ArmingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then arms the adapter once the package has executed."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        with paused_collector():  # importing FedML: see fl_adapters.collector
            self.loader.exec_module(module)  # the host's own errors are the host's
            arm_host(self.name, module)

    def __getattr__(self, item: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.loader, item)


class HostFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real spec of a host that arms (:data:`HOOKS`)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in HOOKS or disabled():
            return None
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _ArmingLoader(spec.loader, fullname)
                    return spec
        except Exception:  # let the import system find the host itself, stock
            return None
        return None


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (called from the ``.pth`` file)."""
    if disabled() or any(isinstance(f, HostFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, HostFinder())
