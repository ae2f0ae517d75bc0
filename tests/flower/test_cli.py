"""``fedbalance run`` with ``framework: flower``: the same files and keys as every host writes
(``helpers.check_host_files``, the contract of ``tests/test_host_contract.py``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from flower_runs import FEDAVGM, fedbalance, finished, lines
from helpers import check_bias_rows, check_host_files


@pytest.mark.slow
def test_fedbalance_run_on_flower_writes_metrics_and_summary(
    fedavgm_first_round: Path, fedavgm_whole: Path
) -> None:
    out = fedavgm_first_round / "out"
    rows = lines(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1]
    for row in rows:
        assert len(row["clients"]) == 2 and set(row["clients"]) <= {0, 1, 2}
        assert sum(row["weights"]) == pytest.approx(1.0) and row["rejected"] == 0
        assert 0.0 <= row["test_accuracy"] <= 1.0 and row["test_loss"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 1 and summary["config"]["framework"] == "flower"
    assert summary["final_accuracy"] == rows[-1]["test_accuracy"] and summary["elapsed_s"] > 0
    check_bias_rows(fedavgm_whole / "out", evaluated=FEDAVGM["rounds"])  # every node, every round
    check_host_files(fedavgm_whole / "out", FEDAVGM["rounds"], "flower")
    assert {e["host"] for e in lines(out / "aggregations.jsonl")} == {"flower"}
    # the engine polled by message (fl_adapters.flower.engine), and said so
    log = (out / "flower-simulation.log").read_text()
    assert "Flower's simulation engine polls its stored messages once a pass, not per node" in log
    assert "its own message polling runs" not in log  # the in-memory state: no fallback
    # Seeded sampling: the clients drawn are the run's, not the global RNG's, so the longer run
    # of the same config (another process) began with the same round.
    longer = lines(fedavgm_whole / "out" / "metrics.jsonl")
    assert len(longer) == FEDAVGM["rounds"] > 1
    assert longer[0].pop("elapsed_s") > 0 and rows[0].pop("elapsed_s") > 0  # wall time differs
    assert longer[0] == rows[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [({"eval_data": "test"}, "eval_data must be clients for flower")],
    ids=["eval-data"],
)
def test_fedbalance_run_on_flower_refuses_what_it_cannot_run(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    out = fedbalance(tmp_path, {**FEDAVGM, **change})
    assert isinstance(out, subprocess.CompletedProcess)
    assert out.returncode == 2 and message in out.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_thesis_grid_on_flower_stands_beside_the_committed_hosts() -> None:
    """The Flower row joins the committed FedLab and FedML grids when the settings match."""
    from fedbalance_benchmarks import thesis, thesis_report

    fedml = json.loads((thesis.RESULTS / "thesis_fmnist_fedml-sp.json").read_text())
    opts = {**fedml["options"], "framework": "flower"}
    flower = [{**c, "accuracy": [0.5, 0.9]} for c in fedml["runs"]]  # a stand-in Flower grid
    table = thesis_report.committed_hosts_table(flower, opts)
    header, _, *rows = [line for line in table.splitlines() if line.startswith("|")]
    assert "FedLab standalone best %" in header and "FedML sp simulation best %" in header
    assert "Flower 1.41 simulation engine best %" in header
    assert rows[0].split("|")[1].strip() == "mixed" and "90.00 ± 0.00" in rows[0]
    assert (
        thesis_report.committed_hosts_table(flower, {**opts, "rounds": 7}) == ""
    )  # other settings


@pytest.mark.slow
def test_eval_every_and_eval_fraction_pick_the_rounds_and_clients(
    tmp_path: Path, fedavgm_whole: Path
) -> None:
    """``eval_every: 2, eval_fraction: 0.34``: round 2 (the last) alone is evaluated, on the one
    client :func:`evaluated_clients` draws (its test accuracy is the final model's on that
    client's test split); training is the run's that evaluates every node every round."""
    import tomllib
    import torch

    from fl_adapters._training import evaluate, evaluated_clients
    from fl_adapters.flower.app.task import client_data, model_of

    out = finished(tmp_path, {**FEDAVGM, "eval_every": 2, "eval_fraction": 0.34}) / "out"
    rows = lines(out / "metrics.jsonl")
    assert [("test_accuracy" in r) for r in rows] == [False, True]
    config = tomllib.loads((out / "run_config.toml").read_text())
    (chosen,) = evaluated_clients(FEDAVGM["num_clients"], 0.34, FEDAVGM["seed"], 2)
    model = model_of(config)
    model.load_state_dict(torch.load(out / "app" / "final.pt"))
    _, accuracy, _ = evaluate(model, [client_data(config, chosen)["test"]])
    assert rows[1]["test_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    every = lines(fedavgm_whole / "out" / "metrics.jsonl")
    assert [(r["clients"], r["weights"]) for r in rows] == [
        (r["clients"], r["weights"]) for r in every
    ]


@pytest.mark.slow
def test_fedbalance_run_on_flower_that_learns_nothing_exits_non_zero_naming_why(
    tmp_path: Path,
) -> None:
    """Every client's model overflows (lr 1e30): the strategy stops after max_skipped_rounds,
    and `fedbalance run` says why instead of exiting 0."""
    config = {
        **FEDAVGM,
        "aggregator": "fedavg",
        "aggregator_args": {"max_skipped_rounds": 2},
        "optimizer": "sgd",
        "lr": 1e30,
        "rounds": 3,
    }
    done = fedbalance(tmp_path, config, "--no-progress")
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert (
        "it stopped because fedavg: rounds 1-2 aggregated nothing (2 in a row, max_skipped_rounds 2)"
        in last
    ), last


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"FEDBALANCE_FLOWER_POLLING": "fast"},
            "FEDBALANCE_FLOWER_POLLING must be one of index, flower, got 'fast'",
        ),
        (
            {"FEDBALANCE_FLOWER_ACTORS": "0"},
            "FEDBALANCE_FLOWER_ACTORS must be a whole number of ClientApp actors in [1, 1024]",
        ),
    ],
    ids=["polling", "actors"],
)
def test_a_bad_simulation_switch_is_one_line_before_any_process(
    tmp_path: Path, env: dict[str, str], line: str
) -> None:
    done = fedbalance(tmp_path, FEDAVGM, "--no-progress", env=env)
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fedbalance run: error: {line}"), last
    assert not (tmp_path / "out" / "flower-simulation.log").exists()
