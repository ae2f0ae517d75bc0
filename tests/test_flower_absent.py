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


@pytest.mark.parametrize("name", ["strategy_from_run_config", "train_reply", "evaluate_reply"])
def test_asking_for_the_flower_adapter_says_what_to_install(name: str) -> None:
    """The package and its host spec import without flwr (the registry reads the spec); any
    name of the adapter checks flwr first."""
    import fl_adapters.flower
    from fl_adapters.flower.spec import FLOWER

    assert FLOWER.frameworks == ("flower", "flower-deployment")
    with pytest.raises(
        ImportError, match=r"needs flwr 1\.41\.x or 1\.42\.x, which is not installed: "
    ):
        getattr(fl_adapters.flower, name)


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
