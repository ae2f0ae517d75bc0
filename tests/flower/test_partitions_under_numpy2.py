"""Flower's environment (numpy 2.x) partitions exactly as the main one (numpy 1.26): the
committed digests of ``tests/partition_digests.py`` hold here too."""

from __future__ import annotations

import numpy as np
from test_partition_numpy import test_partitions_equal_the_committed_digests

__all__ = ["test_partitions_equal_the_committed_digests"]


def test_this_environment_has_numpy_2() -> None:
    """Otherwise the comparison above would not compare two numpy releases."""
    assert int(np.__version__.split(".")[0]) >= 2, np.__version__
