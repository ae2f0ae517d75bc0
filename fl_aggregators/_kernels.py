"""Compiled kernels (numba) for the weighted mean, the median and the finiteness check.

Each kernel takes every tensor of every client in one call, as raw addresses, so a
ResNet-18 round (122 tensors x K clients) costs one dispatch instead of thousands of torch
ops, and reads each client value exactly once:

- ``weighted_sum``: up to ``REGISTER_CLIENTS`` (16) clients, per 64-byte cache line of
  coordinates every client's values are weighted and added in float64 registers and the sum
  is rounded and written once (no accumulator in memory). More clients: per block of
  ``BLOCK`` values, a float64 accumulator in L1 that four clients at a time are added into;
  the block is rounded to the output dtype once.
- ``median``: Batcher's odd-even merge sort pruned to the comparators that reach the two
  middle wires (29 for 10 clients, 898 for 100), run on 32-byte registers of coordinates
  (8 float32 lanes) with one min and one max instruction per comparator. Up to
  ``REGISTER_CLIENTS`` (16) clients the whole network is unrolled in registers: each value
  is read once from its tensor and the median written, nothing in between. More clients:
  groups of 16 are sorted that way into a block buffer (one row of lanes per client), then
  the merging comparators run on whole rows there. NaN anywhere gives NaN, as
  ``numpy.median``; the mean of two middle values is taken in their dtype, as numpy does.
- ``any_nonfinite``: one read of every value.

The first two also report whether their output is all finite, so an aggregator learns that a
client sent NaN/Inf without another pass over the model.

Work is split across ``torch.get_num_threads()`` Python threads (the kernels release the
GIL), started per call, so nothing survives a ``fork`` and no thread pool of numba's is used.
Only float32 and float64 go through here; callers handle other dtypes with torch.

The numba code itself is :mod:`fl_aggregators._compiled`, imported (numba with it) by the first
aggregation (:func:`compiled`), so a process that never aggregates does not import numba.
Without numba, or with ``FEDBALANCE_KERNELS=0`` in the environment, :func:`available` is
false and :mod:`fl_aggregators.functional` falls back to its blocked torch code (slower, same
results up to float rounding).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fl_aggregators._networks import BLOCK, REGISTER_CLIENTS, _network

#: Most coordinates per block of the median; fewer for many clients (see :func:`median_block`).
MEDIAN_BLOCK = 512
#: Bytes of one median block (K rows of lanes) for many clients: the merging comparators run
#: in L2 (in L1 the rows get so short that the loop around each comparator dominates).
MEDIAN_BYTES = 192 << 10
#: Bytes between the median's rows beyond their lanes, so no two rows share an address
#: modulo 4 KiB (loads would wait on unrelated stores) or all sit in the same cache sets.
PAD = 64
#: Below this many values in all, one thread (starting threads costs more than it saves).
MIN_PARALLEL = 1 << 18

DTYPES = (torch.float32, torch.float64)


def takes(column: Sequence[torch.Tensor]) -> bool:
    """Whether the kernels can read these tensors: float32/float64, all in CPU memory (they
    read raw addresses, so a GPU tensor must never reach them)."""
    return column[0].dtype in DTYPES and all(t.is_cpu for t in column)


def available() -> bool:
    """Whether the compiled kernels are used (numba importable, not turned off); the first
    call that says yes imports them (:func:`compiled`)."""
    return os.environ.get("FEDBALANCE_KERNELS", "1") != "0" and compiled() is not None


@functools.cache
def compiled() -> Any:
    """The numba kernels (:mod:`fl_aggregators._compiled`), imported with numba on first use;
    ``None`` without numba."""
    try:
        import numba  # noqa: F401
    except ImportError:  # pragma: no cover - numba is a dependency; this is the documented fallback
        return None
    from fl_aggregators import _compiled

    return _compiled


# -- the Python side: addresses, work split, threads ------------------------------------------
def _check_column(column: Sequence[torch.Tensor]) -> None:
    """A column the kernels can read: clients present, one dtype they take, one size, CPU
    memory (the kernels trust all of it, so this check is what stands between a bad input
    and a read past a tensor's end)."""
    if not column:
        raise ValueError("a column needs at least one client's tensor")
    first = column[0]
    dtype, size = first.dtype, first.numel()
    if dtype not in DTYPES:
        raise ValueError(f"the kernels take float32 or float64 tensors in CPU memory, got {dtype}")
    for t in column:
        if not t.is_cpu:
            raise ValueError(
                f"the kernels take float32 or float64 tensors in CPU memory, got one on {t.device}"
            )
        if t.dtype != dtype or t.numel() != size:
            raise ValueError(
                f"tensors of one position must share dtype and size, got {t.dtype} x {t.numel()}"
                f" beside {dtype} x {size}"
            )


def _like(dtype: torch.dtype) -> np.ndarray:
    """An empty numpy array of ``dtype``: the kernels read their element type from it."""
    return np.empty(0, dtype=torch.empty(0, dtype=dtype).numpy().dtype)


def _contiguous(ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t if t.is_contiguous() else t.contiguous() for t in ts]


def _addresses(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    return np.fromiter((t.data_ptr() for t in tensors), dtype=np.uint64, count=len(tensors))


def _split(sizes: Sequence[int], parts: int) -> list[np.ndarray]:
    """``parts`` lists of segments ``(tensor, start, stop)`` holding about equal work."""
    bounds = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
    total = int(bounds[-1])
    out = []
    for r in range(parts):
        lo, hi = total * r // parts, total * (r + 1) // parts
        starts = np.maximum(bounds[:-1], lo)
        stops = np.minimum(bounds[1:], hi)
        keep = np.flatnonzero(stops > starts)
        segs = np.stack([keep, starts[keep] - bounds[keep], stops[keep] - bounds[keep]], axis=1)
        out.append(np.ascontiguousarray(segs, dtype=np.int64))
    return out


def _threads(total: int) -> int:
    return max(1, min(torch.get_num_threads(), total // MIN_PARALLEL))


def _run(call: Callable[[np.ndarray], bool], sizes: Sequence[int]) -> list[bool]:
    """``call(segments)`` on each thread's share of the work; the kernels' return values."""
    parts = _split(sizes, _threads(sum(sizes)))
    results = [False] * len(parts)
    errors: list[BaseException] = []

    def work(r: int) -> None:
        try:
            results[r] = call(parts[r])
        except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(1, len(parts))]
    for th in threads:
        th.start()
    work(0)
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results


class OutputPool:
    """An aggregator's previous outputs, handed out again once nobody else holds them.

    A fresh 47 MB model costs ~11,000 page faults (zero-filled by the OS) when the last
    round's memory has gone back to the OS; that is a third of a 10-client FedAvg round. Hosts
    copy the aggregate into their model and drop it, so last round's output tensors are
    usually free by the next round. A tensor is reused only if this pool holds the sole
    reference to it *and* to its storage (no other name, view, numpy array or state dict), so
    a result anyone kept is never overwritten. At most one round's outputs are held.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[torch.Size, torch.dtype], list[torch.Tensor]] = {}

    def empty_like(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor shaped as ``t`` (uninitialised): recycled if one is free."""
        stack = self._held.get((t.shape, t.dtype))
        while stack:
            if _sole_owner(stack):
                return stack.pop()
            stack.pop()  # someone kept it: let it go with them
        return torch.empty_like(t, memory_format=torch.contiguous_format)

    def hold(self, outs: Sequence[torch.Tensor]) -> None:
        """Keep this round's outputs for the next (dropping what was held before)."""
        self._held = {}
        for t in outs:
            self._held.setdefault((t.shape, t.dtype), []).append(t)


def _sole_owner(stack: list[torch.Tensor]) -> bool:
    """Whether ``stack[-1]`` is referenced only by ``stack`` (tensor and storage alike)."""
    # References to the tensor: the list's and getrefcount's argument. To its storage: the
    # tensor's and the temporary Python storage object's. Anything more is someone else's.
    if not RECYCLE or sys.getrefcount(stack[-1]) > 2:
        return False
    return bool(torch._C._storage_Use_Count(stack[-1].untyped_storage()._cdata) == 2)


#: Recycling trusts ``sys.getrefcount``, exact on CPython up to 3.13; 3.14 may count borrowed
#: references low (and other interpreters differently), so there outputs are always fresh.
RECYCLE = (
    sys.implementation.name == "cpython"
    and sys.version_info < (3, 14)
    and hasattr(torch._C, "_storage_Use_Count")
)


def _per_dtype(
    columns: Sequence[Sequence[torch.Tensor]],
    call: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], bool],
    pool: OutputPool | None = None,
) -> tuple[list[torch.Tensor], bool]:
    """New output tensors, one per column, filled by ``call(src, dst, like, segments)`` once
    per dtype (on each thread's share); and whether every output value is finite."""
    columns = [_contiguous(c) for c in columns]
    for c in columns:
        _check_column(c)
    if pool is None:
        outs = [torch.empty_like(c[0], memory_format=torch.contiguous_format) for c in columns]
    else:
        outs = [pool.empty_like(c[0]) for c in columns]
        pool.hold(outs)
    k = len(columns[0]) if columns else 0
    bad = False
    for dtype in DTYPES:
        idx = [j for j, c in enumerate(columns) if c[0].dtype == dtype]
        if not idx:
            continue
        src = np.stack([_addresses([columns[j][i] for j in idx]) for i in range(k)])
        dst = _addresses([outs[j] for j in idx])
        flags = _run(
            functools.partial(call, src, dst, _like(dtype)), [outs[j].numel() for j in idx]
        )
        bad = bad or any(flags)
    return outs, not bad


def weighted_sum(
    columns: Sequence[Sequence[torch.Tensor]],
    weights: np.ndarray,
    pool: OutputPool | None = None,
) -> tuple[list[torch.Tensor], bool]:
    """``sum_i weights[i] * column[i]`` for each column (one tensor per client, same dtype
    float32/float64 and shape), accumulated in float64, as new tensors of the column's dtype;
    and whether every output value is finite."""
    k = len(columns[0]) if columns else 0
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if w.shape != (k,):
        raise ValueError(f"need one weight per client ({k}), got shape {w.shape}")
    kernels = compiled()

    def call(src: np.ndarray, dst: np.ndarray, like: np.ndarray, segs: np.ndarray) -> bool:
        if k <= REGISTER_CLIENTS:
            return bool(
                kernels._weighted_sum_registers(src, dst, segs, w, np.empty(k, np.uint64), like)
            )
        return bool(kernels._weighted_sum(src, dst, segs, w, np.empty(BLOCK), like))

    return _per_dtype(columns, call, pool)


def median_network(k: int) -> np.ndarray:
    """Comparators ``(a, b, kind)`` after which wires ``(k-1)//2`` and ``k//2`` of ``k`` hold
    the two middle values: kind 0 sets ``a, b = min, max``, 1 only ``a = min``, 2 only
    ``b = max``. Batcher's sort pruned to what reaches those wires: 29 comparators for 10
    clients, 898 for 100."""
    return np.array(_network(k), dtype=np.int64).reshape(-1, 3)


def _aligned(shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """Zeros whose rows start on 64-byte cache lines (when a row is a whole number of lines):
    a register of lanes then never straddles two lines."""
    size = shape[0] * shape[1] * dtype.itemsize
    raw = np.zeros(size + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + size].view(dtype).reshape(shape)


def median_block(k: int, itemsize: int) -> int:
    """Coordinates per median block: ``k`` rows of them fill :data:`MEDIAN_BYTES` (at most
    :data:`MEDIAN_BLOCK`, at least 32), a whole number of 64-byte cache lines."""
    lanes = 64 // itemsize
    fit = MEDIAN_BYTES // (max(k, 1) * itemsize) // lanes * lanes
    return max(32, min(MEDIAN_BLOCK, fit))


def median(
    columns: Sequence[Sequence[torch.Tensor]], pool: OutputPool | None = None
) -> tuple[list[torch.Tensor], bool]:
    """Coordinate-wise median of each column (as ``numpy.median`` along the clients); and
    whether every output value is finite."""
    k = len(columns[0]) if columns else 0
    net = median_network(k)
    # Groups of REGISTER_CLIENTS sorted in registers first (a power of two: the first passes
    # of the sort), then the passes that merge them.
    cross = np.array(_network(k, REGISTER_CLIENTS), dtype=np.int64).reshape(-1, 3)
    lo, hi = (k - 1) // 2, k // 2
    kernels = compiled()

    def call(src: np.ndarray, dst: np.ndarray, like: np.ndarray, segs: np.ndarray) -> bool:
        m = median_block(k, like.itemsize)
        buf = _aligned((k, m + PAD // like.itemsize), like.dtype)
        table = np.empty(k, dtype=np.uint64)
        return bool(kernels._median(src, dst, segs, buf, table, net, cross, lo, hi, m))

    return _per_dtype(columns, call, pool)


def any_nonfinite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether any float32/float64 CPU tensor holds a NaN or Inf (others are skipped)."""
    for dtype in DTYPES:
        ts = _contiguous([t for t in tensors if t.dtype == dtype and t.is_cpu])
        if not ts:
            continue
        flags = _run(
            functools.partial(compiled()._nonfinite, _addresses(ts), _like(dtype)),
            [t.numel() for t in ts],
        )
        if any(flags):
            return True
    return False
