"""`make test-cuda` on a machine without a CUDA device stops at once and says so (it never
passes by skipping every test)."""

from __future__ import annotations

import pytest
import torch


def pytest_sessionstart(session: pytest.Session) -> None:
    if not torch.cuda.is_available():
        raise pytest.UsageError(
            f"tests/cuda needs a CUDA device; torch {torch.__version__} sees none "
            "(run `make test` for everything else)"
        )
