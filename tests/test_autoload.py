"""A plugin never breaks its host: the autoload against faked host releases and removed methods.

Each case runs in a fresh interpreter, where the installed ``fedbalance_autoload.pth`` has put
the finder in place, with a fake FedLab / FedML package first on ``PYTHONPATH`` (or the real
one with a method deleted before arming).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from fl_adapters.autoload import Patches

FORCE = "FEDBALANCE_FORCE_HOST=1"
DISABLE = "FEDBALANCE_DISABLE_HOST_AUTOLOAD=1"


def fake_host(root: Path, name: str, version: str, files: dict[str, str] | None = None) -> Path:
    """A package ``name`` at ``version`` under ``root``: ``__init__`` plus ``files``."""
    package = root / name
    package.mkdir(parents=True)
    init = f"__version__ = {version!r}\n"
    if name == "fedml":  # what FedML scripts call first; returns the flattened config
        init += textwrap.dedent(
            """
            import argparse, os
            def init():
                return argparse.Namespace(aggregator=os.environ.get("FAKE_AGGREGATOR"))
            """
        )
    (package / "__init__.py").write_text(init)
    for path, text in (files or {}).items():
        (package / path).write_text(text)
    return root


def python(code: str, path: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    environ.update(env)
    if path is not None:
        environ["PYTHONPATH"] = str(path)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def told(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("fedbalance: ")]


IMPORT_TWICE = """
    import importlib, sys
    import {host}
    del sys.modules["{host}"]
    import {host}
    print("imported", {host}.__version__)
"""


@pytest.mark.parametrize(
    ("host", "version", "supported", "label"),
    [("fedml", "0.9.7", "0.9.6", "FedML"), ("fedlab", "1.3.1", "1.3.0", "FedLab")],
    ids=["fedml-0.9.7", "fedlab-1.3.1"],
)
def test_an_unsupported_release_imports_as_stock_and_is_named_once(
    tmp_path: Path, host: str, version: str, supported: str, label: str
) -> None:
    path = fake_host(tmp_path, host, version)
    out = python(IMPORT_TWICE.format(host=host), path)
    assert out.returncode == 0, out.stderr
    assert f"imported {version}" in out.stdout
    lines = told(out.stderr)
    assert len(lines) == 1, out.stderr
    for part in (f"{label} {version}", f"supports {label} {supported}", FORCE, DISABLE):
        assert part in lines[0], lines[0]
    quiet = python(IMPORT_TWICE.format(host=host), path, FEDBALANCE_DISABLE_HOST_AUTOLOAD="1")
    assert quiet.returncode == 0 and told(quiet.stderr) == [], quiet.stderr


def test_fedml_config_naming_an_aggregator_stops_at_init_on_an_unsupported_release(
    tmp_path: Path,
) -> None:
    path = fake_host(tmp_path, "fedml", "0.9.7")
    code = "import fedml\nprint('aggregator', fedml.init().aggregator)"
    stock = python(code, path)
    assert stock.returncode == 0 and "aggregator None" in stock.stdout, stock.stderr
    named = python(code, path, FAKE_AGGREGATOR="fedloss")
    assert named.returncode != 0
    assert "HostNotSupported: aggregator: fedloss" in named.stderr, named.stderr
    assert "found FedML 0.9.7" in named.stderr and "Install FedML 0.9.6" in named.stderr


def test_fedlab_aggregator_variable_stops_the_import_on_an_unsupported_release(
    tmp_path: Path,
) -> None:
    path = fake_host(tmp_path, "fedlab", "1.3.1")
    out = python("import fedlab", path, FEDBALANCE_AGGREGATOR="fedloss")
    assert out.returncode != 0
    assert "HostNotSupported: FEDBALANCE_AGGREGATOR is set" in out.stderr, out.stderr
    assert "found FedLab 1.3.1" in out.stderr
    # Forced, arming meets the missing fedlab.contrib and says so, still before any training.
    forced = python(
        "import fedlab", path, FEDBALANCE_AGGREGATOR="fedloss", FEDBALANCE_FORCE_HOST="1"
    )
    assert forced.returncode != 0
    assert "fedlab.contrib" in forced.stderr and "FedLab 1.3.1" in forced.stderr, forced.stderr


@pytest.mark.parametrize(
    "runner",
    [None, "raise RuntimeError('boom in fedml.runner')\n"],
    ids=["runner-moved", "runner-raises"],
)
def test_a_supported_release_whose_internals_moved_runs_stock(
    tmp_path: Path, runner: str | None
) -> None:
    path = fake_host(tmp_path, "fedml", "0.9.6", {} if runner is None else {"runner.py": runner})
    code = """
        import fedml
        import fl_adapters.autoload as a
        print("aggregator", fedml.init().aggregator)
        print("patched", [attr for _, attr, _ in a.PATCHES["fedml"]._undo])
    """
    out = python(code, path)
    assert out.returncode == 0, out.stderr
    assert "aggregator None" in out.stdout
    assert "patched ['init']" in out.stdout  # only the guard that refuses a named aggregator
    lines = told(out.stderr)
    assert len(lines) == 1 and "FedML 0.9.6 failed" in lines[0], out.stderr
    cause = "fedml.runner" if runner is None else "boom in fedml.runner"
    assert cause in lines[0]
    named = python(code, path, FAKE_AGGREGATOR="fedloss")
    assert named.returncode != 0 and "HostNotSupported" in named.stderr, named.stderr


@pytest.mark.parametrize(
    ("remove", "named"),
    [
        # found missing while the targets are looked up, before the first patch
        (
            "from fedml.simulation.mpi.fedavg.FedAVGAggregator import FedAVGAggregator as owner",
            "'aggregate'",
        ),
        # found missing after the training and aggregation points were already patched
        ("import fedml.data as owner", "'load'"),
    ],
    ids=["before-patching", "mid-patching"],
)
def test_real_fedml_with_a_removed_method_is_left_exactly_stock(remove: str, named: str) -> None:
    attr = named.strip("'")
    out = python(
        f"""
        import fedml
        from fedml.simulation.sp.fedavg.fedavg_api import FedAvgAPI
        {remove}
        before = dict(vars(FedAvgAPI))
        delattr(owner, {attr!r})
        import fl_adapters.autoload as a
        a.arm_host("fedml", fedml)
        assert dict(vars(FedAvgAPI)) == before, "a patch survived the failed arming"
        assert not hasattr(fedml.runner.FedMLRunner.__init__, "__wrapped__")
        print("stock")
        """,
        FEDBALANCE_DISABLE_HOST_AUTOLOAD="1",  # arm by hand, after deleting the method
    )
    assert out.returncode == 0 and "stock" in out.stdout, out.stderr
    lines = told(out.stderr)
    assert len(lines) == 1 and named in lines[0] and "FedML 0.9.6" in lines[0], lines


def test_real_fedlab_with_a_removed_method_refuses_a_named_aggregator_and_patches_nothing() -> None:
    out = python(
        """
        import fedlab
        from fedlab.contrib.algorithm.basic_client import SGDClientTrainer
        from fedlab.contrib.algorithm.basic_server import SyncServerHandler
        before = SyncServerHandler.global_update
        for cls in SGDClientTrainer.__mro__:
            if "uplink_package" in vars(cls):
                delattr(cls, "uplink_package")
        import fl_adapters.autoload as a
        try:
            a.arm_host("fedlab", fedlab)
        except a.HostNotSupported as e:
            print("refused:", e)
        assert SyncServerHandler.global_update is before
        """,
        FEDBALANCE_DISABLE_HOST_AUTOLOAD="1",
        FEDBALANCE_AGGREGATOR="fedloss",
    )
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "FedLab 1.3.0" in out.stdout, out.stdout
    assert "uplink_package" in out.stdout


#: A host package that notes whether the collector ran while it imported and leaves a cycle.
COLLECTED_HOST = """
import gc, weakref
__version__ = "1.3.0"
collecting = gc.isenabled()
class Node:
    pass
cycle = Node()
cycle.me = cycle
dropped = weakref.ref(cycle)
del cycle
"""


def test_a_hosts_import_pauses_the_collector_then_collects_and_freezes(tmp_path: Path) -> None:
    path = fake_host(tmp_path, "fedlab", "1.3.0", {"__init__.py": COLLECTED_HOST})
    code = """
        import gc, sys
        import fedlab
        print(fedlab.collecting, gc.isenabled(), fedlab.dropped() is None, gc.get_freeze_count() > 0)
        gc.unfreeze()
        del sys.modules["fedlab"]
        gc.disable()
        import fedlab
        print(fedlab.collecting, gc.isenabled(), gc.get_freeze_count())
    """
    out = python(code, path)
    assert out.returncode == 0, out.stderr
    # paused during the import, on again after it; the import's cycle collected, the rest frozen
    # (not walked by the collector again); a process that turned the collector off keeps it off
    assert out.stdout.split("\n")[:2] == ["False True True True", "False False 0"], out.stdout
    # without the hook, or with the collector left alone: collecting during the import,
    # nothing frozen
    for env in ({"FEDBALANCE_DISABLE_HOST_AUTOLOAD": "1"}, {"FEDBALANCE_FREEZE_IMPORTS": "0"}):
        stock = python(code, path, **env).stdout.split()
        assert (stock[0], stock[1], stock[3]) == ("True", "True", "False"), (env, stock)


def test_cli_run_stops_before_training_on_an_unsupported_host(tmp_path: Path) -> None:
    path = fake_host(tmp_path / "hosts", "fedlab", "1.3.1")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"framework": "fedlab", "dataset": "digits"}))
    out = python(
        f"import sys; from fl_adapters.cli import main; sys.exit(main(['run', {str(config)!r}]))",
        path,
    )
    assert out.returncode == 2, out.stderr
    assert "fedbalance run: error:" in out.stderr and "found FedLab 1.3.1" in out.stderr


def test_patches_undo_restores_own_and_inherited_attributes() -> None:
    class Base:
        def f(self) -> str:
            return "base"

    class Child(Base):
        def g(self) -> str:
            return "child"

    patches = Patches()
    patches.set(Child, "f", lambda self: "patched")
    patches.set(Child, "g", lambda self: "patched")
    assert Child().f() == Child().g() == "patched"
    patches.undo()
    assert Child().f() == "base" and Child().g() == "child"
    assert "f" not in vars(Child)  # inherited again, not copied down
