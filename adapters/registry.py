"""Name -> class registry of aggregator and partitioner plugins, on pluggy.

fedbalance's built-ins (:mod:`fl_adapters.builtin`) are registered directly, so they work
from a plain source checkout; third-party plugins come from the ``fedbalance`` entry-point
group through pluggy's ``load_setuptools_entrypoints``, so a package adds an aggregator with
one module and one entry-point line. Set ``FEDBALANCE_DISABLE_PLUGIN_AUTOLOAD=1`` to load the
built-ins only (as pytest's ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), e.g. when a plugin is broken.

Every plugin is checked before it is used: ``check_pending()`` makes a misspelt hook
(``fedbalance_aggregator``) an error naming it, and a ``fedbalance_*`` function without
``@hookimpl`` is an error too (pluggy would ignore it). The classes come from pluggy's own
hook calls, one per plugin (:meth:`Registry._collect` says why), and each plugin's distribution
from pluggy's record of what it loaded (``list_plugin_distinfo``).

Names are case-insensitive. An unknown name raises :class:`UnknownPluginError`, which lists
every available name and suggests the closest; a plugin that fails to import or whose hook
raises is a :class:`PluginLoadError` naming it and its distribution, chained to the cause; two
plugins claiming one name raise :class:`DuplicatePluginError`.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.metadata as md
import inspect
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pluggy

from fl_adapters import builtin, hookspecs
from fl_adapters.autoload import env_flag
from fl_adapters.hosts import HostSpec, builtin_hosts
from fl_checks import FedbalanceError, ParameterError
from fl_partitions.base import Partitioner
from fl_partitions.builtin import make_partitioner

#: The host spec fields read for the built-in hosts only, before any plugin is loaded.
BUILTIN_ONLY = ("arm", "asked", "guard", "commands")
GROUP = "fedbalance"
DISTRIBUTION = "fedbalance"
DISABLE_ENV = "FEDBALANCE_DISABLE_PLUGIN_AUTOLOAD"
KINDS = ("aggregators", "partitioners", "hosts")
#: The built-ins' plugin name (an entry-point name holds no ":", so no plugin can take it).
BUILTIN = "fedbalance:builtin"
HOOKS = tuple(f"fedbalance_{kind}" for kind in KINDS)


class PluginError(FedbalanceError):
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
        own = getattr(self.cls, "description", None)  # a host spec says it itself
        if isinstance(own, str) and own:
            return own
        doc = (self.cls.__doc__ or "").strip()
        return doc.splitlines()[0].strip() if doc else ""

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "description": self.description, "source": self.source}


def _entry_points() -> list[tuple[str, Any]]:
    """``(distribution, entry point)`` of every third-party plugin, by entry-point name."""
    found = []
    seen: set[str] = set()
    for dist in md.distributions():
        name = getattr(dist, "name", None) or dist.metadata["Name"]
        if name == DISTRIBUTION:  # the built-ins are registered directly
            continue
        # One distribution found on two sys.path entries (the working directory and
        # PYTHONPATH naming the same folder) is one plugin: the first is the one Python imports.
        key = re.sub(r"[-_.]+", "-", name).lower()  # PEP 503's normalised name
        if key in seen:
            continue
        seen.add(key)
        found += [(name, ep) for ep in dist.entry_points if ep.group == GROUP]
    found.sort(key=lambda item: item[1].name)
    for (d1, ep1), (d2, ep2) in zip(found, found[1:], strict=False):
        if ep1.name == ep2.name:  # pluggy would load the first and skip the other unsaid
            raise DuplicatePluginError(
                f"fedbalance plugin name {ep1.name!r} is claimed by {d1} ({ep1.value}) and "
                f"{d2} ({ep2.value}); uninstall one of them"
            )
    return found


def _raised(e: BaseException) -> str:
    """An exception as a message names it (``sys.exit(3)`` for a ``SystemExit``)."""
    if isinstance(e, SystemExit):
        return f"called sys.exit({e.code!r})"
    return f"{type(e).__name__}: {e}"


def _where(plugin: Any) -> str:
    """Where a registered class (or a host spec, an object) was defined."""
    if isinstance(plugin, type):
        return f"{plugin.__module__}.{plugin.__qualname__}"
    return f"{type(plugin).__name__} {getattr(plugin, 'name', '?')!r}"


class Registry:
    """Loads every plugin once and answers lookups by name."""

    def __init__(self, autoload: bool | None = None) -> None:
        self.plugin_manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.plugin_manager.add_hookspecs(hookspecs)
        self.plugin_manager.register(builtin, name=BUILTIN)
        if autoload if autoload is not None else not env_flag(DISABLE_ENV):
            for dist, ep in _entry_points():
                self._load(dist, ep)
        pm = self.plugin_manager
        self._sources = {BUILTIN: DISTRIBUTION} | {
            str(pm.get_name(plugin)): dist.project_name
            for plugin, dist in pm.list_plugin_distinfo()
        }
        self._check()
        self._tables: dict[str, dict[str, PluginInfo]] = {kind: {} for kind in KINDS}
        for kind in KINDS:
            self._collect(kind)

    def _load(self, dist: str, ep: Any) -> None:
        """Entry point ``ep`` of ``dist`` through pluggy, an import error naming both."""
        try:
            self.plugin_manager.load_setuptools_entrypoints(GROUP, name=ep.name)
        except (Exception, SystemExit) as e:  # sys.exit() in a plugin must not end its host
            raise PluginLoadError(
                f"fedbalance plugin {ep.name!r} from {dist} failed to import "
                f"({ep.value}): {_raised(e)}"
            ) from e
        plugin = self.plugin_manager.get_plugin(ep.name)
        for attr in dir(plugin):
            value = getattr(plugin, attr, None)
            if attr.startswith("fedbalance_") and callable(value):
                if self.plugin_manager.parse_hookimpl_opts(plugin, attr) is None:
                    raise PluginError(
                        f"fedbalance plugin {ep.name!r} from {dist}: {attr}() is not marked "
                        "@hookimpl (from fl_adapters.hookspecs import hookimpl), so it would "
                        "never be called"
                    )

    def _check(self) -> None:
        """``check_pending()``: a hook no spec declares (a misspelling) is an error naming it."""
        try:
            self.plugin_manager.check_pending()
        except pluggy.PluginValidationError as e:
            name = self.plugin_manager.get_name(e.plugin) or repr(e.plugin)
            unknown = [
                hook
                for hook, caller in vars(self.plugin_manager.hook).items()
                if not caller.has_spec()
                and any(i.plugin is e.plugin for i in caller.get_hookimpls())
            ]
            close = difflib.get_close_matches(unknown[0], HOOKS, n=1) if unknown else []
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise PluginError(
                f"fedbalance plugin {name!r} from {self._sources.get(name, '?')} implements "
                f"{', '.join(map(repr, unknown))}, which is not a fedbalance hook; "
                f"{hint}the hooks are {', '.join(HOOKS)}"
            ) from e

    def _collect(self, kind: str) -> None:
        """Call ``fedbalance_<kind>`` through pluggy and add the classes it returns.

        One call per plugin (``subset_hook_caller``: pluggy's own call loop, with its tracing,
        monitoring and the plugin's own hook wrappers), not one ``pm.hook.fedbalance_<kind>()``
        for all: that call returns the lists without saying which plugin gave which (and drops
        a ``None``), so neither a class's distribution nor a hook that raised could be named.
        """
        pm = self.plugin_manager
        name = f"fedbalance_{kind}"
        impls = getattr(pm.hook, name).get_hookimpls()
        plugins = {impl.plugin_name: impl.plugin for impl in impls}
        for plugin_name in plugins:
            source = self._sources.get(plugin_name, "(unknown distribution)")
            others = [p for n, p in plugins.items() if n != plugin_name]
            try:
                classes = [c for result in pm.subset_hook_caller(name, others)() for c in result]
            except (Exception, SystemExit) as e:
                raise PluginLoadError(
                    f"fedbalance plugin {plugin_name!r} from {source}: {name}() raised {_raised(e)}"
                ) from e
            for cls in classes:
                self._check_kind(kind, cls, plugin_name, source)
                self._add(kind, cls, source)

    @staticmethod
    def _check_kind(kind: str, cls: Any, plugin: str, source: str) -> None:
        """What a discovery hook returns is what it promises: an ``Aggregator`` or
        ``Partitioner`` subclass (hosts are checked by :meth:`_check_host`), refused here by
        name rather than failing mid-run."""
        from fl_aggregators import Aggregator

        base = {"aggregators": Aggregator, "partitioners": Partitioner}.get(kind)
        if base is not None and not (isinstance(cls, type) and issubclass(cls, base)):
            raise PluginError(
                f"fedbalance plugin {plugin!r} from {source}: fedbalance_{kind}() returned "
                f"{cls!r}, which is not a subclass of {base.__module__.split('.')[0]}."
                f"{base.__name__}"
            )

    def _add(self, kind: str, cls: type, source: str) -> None:
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise PluginError(f"{kind[:-1]} class {cls!r} from {source} has no string 'name'")
        key = name.lower()
        table = self._tables[kind]
        if key in table and table[key].cls is not cls:
            other = table[key]
            raise DuplicatePluginError(
                f"{kind[:-1]} name {name!r} is registered twice: {_where(other.cls)} "
                f"({other.source}) and {_where(cls)} ({source}); uninstall one of them or rename "
                "its plugin"
            )
        if kind == "hosts":
            self._check_host(cls, source)
        table[key] = PluginInfo(name=key, cls=cls, source=source)

    def _check_host(self, spec: Any, source: str) -> None:
        """A host is a :class:`HostSpec` whose ``framework`` values no other host serves; a
        plugin's sets none of the fields read before plugins load (:data:`BUILTIN_ONLY`)."""
        if not isinstance(spec, HostSpec):
            raise PluginError(
                f"fedbalance_hosts() of {source} returned {spec!r}, not a fl_adapters.hosts.HostSpec"
            )
        builtin_only = [f for f in BUILTIN_ONLY if getattr(spec, f) is not None]
        if builtin_only and spec not in builtin_hosts():
            raise PluginError(
                f"host {spec.name!r} of {source} sets {', '.join(builtin_only)}, which fedbalance "
                "reads for its built-in hosts only (at interpreter start and to build its command "
                "line, before any plugin is loaded): a plugin host arms itself when its package "
                "is imported and runs through `fedbalance run`; leave them unset"
            )
        for other in self._tables["hosts"].values():
            shared = sorted(set(spec.frameworks) & set(cast(HostSpec, other.cls).frameworks))
            if shared:
                raise DuplicatePluginError(
                    f"framework {shared[0]!r} is served by host {other.name!r} ({other.source}) "
                    f"and host {spec.name!r} ({source}); uninstall one of them"
                )

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

    def hosts(self) -> list[HostSpec]:
        """Every registered host spec, sorted by name."""
        return [cast(HostSpec, info.cls) for info in self.infos("hosts")]

    def host_for(self, framework: str) -> HostSpec:
        """The host spec that serves run config ``framework`` value."""
        for spec in self.hosts():
            if framework in spec.frameworks:
                return spec
        raise ParameterError(
            f"framework must be one of {', '.join(self.frameworks())}, got {framework!r}"
        )

    def frameworks(self) -> list[str]:
        """Every ``framework`` value some registered host serves."""
        return [f for spec in self.hosts() for f in spec.frameworks]

    def make_partitioner(self, spec: dict[str, Any] | str) -> Partitioner:
        """Build a partitioner (nested ``mixed`` components too) from a spec via this registry."""
        name = spec.get("name") if isinstance(spec, dict) else spec
        with self._plugin_parameters("partitioners", name):
            return make_partitioner(spec, self.partitioner)

    def make_aggregator(self, name: str, **kwargs: Any) -> Any:
        """Instantiate the aggregator registered as ``name`` with keyword arguments.

        An argument the aggregator does not take is a ``ParameterError`` naming the allowed ones.
        :data:`STOP_AFTER_KEY` is taken for every aggregator: the run's limit on skipped rounds
        in a row (:meth:`~fl_aggregators.Aggregator.stop_after_skipped`).
        """
        stop_after = kwargs.pop(STOP_AFTER_KEY, None)
        cls = self.aggregator(name)
        params = inspect.signature(cls).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            allowed = sorted(
                k for k, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            )
            unknown = sorted(set(kwargs) - set(allowed))
            if unknown:
                raise ParameterError(
                    f"aggregator_args: unknown argument(s) {', '.join(map(repr, unknown))} for "
                    f"aggregator {name!r}; allowed: {', '.join(allowed) or '(none)'} (and "
                    f"{STOP_AFTER_KEY}, the run's, for every aggregator)"
                )
        with self._plugin_parameters("aggregators", name):
            agg = cls(**kwargs)
        if stop_after is not None:
            agg.stop_after_skipped(stop_after)
        return agg

    @contextlib.contextmanager
    def _plugin_parameters(self, kind: str, name: Any) -> Iterator[None]:
        """A third-party plugin that refuses its parameters with a plain ``ValueError`` or
        ``TypeError`` gets a :class:`ParameterError` naming it and its distribution (the
        original is chained); a built-in raises ``ParameterError`` itself, so anything else
        from one is a bug and keeps its traceback."""
        try:
            yield
        except (TypeError, ValueError) as e:
            info = self._tables[kind].get(str(name).strip().lower())
            if isinstance(e, FedbalanceError) or info is None or info.source == DISTRIBUTION:
                raise
            raise ParameterError(
                f"{kind[:-1]} {info.name!r} from {info.source} refused its parameters: {e}"
            ) from e

    def as_dict(self) -> dict[str, list[dict[str, str]]]:
        return {kind: [i.as_dict() for i in self.infos(kind)] for kind in KINDS}


#: The aggregator argument every aggregator takes: skipped rounds in a row before the run stops.
STOP_AFTER_KEY = "max_skipped_rounds"


def build_aggregator(aggregator: Any, args: Mapping[str, Any] | None = None) -> Any:
    """The one way every host gets its aggregator: an ``Aggregator`` instance as given, or
    the plugin registered as ``aggregator`` built with ``args`` (an unknown name is an
    :class:`UnknownPluginError`, a refused argument a ``ParameterError``).

    ``max_skipped_rounds`` in ``args`` is the run's, for any aggregator: the skipped rounds in
    a row after which the run stops (:class:`~fl_aggregators.NothingAggregated`)."""
    from fl_aggregators import Aggregator

    if isinstance(aggregator, Aggregator):
        return aggregator
    return get_registry().make_aggregator(aggregator, **dict(args or {}))


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
