"""Every partitioner gives the committed partitions under this environment's numpy (1.26 here;
``tests/flower/test_partitions_under_numpy2.py`` checks numpy 2.x against the same digests)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from partition_digests import GOLDEN, digests


def test_partitions_equal_the_committed_digests() -> None:
    golden = json.loads(GOLDEN.read_text())["digests"]
    got = digests()
    assert set(got) == set(golden)
    differ = sorted(k for k in golden if got[k] != golden[k])
    assert not differ, f"numpy {np.__version__} partitions differently: {differ}"


@pytest.mark.parametrize(
    ("label_seed", "expected"),
    [(3, [2103, 1051, 701, 525, 420, 350, 300, 262, 233, 210])],
    ids=["class-2-exactly-701"],
)
def test_global_imbalance_floors_exact_integers_up(label_seed: int, expected: list[int]) -> None:
    """Zipf's class 2 needs exactly 701 samples here; in floats ``p * total`` is 701 - 1e-13,
    which a plain floor turned into 700 on one numpy and 701 on another."""
    from fl_partitions.global_imbalance import GlobalImbalance

    labels = np.random.default_rng(label_seed).integers(0, 10, 20_000)
    counts = GlobalImbalance().target_counts(np.bincount(labels, minlength=10))
    assert counts.tolist() == expected
