"""The Flower page's whole local deployment (``docs/hosts/flower.md``, the block marked
``flower-deployment``), run as it stands with bash in a copy of the quickstart-shaped app
(``tests/hosts/flower_quickstart``: Flower Datasets' dict samples, the template's own training):
the SuperLink, two SuperNodes, the connection entry and ``flwr run``, all on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fl_adapters.run.processes import kill_all, matching

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "hosts" / "flower.md"
APP = ROOT / "tests" / "hosts" / "flower_quickstart"


def block() -> str:
    (code,) = re.findall(
        r"<!-- test: flower-deployment -->\n```bash\n(.*?)\n```", PAGE.read_text(), re.S
    )
    return code


@pytest.mark.slow
def test_the_documented_deployment_runs_the_quickstart_with_fedloss(tmp_path: Path) -> None:
    app = tmp_path / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    record = tmp_path / "record.jsonl"
    # A loaded machine starts the SuperLink late (CI's took over 5 s): this one waits 8 s
    # before Flower's own starts, so the block must wait for it rather than for a fixed time.
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    superlink = slow / "flower-superlink"
    real = Path(sys.executable).parent / "flower-superlink"
    superlink.write_text(f'#!/bin/bash\nsleep 8\nexec "{real}" "$@"\n')
    superlink.chmod(0o755)
    env = {
        **os.environ,
        "FLWR_HOME": str(tmp_path / "flwr-home"),  # never the user's ~/.flwr
        "FEDBALANCE_RECORD": str(record),
        "PATH": os.pathsep.join(
            [str(slow), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
        ),
    }
    try:
        out = subprocess.run(
            ["bash", "-e", "-c", block()],
            cwd=app,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            start_new_session=True,
        )
    finally:  # the block's trap stops its jobs; whatever Flower started below them goes too
        kill_all(matching([f"127.0.0.1:{p} " for p in (9100, 9101, 9102)] + ["--port 9100 "]))
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "Exit Code" not in log, log[-3000:]  # Flower's word for a ServerApp that failed
    # Flower Datasets' dict samples in DataLoaders, read by train_reply: FedLoss applied
    (row,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert row["aggregator"] == "fedloss" and not row["skipped"] and not row["rejected"]
    assert [sorted(m) for m in row["metrics"]] == [["val_loss"], ["val_loss"]]
    assert sum(row["weights"]) == pytest.approx(1.0) and min(row["weights"]) > 0
    # the banner says the weighing used, not FedAvg's "Weighted by: 'num-examples'" for training
    assert "Train replies weighed by: fedbalance 'fedloss' (reads 'val_loss'" in log
    assert "aggregate_train: Received 2 results and 0 failures" in log
    # evaluate_reply's class counts: the strategy's bias figures, logged for the round
    assert re.search(r"evaluate round 1: balanced accuracy 0\.\d+, worst class \d", log), log[
        -3000:
    ]
