"""The plugin registry: built-ins via entry points, third-party plugins, errors that help."""

from __future__ import annotations

import dataclasses
import email.message
import importlib.util
import json
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fl_adapters import registry as reg_mod
from fl_adapters.hookspecs import hookimpl
from fl_adapters.registry import (
    DuplicatePluginError,
    PluginError,
    PluginLoadError,
    Registry,
    UnknownPluginError,
    get_registry,
)
from fl_aggregators import FedAvg
from fl_partitions import IID, ParameterError, Partitioner, make_partitioner

BUILTIN_PARTITIONERS = {
    "iid",
    "label_dirichlet",
    "label_quantity",
    "label_noise",
    "quantity_dirichlet",
    "feature_noise",
    "global_imbalance",
    "mixed",
}


@dataclass
class FakeEntryPoint:
    """Stands in for an importlib.metadata entry point of a third-party distribution."""

    name: str
    value: str
    dist: FakeDist
    target: Any = None
    error: BaseException | None = None
    group: str = "fedbalance"

    def load(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.target

    def matches(self, **params: Any) -> bool:  # what importlib.metadata.entry_points() asks
        return all(getattr(self, k) == v for k, v in params.items())


@dataclass
class FakeDist:
    """Stands in for an installed distribution (what pluggy's entry-point loading reads)."""

    name: str
    entry_points: list[FakeEntryPoint] = field(default_factory=list)

    @property
    def metadata(self) -> email.message.Message:  # case-insensitive, as a real one's
        meta = email.message.Message()
        meta["Name"] = self.name
        return meta

    @property
    def _normalized_name(self) -> str:  # importlib.metadata de-duplicates distributions by it
        return self.name.replace("-", "_").lower()


class EveryOther(Partitioner):
    """Round-robin split: sample i goes to client i mod N."""

    name = "every_other"

    def __init__(self) -> None:
        pass

    def assign(self, labels, num_clients, num_classes, rng):  # type: ignore[no-untyped-def]
        return np.arange(len(labels)) % num_clients


def plugin_module(name: str, partitioners: list[type]) -> types.ModuleType:
    mod = types.ModuleType(name)

    @hookimpl
    def fedbalance_partitioners() -> list[type]:
        return partitioners

    mod.fedbalance_partitioners = fedbalance_partitioners  # type: ignore[attr-defined]
    return mod


def every_other_plugin() -> FakeEntryPoint:
    """The distribution ``fb-everyother``, whose plugin module contributes :class:`EveryOther`."""
    module = plugin_module("fb_everyother", [EveryOther])
    return FakeEntryPoint("everyother", "fb_everyother", FakeDist("fb-everyother"), module)


@pytest.fixture
def with_entry_points(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Install fake third-party distributions beside the real ones: each entry point's
    ``dist`` gets it (pluggy's ``load_setuptools_entrypoints`` reads distributions)."""
    import importlib.metadata

    def install(*extra: FakeEntryPoint) -> None:
        real = list(importlib.metadata.distributions())
        dists: dict[str, FakeDist] = {}
        for ep in extra:
            dists.setdefault(ep.dist.name, FakeDist(ep.dist.name)).entry_points.append(ep)
        monkeypatch.setattr(importlib.metadata, "distributions", lambda: [*real, *dists.values()])

    return install


def test_builtins_register_directly_even_without_any_installed_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain source checkout: no distribution metadata at all, the built-ins still load."""
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [])
    registry = Registry()
    infos = {i.name: i for i in registry.infos("partitioners")}
    assert BUILTIN_PARTITIONERS <= set(infos)
    assert {infos[n].source for n in BUILTIN_PARTITIONERS} == {"fedbalance"}
    assert "fedloss" in registry.names("aggregators")
    assert registry.plugin_manager.get_plugin(reg_mod.BUILTIN) is not None


@pytest.mark.parametrize(
    "name",
    ["label_dirichlet", "LABEL_DIRICHLET", " Label_Dirichlet "],
    ids=["lower", "upper", "mixed-case-padded"],
)
def test_lookup_is_case_insensitive(name: str) -> None:
    from fl_partitions import LabelDirichlet

    assert get_registry().partitioner(name) is LabelDirichlet


def test_unknown_name_lists_available_and_suggests_closest() -> None:
    with pytest.raises(UnknownPluginError) as err:
        get_registry().partitioner("label_dirichlett")
    msg = str(err.value)
    assert "unknown partitioner 'label_dirichlett'" in msg
    assert "plugin group 'fedbalance'" in msg
    for name in BUILTIN_PARTITIONERS:
        assert name in msg
    assert "did you mean 'label_dirichlet'?" in msg


def test_unknown_name_without_close_match_has_no_suggestion() -> None:
    with pytest.raises(UnknownPluginError) as err:
        get_registry().partitioner("zzzzzz")
    assert "did you mean" not in str(err.value)


def test_third_party_plugin_is_found_and_usable(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    with_entry_points(every_other_plugin())
    registry = Registry()
    info = {i.name: i for i in registry.infos("partitioners")}["every_other"]
    assert info.source == "fb-everyother"
    assert info.description == "Round-robin split: sample i goes to client i mod N."
    part = registry.make_partitioner({"name": "Every_Other"}).partition(np.zeros(10, int), 3)
    assert [ix.tolist() for ix in part.client_indices] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_third_party_component_inside_mixed(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    with_entry_points(every_other_plugin())
    part = (
        Registry()
        .make_partitioner(
            {
                "name": "mixed",
                "components": [{"name": "every_other"}, {"name": "feature_noise", "sigma": 1.0}],
            }
        )
        .partition(np.zeros(6, int), 2, seed=0)
    )
    assert [ix.tolist() for ix in part.client_indices] == [[0, 2, 4], [1, 3, 5]]
    assert part.noise_std.tolist() == [0.0, 1.0]


class Halves(EveryOther):
    """Round-robin split, registered by a hook wrapper."""

    name = "halves"


def test_hooks_are_called_through_pluggy_with_the_plugins_own_wrapper(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    """A plugin's hook wrapper runs around its hook (pluggy's call loop, not the functions
    called one by one), and what both give is attributed to the plugin's distribution."""
    module = plugin_module("fb_wrapped", [EveryOther])

    @hookimpl(wrapper=True, specname="fedbalance_partitioners")
    def add_halves() -> Any:
        found = yield
        return [*found, [Halves]]

    module.add_halves = add_halves  # type: ignore[attr-defined]
    with_entry_points(FakeEntryPoint("wrapped", "fb_wrapped", FakeDist("fb-wrapped"), module))
    infos = {i.name: i for i in Registry().infos("partitioners")}
    assert infos["halves"].source == infos["every_other"].source == "fb-wrapped"


def test_one_distribution_found_on_two_paths_is_one_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The working directory and PYTHONPATH naming one folder: Python sees the distribution
    twice, and it is still one plugin, not a name clash with itself."""
    import importlib.metadata

    real = list(importlib.metadata.distributions())
    twice = []
    for _ in range(2):
        ep = every_other_plugin()
        ep.dist.entry_points.append(ep)
        twice.append(ep.dist)
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [*real, *twice])
    assert "every_other" in Registry().names("partitioners")


def test_third_party_split_inside_global_imbalance_then(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    """``then:`` resolves through the registry that builds ``global_imbalance``, so a
    registered split scheme works there as it does inside ``mixed``."""
    with_entry_points(every_other_plugin())
    spec = {"name": "global_imbalance", "profile": "zipf", "then": {"name": "every_other"}}
    part = Registry().make_partitioner(spec).partition(np.repeat([0, 1], [6, 6]), 2, seed=0)
    owners = sorted(i for ix in part.client_indices for i in ix.tolist())
    assert len(owners) == 6 + 3  # zipf keeps 6 of class 0 and 3 of class 1
    assert [len(ix) for ix in part.client_indices] == [5, 4]  # round-robin over the 9 kept
    with pytest.raises(ParameterError, match="unknown partitioner 'every_other'"):
        make_partitioner(spec)  # the built-ins alone do not know it


def test_plugin_that_fails_to_import_is_named_with_its_cause(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    cause = ModuleNotFoundError("No module named 'missing_dep'")
    with_entry_points(
        FakeEntryPoint("broken", "fb_broken.plugin", FakeDist("fb-broken"), error=cause)
    )
    with pytest.raises(PluginLoadError) as err:
        Registry()
    msg = str(err.value)
    assert "'broken'" in msg and "fb-broken" in msg and "fb_broken.plugin" in msg
    assert "No module named 'missing_dep'" in msg
    assert err.value.__cause__ is cause


def test_hook_that_raises_is_named(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    mod = types.ModuleType("fb_raises")

    @hookimpl
    def fedbalance_partitioners() -> list[type]:
        raise RuntimeError("boom")

    mod.fedbalance_partitioners = fedbalance_partitioners  # type: ignore[attr-defined]
    with_entry_points(FakeEntryPoint("raises", "fb_raises", FakeDist("fb-raises"), target=mod))
    with pytest.raises(
        PluginLoadError,
        match=r"'raises' from fb-raises: fedbalance_partitioners\(\) raised RuntimeError: boom",
    ):
        Registry()


def test_duplicate_names_are_rejected_loudly(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    class FakeIID(IID):
        """Another 'IID'."""

        name = "IID"

    with_entry_points(
        FakeEntryPoint(
            "dup", "fb_dup", FakeDist("fb-dup"), target=plugin_module("fb_dup", [FakeIID])
        )
    )
    with pytest.raises(DuplicatePluginError) as err:
        Registry()
    msg = str(err.value)
    assert "'IID' is registered twice" in msg and "(fedbalance)" in msg and "(fb-dup)" in msg


def test_disable_autoload_loads_builtins_only(with_entry_points, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cause = ImportError("would break")
    with_entry_points(
        FakeEntryPoint("broken", "fb_broken", FakeDist("fb-broken"), error=cause),
        every_other_plugin(),
    )
    monkeypatch.setenv("FEDBALANCE_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = set(Registry().names("partitioners"))
    assert names == BUILTIN_PARTITIONERS


def test_list_json_shape(with_entry_points, capsys) -> None:  # type: ignore[no-untyped-def]
    from fl_adapters.cli import main

    with_entry_points(every_other_plugin())
    assert main(["list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"aggregators", "partitioners", "hosts"}
    for entry in doc["partitioners"]:
        assert set(entry) == {"name", "description", "source"} and entry["description"]
    assert {
        "name": "every_other",
        "description": EveryOther.__doc__,
        "source": "fb-everyother",
    } in doc["partitioners"]


def test_list_from_the_installed_console_script() -> None:
    exe = subprocess.run(
        [sys.executable, "-m", "fl_adapters.cli", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for name in BUILTIN_PARTITIONERS:
        assert name in exe.stdout
    assert "[fedbalance]" in exe.stdout


EXAMPLE = Path(__file__).parent / "plugins" / "example_plugin.py"


def _module(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_plugin_example_is_this_tested_plugin(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    """The plugin page includes ``tests/plugins/example_plugin.py`` itself; installed under an
    entry point it adds an aggregator and a partitioner that work."""
    from fl_aggregators import ClientUpdate

    page = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    assert '--8<-- "tests/plugins/example_plugin.py"' in page
    plugin = _module(EXAMPLE, "fb_example")
    with_entry_points(FakeEntryPoint("example", "fb_example", FakeDist("fb-example"), plugin))
    registry = Registry()
    assert {i.name: i.source for i in registry.infos("aggregators")}["equal_weights"] == (
        "fb-example"
    )
    agg = registry.make_aggregator("equal_weights")
    updates = [ClientUpdate(params=torch.full((2,), float(v)), num_samples=n) for v, n in
               ((0, 1), (3, 100))]  # fmt: skip
    result = agg.aggregate(torch.zeros(2), updates)
    assert result.weights == pytest.approx([0.5, 0.5])
    assert result.params.tolist() == pytest.approx([1.5, 1.5])  # not 100/101 of the way to 3
    part = registry.make_partitioner({"name": "round_robin"}).partition(np.zeros(6, int), 3)
    assert [ix.tolist() for ix in part.client_indices] == [[0, 3], [1, 4], [2, 5]]


def test_a_misspelt_hook_is_an_error_naming_it(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    mod = types.ModuleType("fb_typo")

    @hookimpl
    def fedbalance_aggregator() -> list[type]:  # no "s": not a fedbalance hook
        return []

    mod.fedbalance_aggregator = fedbalance_aggregator  # type: ignore[attr-defined]
    with_entry_points(FakeEntryPoint("typo", "fb_typo", FakeDist("fb-typo"), target=mod))
    with pytest.raises(PluginError) as err:
        Registry()
    msg = str(err.value)
    assert "plugin 'typo' from fb-typo implements 'fedbalance_aggregator'" in msg
    assert "did you mean 'fedbalance_aggregators'?" in msg


def test_a_hook_without_hookimpl_is_an_error_not_ignored(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    mod = types.ModuleType("fb_unmarked")
    mod.fedbalance_partitioners = lambda: [EveryOther]  # type: ignore[attr-defined]
    with_entry_points(FakeEntryPoint("unmarked", "fb_unmarked", FakeDist("fb-unmarked"), mod))
    with pytest.raises(PluginError, match=r"fedbalance_partitioners\(\) is not marked @hookimpl"):
        Registry()


def test_two_distributions_claiming_one_plugin_name_are_named(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    with_entry_points(
        FakeEntryPoint("same", "fb_a", FakeDist("fb-a"), plugin_module("fb_a", [EveryOther])),
        FakeEntryPoint("same", "fb_b", FakeDist("fb-b"), plugin_module("fb_b", [])),
    )
    with pytest.raises(DuplicatePluginError, match="'same' is claimed by fb-a .* and fb-b"):
        Registry()


class Picky(FedAvg):
    """Refuses its parameter with a plain ValueError, as a third-party plugin may."""

    name = "picky"

    def __init__(self, *, level: int = 1) -> None:
        if level > 3:
            raise ValueError(f"level must be at most 3, got {level}")
        super().__init__()


def test_a_plugins_own_refusal_becomes_a_parameter_error_naming_it(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    from fl_partitions import ParameterError

    mod = types.ModuleType("fb_picky")

    @hookimpl
    def fedbalance_aggregators() -> list[type]:
        return [Picky]

    mod.fedbalance_aggregators = fedbalance_aggregators  # type: ignore[attr-defined]
    with_entry_points(FakeEntryPoint("picky", "fb_picky", FakeDist("fb-picky"), target=mod))
    registry = Registry()
    assert registry.make_aggregator("picky", level=2).name == "picky"
    with pytest.raises(ParameterError, match="aggregator 'picky' from fb-picky refused") as info:
        registry.make_aggregator("picky", level=9)
    assert "level must be at most 3, got 9" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)  # the plugin's own error, chained


TOY_HOST = Path(__file__).parent / "plugins" / "toy_host.py"


def test_a_fourth_host_is_one_module_and_one_entry_point(
    with_entry_points, tmp_path, capsys
) -> None:  # type: ignore[no-untyped-def]
    """``tests/plugins/toy_host.py`` registers a host spec through ``fedbalance_hosts``: the
    config accepts its framework, ``fedbalance run`` runs it, ``fedbalance list`` names it."""
    from fl_adapters.cli import main

    plugin = _module(TOY_HOST, "fb_toy")
    with_entry_points(FakeEntryPoint("toy", "fb_toy", FakeDist("fb-toy"), plugin))
    config = tmp_path / "toy.yaml"
    config.write_text(
        "framework: toy\ndataset: digits\naggregator: fedloss\nnum_clients: 6\n"
        "clients_per_round: 3\nrounds: 4\nseed: 1\n"
    )
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert all(len(r["clients"]) == 3 and sum(r["weights"]) == pytest.approx(1) for r in rows)
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]  # it converges
    capsys.readouterr()
    assert main(["list", "--json"]) == 0
    hosts = {h["name"]: h["source"] for h in json.loads(capsys.readouterr().out)["hosts"]}
    assert hosts == {"fedlab": "fedbalance", "fedml": "fedbalance", "flower": "fedbalance",
                     "toy": "fb-toy"}  # fmt: skip
    config.write_text("framework: toyy\n")
    assert main(["run", str(config), "--check"]) == 2
    assert "framework must be one of" in capsys.readouterr().err  # toy among them


def test_two_hosts_serving_one_framework_are_named(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    from fl_adapters.fedlab.spec import FEDLAB

    mod = types.ModuleType("fb_clash")

    @hookimpl
    def fedbalance_hosts() -> list[Any]:
        return [dataclasses.replace(FEDLAB, name="fedlab2", arm=None, asked=None, commands=None)]

    mod.fedbalance_hosts = fedbalance_hosts  # type: ignore[attr-defined]
    with_entry_points(FakeEntryPoint("clash", "fb_clash", FakeDist("fb-clash"), mod))
    with pytest.raises(DuplicatePluginError, match="framework 'fedlab' is served by host 'fedlab'"):
        Registry()


def test_a_host_named_like_a_builtin_is_named_with_both(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    from fl_adapters.fedlab.spec import FEDLAB

    mod = types.ModuleType("fb_twin")

    @hookimpl
    def fedbalance_hosts() -> list[Any]:
        return [dataclasses.replace(FEDLAB, frameworks=("fedlab-twin",))]

    mod.fedbalance_hosts = fedbalance_hosts  # type: ignore[attr-defined]
    with_entry_points(FakeEntryPoint("twin", "fb_twin", FakeDist("fb-twin"), mod))
    with pytest.raises(DuplicatePluginError, match="host name 'fedlab' is registered twice"):
        Registry()


def test_a_plugin_that_exits_on_import_is_named_instead_of_ending_the_process(
    with_entry_points,  # type: ignore[no-untyped-def]
) -> None:
    with_entry_points(
        FakeEntryPoint("quits", "fb_quits", FakeDist("fb-quits"), error=SystemExit(3))
    )
    with pytest.raises(PluginLoadError) as err:
        Registry()
    assert str(err.value) == (
        "fedbalance plugin 'quits' from fb-quits failed to import (fb_quits): called sys.exit(3)"
    )


@pytest.mark.parametrize(
    ("kind", "returned", "words"),
    [
        ("aggregators", FedAvg(), "returned FedAvg(update_clip=None, sample_clip=20.0), which is"),
        ("aggregators", IID, "not a subclass of fl_aggregators.Aggregator"),
        ("partitioners", FedAvg, "not a subclass of fl_partitions.Partitioner"),
        ("partitioners", "iid", "returned 'iid', which is not a subclass"),
    ],
    ids=["instance", "partitioner-as-aggregator", "aggregator-as-partitioner", "string"],
)
def test_a_hook_returning_what_it_does_not_promise_is_refused_by_name(
    with_entry_points,  # type: ignore[no-untyped-def]
    kind: str,
    returned: Any,
    words: str,
) -> None:
    mod = types.ModuleType("fb_liar")

    @hookimpl
    def hook() -> list[Any]:
        return [returned]

    setattr(mod, f"fedbalance_{kind}", hook)
    with_entry_points(FakeEntryPoint("liar", "fb_liar", FakeDist("fb-liar"), target=mod))
    with pytest.raises(PluginError) as err:
        Registry()
    assert f"fedbalance plugin 'liar' from fb-liar: fedbalance_{kind}() returned" in str(err.value)
    assert words in str(err.value)


def test_a_plugin_host_that_sets_what_only_built_in_hosts_use_is_refused(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    """Arming and subcommands are read before plugins load: a plugin host setting them would
    be silently ignored, so the registry refuses it, naming the fields."""
    from fl_adapters.fedlab.spec import FEDLAB

    mod = types.ModuleType("fb_armed")

    @hookimpl
    def fedbalance_hosts() -> list[Any]:
        return [dataclasses.replace(FEDLAB, name="armed", frameworks=("armed",))]

    mod.fedbalance_hosts = fedbalance_hosts  # type: ignore[attr-defined]
    with_entry_points(FakeEntryPoint("armed", "fb_armed", FakeDist("fb-armed"), target=mod))
    with pytest.raises(PluginError, match="host 'armed' of fb-armed sets arm, asked, commands"):
        Registry()
