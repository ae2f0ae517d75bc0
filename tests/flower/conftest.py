"""Flower's tests leave the user's home alone: Flower's files and telemetry, Hugging Face's cache.

Set at import, before any test module imports flwr or datasets (both read these once), and
inherited by every Flower process the tests start. ``run_deployment`` gives its processes a
``FLWR_HOME`` of their own on top. The simulations' actor count is set here too.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

_HOME = Path(tempfile.mkdtemp(prefix="fedbalance-flower-tests-"))
atexit.register(shutil.rmtree, _HOME, True)
os.environ.update(
    {
        "FLWR_HOME": str(_HOME / "flwr"),  # flwr writes a telemetry id file there
        "FLWR_TELEMETRY_ENABLED": "0",
        "HF_HOME": str(_HOME / "huggingface"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
    }
)
# One ClientApp actor per simulation unless the environment says otherwise: these runs are a
# few digits clients, and each further actor is a process that imports torch and loads the
# data (about 10 CPU-s). The shared FedLoss simulation (test_runs.py) keeps Flower's default.
os.environ.setdefault("FEDBALANCE_FLOWER_ACTORS", "1")


# -- runs several modules read (see flower_runs.py) -------------------------------------------
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402  (after the environment above, as flwr must read it first)
from flower_runs import ASTRAEA, FEDAVGM, finished  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402


@pytest.fixture
def flower_task() -> Iterator[None]:
    """The run, node and task ids a ServerApp process has: Flower 1.41 stamps them on every
    ``Message`` it builds."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture(scope="session")
def fedavgm_whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted simulation run of :data:`flower_runs.FEDAVGM` (its work directory)."""
    return finished(tmp_path_factory.mktemp("fedavgm-whole"), FEDAVGM)


@pytest.fixture(scope="session")
def fedavgm_first_round(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run stopped after round 1: its checkpoint holds round 1. Tests copy from it."""
    return finished(tmp_path_factory.mktemp("fedavgm-round1"), {**FEDAVGM, "rounds": 1})


@pytest.fixture(scope="session")
def astraea_whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulation run of :data:`flower_runs.ASTRAEA` (its work directory)."""
    return finished(tmp_path_factory.mktemp("astraea-whole"), ASTRAEA)
