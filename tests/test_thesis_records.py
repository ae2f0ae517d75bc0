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
