"""The committed results (``benchmarks/results``): no file names a folder of the machine that
wrote it, and a report is what its records (or its measured JSON) give.

The map, the sweeps and the thesis grids have their own such tests (``test_map_report.py``,
``test_astraea_sweep.py``, ``test_thesis_records.py``/``test_thesis_claims.py``); the Astraea
benchmark's and the evaluation cost's are here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
#: What a path of the machine that ran a benchmark looks like: a home, cache, temp or checkout.
MACHINE_PATH = re.compile(r"/(root|home|tmp|work|Users)/|\.cache/fedbalance|[A-Z]:\\\\")


def test_no_committed_result_names_a_folder_of_the_machine_that_wrote_it() -> None:
    files = [p for p in RESULTS.rglob("*") if p.suffix in (".md", ".json") and p.is_file()]
    assert len(files) > 100  # the reports and the per-run records
    named = {
        str(p.relative_to(RESULTS)): m.group(0)
        for p in files
        if (m := MACHINE_PATH.search(p.read_text(errors="replace")))
    }
    assert named == {}


def test_a_folder_in_an_option_or_a_message_is_kept_out() -> None:
    from fedbalance_benchmarks._runs import public, scrubbed

    opts = {"seeds": 3, "out": "/x/results", "runs_dir": "/home/me/.cache/runs"}
    assert public(opts) == {"seeds": 3}
    doc = {"kill": [{"error": "see /home/me/.cache/runs/a/fedml.log"}], "n": 1}
    assert scrubbed(doc, {"/home/me/.cache/runs": "RUNS"}) == {
        "kill": [{"error": "see RUNS/a/fedml.log"}],
        "n": 1,
    }


ASTRAEA_REPORTS = sorted(
    p.stem for p in RESULTS.glob("astraea_*.json") if not p.stem.startswith("astraea_sweep")
)


@pytest.mark.parametrize("stem", ASTRAEA_REPORTS)
def test_a_committed_astraea_report_is_what_its_records_give(tmp_path: Path, stem: str) -> None:
    """Its Markdown and its JSON, both from the committed per-run records (the JSON once held
    an earlier design's runs beside a Markdown made from today's)."""
    from fedbalance_benchmarks import astraea

    doc = json.loads((RESULTS / f"{stem}.json").read_text())
    opts = {**doc["options"], "out_dir": str(RESULTS), "runs_dir": str(tmp_path)}
    assert astraea.stem_of(opts) == stem
    records = astraea.collect(opts, run=False)
    assert records
    text = astraea.report(records, opts, doc["command"])
    assert (RESULTS / f"{stem}.md").read_text() == text
    fresh = astraea.report_doc(records, opts, doc["command"])
    assert json.loads(json.dumps(fresh)) == doc


def test_every_astraea_report_is_checked() -> None:
    assert "astraea_fmnist_letters_adam_lr0.001" in ASTRAEA_REPORTS


@pytest.mark.parametrize("module", ["perf_evaluate"])
def test_a_measured_report_is_its_json_written_out(module: str) -> None:
    import importlib

    report = importlib.import_module(f"fedbalance_benchmarks.{module}").report
    result = json.loads((RESULTS / f"{module}.json").read_text())
    assert (RESULTS / f"{module}.md").read_text() == report(result)


def test_the_readme_quotes_the_astraea_reports_two_readings() -> None:
    """The README's Astraea lines set the paper's formula beside the paper (best over rounds)
    and the bounded default beside it, each as the tuned report's paired-difference cell says,
    and Astraea's minority-class recall against FedAvg with its interval."""
    text = (RESULTS / "astraea_fmnist_letters.md").read_text()
    readme = (RESULTS.parents[1] / "README.md").read_text().replace("\n", " ")
    rows = {
        line.split("|")[1].strip(): line.split("|")[3].strip()
        for line in text.split("## Against the paper", 1)[1].splitlines()
        if line.startswith("| Astraea, ")
    }
    assert len(rows) == 2
    for cell in rows.values():
        assert cell.startswith(("+", "-")) and cell in readme, cell
    bias = text.split("## Measured on its purpose", 1)[1]
    astraea = next(line for line in bias.splitlines() if line.startswith("| astraea "))
    diff, interval = astraea.split("|")[5].strip().split(" ", 1)
    lo, hi = interval.strip("()").split(" to ")
    assert f"recall is {diff} points (95 % interval {lo} to {hi}" in readme
