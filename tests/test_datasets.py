"""The bundled datasets' loaders: scikit-learn's digits, read as scikit-learn reads them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from fl_adapters.datasets import digits_arrays


def test_digits_are_scikit_learns_to_the_bit() -> None:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images, targets = digits_arrays()
    assert images.dtype == bunch.images.dtype and np.array_equal(images, bunch.images)
    assert np.array_equal(targets, bunch.target) and targets.dtype == np.int64


def test_loading_digits_does_not_import_scikit_learn() -> None:
    # Every client process that trains on digits loads them; the import alone took ~1.4 s.
    code = (
        "import sys\n"
        "from fl_adapters.datasets import load_dataset\n"
        "assert len(load_dataset('digits', train=True)) + len(load_dataset('digits', False)) == 1797\n"
        "print('sklearn' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
