"""Flower's environments, as `make setup-flower` and `make setup-flower-oldest` build them: the
newest and the oldest supported flwr beside fedbalance."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys

from packaging.version import Version


def test_flower_env_has_the_release_its_lane_tests_and_protobuf_5() -> None:
    from fl_adapters.flower import RELEASES

    # make test-flower-oldest says which; the main Flower lane runs on the newest
    expected = os.environ.get("FEDBALANCE_FLWR_RELEASE", RELEASES[-1])
    assert ".".join(map(str, Version(md.version("flwr")).release[:2])) == expected
    # The reason this environment exists: FedML 0.9.6 needs protobuf<4.
    assert Version(md.version("protobuf")).major >= 5


def test_core_packages_never_import_flwr() -> None:
    code = (
        "import sys, fl_aggregators, fl_partitions, fl_adapters.registry, fl_adapters.cli;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'flwr'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_apps_components_import_with_the_collector_paused_then_frozen() -> None:
    """Flower starts a process per message for the ClientApp: its imports leave the collector
    on and their objects frozen (fl_adapters.collector), with or without the switch."""
    code = (
        "import gc, fl_adapters.flower.app.client_app, fl_adapters.flower.app.server_app;"
        "print(gc.isenabled(), gc.get_freeze_count() > 0)"
    )
    for switch, frozen in (("1", "True"), ("0", "False")):
        env = {**os.environ, "FEDBALANCE_FREEZE_IMPORTS": switch}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        )
        assert out.stdout.split() == ["True", frozen], (switch, out.stdout)
