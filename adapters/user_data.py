"""Arrays a user brings: ``npy:PATH``.

* ``PATH.npy`` — a labels array: enough to partition (``fedbalance partition``), not to train.
* ``PATH.npz`` — an archive (``numpy.savez`` or ``savez_compressed``) with ``x_train``
  (N, H, W) or (N, C, H, W) square images, ``y_train`` (N,) integer labels, and optionally
  ``x_test`` / ``y_test`` for ``eval_data: test``. It partitions and trains on every host.

Images may be ``uint8`` (0-255, divided by 255) or floating point (taken as intensities,
e.g. in [0, 1]); both are then standardised with the training images' own mean and standard
deviation, and feature noise is given in the intensities' units (``pixel_scale``).

Nothing is unpickled, and every array's header is read before its data: an array whose
header claims more bytes than its member of the archive holds, or more than half of this
machine's memory, is refused before anything is allocated.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import IO

import numpy as np
import torch
from numpy.typing import NDArray

from fl_checks import FedbalanceError
from fl_partitions._limits import MAX_CLASSES

PREFIX = "npy:"
#: Channels an image may have (grey, grey + alpha, RGB, RGBA).
MAX_CHANNELS = 4
IMAGE_DTYPES = ("uint8", "float16", "float32", "float64")


class UserDataError(FedbalanceError, ValueError):
    """An ``npy:PATH`` file that cannot serve as asked; the message says what to give."""


def is_user_data(name: str) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def path_of(name: str) -> Path:
    path = Path(name[len(PREFIX) :])
    if not name[len(PREFIX) :]:
        raise UserDataError("dataset npy:PATH needs a path, e.g. npy:data/mine.npz")
    return path


def _memory_cap() -> int:
    """Half of this machine's physical memory, in bytes (no array may claim more)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 << 30


def _header(fh: IO[bytes], where: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
    except ValueError as e:
        raise UserDataError(f"{where}: not a .npy array ({e})") from None
    if dtype.hasobject:
        raise UserDataError(f"{where}: holds Python objects; fedbalance reads plain arrays only")
    return tuple(int(s) for s in shape), dtype


def _claimed_bytes(shape: tuple[int, ...], dtype: np.dtype, where: str, room: int) -> int:
    """The bytes the header claims, checked against the member's own size and against the
    memory loading it takes: the array and, for images, their float32 copy (an 8-bit archive
    of 3 GB is 15 GB once read), so an archive that inflates past this machine is refused
    before one byte of it is read."""
    claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if claimed > room:
        raise UserDataError(
            f"{where}: its header claims {claimed:,} bytes of data but the file holds {room:,}"
        )
    working = claimed + int(np.prod(shape, dtype=object)) * 4  # the float32 copy
    if working > _memory_cap():
        raise UserDataError(
            f"{where}: {claimed:,} bytes of data ({working:,} once read as float32) is more than "
            f"half of this machine's memory ({_memory_cap():,} bytes)"
        )
    return claimed


#: Zip compression methods numpy's savez and savez_compressed write (stored, deflated).
METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}


def _check_member(info: zipfile.ZipInfo, where: str) -> None:
    """A member numpy could have written: not encrypted, stored or deflated (anything else is
    refused before it is opened)."""
    if info.flag_bits & 0x1:
        raise UserDataError(f"{where}: the member is encrypted; give the arrays unencrypted")
    if info.compress_type not in METHODS:
        raise UserDataError(
            f"{where}: the member is compressed with zip method {info.compress_type}; "
            f"numpy.savez writes {' or '.join(METHODS.values())} members"
        )


def _read_npz(path: Path, keys: tuple[str, ...]) -> dict[str, NDArray]:
    """The arrays ``keys`` of archive ``path`` (absent keys are left out), headers checked
    against the archive's members before any data is read."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise UserDataError(f"cannot read {path} as an .npz archive: {e}") from None
    with archive:
        members = {
            info.filename.removesuffix(".npy"): info
            for info in archive.infolist()
            if info.filename.endswith(".npy")
        }
        out = {}
        for key in keys:
            if key not in members:
                continue
            info = members[key]
            where = f"{path}[{key}]"
            _check_member(info, where)
            try:
                with archive.open(info) as fh:
                    shape, dtype = _header(fh, where)
                _claimed_bytes(shape, dtype, where, info.file_size)
                with archive.open(info) as fh:
                    out[key] = np.lib.format.read_array(fh, allow_pickle=False)
            except (OSError, zipfile.BadZipFile, EOFError, NotImplementedError, RuntimeError) as e:
                raise UserDataError(f"{where}: cannot read it ({e})") from None
    return out


def read_labels_npy(path: Path) -> NDArray[np.int64]:
    """A bare ``.npy`` labels array (mapped, so a lying header fails before allocating)."""
    try:
        labels = np.load(path, allow_pickle=False, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise UserDataError(f"cannot read labels from {path}: {e}") from None
    return check_labels(np.array(labels), str(path))


def check_labels(y: NDArray, where: str) -> NDArray[np.int64]:
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise UserDataError(
            f"{where}: labels must be a 1-D integer array, got shape {y.shape} dtype {y.dtype}"
        )
    if y.size == 0:
        raise UserDataError(f"{where}: labels are empty")
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= MAX_CLASSES:
        raise UserDataError(
            f"{where}: labels must be class ids in [0, {MAX_CLASSES}), got values in "
            f"[{low}, {high}]"
        )
    return y.astype(np.int64)


def _check_images(x: NDArray, n: int, where: str) -> NDArray:
    given = x.shape
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4 or x.shape[0] != n or x.shape[2] != x.shape[3]:
        raise UserDataError(
            f"{where}: images must be (N, H, W) or (N, C, H, W) with H == W and N = {n} "
            f"labels, got shape {given}"
        )
    if not 1 <= x.shape[1] <= MAX_CHANNELS:
        raise UserDataError(
            f"{where}: images must have 1 to {MAX_CHANNELS} channels, got {x.shape[1]}"
        )
    if x.dtype.name not in IMAGE_DTYPES:
        raise UserDataError(
            f"{where}: images must be one of {', '.join(IMAGE_DTYPES)}, got {x.dtype}"
        )
    if x.dtype != np.uint8 and not np.isfinite(x).all():
        raise UserDataError(f"{where}: images hold NaN or infinite values")
    limit = float(np.finfo(np.float32).max)
    if x.dtype == np.float64 and x.size and float(np.abs(x).max()) > limit:
        raise UserDataError(
            f"{where}: pixel values reach {float(np.abs(x).max()):.3g}, beyond float32's range "
            f"({limit:.3g}) that training uses; rescale the images"
        )
    return x


def _standardised(x: NDArray) -> tuple[torch.Tensor, float, float]:
    """``x`` as float32 (8-bit images scaled to [0, 1]), its mean and std (n - 1) in float64.

    The statistics are summed in float64 a block of images at a time, so reading an archive
    takes the float32 copy and no more (a whole float64 copy was twice that again)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if x.dtype == np.uint8:
        t.div_(255.0)
    flat = t.reshape(len(t), -1)
    n, step = flat.numel(), max(1, (1 << 24) // max(1, flat.shape[1]))
    blocks = [flat[i : i + step] for i in range(0, len(flat), step)]
    mean = sum(float(b.double().sum()) for b in blocks) / max(1, n)
    ss = sum(float((b.double() - mean).square().sum()) for b in blocks)
    return t, mean, (ss / (n - 1)) ** 0.5 if n > 1 else float("nan")


def read_npz(path: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Images (standardised by the training images' statistics), labels and ``pixel_scale``."""
    if path.suffix != ".npz":
        raise UserDataError(
            f"dataset npy:{path}: a .npy file holds labels only, which serve `fedbalance "
            "partition`; to train, give an .npz archive with x_train and y_train (and x_test, "
            "y_test for eval_data: test), e.g. numpy.savez('mine.npz', x_train=..., y_train=...)"
        )
    keys = ("x_train", "y_train") if train else ("x_train", "x_test", "y_test")
    arrays = _read_npz(path, keys)
    missing = [k for k in keys if k not in arrays]
    if missing:
        need = "x_test and y_test (for eval_data: test)" if not train else "x_train and y_train"
        raise UserDataError(f"{path}: the archive has no {', '.join(missing)}; it needs {need}")
    split = "train" if train else "test"
    y = check_labels(arrays[f"y_{split}"], f"{path}[y_{split}]")
    x_train = _check_images(
        arrays["x_train"], len(y) if train else len(arrays["x_train"]), f"{path}[x_train]"
    )
    images, mean, std = _standardised(x_train)
    if not train:
        x_test = _check_images(arrays["x_test"], len(y), f"{path}[x_test]")
        if x_test.shape[1:] != x_train.shape[1:] or x_test.dtype != x_train.dtype:
            raise UserDataError(
                f"{path}: x_test is {x_test.dtype} {x_test.shape[1:]} per image but x_train "
                f"is {x_train.dtype} {x_train.shape[1:]}"
            )
        images = _standardised(x_test)[0]
    if not std > 0:
        raise UserDataError(f"{path}[x_train]: every pixel has the same value")
    return images.sub_(mean).div_(std), torch.from_numpy(y), 1.0 / std  # in place: no copy


def read_labels(path: Path) -> NDArray[np.int64]:
    """The training labels of ``npy:PATH``: the ``.npy`` array itself, or an archive's
    ``y_train``."""
    if path.suffix != ".npz":
        return read_labels_npy(path)
    arrays = _read_npz(path, ("y_train",))
    if "y_train" not in arrays:
        raise UserDataError(f"{path}: the archive has no y_train (the training labels)")
    return check_labels(arrays["y_train"], f"{path}[y_train]")
