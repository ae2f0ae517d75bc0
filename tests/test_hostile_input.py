"""Hostile and careless input, kept as regressions (issue: bounded memory, run directories never
clobbered, corrupted checkpoints refused).

Every command runs as a real ``fedbalance`` (or Python) process under a 1 GiB data limit
(``RLIMIT_DATA``: torch's shared libraries need address space, not data) and a time limit: a
case that tried to expand a YAML bomb, allocate a claimed 10^13-element array or recurse
without end would die of ``MemoryError`` or time out, not print its one line.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_adapters.checkpoint import Checkpoint, CheckpointError
from fl_adapters.experiment import json_line
from fl_adapters.inputs import InputError, load_json
from fl_aggregators import ClientUpdate, FedAvgM, FedLoss, FedLossN

FEDBALANCE = [sys.executable, "-m", "fl_adapters.cli"]
MEMORY = 1 << 30
SECONDS = 90
BASE = "framework: fedlab\ndataset: digits\naggregator: fedavg\nnum_clients: 4\nclients_per_round: 2\nrounds: 1\n"
BOMB = "".join(
    f"{k}: &{k} [{', '.join([f'*{p}'] * 10)}]\n" for p, k in zip("abcdefg", "bcdefgh", strict=True)
)
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + BOMB


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY, MEMORY))


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    return subprocess.run(
        argv, cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=SECONDS,
        preexec_fn=_limited,
    )  # fmt: skip


def refused(out: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2, no traceback, and one error line holding ``words``."""
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = [x for x in out.stderr.splitlines() if "error:" in x]
    assert len(lines) == 1 and len(lines[0]) < 600, out.stderr[-2000:]
    for word in words:
        assert word in lines[0], (word, lines[0])


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


# -- 1. bounded memory: configs and argument JSON --------------------------------------------
@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (BOMB.replace("aggregator", "x") + "aggregator_args: {x: *h}\n", ["more than 100,000"]),
        (BOMB + "partition: {beta: *h}\n", ["more than 100,000"]),
        ("rounds: 2\n", ["duplicate key 'rounds'"]),
        ("aggregator_args: {server_lr: .inf}\n", ["server_lr must be a finite float"]),
        ("seed: 1099511627776\n", ["seed must be an int in [0, 4294967295]"]),
        ("port: 999999\n", ["port must be an int in [1024, 65535]"]),
    ],
    ids=["bomb-aggregator-args", "bomb-partition", "duplicate-key", "inf", "seed", "port"],
)
def test_a_config_is_refused_in_one_line(tmp_path: Path, extra: str, words: list[str]) -> None:
    text = BASE.replace("aggregator: fedavg", "aggregator: fedavgm") + extra
    refused(run([*FEDBALANCE, "run", str(config(tmp_path, text)), "--check"], tmp_path), *words)


def test_numbers_read_as_written(tmp_path: Path) -> None:
    out = run([*FEDBALANCE, "run", str(config(tmp_path, BASE + "lr: 1e-3\n")), "--check"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]


def test_npy_in_a_run_config_says_what_it_is_for(tmp_path: Path) -> None:
    np.save(tmp_path / "labels.npy", np.arange(10) % 3)
    text = BASE.replace("dataset: digits", f"dataset: npy:{tmp_path / 'labels.npy'}")
    out = run([*FEDBALANCE, "run", str(config(tmp_path, text)), "--check"], tmp_path)
    refused(out, "serves `fedbalance partition`")


@pytest.mark.parametrize(
    ("counts", "words"),
    [("[" * 200_000 + "]" * 200_000, ["nested too deeply"]), (None, ["more than 1,000,000"])],
    ids=["deep", "too-many"],
)
def test_astraea_plan_counts_are_bounded(
    tmp_path: Path, counts: str | None, words: list[str]
) -> None:
    path = tmp_path / "counts.json"
    path.write_text(counts if counts is not None else json.dumps([[1] * 1001] * 1001))
    out = run([*FEDBALANCE, "astraea", "plan", "--class-counts", str(path)], tmp_path)
    refused(out, *words)


def test_a_deep_aggregator_args_variable_stops_fedlab_with_its_name(tmp_path: Path) -> None:
    out = run(
        [sys.executable, "-c", "import fedlab"], tmp_path,
        FEDBALANCE_AGGREGATOR="fedavg", FEDBALANCE_AGGREGATOR_ARGS="[" * 30_000 + "]" * 30_000,
    )  # fmt: skip
    assert out.returncode != 0
    assert "FEDBALANCE_AGGREGATOR_ARGS: nested too deeply to read" in out.stderr
    assert "RecursionError" not in out.stderr and "MemoryError" not in out.stderr


def test_off_words_switch_the_autoload_off_and_only_they(tmp_path: Path) -> None:
    probe = "import fl_adapters.autoload as a; print(a.disabled())"
    for value, disabled in [("false", False), ("OFF", False), ("no", False), ("1", True)]:
        out = run([sys.executable, "-c", probe], tmp_path, FEDBALANCE_DISABLE_HOST_AUTOLOAD=value)
        assert out.stdout.strip() == str(disabled), (value, out.stderr[-1000:])


def test_json_arguments_refuse_nan_infinity_and_overflow() -> None:
    for text, words in [
        ('{"a": NaN}', "NaN is not JSON"),
        ('{"a": Infinity}', "Infinity is not JSON"),
        ('{"a": 1e400}', "too large for a float"),
    ]:
        with pytest.raises(InputError, match=words):
            load_json(text, "aggregator-args")


# -- 2. run directories ------------------------------------------------------------------------
def test_a_fresh_run_never_clobbers_another_runs_records(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "metrics.jsonl").write_text('{"round": 1}\n')
    out = run([*FEDBALANCE, "run", str(config(tmp_path, BASE)), "--out", str(out_dir)], tmp_path)
    refused(out, "holds another run's records (metrics.jsonl)", "--overwrite")
    assert (out_dir / "metrics.jsonl").read_text() == '{"round": 1}\n'


def test_a_second_run_on_the_same_directory_is_refused_naming_the_first(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with open(out_dir / ".fedbalance.lock", "w") as lock:
        lock.write("pid 4242, started earlier")
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = run(
            [*FEDBALANCE, "run", str(config(tmp_path, BASE)), "--out", str(out_dir)], tmp_path
        )
    refused(out, "in use by another fedbalance run (pid 4242")


@pytest.mark.parametrize("target", ["/dev/full", "file"])
def test_run_out_must_be_a_directory(tmp_path: Path, target: str) -> None:
    path = target if target.startswith("/") else str(tmp_path / "a-file")
    Path(path).touch() if not target.startswith("/") else None
    out = run([*FEDBALANCE, "run", str(config(tmp_path, BASE)), "--out", path], tmp_path)
    refused(out, "is not a directory")


def test_a_record_that_cannot_be_written_stops_before_training(tmp_path: Path) -> None:
    out = run(
        [*FEDBALANCE, "run", str(config(tmp_path, BASE)), "--out", str(tmp_path / "o")],
        tmp_path, FEDBALANCE_RECORD="/dev/full",
    )  # fmt: skip
    refused(out, "FEDBALANCE_RECORD=/dev/full is not a regular file")
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("target", "words"), [("dir", "is a directory"), ("/dev/full", "cannot write")]
)
def test_partition_out_is_checked(tmp_path: Path, target: str, words: str) -> None:
    np.save(tmp_path / "labels.npy", np.arange(100) % 3)
    path = str(tmp_path) if target == "dir" else target
    argv = ["partition", "--dataset", f"npy:{tmp_path / 'labels.npy'}", "--scheme", "iid"]
    out = run([*FEDBALANCE, *argv, "--clients", "4", "--out", path], tmp_path)
    refused(out, words)


def test_an_npy_header_claiming_trillions_of_labels_is_not_allocated(tmp_path: Path) -> None:
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (10000000000000,), }"
    header = header.ljust(117) + "\n"
    raw = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
    (tmp_path / "huge.npy").write_bytes(raw + bytes(80))
    argv = ["partition", "--dataset", f"npy:{tmp_path / 'huge.npy'}", "--scheme", "iid"]
    out = run([*FEDBALANCE, *argv, "--clients", "4", "--out", str(tmp_path / "p.json")], tmp_path)
    refused(out, "cannot read labels")


# -- 3. checkpoints ----------------------------------------------------------------------------
def _checkpoint(model: object, **fields: object) -> Checkpoint:
    doc: dict = {"config": {}, "round": 1, "model": model, "aggregator": {"round": 1}}
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


def test_a_nan_checkpoint_is_not_resumed_by_fedbalance_run(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    _checkpoint(torch.full((4,), float("nan"))).save(out_dir / "checkpoint.pt")
    cfg = config(tmp_path, BASE)
    out = run([*FEDBALANCE, "run", str(cfg), "--out", str(out_dir), "--resume"], tmp_path)
    refused(out, "NaN or Inf")


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
