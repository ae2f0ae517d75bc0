"""``npy:PATH``: arrays a user brings, partitioned and trained on as the built-in datasets are.

The hostile cases (labels-only files in a run, missing test arrays, lying headers, shapes
that do not match) are in :mod:`fedbalance_benchmarks.hostile`'s list.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import images_npz, user_data_run

from fl_adapters.datasets import image_spec, load_dataset, load_labels
from fl_adapters.user_data import UserDataError


def test_an_archive_loads_standardised_with_its_own_statistics(tmp_path: Path) -> None:
    path = images_npz(tmp_path / "mine.npz")
    name = f"npy:{path}"
    train, test = load_dataset(name, train=True), load_dataset(name, train=False)
    raw = np.load(path)
    assert train.x.shape == (400, 3, 20, 20) and test.x.shape == (100, 3, 20, 20)
    assert abs(float(train.x.mean())) < 1e-5 and float(train.x.std()) == pytest.approx(1, 1e-4)
    # The test images are standardised with the training statistics, not their own.
    pixels = raw["x_train"].astype(np.float64) / 255
    expected = (raw["x_test"][0, 0, 0, 0] / 255 - pixels.mean()) / pixels.std(ddof=1)
    assert float(test.x[0, 0, 0, 0]) == pytest.approx(expected, abs=1e-5)
    assert train.pixel_scale == pytest.approx(1 / pixels.std(ddof=1), rel=1e-5)
    assert image_spec(name) == (3, 20, 4)
    assert (load_labels(name) == raw["y_train"]).all()


@pytest.mark.parametrize(
    ("arrays", "words"),
    [
        ({"x_train": np.zeros((4, 20, 20), object), "y_train": np.arange(4)}, "Python objects"),
        ({"x_train": np.full((4, 20, 20), np.nan), "y_train": np.arange(4)}, "NaN"),
        ({"x_train": np.zeros((4, 20, 20), np.uint8), "y_train": -np.arange(4)}, "[-3, 0]"),
        ({"x_train": np.zeros((4, 20, 16), np.uint8), "y_train": np.arange(4)}, "H == W"),
        ({"x_train": np.zeros((4, 5, 20, 20), np.uint8), "y_train": np.arange(4)}, "1 to 4"),
        ({"x_train": np.zeros((4, 20, 20), np.int32), "y_train": np.arange(4)}, "got int32"),
        ({"x_train": np.zeros((4, 20, 20), np.uint8), "y_train": np.arange(4)}, "same value"),
        ({"x_train": np.zeros((4, 20, 20), np.uint8)}, "no y_train"),
        ({"x_train": np.full((4, 20, 20), 1e300), "y_train": np.arange(4)}, "beyond float32's"),
    ],
    ids=["objects", "nan", "negative-labels", "not-square", "channels", "dtype", "flat",
         "no-labels", "beyond-float32"],
)  # fmt: skip
def test_unusable_archives_are_refused_naming_the_array(
    tmp_path: Path, arrays: dict[str, np.ndarray], words: str
) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(UserDataError) as e:
        load_dataset(f"npy:{path}", train=True)
    assert words in str(e.value), str(e.value)


def test_a_model_too_big_for_the_images_is_refused(tmp_path: Path) -> None:
    from fl_adapters.models import model_for

    path = images_npz(tmp_path / "small.npz", size=14)
    with pytest.raises(ValueError, match="at least 16x16 pixels, got 14x14"):
        model_for("thesis_cnn", f"npy:{path}")
    logits = model_for("astraea_cnn", f"npy:{path}")(load_dataset(f"npy:{path}").x[:2])
    assert logits.shape == (2, 4)


def test_an_archive_trains_on_fedlab(tmp_path: Path) -> None:
    summary = user_data_run(tmp_path, "fedlab")
    assert summary["best_accuracy"] > 0.6  # chance is 0.25: the images and labels arrived


@pytest.mark.slow
def test_an_archive_trains_on_fedml_sp(tmp_path: Path) -> None:
    summary = user_data_run(tmp_path, "fedml-sp")
    assert summary["best_accuracy"] > 0.6


def patched_members(path: Path, *, flags: int = 0, method: int | None = None) -> None:
    """Set every member's general-purpose flags and compression method in both its local and
    its central header, as another zip tool would have written them."""
    data = bytearray(path.read_bytes())
    for signature, flag_at, method_at in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
        start = data.find(signature)
        while start != -1:
            data[start + flag_at] |= flags
            if method is not None:
                data[start + method_at : start + method_at + 2] = method.to_bytes(2, "little")
            start = data.find(signature, start + 4)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("patch", "words"),
    [
        ({"flags": 0x1}, "[x_train]: the member is encrypted; give the arrays unencrypted"),
        ({"method": 99}, "[x_train]: the member is compressed with zip method 99; numpy.savez"),
    ],
    ids=["encrypted", "unknown-method"],
)
def test_members_numpy_never_writes_are_refused_before_reading(
    tmp_path: Path, patch: dict, words: str
) -> None:
    path = tmp_path / "odd.npz"
    np.savez(path, x_train=np.ones((4, 8, 8), np.uint8), y_train=np.arange(4))
    patched_members(path, **patch)
    with pytest.raises(UserDataError) as e:
        load_dataset(f"npy:{path}", train=True)
    assert words in str(e.value)


def test_an_archive_larger_than_memory_once_read_is_refused_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small compressed member can inflate to gigabytes; what it takes once read (the array
    and its float32 copy) is checked against the memory before any of it is read."""
    import fl_adapters.user_data as user_data

    path = tmp_path / "zeros.npz"
    np.savez_compressed(path, x_train=np.zeros((64, 16, 16), np.uint8), y_train=np.arange(64))
    assert path.stat().st_size < 2_000  # 16,384 pixels that deflate to almost nothing
    monkeypatch.setattr(user_data, "_memory_cap", lambda: 40_000)  # > 16,384, < 5 x 16,384
    with pytest.raises(UserDataError) as e:
        load_dataset(f"npy:{path}", train=True)
    assert "[x_train]: 16,384 bytes of data (81,920 once read as float32) is more than" in str(
        e.value
    )


def test_check_refuses_images_the_model_cannot_take_as_the_run_does(tmp_path: Path) -> None:
    from fl_adapters.config import RunConfig
    from fl_adapters.experiment import check

    path = images_npz(tmp_path / "tiny.npz", size=1)
    config = RunConfig.from_dict(
        {"framework": "fedlab", "dataset": f"npy:{path}", "num_clients": 2, "clients_per_round": 2}
    )
    with pytest.raises(ValueError, match="1x1"):
        check(config)
