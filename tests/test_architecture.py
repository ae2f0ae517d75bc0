"""What the layout promises, read from the source (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ADAPTERS = Path(__file__).resolve().parents[1] / "adapters"


def modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(ADAPTERS)): ast.parse(path.read_text(), str(path))
        for path in sorted(ADAPTERS.rglob("*.py"))
    }


def test_one_module_words_a_run_that_stopped() -> None:
    """Every host's failed run is worded by fl_adapters.run.lifecycle.failed."""
    makers = sorted(
        name
        for name, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "RunFailed"
    )
    assert makers == ["run/lifecycle.py"]


def test_no_host_names_a_client_metric() -> None:
    """Client metrics travel by the names the aggregator asks for; only the table names them."""
    naming = sorted(
        name
        for name, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value == "val_loss"
    )
    assert naming == ["client_metrics.py"]
