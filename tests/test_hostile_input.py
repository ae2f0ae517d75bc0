"""Hostile and careless input, kept as regressions (issue: bounded memory, run directories never
clobbered, corrupted checkpoints refused).

The command-line cases are :data:`fedbalance_benchmarks.hostile.CASES` (``fedbalance bench
hostile`` reports them): each a real ``fedbalance`` (or Python) process under a 1 GiB data
limit (``RLIMIT_DATA``: torch's shared libraries need address space, not data) and a time
limit, so a case that tried to expand a YAML bomb, allocate a claimed 10^13-element array or
recurse without end would die of ``MemoryError`` or time out, not print its one line. The list
holds issue #61's second pass too (each also tested where it was fixed): plugins found through a
``.dist-info`` on ``PYTHONPATH``, a zip bomb, a disk that fills up (``RLIMIT_FSIZE``). The rest
run in this process: checkpoints, aggregators, JSON output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedbalance_benchmarks.hostile import CASES, Case, run_case
from fl_adapters.checkpoint import Checkpoint, CheckpointError
from fl_adapters.experiment import json_line
from fl_adapters.inputs import InputError, load_json
from fl_aggregators import ClientUpdate, FedAvgM, FedLoss, FedLossN


# -- the command-line cases: every one a real process (benchmarks/hostile.py) ----------------------
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_is_refused_clearly_or_handled(case: Case, tmp_path: Path) -> None:
    outcome = run_case(case, tmp_path)
    assert outcome.verdict != "FAILED", (outcome.code, outcome.line, outcome.seconds)


def test_json_arguments_refuse_nan_infinity_and_overflow() -> None:
    for text, words in [
        ('{"a": NaN}', "NaN is not JSON"),
        ('{"a": Infinity}', "Infinity is not JSON"),
        ('{"a": 1e400}', "too large for a float"),
    ]:
        with pytest.raises(InputError, match=words):
            load_json(text, "aggregator-args")


def test_off_words_switch_the_autoload_off_and_only_they(monkeypatch: pytest.MonkeyPatch) -> None:
    from fl_adapters.autoload import disabled

    for value, off in [("false", False), ("OFF", False), ("no", False), ("0", False), ("1", True)]:
        monkeypatch.setenv("FEDBALANCE_DISABLE_HOST_AUTOLOAD", value)
        assert disabled() is off, value


# -- 3. checkpoints ----------------------------------------------------------------------------
def _checkpoint(model: object, **fields: object) -> Checkpoint:
    doc: dict = {"config": {}, "round": 1, "model": model, "aggregator": {"round": 1}}
    fields.setdefault("host", "fedlab")
    return Checkpoint(participations=fields.pop("participations", {}), **doc, **fields)  # type: ignore[arg-type]


def test_a_nan_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    _checkpoint({"w": torch.full((2,), float("nan"))}).save(path)
    with pytest.raises(CheckpointError, match="NaN or Inf"):
        Checkpoint.load(path)


def test_the_model_must_be_the_runs_own(tmp_path: Path) -> None:
    ckpt = _checkpoint({"w": torch.zeros(2, 3), "b": torch.zeros(3)})
    ckpt.check_model({"w": torch.zeros(2, 3), "b": torch.zeros(3)}, tmp_path)
    for template, words in [
        ({"w": torch.zeros(3, 2), "b": torch.zeros(3)}, "parameter 'w' is (2, 3)"),
        ({"w": torch.zeros(2, 3), "b": torch.zeros(3, dtype=torch.float64)}, "torch.float64"),
        ({"w": torch.zeros(2, 3)}, "unexpected ['b']"),
        (torch.zeros(9), "is not this run's"),
    ]:
        with pytest.raises(
            CheckpointError,
            match=words.replace("(", r"\(")
            .replace(")", r"\)")
            .replace("[", r"\[")
            .replace("]", r"\]"),
        ):
            ckpt.check_model(template, tmp_path)  # type: ignore[arg-type]


def test_impossible_participation_counts_and_deep_json_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    _checkpoint({"w": torch.zeros(2)}, participations={3: -1}).save(path)
    with pytest.raises(CheckpointError, match="participation counts"):
        Checkpoint.load(path)
    doc = torch.load(path, weights_only=True)
    doc["participations"], doc["config"] = [], "[" * 100_000 + "]" * 100_000
    torch.save(doc, path)
    with pytest.raises(CheckpointError, match="nested too deeply"):
        Checkpoint.load(path)


# -- 5. aggregators on absurd reports ----------------------------------------------------------
def test_huge_or_malformed_losses_never_crash_a_round() -> None:
    g = {"w": torch.zeros(3)}
    for losses in (
        [1e308, 1e308, 1.0, 2.0],
        [1.7e308] * 4,
        [10**400, 1.0, 2.0],
        ["5.0", 1.0, 2.0],
        [True, 1.0, 2.0],
    ):
        updates = [
            ClientUpdate(
                params={"w": torch.ones(3) * i},
                num_samples=10 * (i + 1),
                metrics={"val_loss": x},
                client_id=i,
            )
            for i, x in enumerate(losses)
        ]
        for agg in (FedLoss(), FedLossN(), FedLoss(loss_clip=None, peer_clip=None)):
            result = agg.aggregate(g, updates)
            assert not result.skipped and sum(result.weights) == pytest.approx(1.0)
            if not isinstance(losses[0], float):  # 10**400, "5.0", True: rejected, named
                assert [r.client for r in result.rejected] == [0]


@pytest.mark.parametrize("value", [float("inf"), 10**400, float("nan")])
def test_fedavgm_refuses_infinite_steps(value: object) -> None:
    with pytest.raises(ValueError, match="server_lr must be a finite float"):
        FedAvgM(server_lr=value)  # type: ignore[arg-type]


# -- 4. JSON output ----------------------------------------------------------------------------
def test_metrics_lines_hold_no_bare_nan() -> None:
    line = json_line({"round": 1, "test_loss": float("nan"), "w": [float("inf"), 0.5]})
    assert json.loads(line) == {"round": 1, "test_loss": None, "w": [None, 0.5]}


def test_the_reliability_report_carries_the_committed_hostile_counts() -> None:
    """`fedbalance bench hostile` sets this section; regenerating it changes nothing."""
    from fedbalance_benchmarks._runs import RESULTS
    from fedbalance_benchmarks.hostile import BEGIN, with_reliability_section

    hostile = (RESULTS / "hostile_input.md").read_text()
    report = (RESULTS / "reliability_fmnist.md").read_text()
    assert BEGIN in report and with_reliability_section(report, hostile) == report
    counts = next(x for x in hostile.splitlines() if x.startswith("Tried "))
    assert counts in report and "failed 0." in counts
