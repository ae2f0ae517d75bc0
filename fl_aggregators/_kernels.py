"""Compiled kernels (numba) for the weighted mean, the median and the finiteness check.

Each kernel takes every tensor of every client in one call, as raw addresses, so a
ResNet-18 round (122 tensors x K clients) costs one dispatch instead of thousands of torch
ops, and reads each client value exactly once:

- ``weighted_sum``: per block of ``BLOCK`` values, a float64 accumulator in L1 that four
  clients at a time are added into; the block is rounded to the output dtype once.
- ``median``: per block of ``MEDIAN_BLOCK`` coordinates, the K client values (padded with
  +inf to a power of two P) are sorted along the clients by a bitonic network of
  ``minimum``/``maximum`` steps that run vectorised across the coordinates; NaN anywhere
  gives NaN, as ``numpy.median``.
- ``any_nonfinite``: one read of every value.

The first two also report whether their output is all finite, so an aggregator learns that a
client sent NaN/Inf without another pass over the model.

Work is split across ``torch.get_num_threads()`` Python threads (the kernels release the
GIL), started per call, so nothing survives a ``fork`` and no thread pool of numba's is used.
Only float32 and float64 go through here; callers handle other dtypes with torch.

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

try:
    import numba
    from numba import types
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover - numba is a dependency; this is the documented fallback
    numba = None  # type: ignore[assignment]

#: Values per block of the weighted sum: the float64 accumulator (32 KiB) stays in L1/L2.
BLOCK = 4096
#: Coordinates per block of the median: P x 64 values are sorted in place (32 KiB for
#: float32 and 128 clients), so the network runs in L1/L2.
MEDIAN_BLOCK = 64
#: Below this many values in all, one thread (starting threads costs more than it saves).
MIN_PARALLEL = 1 << 18

DTYPES = (torch.float32, torch.float64)


def takes(column: Sequence[torch.Tensor]) -> bool:
    """Whether the kernels can read these tensors: float32/float64, all in CPU memory (they
    read raw addresses, so a GPU tensor must never reach them)."""
    return column[0].dtype in DTYPES and all(t.is_cpu for t in column)


def available() -> bool:
    """Whether the compiled kernels are used (numba importable, not turned off)."""
    return numba is not None and os.environ.get("FEDBALANCE_KERNELS", "1") != "0"


if numba is not None:

    @intrinsic
    def _ptr(typingctx: Any, addr: Any, like: Any) -> Any:
        """The integer ``addr`` as a pointer to ``like``'s dtype (for ``numba.carray``)."""
        sig = types.CPointer(like.dtype)(addr, like)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    @numba.njit(nogil=True, cache=True)
    def _weighted_sum(src, dst, segs, w, acc, like):
        """``dst[t][s:e] = sum_i w[i] * src[i, t][s:e]`` for each segment ``(t, s, e)``;
        returns whether any output value is NaN or Inf."""
        k = src.shape[0]
        size = like.itemsize
        top = np.float64(np.finfo(like.dtype).max)
        bad = False
        for q in range(segs.shape[0]):
            t, s, e = segs[q, 0], segs[q, 1], segs[q, 2]
            b = s
            while b < e:
                n = min(BLOCK, e - b)
                off = b * size
                x = numba.carray(_ptr(src[0, t] + off, like), n)
                w0 = w[0]
                for j in range(n):
                    acc[j] = w0 * np.float64(x[j])
                i = 1
                while i + 4 <= k:
                    x1 = numba.carray(_ptr(src[i, t] + off, like), n)
                    x2 = numba.carray(_ptr(src[i + 1, t] + off, like), n)
                    x3 = numba.carray(_ptr(src[i + 2, t] + off, like), n)
                    x4 = numba.carray(_ptr(src[i + 3, t] + off, like), n)
                    w1, w2, w3, w4 = w[i], w[i + 1], w[i + 2], w[i + 3]
                    for j in range(n):
                        acc[j] += (w1 * np.float64(x1[j]) + w2 * np.float64(x2[j])) + (
                            w3 * np.float64(x3[j]) + w4 * np.float64(x4[j])
                        )
                    i += 4
                while i < k:
                    x1 = numba.carray(_ptr(src[i, t] + off, like), n)
                    w1 = w[i]
                    for j in range(n):
                        acc[j] += w1 * np.float64(x1[j])
                    i += 1
                o = numba.carray(_ptr(dst[t] + off, like), n)
                for j in range(n):
                    a = acc[j]
                    o[j] = a
                    # NaN, +-Inf, or too large for the output dtype (rounds to +-Inf there)
                    bad |= not abs(a) <= top
                b += n
        return bad

    @numba.njit(nogil=True, cache=True)
    def _median(src, dst, segs, buf, nan, lo, hi):
        """Coordinate-wise median of ``src[:, t][s:e]`` into ``dst[t][s:e]`` per segment;
        returns whether any output value is NaN or Inf."""
        bad = False
        k = src.shape[0]
        p_len = buf.shape[0]
        m = buf.shape[1]
        like = buf[0, :0]
        size = buf.itemsize
        inf = np.inf
        for q in range(segs.shape[0]):
            t, s, e = segs[q, 0], segs[q, 1], segs[q, 2]
            b = s
            while b < e:
                n = min(m, e - b)
                off = b * size
                for j in range(m):
                    nan[j] = False
                for i in range(k):
                    x = numba.carray(_ptr(src[i, t] + off, like), n)
                    for j in range(n):
                        v = x[j]
                        buf[i, j] = v
                        nan[j] |= v != v
                    for j in range(n, m):
                        buf[i, j] = 0
                for i in range(k, p_len):
                    for j in range(m):
                        buf[i, j] = inf
                # Bitonic sort of each column (the clients), all columns at once.
                size2 = 2
                while size2 <= p_len:
                    stride = size2 // 2
                    while stride > 0:
                        for i in range(p_len):
                            p = i ^ stride
                            if p > i:
                                a0, a1 = (i, p) if (i & size2) == 0 else (p, i)
                                for j in range(m):
                                    u = buf[a0, j]
                                    v = buf[a1, j]
                                    # np.minimum/maximum, not a comparison: LLVM turns
                                    # ``u if u < v else v`` into masked stores (slow on AMD).
                                    buf[a0, j] = np.minimum(u, v)
                                    buf[a1, j] = np.maximum(u, v)
                        stride //= 2
                    size2 *= 2
                o = numba.carray(_ptr(dst[t] + off, like), n)
                for j in range(n):
                    if nan[j]:
                        o[j] = np.nan
                    elif lo == hi:
                        o[j] = buf[lo, j]
                    else:  # exact in float64, rounded once (as numpy's float32 mean)
                        o[j] = (np.float64(buf[lo, j]) + np.float64(buf[hi, j])) * 0.5
                    bad |= (o[j] - o[j]) != 0
                b += n
        return bad

    @numba.njit(nogil=True, cache=True)
    def _nonfinite(src, like, segs):
        """1 if any value of ``src[t][s:e]`` over the segments is NaN or +-Inf, else 0."""
        size = like.itemsize
        for q in range(segs.shape[0]):
            t, s, e = segs[q, 0], segs[q, 1], segs[q, 2]
            b = s
            while b < e:
                n = min(BLOCK, e - b)
                x = numba.carray(_ptr(src[t] + b * size, like), n)
                bad = False
                for j in range(n):
                    bad |= (x[j] - x[j]) != 0  # NaN exactly for NaN and +-Inf
                if bad:
                    return 1
                b += n
        return 0


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

    def call(src: np.ndarray, dst: np.ndarray, like: np.ndarray, segs: np.ndarray) -> bool:
        return bool(_weighted_sum(src, dst, segs, w, np.empty(BLOCK), like))

    return _per_dtype(columns, call, pool)


def median(
    columns: Sequence[Sequence[torch.Tensor]], pool: OutputPool | None = None
) -> tuple[list[torch.Tensor], bool]:
    """Coordinate-wise median of each column (as ``numpy.median`` along the clients); and
    whether every output value is finite."""
    k = len(columns[0]) if columns else 0
    p_len = 1 << max(0, (k - 1).bit_length())
    lo, hi = (k - 1) // 2, k // 2

    def call(src: np.ndarray, dst: np.ndarray, like: np.ndarray, segs: np.ndarray) -> bool:
        buf = np.empty((p_len, MEDIAN_BLOCK), dtype=like.dtype)
        return bool(_median(src, dst, segs, buf, np.empty(MEDIAN_BLOCK, dtype=np.bool_), lo, hi))

    return _per_dtype(columns, call, pool)


def any_nonfinite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether any float32/float64 CPU tensor holds a NaN or Inf (others are skipped)."""
    for dtype in DTYPES:
        ts = _contiguous([t for t in tensors if t.dtype == dtype and t.is_cpu])
        if not ts:
            continue
        flags = _run(
            functools.partial(_nonfinite, _addresses(ts), _like(dtype)), [t.numel() for t in ts]
        )
        if any(flags):
            return True
    return False
