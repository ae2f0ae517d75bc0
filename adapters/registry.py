"""Name -> class registry of aggregator and partitioner plugins (pluggy + entry points).

Plugins are discovered from the ``fedbalance`` entry-point group — fedbalance's built-ins
included — so a third-party package adds an aggregator with one module and one entry-point
line. Set ``FEDBALANCE_DISABLE_PLUGIN_AUTOLOAD=1`` to load the built-ins only (as pytest's
``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), e.g. in tests or when a third-party plugin is broken.

Names are case-insensitive. An unknown name raises :class:`UnknownPluginError`, which lists
every available name and suggests the closest; a plugin that fails to import raises
:class:`PluginLoadError` naming it and its distribution, chained to the cause; two plugins
claiming one name raise :class:`DuplicatePluginError`.
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import inspect
from dataclasses import dataclass
from typing import Any

import pluggy

from fl_adapters import hookspecs
from fl_partitions.base import Partitioner
from fl_partitions.builtin import make_partitioner

GROUP = "fedbalance"
DISTRIBUTION = "fedbalance"
DISABLE_ENV = "FEDBALANCE_DISABLE_PLUGIN_AUTOLOAD"
KINDS = ("aggregators", "partitioners")


class PluginError(Exception):
    """Base class of registry errors."""


class PluginLoadError(PluginError, ImportError):
    """A plugin module that failed to import or whose hook raised."""


class DuplicatePluginError(PluginError, ValueError):
    """Two plugins registered the same name (case-insensitively)."""


class UnknownPluginError(PluginError, KeyError, ValueError):
    """No plugin of that kind has the requested name."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True)
class PluginInfo:
    """One registered class: its public name, one-line description and providing distribution."""

    name: str
    cls: type
    source: str

    @property
    def description(self) -> str:
        doc = (self.cls.__doc__ or "").strip()
        return doc.splitlines()[0].strip() if doc else ""

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "description": self.description, "source": self.source}


def _entry_points() -> list[md.EntryPoint]:
    eps = sorted(md.entry_points(group=GROUP), key=lambda ep: ep.name)
    from fl_adapters.autoload import env_flag

    if env_flag(DISABLE_ENV):
        eps = [ep for ep in eps if ep.dist is not None and ep.dist.name == DISTRIBUTION]
    return eps


class Registry:
    """Loads every plugin once and answers lookups by name."""

    def __init__(self, entry_points: list[md.EntryPoint] | None = None) -> None:
        self.plugin_manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.plugin_manager.add_hookspecs(hookspecs)
        self._tables: dict[str, dict[str, PluginInfo]] = {kind: {} for kind in KINDS}
        for ep in _entry_points() if entry_points is None else entry_points:
            self._load(ep)

    def _load(self, ep: md.EntryPoint) -> None:
        source = ep.dist.name if ep.dist is not None else "(unknown distribution)"
        try:
            module = ep.load()
        except Exception as e:
            raise PluginLoadError(
                f"fedbalance plugin {ep.name!r} from {source} failed to import "
                f"({ep.value}): {type(e).__name__}: {e}"
            ) from e
        if self.plugin_manager.is_registered(module):
            return
        self.plugin_manager.register(module, name=f"{source}:{ep.name}")
        for kind in KINDS:
            hook = getattr(module, f"fedbalance_{kind}", None)
            if hook is None:
                continue
            try:
                classes = list(hook())
            except Exception as e:
                raise PluginLoadError(
                    f"fedbalance plugin {ep.name!r} from {source}: fedbalance_{kind}() raised "
                    f"{type(e).__name__}: {e}"
                ) from e
            for cls in classes:
                self._add(kind, cls, source)

    def _add(self, kind: str, cls: type, source: str) -> None:
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise PluginError(f"{kind[:-1]} class {cls!r} from {source} has no string 'name'")
        key = name.lower()
        table = self._tables[kind]
        if key in table and table[key].cls is not cls:
            other = table[key]
            raise DuplicatePluginError(
                f"{kind[:-1]} name {name!r} is registered twice: {other.cls.__module__}."
                f"{other.cls.__qualname__} ({other.source}) and {cls.__module__}.{cls.__qualname__} "
                f"({source}); uninstall one of them or rename its plugin"
            )
        table[key] = PluginInfo(name=key, cls=cls, source=source)

    # -- lookups ----------------------------------------------------------------------------
    def infos(self, kind: str) -> list[PluginInfo]:
        """Registered plugins of ``kind`` ("aggregators" or "partitioners"), sorted by name."""
        return sorted(self._tables[kind].values(), key=lambda i: i.name)

    def names(self, kind: str) -> list[str]:
        return [i.name for i in self.infos(kind)]

    def get(self, kind: str, name: str) -> type:
        """The class registered as ``name`` (case-insensitive)."""
        if kind not in self._tables:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        table = self._tables[kind]
        key = str(name).strip().lower()
        if key in table:
            return table[key].cls
        available = sorted(table)
        close = difflib.get_close_matches(key, available, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownPluginError(
            f"unknown {kind[:-1]} {name!r} in plugin group {GROUP!r}; available: "
            f"{', '.join(available) or '(none)'}{hint}"
        )

    def aggregator(self, name: str) -> type:
        return self.get("aggregators", name)

    def partitioner(self, name: str) -> type[Partitioner]:
        return self.get("partitioners", name)

    def make_partitioner(self, spec: dict[str, Any] | str) -> Partitioner:
        """Build a partitioner (nested ``mixed`` components too) from a spec via this registry."""
        return make_partitioner(spec, self.partitioner)

    def make_aggregator(self, name: str, **kwargs: Any) -> Any:
        """Instantiate the aggregator registered as ``name`` with keyword arguments.

        An argument the aggregator does not take is a ``ValueError`` naming the allowed ones.
        """
        cls = self.aggregator(name)
        params = inspect.signature(cls).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            allowed = sorted(
                k for k, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            )
            unknown = sorted(set(kwargs) - set(allowed))
            if unknown:
                raise ValueError(
                    f"aggregator_args: unknown argument(s) {', '.join(map(repr, unknown))} for "
                    f"aggregator {name!r}; allowed: {', '.join(allowed) or '(none)'}"
                )
        return cls(**kwargs)

    def as_dict(self) -> dict[str, list[dict[str, str]]]:
        return {kind: [i.as_dict() for i in self.infos(kind)] for kind in KINDS}


_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = Registry()
    return _registry


def reset_registry() -> None:
    """Forget the loaded registry (tests that fake entry points call this)."""
    global _registry
    _registry = None
