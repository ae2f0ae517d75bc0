"""Flower's environment, as `make setup-flower` builds it: flwr 1.41 beside fedbalance."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

from packaging.version import Version


def test_flower_env_has_flwr_141_and_protobuf_5() -> None:
    assert Version(md.version("flwr")).release[:2] == (1, 41)
    # The reason this environment exists: FedML 0.9.6 needs protobuf<4.
    assert Version(md.version("protobuf")).major >= 5


def test_core_packages_never_import_flwr() -> None:
    code = (
        "import sys, fl_aggregators, fl_partitions, fl_adapters.registry, fl_adapters.cli;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'flwr'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
