"""Run configs are validated at the boundary: every error names the field, range and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from fl_adapters.cli import main
from fl_adapters.config import ConfigError, RunConfig

#: A run's bad split: the partitioners' wording (``fl_checks.check_fractions``), and
#: a run needs a train share.
SPLIT = "split must be 3 non-negative fractions [train, val, test] summing to 1 with train > 0"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("framework", "flwr", "framework must be one of fedlab, fedlab-distributed"),
        ("rounds", 0, "rounds must be an int >= 1, got 0"),
        ("rounds", 2.5, "rounds must be an int >= 1, got 2.5"),
        ("lr", -0.1, "lr must be a finite float > 0, got -0.1"),
        ("lr", float("nan"), "lr must be a finite float > 0, got nan"),
        ("clients_per_round", 31, "clients_per_round must be between 1 and num_clients=30, got 31"),
        ("optimizer", "adagrad", "optimizer must be one of adam, sgd; got 'adagrad'"),
        ("dataset", "imagenet", "dataset must be one of fmnist, digits"),
        ("split", [0.5, 0.5], SPLIT + ", got [0.5, 0.5]"),
        ("split", [float("nan"), 0.5, 0.5], SPLIT + ", got [nan, 0.5, 0.5]"),
        ("split", [0, 0.5, 0.5], SPLIT + ", got [0, 0.5, 0.5]"),
        ("split", [True, 0, 0], SPLIT + ", got [True, 0, 0]"),
        ("split", ["0.7", 0.1, 0.2], SPLIT + ", got ['0.7', 0.1, 0.2]"),
        ("partition", 3, "partition must be a mapping with a 'name', got 3"),
        ("aggregator_args", [1], "aggregator_args must be a mapping, got [1]"),
        ("batch_size", True, "batch_size must be an int >= 1, got True"),
        ("eval_every", 0, "eval_every must be an int >= 1, got 0"),
    ],
    ids=lambda v: str(v)[:20],
)
def test_bad_field_names_field_range_and_value(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({field: value})
    assert message in str(err.value)


def test_numbers_given_from_python_are_kept_as_the_plain_numbers_yaml_holds() -> None:
    import numpy as np
    import yaml

    cfg = RunConfig(rounds=np.int64(3), lr=np.float32(0.5), seed=np.int32(2), port=np.int64(2000))
    doc = cfg.to_dict()
    assert [type(doc[k]) for k in ("rounds", "lr", "seed", "port")] == [int, float, int, int]
    assert RunConfig.from_dict(yaml.safe_load(yaml.safe_dump(doc))) == cfg


def test_flower_evaluates_on_the_clients() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"framework": "flower", "eval_data": "test"})
    assert "eval_data must be clients for flower (Flower evaluates on the" in str(err.value)
    cfg = RunConfig.from_dict({"framework": "flower", "eval_every": 2, "eval_fraction": 0.5})
    assert (cfg.eval_every, cfg.eval_fraction) == (2, 0.5)


#: The one wording of a bad eval_fraction on every host (fl_adapters.config.check_eval_keys).
SHARE = "eval_fraction must be a number in (0, 1] (the share of clients evaluated)"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        *[
            ({"eval_fraction": bad}, f"{SHARE}, got {shown}")
            for bad, shown in [(0, "0"), (1.5, "1.5"), (float("nan"), "nan"), ("half", "'half'")]
        ],
        (
            {"eval_fraction": 0.5, "eval_data": "test"},
            "eval_fraction samples clients: it is for eval_data: clients or val",
        ),
        (
            {"eval_fraction": 0.5, "framework": "fedml-mpi"},
            "eval_fraction must be 1 for fedml-mpi: FedML's server tests the global test set",
        ),
    ],
    ids=["zero", "above-one", "nan", "string", "test-set", "fedml"],
)
def test_eval_fraction_is_a_share_of_clients_where_the_host_can_sample(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(change)
    assert message in str(err.value)


def test_evaluated_clients_are_a_seeded_draw_of_their_own() -> None:
    """The same clients for a seed and round on every host; all of them at fraction 1; the
    last round always evaluated."""
    from fl_adapters._training import evaluated_clients, evaluates

    assert evaluated_clients(5, 1.0, 0, 3) == [0, 1, 2, 3, 4]
    drawn = evaluated_clients(1000, 0.05, 7, 3)
    assert drawn == sorted(drawn) and len(set(drawn)) == 50 and max(drawn) < 1000
    assert drawn == evaluated_clients(1000, 0.05, 7, 3)
    assert drawn != evaluated_clients(1000, 0.05, 7, 4) != evaluated_clients(1000, 0.05, 8, 3)
    assert evaluated_clients(3, 0.01, 0, 1) != []  # at least one client
    assert [r for r in range(1, 8) if evaluates(r, 3, 7)] == [3, 6, 7]
    assert [r for r in range(1, 5) if evaluates(r, 2, None)] == [2, 4]


def test_unknown_keys_are_rejected_with_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) 'round'; allowed: .*rounds"):
        RunConfig.from_dict({"round": 5})


def test_defaults_are_the_thesis_setting() -> None:
    cfg = RunConfig()
    assert (cfg.num_clients, cfg.clients_per_round, cfg.rounds, cfg.local_epochs) == (30, 5, 50, 10)
    assert (cfg.optimizer, cfg.lr, cfg.batch_size, cfg.split) == ("adam", 1e-3, 64, [0.7, 0.1, 0.2])


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("rounds: -3\n", "rounds must be an int >= 1, got -3"),
        ("aggregator: fedlos\n", "did you mean 'fedloss'?"),
        (
            "aggregator: fedavgm\naggregator_args: {beta: 2}\n",
            "beta must be a finite float in [0, 1), got 2",
        ),
        ("- just\n- a list\n", "a run config must be a mapping, got list"),
        ("rounds: [\n", "not valid YAML"),
    ],
    ids=["negative-rounds", "typo", "bad-aggregator-arg", "not-a-mapping", "bad-yaml"],
)
def test_fedbalance_run_exits_2_before_any_work(
    tmp_path: Path, capsys, yaml_text: str, message: str
) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dataset: digits\n" + yaml_text if not yaml_text.startswith("-") else yaml_text)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_eval_data_val_is_fedlabs_tuning_split() -> None:
    """``eval_data: val`` (a sweep's score) is a FedLab choice; FedML reports its own test."""
    assert RunConfig.from_dict({"eval_data": "val"}).eval_data == "val"
    with pytest.raises(ConfigError, match="eval_data: val is for the FedLab frameworks"):
        RunConfig.from_dict({"framework": "fedml-sp", "eval_data": "val"})


def test_a_val_run_scores_on_the_validation_splits_only(tmp_path: Path) -> None:
    """The rows carry ``val_*`` and no ``test_*`` metric, and the summary says what it read."""
    import json

    from helpers import digits_run

    from fl_adapters.fedlab.runner import run_standalone

    cfg = digits_run(
        {}, {"num_clients": 4, "clients_per_round": 2, "rounds": 2, "eval_data": "val"}
    )
    summary = run_standalone(cfg, tmp_path, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all("val_accuracy" in r and "test_accuracy" not in r for r in rows)
    assert summary["evaluated_on"] == "val"
    assert summary["final_accuracy"] == rows[-1]["val_accuracy"]
    from fl_adapters.datasets import load_digits  # the splits it read: 10 % each

    assert rows[0]["val_samples"] < 0.2 * len(load_digits(train=True))
