"""``npy:PATH`` on Flower: an archive of 3x20x20 images in 4 classes trains in a simulation,
the server's and the clients' models shaped for it (the FedLab and FedML runs are in
``tests/test_user_data.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import user_data_run


@pytest.mark.slow
def test_an_archive_trains_on_flower(tmp_path: Path) -> None:
    summary = user_data_run(tmp_path, "flower")
    assert summary["best_accuracy"] > 0.6  # chance is 0.25: the images and labels arrived
