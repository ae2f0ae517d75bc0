"""The documentation's parameter tables say what the code does: names, defaults and upper limits.

Each row's parameter cell lists ``name=default`` (or a bare ``name`` where the default is not
a scalar) in backticks, optionally followed by the allowed range in parentheses. Every
default must equal the constructor's (``inspect.signature``), every keyword parameter must be
listed, and every ceiling in the code must be stated.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fl_aggregators import BUILTIN_AGGREGATORS
from fl_aggregators.astraea import MAX_MEDIATOR_EPOCHS
from fl_aggregators.astraea_plan import MAX_COUNT_CLIP, TAU_D_RANGE
from fl_partitions import BUILTIN_PARTITIONERS
from fl_partitions._limits import MAX_CLASSES, MAX_TRIES
from fl_partitions.base import KINDS

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: Constructor arguments that are plumbing, not settings (mixed's spec resolver).
INTERNAL = {"resolve"}
#: Every ceiling in the code, by (plugin, parameter): the numbers its docs note must state.
LIMITS: dict[tuple[str, str], tuple[float, ...]] = {
    ("label_dirichlet", "max_tries"): (MAX_TRIES,),
    ("quantity_dirichlet", "max_tries"): (MAX_TRIES,),
    ("label_quantity", "k"): (MAX_CLASSES,),
    ("global_imbalance", "proportions"): (MAX_CLASSES,),
    ("mixed", "components"): (len(KINDS),),
    ("astraea", "mediator_epochs"): (MAX_MEDIATOR_EPOCHS,),
    ("astraea", "tau_d"): TAU_D_RANGE,
    ("astraea", "count_clip"): (MAX_COUNT_CLIP,),
}
TOKEN = re.compile(r"`([a-z_]+)(?:=([^`]*))?`(?:\s*\(([^)]*)\))?")


def table(section: str) -> dict[str, list[tuple[str, str | None, str | None]]]:
    """``{plugin name: [(parameter, default text or None, limit note or None)]}`` of the first
    table of the docs page ``section`` (``aggregators``, ``partitioners``)."""
    text = (DOCS / f"{section}.md").read_text()
    start = text.index("\n|")
    rows: dict[str, list[tuple[str, str | None, str | None]]] = {}
    in_table = False
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = re.fullmatch(r"`([a-z_]+)`", cells[0])
        if name is None:  # the header and its separator
            continue
        rows[name.group(1)] = [(p, d or None, n or None) for p, d, n in TOKEN.findall(cells[-1])]
    return rows


def keyword_defaults(cls: type) -> dict[str, Any]:
    sig = inspect.signature(cls.__init__)  # type: ignore[misc]
    return {
        p.name: p.default
        for p in sig.parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name not in INTERNAL
    }


def numbers(text: str) -> set[float]:
    return {float(v) for v in re.findall(r"\d+(?:\.\d+)?", text.replace(",", ""))}


SECTIONS = [
    ("partitioners", {cls.name: cls for cls in BUILTIN_PARTITIONERS}),
    ("aggregators", {cls.name: cls for cls in BUILTIN_AGGREGATORS}),
]


@pytest.mark.parametrize(("section", "classes"), SECTIONS, ids=[s for s, _ in SECTIONS])
def test_every_builtin_has_a_row_and_every_row_a_builtin(
    section: str, classes: dict[str, type]
) -> None:
    assert sorted(table(section)) == sorted(classes)


CASES = [
    (section, name, cls) for section, classes in SECTIONS for name, cls in sorted(classes.items())
]


@pytest.mark.parametrize(("section", "name", "cls"), CASES, ids=[c[1] for c in CASES])
def test_documented_defaults_are_the_constructor_defaults(
    section: str, name: str, cls: type
) -> None:
    listed = table(section)[name]
    real = keyword_defaults(cls)
    assert [p for p, _, _ in listed] == list(real), f"{name}: the docs list other parameters"
    for param, shown, _ in listed:
        if shown is None:  # a bare name: the default is not a scalar (mixed's components)
            assert not isinstance(real[param], (int, float, str, bool, type(None))), param
            continue
        value = yaml.safe_load(shown)
        same_kind = isinstance(value, bool) == isinstance(real[param], bool)
        assert value == real[param] and same_kind, (
            f"the docs say {name}: {param}={shown}, the code's default is {real[param]!r}"
        )


@pytest.mark.parametrize(
    ("plugin", "param", "limit"), [(p, q, lim) for (p, q), lim in LIMITS.items()], ids=str
)
def test_docs_state_every_upper_limit(plugin: str, param: str, limit: tuple[float, ...]) -> None:
    section = "aggregators" if plugin in {c.name for c in BUILTIN_AGGREGATORS} else "partitioners"
    notes = {p: n for p, _, n in table(section)[plugin]}
    assert notes.get(param), f"the docs state no range for {plugin}: {param}"
    assert set(map(float, limit)) <= numbers(notes[param] or ""), (plugin, param, notes[param])
