"""The plugin registry: built-ins via entry points, third-party plugins, errors that help."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from fl_adapters import registry as reg_mod
from fl_adapters.hookspecs import hookimpl
from fl_adapters.registry import (
    DuplicatePluginError,
    PluginLoadError,
    Registry,
    UnknownPluginError,
    get_registry,
)
from fl_partitions import IID, Partitioner

BUILTIN_PARTITIONERS = {
    "iid",
    "label_dirichlet",
    "label_quantity",
    "quantity_dirichlet",
    "feature_noise",
    "global_imbalance",
    "mixed",
}


@dataclass
class FakeDist:
    name: str


@dataclass
class FakeEntryPoint:
    """Stands in for an importlib.metadata entry point of a third-party distribution."""

    name: str
    value: str
    dist: FakeDist
    target: Any = None
    error: BaseException | None = None

    def load(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.target


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


@pytest.fixture
def with_entry_points(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Add fake third-party entry points beside the real (installed) ones."""

    def install(*extra: FakeEntryPoint) -> None:
        real = list(reg_mod.md.entry_points(group=reg_mod.GROUP))
        monkeypatch.setattr(
            reg_mod.md,
            "entry_points",
            lambda group=None: [*real, *extra] if group == reg_mod.GROUP else [],
        )

    return install


def test_builtins_register_through_the_entry_point_group() -> None:
    infos = {i.name: i for i in get_registry().infos("partitioners")}
    assert BUILTIN_PARTITIONERS <= set(infos)
    assert {infos[n].source for n in BUILTIN_PARTITIONERS} == {"fedbalance"}
    eps = [ep for ep in reg_mod.md.entry_points(group="fedbalance") if ep.dist.name == "fedbalance"]
    assert [ep.value for ep in eps] == ["fl_adapters.builtin"]


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
    with_entry_points(
        FakeEntryPoint(
            "everyother",
            "fb_everyother",
            FakeDist("fb-everyother"),
            target=plugin_module("fb_everyother", [EveryOther]),
        )
    )
    registry = Registry()
    info = {i.name: i for i in registry.infos("partitioners")}["every_other"]
    assert info.source == "fb-everyother"
    assert info.description == "Round-robin split: sample i goes to client i mod N."
    part = registry.make_partitioner({"name": "Every_Other"}).partition(np.zeros(10, int), 3)
    assert [ix.tolist() for ix in part.client_indices] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_third_party_component_inside_mixed(with_entry_points) -> None:  # type: ignore[no-untyped-def]
    with_entry_points(
        FakeEntryPoint(
            "everyother",
            "fb_everyother",
            FakeDist("fb-everyother"),
            target=plugin_module("fb_everyother", [EveryOther]),
        )
    )
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
        FakeEntryPoint(
            "everyother",
            "fb_everyother",
            FakeDist("fb-everyother"),
            target=plugin_module("fb_everyother", [EveryOther]),
        ),
    )
    monkeypatch.setenv("FEDBALANCE_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = set(Registry().names("partitioners"))
    assert names == BUILTIN_PARTITIONERS


def test_list_json_shape(with_entry_points, capsys) -> None:  # type: ignore[no-untyped-def]
    from fl_adapters.cli import main

    with_entry_points(
        FakeEntryPoint(
            "everyother",
            "fb_everyother",
            FakeDist("fb-everyother"),
            target=plugin_module("fb_everyother", [EveryOther]),
        )
    )
    assert main(["list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"aggregators", "partitioners"}
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
