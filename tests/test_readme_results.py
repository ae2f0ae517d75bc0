"""The README's host-comparison tables are the committed reports' tables: every data row of a
report's comparison table appears, cell for cell, as a row of the README (the README may
shorten the header)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: Reports whose comparison table the README shows.
REPORTS = ["thesis_fmnist_fedml-sp", "thesis_fmnist_fedml-sp_e10", "thesis_fmnist_flower"]


def rows(text: str) -> list[list[str]]:
    """Every markdown table row's cells, header and separator rows left out."""
    out = []
    for line in text.splitlines():
        if not line.startswith("|") or set(line) <= {"|", "-", " "}:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] != "scenario":
            out.append(cells)
    return out


def comparison_rows(report: str) -> list[list[str]]:
    """The data rows of a report's first table (its host comparison)."""
    table = report[report.index("\n| scenario") :].split("\n\n", 1)[0]
    return rows(table)


@pytest.mark.parametrize("stem", REPORTS)
def test_the_readme_shows_the_reports_comparison(stem: str) -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"benchmarks/results/{stem}.md" in readme
    expected = comparison_rows((RESULTS / f"{stem}.md").read_text())
    assert expected, f"{stem}.md has no comparison table"
    shown = rows(readme)
    for row in expected:
        assert row in shown, f"README lacks {stem}.md's row {row}"
