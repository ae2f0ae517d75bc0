"""What defines a thesis-grid run, so that a changed variant or data pipeline reruns it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedbalance_benchmarks import thesis
from fedbalance_benchmarks.fedavgm_sweep import summarise

OPTS = {"dataset": "fmnist", **thesis.FULL}


def test_the_thesis_rule_runs_with_every_bound_off() -> None:
    for variant in ("fedloss", "fedloss_n"):
        _, args = thesis.aggregator_args(variant)
        assert all(args.get(k) is None for k in thesis.BOUNDS), (variant, args)
    _, default = thesis.aggregator_args("fedloss-default")
    assert (default["loss_clip"], default["peer_clip"]) == (5.0, 1.0)


def test_fedavgm_runs_with_the_committed_sweeps_choice() -> None:
    chosen = json.loads(thesis.SWEEP.read_text())["chosen"]
    _, args = thesis.aggregator_args("fedavgm")
    assert (args["beta"], args["server_lr"]) == (chosen["beta"], chosen["server_lr"])


def test_the_library_default_is_the_sweeps_choice() -> None:
    """The sweep decides the library default too, so FedAvgM never diverges at the thesis
    setting out of the box."""
    import inspect

    from fl_aggregators import FedAvgM

    chosen = json.loads(thesis.SWEEP.read_text())["chosen"]
    params = inspect.signature(FedAvgM).parameters
    assert (params["beta"].default, params["server_lr"].default) == (
        chosen["beta"],
        chosen["server_lr"],
    )


def test_the_sweep_chooses_on_validation_data_only() -> None:
    doc = json.loads(thesis.SWEEP.read_text())
    assert doc["runs"] and all(r["evaluated_on"] == "val" for r in doc["runs"])
    assert all(r["config"]["eval_data"] == "val" for r in doc["runs"])
    assert summarise(doc["runs"], [p["name"] for p in doc["pairs"]])["chosen"] == doc["chosen"]


def test_feature_noise_runs_are_keyed_by_the_noise_units() -> None:
    """Runs made when the noise was added after normalisation must not count as today's."""
    feature = thesis.record_key(thesis.run_config("feature", "fedavg", 0, OPTS))
    mixed = thesis.record_key(thesis.run_config("mixed", "fedavg", 0, OPTS))
    label = thesis.record_key(thesis.run_config("label", "fedavg", 0, OPTS))
    assert feature["noise_units"] == mixed["noise_units"] == "pixel"
    assert "noise_units" not in label


@pytest.mark.parametrize(
    ("variant", "needs_note"),
    [("fedloss-default", True), ("fedloss", False), ("fedavg", False)],
    ids=["bounded", "thesis-rule", "fedavg-trusting"],
)
def test_a_bounded_runs_record_must_say_when_its_bounds_acted(
    tmp_path: Path, variant: str, needs_note: bool
) -> None:
    cfg = thesis.run_config("label", variant, 0, OPTS)
    path = tmp_path / "seed0.json"
    path.write_text(json.dumps({"config": thesis.record_key(cfg), "accuracy": [0.5]}))
    assert (thesis.load_record(path, cfg) is None) == needs_note
    path.write_text(
        json.dumps({"config": thesis.record_key(cfg), "accuracy": [0.5], "bounded_rounds": []})
    )
    assert thesis.load_record(path, cfg) is not None


def test_the_bias_table_stands_only_on_runs_that_measured_the_figures() -> None:
    """Records written before the bias figures existed leave the report as it was; a run that
    measured them gets its cells, over the same final rounds as its final accuracy, and a run
    that measured them in only some of those rounds gets none rather than a partial mean."""
    from fedbalance_benchmarks.thesis_report import bias_table

    opts = {"scenarios": ["iid"], "aggregators": ["fedavg"]}
    old = {"scenario": "iid", "aggregator": "fedavg", "rounds": [1, 2], "accuracy": [0.5, 0.6]}
    assert bias_table([old], opts) == ""
    rounds = list(range(1, 8))
    figures = {
        "balanced_accuracy": [0.0, 0.0, 0.4, 0.5, 0.6, 0.7, 0.8],
        "worst_class_recall": [None] * 7,
        "client_acc_p10": [0.1] * 6 + [None],
    }
    new = {**old, "rounds": rounds, "accuracy": [0.5] * 7, "bias": figures}
    (line,) = [ln for ln in bias_table([new], opts).splitlines() if ln.startswith("| iid ")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells == ["iid", "fedavg", "50.00 (n = 1)", "60.00 (n = 1)", "-", "-"]
