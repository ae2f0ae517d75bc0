"""Reading Flower's serialised arrays: the fast path gives exactly what ``Array.numpy`` gives."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fl_adapters.flower.payload import to_numpy, to_state_dict

CASES = {
    "float32 matrix": np.arange(12, dtype=np.float32).reshape(3, 4),
    "float64 vector": np.linspace(-1, 1, 7),
    "int64 counter (0-d)": np.array(5, dtype=np.int64),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "bool": np.array([True, False, True]),
    "fortran order": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    "big-endian": np.arange(4, dtype=">f4"),
    "non-contiguous slice": np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2],
}


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_to_numpy_equals_flowers_own_reading(values: np.ndarray) -> None:
    array = Array(values)
    ours, flowers = to_numpy(array), array.numpy()
    assert ours.dtype == flowers.dtype and ours.shape == flowers.shape
    np.testing.assert_array_equal(ours, flowers)
    np.testing.assert_array_equal(ours, values)


def test_state_dict_tensors_are_writable_copies() -> None:
    record = ArrayRecord({"w": Array(np.ones((2, 2), dtype=np.float32))})
    state = to_state_dict(record)
    state["w"] += 1  # owns its memory: the message's bytes stay as they were
    np.testing.assert_array_equal(record["w"].numpy(), np.ones((2, 2), dtype=np.float32))
