"""Flower's tests leave the user's home alone: Flower's files and telemetry, Hugging Face's cache.

Set at import, before any test module imports flwr or datasets (both read these once), and
inherited by every Flower process the tests start. ``run_deployment`` gives its processes a
``FLWR_HOME`` of their own on top.
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
