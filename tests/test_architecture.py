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


def callers(name: str, attribute: str | None = None) -> list[str]:
    """The modules that call ``name(...)`` (or ``name.attribute(...)``), one entry per call."""
    found = []
    for module, tree in modules().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if attribute is None and isinstance(f, ast.Name) and f.id == name:
                found.append(module)
            elif (
                attribute is not None
                and isinstance(f, ast.Attribute)
                and f.attr == attribute
                and isinstance(f.value, ast.Name)
                and f.value.id == name
            ):
                found.append(module)
    return sorted(found)


def test_one_module_words_a_run_that_stopped() -> None:
    """Every host's failed run is worded by fl_adapters.run.lifecycle.failed."""
    assert callers("RunFailed") == ["run/lifecycle.py"]


def test_one_capture_and_one_open_build_and_read_every_hosts_checkpoint() -> None:
    """``run.lifecycle.capture`` builds every checkpoint and ``open_for_resume`` opens every
    one a run resumes from. FedML and Flower call ``capture``; FedLab and in-process hosts
    report rounds to ``Rounds.done``, which calls it."""
    assert callers("Checkpoint") == ["run/lifecycle.py"]
    assert callers("Checkpoint", "open") == ["run/lifecycle.py"]
    assert {m.split("/")[0] for m in callers("capture")} == {"fedml", "flower", "run"}
    assert sorted(set(callers("Rounds"))) == ["fedlab/runner.py", "run/lifecycle.py"]


def test_no_host_names_a_client_metric() -> None:
    """Client metrics travel by the names the aggregator asks for; only the table names them."""
    naming = sorted(
        name
        for name, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value == "val_loss"
    )
    assert naming == ["client_metrics.py"]


def strings(tree: ast.Module) -> list[str]:
    """The string constants of ``tree``'s code, docstrings left out."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_autoload_config_checkpoint_and_cli_name_no_host() -> None:
    """What a host needs is in its spec (``fl_adapters.<host>.spec``); these modules read
    specs."""
    trees = modules()
    for module in ("autoload.py", "config.py", "checkpoint.py", "cli.py", "hosts.py"):
        named = [
            s
            for s in strings(trees[module])
            if any(host in s.lower() for host in ("fedlab", "fedml", "flower", "flwr"))
        ]
        assert named == [], (module, named)
