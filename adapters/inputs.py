"""Reading what users and other processes hand fedbalance, in bounded time and memory.

Every YAML config, JSON argument and JSON file fedbalance reads goes through :func:`load_yaml`
or :func:`load_json` (or :func:`check_tree` when a host has parsed it already), which refuse,
with one line naming where the input came from:

* text longer than ``max_bytes`` (1 MiB by default);
* more than ``max_nodes`` values once YAML aliases are expanded (a "billion laughs" document
  is a few hundred bytes and expands to 10^9 strings: counted, never built) or nesting deeper
  than ``max_depth``;
* duplicate mapping keys (YAML would keep the last one silently).

YAML numbers read as a person writes them: ``1e-3`` is a float (YAML 1.1 wants ``1.0e-3``).
:func:`brief` is the bounded ``repr`` every error message about such a value uses.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from fl_checks import FedbalanceError
from fl_checks import shown as brief

MAX_BYTES = 1 << 20
MAX_NODES = 100_000
MAX_DEPTH = 64


class InputError(FedbalanceError, ValueError):
    """Input that is too large, too deep or not well formed (one line, names the source)."""


def check_tree(
    value: Any, where: str, *, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH
) -> Any:
    """``value`` if it has at most ``max_nodes`` values (shared ones counted at every place
    they appear, as any consumer would expand them) nested at most ``max_depth`` deep."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise InputError(
                f"{where}: more than {max_nodes:,} values (YAML aliases counted at every use); "
                "refusing to expand it"
            )
        if depth > max_depth:
            raise InputError(f"{where}: nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            stack.extend((k, depth + 1) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)
    return value


def _check_text(text: str | bytes, where: str, max_bytes: int) -> None:
    if len(text) > max_bytes:
        raise InputError(f"{where}: {len(text):,} bytes, more than the {max_bytes:,} allowed")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys and reading ``1e-3`` as a float."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: PyYAML's own error follows
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {brief(key)}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(
    text: str, where: str, *, max_bytes: int = MAX_BYTES, max_nodes: int = MAX_NODES
) -> Any:
    """The YAML document in ``text`` (see the module docstring for what is refused)."""
    _check_text(text, where, max_bytes)
    try:
        value = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise InputError(f"{where}: not valid YAML ({' '.join(str(e).split())[:300]})") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply to read") from None
    return check_tree(value, where, max_nodes=max_nodes)


def load_json(
    text: str | bytes, where: str, *, max_bytes: int = MAX_BYTES, max_nodes: int = MAX_NODES
) -> Any:
    """The JSON value in ``text``: bounded like :func:`load_yaml`; ``NaN``/``Infinity`` and
    numbers too large for a float are refused too."""
    _check_text(text, where, max_bytes)

    def constant(name: str) -> Any:
        raise InputError(f"{where}: {name} is not JSON (use null or a finite number)")

    def number(raw: str) -> float:
        value = float(raw)
        if value in (float("inf"), float("-inf")):
            raise InputError(f"{where}: the number {brief(raw)} is too large for a float")
        return value

    try:
        value = json.loads(text, parse_constant=constant, parse_float=number)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply to read") from None
    return check_tree(value, where, max_nodes=max_nodes)
