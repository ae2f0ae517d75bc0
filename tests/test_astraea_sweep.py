"""The Astraea benchmark's optimizer sweep (fedbalance_benchmarks.astraea_sweep): it scores on
validation data only, its report and ``chosen`` come from its per-run records, and the committed
report is what the committed records give."""

from __future__ import annotations

import json
import shlex
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from fedbalance_benchmarks import astraea_sweep as sweep

TINY = ["--quick", "--dataset", "digits", "--rounds", "2", "--settings", "adam:1e-3", "sgd:0.1"]


def curve_record(curve: list[float]) -> dict[str, Any]:
    return {
        "rounds": list(range(1, len(curve) + 1)),
        sweep.SCORED: curve,
        sweep.PLAIN: [x + 0.1 for x in curve],
        "elapsed_s": 1.0,
    }


OPTS = {"arms": ["fedavg", "astraea"], "settings": [("adam", 1e-3), ("sgd", 0.1)], "seeds": 1}


def test_a_rise_then_fall_shows_as_best_round_and_drop() -> None:
    rise_fall = [0.2, 0.6, 0.7, 0.5, 0.5, 0.5, 0.5, 0.5]
    steady = [0.2, 0.4, 0.5, 0.55, 0.55, 0.56, 0.56, 0.57]
    records = {
        ("fedavg", "adam_lr0.001", 0): curve_record(rise_fall),
        ("fedavg", "sgd_lr0.1", 0): curve_record(steady),
        ("astraea", "adam_lr0.001", 0): curve_record(rise_fall),
    }
    summary = sweep.summarise(records, OPTS)
    adam, sgd = summary["arms"]["fedavg"]
    assert adam["best"] == 0.7 and adam["best_round"] == 3 and adam["final"] == 0.5
    assert adam["score"] == pytest.approx(0.5) and adam["drop"] == pytest.approx(0.2)
    assert adam["plain_score"] == pytest.approx(0.6)
    # Scored on the last rounds, not the best one: the steady setting is chosen.
    assert sgd["score"] == pytest.approx(statistics.mean(steady[-sweep.LAST :]))
    assert summary["chosen"]["fedavg"] == {"optimizer": "sgd", "lr": 0.1, "score": sgd["score"]}
    # An arm whose grid is not complete has no choice yet.
    assert summary["chosen"]["astraea"] is None and len(summary["arms"]["astraea"]) == 1


def test_a_malformed_setting_names_the_form(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        sweep.main(["--settings", "adam"])
    assert "a setting is OPTIMIZER:LR, e.g. adam:1e-3; got 'adam'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main(["--settings", "rmsprop:0.1"])
    assert "OPTIMIZER one of adam, sgd and LR > 0; got rmsprop:0.1" in capsys.readouterr().err


def test_the_sweep_scores_validation_only_and_reports_from_its_records(tmp_path: Path) -> None:
    pytest.importorskip("fedlab")
    out, runs = tmp_path / "out", tmp_path / "runs"
    argv = [*TINY, "--out", str(out), "--runs-dir", str(runs)]
    assert sweep.main(argv) == 0
    stem = "astraea_sweep_digits_letters_quick"
    paths = sorted((out / "per-run" / stem).rglob("seed0.json"))
    assert [p.relative_to(out / "per-run" / stem).parts[:2] for p in paths] == [
        ("astraea", "adam_lr0.001"),
        ("astraea", "sgd_lr0.1"),
        ("fedavg", "adam_lr0.001"),
        ("fedavg", "sgd_lr0.1"),
    ]
    records = {
        p.relative_to(out / "per-run" / stem).parts[:2]: json.loads(p.read_text()) for p in paths
    }
    for (arm, setting), rec in records.items():
        cfg = rec["config"]
        # The benchmark's design for the arm, at the setting, on validation data only.
        assert cfg["eval_data"] == "val" and cfg["split"] == sweep.VAL_SPLIT
        assert sweep.setting_name(cfg["optimizer"], cfg["lr"]) == setting
        assert cfg["aggregator"] == ("fedavg" if arm == "fedavg" else "astraea")
        assert (cfg["clients_per_round"], cfg["local_epochs"]) == (
            (4, 5) if arm == "fedavg" else (10, 1)
        )
        assert len(rec[sweep.SCORED]) == len(rec[sweep.PLAIN]) == 2
    for metrics in runs.rglob("metrics.jsonl"):  # the runs never evaluated the test data
        rows = [json.loads(x) for x in metrics.read_text().splitlines()]
        assert rows and all("val_accuracy" in r and "test_accuracy" not in r for r in rows)
    doc = json.loads((out / f"{stem}.json").read_text())
    for arm in ("fedavg", "astraea"):
        scores = {r["setting"]: r["score"] for r in doc["arms"][arm]}  # what the records give
        assert scores == {
            s: statistics.mean(records[(arm, s)][sweep.SCORED][-sweep.LAST :])
            for s in ("adam_lr0.001", "sgd_lr0.1")
        }
        best = max(doc["arms"][arm], key=lambda r: r["score"])
        assert doc["chosen"][arm] == {k: best[k] for k in ("optimizer", "lr", "score")}
    md = (out / f"{stem}.md").read_text()
    assert "Regenerate: `fedbalance bench astraea-sweep --quick" in md and "(chosen)" in md
    assert (out / f"{stem}.png").stat().st_size > 0
    # Another machine: no run directories, the report rebuilt from the records alone.
    (out / f"{stem}.json").unlink()
    (out / f"{stem}.md").unlink()
    shutil.rmtree(runs)
    assert sweep.main([*argv, "--no-run"]) == 0
    assert json.loads((out / f"{stem}.json").read_text()) == doc
    assert (out / f"{stem}.md").read_text() == md
    assert not runs.exists()


def test_the_committed_sweep_is_what_its_records_give() -> None:
    from fedbalance_benchmarks._runs import RESULTS

    committed = sorted(RESULTS.glob("astraea_sweep_*.json"))
    if not committed:
        pytest.skip("the sweep has no committed report yet")
    for path in committed:
        doc = json.loads(path.read_text())
        argv = shlex.split(doc["command"])[3:]  # after `fedbalance bench astraea-sweep`
        assert "--out" not in argv, "a committed report comes from the committed records"
        try:
            opts, _ = sweep.options([*argv, "--no-run"])
        except SystemExit as e:  # its dataset is not installed here
            pytest.skip(str(e))
        text, rebuilt = sweep.report(sweep.collect(opts, run=False), opts, doc["command"])
        assert path.with_suffix(".md").read_text() == text
        assert doc == json.loads(json.dumps(rebuilt))
        assert all(r["config"]["eval_data"] == "val" for r in doc["runs"])


def test_a_diverged_setting_is_reported_and_out_of_the_choice() -> None:
    """A rate whose rounds aggregate nothing (every client NaN) stops its run: the sweep
    records why and chooses among the others."""
    records = {
        ("fedavg", "adam_lr0.001", 0): curve_record([0.2, 0.4, 0.5, 0.5, 0.5, 0.5]),
        ("fedavg", "sgd_lr0.1", 0): {**curve_record([0.1]), "diverged": "rounds 2-6 ... NaN"},
    }
    summary = sweep.summarise(records, {**OPTS, "arms": ["fedavg"]})
    adam, sgd = summary["arms"]["fedavg"]
    assert sgd["score"] is None and sgd["diverged"] == "rounds 2-6 ... NaN"
    assert summary["chosen"]["fedavg"]["optimizer"] == "adam"
    table = sweep.arm_table(summary["arms"]["fedavg"], summary["chosen"]["fedavg"])
    assert "| sgd_lr0.1" in table and "- sgd_lr0.1 diverged: rounds 2-6 ... NaN" in table
