"""Shared fixtures: isolate the plugin registry and keep torch's import warning quiet."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator

import pytest
import torch
from hypothesis import settings

# CI runs the same examples every time (a red build must be reproducible); locally hypothesis
# explores new ones on every run.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# One intra-op thread: tests start host processes beside the test process on 2 cores, and
# oversubscribed threads slow every one of them down.
torch.set_num_threads(1)

warnings.filterwarnings("ignore", message=".*pynvml.*", category=FutureWarning)


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    """Every test sees a registry built from the entry points as they are during the test."""
    from fl_adapters.registry import reset_registry

    reset_registry()
    yield
    reset_registry()
