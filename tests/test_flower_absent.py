"""fedbalance where Flower is not installed (the main test environment: FedML's protobuf<4).

A plugin never breaks its host, nor itself: everything but the Flower adapter works without
flwr, and asking for the adapter says what to install.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("flwr") is not None, reason="flwr is installed here"
)


def test_fedbalance_imports_and_lists_without_flwr() -> None:
    code = "import fl_aggregators, fl_partitions, fl_adapters.cli, fl_adapters.registry"
    subprocess.run([sys.executable, "-c", code], check=True)
    out = subprocess.run(
        [sys.executable, "-m", "fl_adapters.cli", "list"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "fedloss" in out.stdout


def test_asking_for_the_flower_adapter_says_what_to_install() -> None:
    with pytest.raises(
        ImportError, match=r"needs flwr 1\.41\.x or 1\.42\.x, which is not installed: "
    ):
        import fl_adapters.flower  # noqa: F401


def test_fedbalance_run_on_flower_without_flwr_exits_2_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("framework: flower\ndataset: digits\naggregator: fedloss\n")
    out = subprocess.run(
        [sys.executable, "-m", "fl_adapters.cli", "run", str(config), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert (
        "needs flwr 1.41.x or 1.42.x, which is not installed: pip install 'fedbalance[flower]'"
        in (out.stderr)
    )
