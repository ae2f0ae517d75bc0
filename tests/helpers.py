"""Helpers shared by the host tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fl_adapters.config import RunConfig


#: A record line's wall times: no two runs share them, so comparisons of runs leave them out.
WALL_TIMES = ("elapsed_s", "aggregate_s")


def records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a recorder or metrics file (empty when it does not exist), less their
    wall times (``elapsed_s``, ``aggregate_s``), which no two runs share."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        for key in WALL_TIMES:
            line.pop(key, None)
    return lines


def fedloss_weights(losses: list[float], clip: float = 5.0, peer: float = 1.0) -> list[float]:
    """FedLoss's default weights by hand: losses clipped at ``clip`` x the lower median, the
    top one at ``peer`` x the runner-up (three clients or more), normalised."""
    med = sorted(losses)[(len(losses) - 1) // 2]
    bounded = [min(x, clip * med) for x in losses]
    if len(bounded) >= 3:
        top = max(range(len(bounded)), key=bounded.__getitem__)
        bounded[top] = min(bounded[top], peer * sorted(bounded)[-2])
    return [x / sum(bounded) for x in bounded]


def check_fedloss_records(lines: list[dict[str, Any]], host: str, rounds: int) -> None:
    """A FedML run's aggregation record: rounds 1..``rounds``, two clients a round, each
    weighted by FedLoss's default rule from the validation loss it sent."""
    import pytest

    assert [r["round"] for r in lines] == list(range(1, rounds + 1)), lines
    for r in lines:
        assert r["host"] == host and r["aggregator"] == "fedloss" and r["rejected"] == []
        losses = [m["val_loss"] for m in r["metrics"]]
        assert len(losses) == 2 and all(x > 0 for x in losses)
        assert r["weights"] == pytest.approx(fedloss_weights(losses))


def digits_run(defaults: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
    """A small FedLab run on scikit-learn's digits (fast enough for CI): one local epoch of
    batches of 32, then a test module's ``defaults``, then one test's ``overrides``."""
    from fl_adapters.config import RunConfig

    fields: dict[str, Any] = dict(
        framework="fedlab", dataset="digits", local_epochs=1, batch_size=32
    )
    return RunConfig.from_dict({**fields, **defaults, **overrides})


def images_npz(path: Path, channels: int = 3, size: int = 20, classes: int = 4) -> Path:
    """A learnable ``.npz`` a user might bring (``npy:PATH``): ``channels`` x ``size`` x
    ``size`` uint8 images whose class is a bright band, with a test set of its own."""
    import numpy as np

    rng = np.random.default_rng(0)

    def split(n: int) -> tuple[Any, Any]:
        y = rng.integers(0, classes, n)
        x = rng.integers(0, 60, (n, channels, size, size), dtype=np.uint8)
        band = size // classes
        for c in range(classes):
            x[y == c, :, c * band : (c + 1) * band] += 150
        return x, y

    (x, y), (x_test, y_test) = split(400), split(100)
    np.savez(path, x_train=x, y_train=y, x_test=x_test, y_test=y_test)
    return path


def user_data_run(work: Path, framework: str) -> dict[str, Any]:
    """``fedbalance run`` of fedloss on :func:`images_npz` (3x20x20, 4 classes) with
    ``framework`` and a user's ``FEDBALANCE_RECORD``; its summary, after checking the
    checkpointed model is shaped for the data and the record is in both places."""
    import os
    import subprocess
    import sys

    import torch
    import yaml

    from fl_adapters.models import build_model

    data = images_npz(work / "mine.npz")
    config = {
        "framework": framework,
        "dataset": f"npy:{data}",
        "partition": {"name": "iid"},
        "aggregator": "fedloss",
        "num_clients": 4,
        "clients_per_round": 2,
        "rounds": 2,
        "local_epochs": 2,
        "lr": 0.01,
        "seed": 3,
    }
    (work / "run.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    env["FEDBALANCE_RECORD"] = str(work / "mine.jsonl")  # the user's own record
    argv = [sys.executable, "-m", "fl_adapters.cli", "run", "run.yaml", "--out", "out"]
    done = subprocess.run(argv + ["--no-progress"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # Every host writes the run's record under --out, and the user's file gets the same lines.
    lines = (work / "out" / "aggregations.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [1, 2]
    assert (work / "mine.jsonl").read_text().splitlines() == lines
    # Per-round wall time in the metrics rows, on every host.
    times = [
        json.loads(x)["elapsed_s"]
        for x in (work / "out" / "metrics.jsonl").read_text().split("\n")
        if x
    ]
    assert len(times) == 2 and 0 <= times[0] <= times[1], times
    model = torch.load(work / "out" / "checkpoint.pt", weights_only=True)["model"]
    values = model.values() if isinstance(model, dict) else [model]
    expected = build_model("thesis_cnn", in_channels=3, num_classes=4, image_size=20)
    assert sum(v.numel() for v in values) == sum(p.numel() for p in expected.parameters())
    summary: dict[str, Any] = json.loads((work / "out" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["config"]["dataset"] == f"npy:{data}"
    return summary


def check_bias_rows(out: Path, evaluated: int | None = None) -> None:
    """Every evaluated row of ``out``'s ``metrics.jsonl`` holds the bias figures, consistent
    with each other and with ``clients.jsonl``: the balanced accuracy is the mean of the present
    classes' recalls, the worst class their minimum, and the client summary is that of the
    round's line of client accuracies (``evaluated``: how many rows are evaluated)."""
    import numpy as np
    import pytest

    rows = [r for r in records(out / "metrics.jsonl") if "test_accuracy" in r]
    clients = {line["round"]: line["client_accuracy"] for line in records(out / "clients.jsonl")}
    assert rows and (evaluated is None or len(rows) == evaluated), rows
    assert sorted(clients) == [r["round"] for r in rows]
    for row in rows:
        present = [x for x in row["class_recall"] if x is not None]
        assert row["balanced_accuracy"] == pytest.approx(float(np.mean(present)))
        assert row["worst_class_recall"] == min(present)
        assert row["class_recall"][row["worst_class"]] == min(present)
        accs = np.array([a for a in clients[row["round"]].values() if a is not None])
        assert row["clients_evaluated"] == len(accs)
        assert row["client_acc_mean"] == pytest.approx(accs.mean())
        assert row["client_acc_min"] == pytest.approx(accs.min())
        assert row["client_acc_p10"] == pytest.approx(np.percentile(accs, 10))
        assert row["client_acc_p90"] == pytest.approx(np.percentile(accs, 90))
        if len(accs) > 1:
            assert row["client_acc_std"] == pytest.approx(accs.std(ddof=1))


# -- what every host's run leaves (tests/test_host_contract.py, tests/flower/test_cli.py) ------
#: The files of a finished ``fedbalance run``, on every host.
HOST_FILES = ("metrics.jsonl", "summary.json", "aggregations.jsonl", "checkpoint.pt")
#: The keys of every ``metrics.jsonl`` row, on every host (an evaluated row adds its
#: ``test_``/``val_`` accuracy).
HOST_ROW_KEYS = {"round", "clients", "weights", "rejected", "skipped"}
#: The keys of every ``summary.json`` (:func:`fl_adapters.experiment.run_summary`).
HOST_SUMMARY_KEYS = {
    "config", "rounds", "aggregated_rounds", "evaluated_on", "final_accuracy", "best_accuracy",
    "best_round", "elapsed_s",
}  # fmt: skip


def check_host_files(out: Path, rounds: int, host: str) -> None:
    """``out`` holds what every host's run of ``rounds`` rounds writes: the files, a row per
    round with the common keys and its accuracy, a record line per round from ``host``, the
    summary's keys, and a checkpoint of the last round that names ``host``."""
    from fl_adapters.checkpoint import Checkpoint

    assert sorted(p.name for p in out.iterdir() if p.name in HOST_FILES) == sorted(HOST_FILES)
    rows = records(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == list(range(1, rounds + 1))
    summary = json.loads((out / "summary.json").read_text())
    assert HOST_SUMMARY_KEYS <= set(summary), HOST_SUMMARY_KEYS - set(summary)
    prefix = "val" if summary["evaluated_on"] == "val" else "test"
    for row in rows:
        assert HOST_ROW_KEYS <= set(row), (HOST_ROW_KEYS - set(row), row)
        assert 0.0 <= row[f"{prefix}_accuracy"] <= 1.0
    assert summary["final_accuracy"] == rows[-1][f"{prefix}_accuracy"]
    lines = records(out / "aggregations.jsonl")
    assert [(r["round"], r["host"]) for r in lines] == [(r, host) for r in range(1, rounds + 1)]
    ckpt = Checkpoint.load(out / "checkpoint.pt")
    assert (ckpt.round, ckpt.host) == (rounds, host.split("-")[0])
