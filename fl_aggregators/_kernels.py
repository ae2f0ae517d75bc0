"""Compiled kernels (numba) for the weighted mean, the median and the finiteness check.

Each kernel takes every tensor of every client in one call, as raw addresses, so a
ResNet-18 round (122 tensors x K clients) costs one dispatch instead of thousands of torch
ops, and reads each client value exactly once:

- ``weighted_sum``: up to ``REGISTER_CLIENTS`` (16) clients, per 32-byte register of
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
    import llvmlite.binding as llvm_binding
    import numba
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover - numba is a dependency; this is the documented fallback
    numba = None  # type: ignore[assignment]

#: Values per block of the weighted sum: the float64 accumulator (32 KiB) stays in L1/L2.
BLOCK = 4096
#: Most coordinates per block of the median; fewer for many clients (see :func:`median_block`).
MEDIAN_BLOCK = 512
#: Bytes of one median block (K rows of lanes) for many clients: the merging comparators run
#: in L2 (in L1 the rows get so short that the loop around each comparator dominates).
MEDIAN_BYTES = 192 << 10
#: Up to this many clients the median's comparators run in registers (no buffer); above it,
#: groups of this many are sorted in registers, then merged on rows of lanes in L1. A power
#: of two (the groups that Batcher's sort sorts first).
REGISTER_CLIENTS = 16
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
    """Whether the compiled kernels are used (numba importable, not turned off)."""
    return numba is not None and os.environ.get("FEDBALANCE_KERNELS", "1") != "0"


if numba is not None:

    def _has_avx() -> bool:
        """Whether numba compiles for a CPU with AVX (the host's, unless NUMBA_CPU_NAME
        names another; then only the features NUMBA_CPU_FEATURES lists count)."""
        if getattr(numba.config, "CPU_NAME", None) in (None, "host"):
            features = llvm_binding.get_host_cpu_features().flatten()
        else:
            features = getattr(numba.config, "CPU_FEATURES", None) or ""
        return "+avx," in features + ","

    #: x86 with AVX: the median's min/max are vminps/vmaxps on 32-byte registers.
    _AVX = _has_avx()

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

    def _lanes(context: Any, like: Any) -> Any:
        """The LLVM vector of one 32-byte register of ``like``'s dtype (8 float32, 4 float64)."""
        return ir.VectorType(context.get_value_type(like.dtype), 256 // like.dtype.bitwidth)

    def _at(builder: Any, addr: Any, ty: Any) -> Any:
        return builder.inttoptr(addr, ty.as_pointer())

    def _mask(builder: Any, lanes: Any) -> Any:
        """A vector of booleans as the bits of an int64 (bit i: lane i)."""
        bits = builder.bitcast(lanes, ir.IntType(lanes.type.count))
        return builder.zext(bits, ir.IntType(64))

    def _minmax(builder: Any, which: str, u: Any, v: Any) -> Any:
        """Lane-wise min or max as one instruction. Not ``select(u < v, u, v)``: stored back
        where ``u`` was loaded from, LLVM turns that into a masked store (microcoded, many
        times slower on AMD). A NaN lane gives either operand: the median finds NaNs itself."""
        ty = u.type
        f32 = ty.element == ir.FloatType()
        if _AVX:
            name = f"llvm.x86.avx.{which}.{'ps' if f32 else 'pd'}.256"
        else:  # portable: one instruction on ARM, a few more on x86 without AVX
            name = f"llvm.{which}num.v{ty.count}f{32 if f32 else 64}"
        fn = builder.module.globals.get(name) or ir.Function(
            builder.module, ir.FunctionType(ty, [ty, ty]), name
        )
        return builder.call(fn, [u, v])

    def _exchange(kind: int) -> Any:
        """A comparator on one register of lanes at addresses ``a`` and ``b``: ``a, b = min,
        max`` (kind 0), only ``a = min`` (1) or only ``b = max`` (2)."""

        @intrinsic
        def exchange(typingctx: Any, a: Any, b: Any, like: Any) -> Any:
            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                ty = _lanes(context, signature.args[2])
                pa, pb = _at(builder, args[0], ty), _at(builder, args[1], ty)
                u, v = builder.load(pa, align=1), builder.load(pb, align=1)
                if kind != 2:
                    builder.store(_minmax(builder, "min", u, v), pa, align=1)
                if kind != 1:
                    builder.store(_minmax(builder, "max", u, v), pb, align=1)
                return context.get_dummy_value()

            return types.void(a, b, like), codegen

        return exchange

    _exchange_both, _exchange_min, _exchange_max = _exchange(0), _exchange(1), _exchange(2)

    def _per_count(builder: Any, count: Any, body: Callable[[int], Any]) -> Any:
        """``body(c)`` (an int64 value) for ``c = count`` in 1 .. :data:`REGISTER_CLIENTS`,
        as a switch over unrolled code for every such ``c`` (predicted: a call has one)."""
        i64 = ir.IntType(64)
        fn = builder.function
        merge = fn.append_basic_block("count.merge")
        other = fn.append_basic_block("count.other")
        switch = builder.switch(count, other)
        results = []
        for c in range(1, REGISTER_CLIENTS + 1):
            block = fn.append_basic_block(f"count.{c}")
            switch.add_case(ir.Constant(count.type, c), block)
            builder.position_at_end(block)
            results.append((body(c), builder.block))
            builder.branch(merge)
        builder.position_at_end(other)  # never taken: the kernel checks the count first
        builder.branch(merge)
        builder.position_at_end(merge)
        phi = builder.phi(i64)
        for res, block in results:
            phi.add_incoming(res, block)
        phi.add_incoming(ir.Constant(i64, 0), other)
        return phi

    def _gather(builder: Any, table: Any, off: Any, c: int, ty: Any) -> tuple[list[Any], Any]:
        """One register of lanes of each of ``c`` clients (client ``i`` at ``table[i] + off``),
        and the lanes where any of them is NaN, as bits."""
        i64 = ir.IntType(64)
        ptrs = builder.inttoptr(table, i64.as_pointer())
        vals = []
        for i in range(c):
            addr = builder.add(builder.load(builder.gep(ptrs, [ir.Constant(i64, i)])), off)
            vals.append(builder.load(_at(builder, addr, ty), align=1))
        nan = builder.fcmp_unordered("uno", vals[-1], vals[0])
        for i in range(0, c - 1, 2):  # uno(u, v): u or v is NaN
            nan = builder.or_(nan, builder.fcmp_unordered("uno", vals[i], vals[i + 1]))
        return vals, _mask(builder, nan)

    def _apply(builder: Any, vals: list[Any], net: Sequence[tuple[int, int, int]]) -> None:
        for a, b, kind in net:
            u, v = vals[a], vals[b]
            if kind != 2:
                vals[a] = _minmax(builder, "min", u, v)
            if kind != 1:
                vals[b] = _minmax(builder, "max", u, v)

    @intrinsic
    def _median_registers(typingctx: Any, table: Any, j: Any, o: Any, k: Any, like: Any) -> Any:
        """The median of ``k`` (2 to :data:`REGISTER_CLIENTS`) clients for one register of
        lanes, in registers: client ``i``'s lanes at ``table[i] + j``, the median to ``o``.
        Returns the lanes where some client is NaN as bits 0-7, and those whose result is NaN
        or +-Inf as bits 32-39."""

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            ptable, off, out, count = args[:4]
            ty = _lanes(context, signature.args[4])

            def body(c: int) -> Any:
                vals, nan = _gather(builder, ptable, off, c, ty)
                _apply(builder, vals, _network(c))
                lo, hi = (c - 1) // 2, c // 2
                val = vals[lo]
                if lo != hi:  # in the values' dtype, as numpy's mean of the two
                    half = ir.Constant(ty, [0.5] * ty.count)
                    val = builder.fmul(builder.fadd(vals[lo], vals[hi]), half)
                builder.store(val, _at(builder, out, ty), align=1)
                diff = builder.fsub(val, val)  # NaN exactly for NaN and +-Inf
                bad = _mask(builder, builder.fcmp_unordered("uno", diff, diff))
                return builder.or_(nan, builder.shl(bad, ir.Constant(ir.IntType(64), 32)))

            return _per_count(builder, count, body)

        return types.int64(table, j, o, k, like), codegen

    @intrinsic
    def _sort_registers(
        typingctx: Any, table: Any, j: Any, rows: Any, row: Any, c: Any, like: Any
    ) -> Any:
        """Sort ``c`` (1 to :data:`REGISTER_CLIENTS`) clients lane-wise for one register of
        lanes, in registers: client ``i``'s lanes at ``table[i] + j``, the ``i``-th smallest
        to ``rows + i * row``. Returns the lanes where some client is NaN, as bits."""

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            ptable, off, prows, stride, count = args[:5]
            ty = _lanes(context, signature.args[5])

            def body(n: int) -> Any:
                vals, nan = _gather(builder, ptable, off, n, ty)
                _apply(builder, vals, [(a, b, 0) for a, b, _ in _batcher(n)])
                for i, v in enumerate(vals):
                    addr = builder.add(prows, builder.mul(stride, ir.Constant(stride.type, i)))
                    builder.store(v, _at(builder, addr, ty), align=1)
                return nan

            return _per_count(builder, count, body)

        return types.int64(table, j, rows, row, c, like), codegen

    @numba.njit(nogil=True, cache=True)
    def _median(src, dst, segs, buf, table, net, cross, lo, hi, m):
        """Coordinate-wise median of ``src[:, t][s:e]`` into ``dst[t][s:e]`` per segment;
        returns whether any output value is NaN or Inf.

        Per block of ``m`` coordinates (lanes), one register of lanes at a time: up to
        :data:`REGISTER_CLIENTS` clients, the whole comparator network runs in registers
        (:func:`_median_registers`). More clients: each group of that many is sorted in
        registers into ``buf`` (one row of lanes per client), then the comparators ``cross``
        (the passes of ``net`` that merge the groups) run on whole rows. A block whose length is not a
        whole number of registers (the end of a tensor, which must not be read past) is
        copied into ``buf`` and takes all of ``net`` there."""
        k = src.shape[0]
        like = buf[0, :0]
        size = buf.itemsize
        reg = 32  # bytes per register of lanes
        w = reg // size
        base = buf.ctypes.data
        row = buf.shape[1] * size
        ptable = table.ctypes.data
        g = REGISTER_CLIENTS
        bad = False
        for q in range(segs.shape[0]):
            t, s, e = segs[q, 0], segs[q, 1], segs[q, 2]
            b = s
            while b < e:
                n = min(m, e - b)
                off = b * size
                pd = dst[t] + off
                full = n // w * reg  # bytes of whole registers
                nans = 0
                net_rows = net
                if full == n * size and k > 1:
                    for i in range(k):
                        table[i] = src[i, t] + off
                    if k <= g:
                        out = 0
                        for j in range(0, full, reg):
                            out |= _median_registers(ptable, j, pd + j, k, like)
                        nans = out & 0xFFFFFFFF
                        bad |= (out >> 32) != 0
                    else:
                        for i in range(0, k, g):
                            p, c = ptable + i * 8, min(g, k - i)
                            for j in range(0, full, reg):
                                nans |= _sort_registers(p, j, base + i * row + j, row, c, like)
                        net_rows = cross
                else:
                    for i in range(k):
                        x = numba.carray(_ptr(src[i, t] + off, like), n)
                        for j in range(n):  # never read past the end
                            v = x[j]
                            buf[i, j] = v
                            nans |= v != v
                if k > g or full != n * size or k == 1:
                    used = (n + w - 1) // w * reg  # lanes past n hold stale values: harmless
                    for c in range(net_rows.shape[0]):
                        pa, pb = base + net_rows[c, 0] * row, base + net_rows[c, 1] * row
                        kind = net_rows[c, 2]
                        if kind == 0:
                            for j in range(0, used, reg):
                                _exchange_both(pa + j, pb + j, like)
                        elif kind == 1:
                            for j in range(0, used, reg):
                                _exchange_min(pa + j, pb + j, like)
                        else:
                            for j in range(0, used, reg):
                                _exchange_max(pa + j, pb + j, like)
                    o = numba.carray(_ptr(pd, like), n)
                    for j in range(n):
                        v = buf[lo, j] if lo == hi else (buf[lo, j] + buf[hi, j]) * 0.5
                        o[j] = v
                        bad |= (v - v) != 0
                if nans:  # rare: a NaN anywhere makes that coordinate's median NaN
                    o = numba.carray(_ptr(pd, like), n)
                    for i in range(k):
                        x = numba.carray(_ptr(src[i, t] + off, like), n)
                        for j in range(n):
                            if x[j] != x[j]:
                                o[j] = np.nan
                                bad = True
                b += n
        return bad

    @intrinsic
    def _sum_registers(
        typingctx: Any, table: Any, j: Any, o: Any, w: Any, k: Any, like: Any
    ) -> Any:
        """``sum_i w[i] * client_i`` of ``k`` (1 to :data:`REGISTER_CLIENTS`) clients for one
        register of lanes, in float64 registers: client ``i``'s lanes at ``table[i] + j``, the
        sum (rounded to the values' dtype) to ``o``. Returns the lanes whose float64 sum is
        NaN, +-Inf or beyond the dtype's largest value, as bits. The order of the additions is
        :func:`_weighted_sum_registers`' for single values."""

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            ptable, off, out, pw, count = args[:5]
            ty = _lanes(context, signature.args[5])
            f64 = ir.DoubleType()
            wide = ir.VectorType(f64, ty.count)
            i64 = ir.IntType(64)
            top = float(np.finfo(signature.args[5].dtype.name).max)

            def body(c: int) -> Any:
                vals, _ = _gather(builder, ptable, off, c, ty)
                weights = builder.inttoptr(pw, f64.as_pointer())
                acc = None
                for i, v in enumerate(vals):
                    x = builder.fpext(v, wide) if ty.element != f64 else v
                    wi = builder.load(builder.gep(weights, [ir.Constant(i64, i)]))
                    wv = builder.insert_element(ir.Constant(wide, None), wi, ir.Constant(i64, 0))
                    wv = builder.shuffle_vector(
                        wv, wv, ir.Constant(ir.VectorType(ir.IntType(32), ty.count), [0] * ty.count)
                    )
                    term = builder.fmul(wv, x)
                    acc = term if acc is None else builder.fadd(acc, term)
                rounded = builder.fptrunc(acc, ty) if ty.element != f64 else acc
                builder.store(rounded, _at(builder, out, ty), align=32)
                fabs = builder.module.globals.get(f"llvm.fabs.v{ty.count}f64") or ir.Function(
                    builder.module, ir.FunctionType(wide, [wide]), f"llvm.fabs.v{ty.count}f64"
                )
                over = builder.fcmp_unordered(
                    ">", builder.call(fabs, [acc]), ir.Constant(wide, [top] * ty.count)
                )
                return _mask(builder, over)

            return _per_count(builder, count, body)

        return types.int64(table, j, o, w, k, like), codegen

    @numba.njit(nogil=True, cache=True, inline="always")
    def _weighted_lanes(src, w, t, o, start, stop, like):
        """``o[j] = sum_i w[i] * src[i, t][j]`` for ``start <= j < stop``, one by one, in
        :func:`_sum_registers`' order; whether any is non-finite or out of range."""
        k = src.shape[0]
        top = np.float64(np.finfo(like.dtype).max)
        bad = False
        for j in range(start, stop):
            a = w[0] * np.float64(numba.carray(_ptr(src[0, t], like), stop)[j])
            for i in range(1, k):
                a += w[i] * np.float64(numba.carray(_ptr(src[i, t], like), stop)[j])
            o[j] = a
            bad |= not abs(a) <= top
        return bad

    @numba.njit(nogil=True, cache=True)
    def _weighted_sum_registers(src, dst, segs, w, table, like):
        """:func:`_weighted_sum` for up to :data:`REGISTER_CLIENTS` clients: per register of
        lanes, every client's values are read once, weighted and added in float64 registers
        (client 0 first), and the sum written once, to an aligned address. No accumulator goes
        through memory. (Streaming stores past the caches measured no faster here.)"""
        k = src.shape[0]
        size = like.itemsize
        reg = 32
        ptable, pw = table.ctypes.data, w.ctypes.data
        out = 0
        bad = False
        for q in range(segs.shape[0]):
            t, s, e = segs[q, 0], segs[q, 1], segs[q, 2]
            for i in range(k):
                table[i] = src[i, t]
            pd = dst[t]
            o = numba.carray(_ptr(pd, like), e)
            # lanes one by one up to a 32-byte aligned output address (no store straddles two
            # cache lines), then whole registers, then the last lanes one by one
            head = min(e, s + (-(pd + s * size) % reg) // size)
            bad |= _weighted_lanes(src, w, t, o, s, head, like)
            full = (e - head) * size // reg * reg
            for j in range(head * size, head * size + full, reg):
                out |= _sum_registers(ptable, j, pd + j, pw, k, like)
            bad |= _weighted_lanes(src, w, t, o, head + full // size, e, like)
        return bad or out != 0

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
        if k <= REGISTER_CLIENTS:
            return bool(_weighted_sum_registers(src, dst, segs, w, np.empty(k, np.uint64), like))
        return bool(_weighted_sum(src, dst, segs, w, np.empty(BLOCK), like))

    return _per_dtype(columns, call, pool)


@functools.lru_cache(maxsize=256)
def _batcher(k: int) -> tuple[tuple[int, int, int], ...]:
    """Batcher's odd-even merge sort of ``k`` wires, as comparators ``(a, b, p)``, ``a < b``,
    where ``p`` is the size of the sorted runs that the comparator's pass merges."""
    # Built on the next power of two of wires. Every comparator puts the smaller value on the
    # lower wire, so pads above wire k - 1 (think +inf) never move: comparators touching one
    # are no-ops and are dropped. The first passes sort aligned groups of 2, 4, 8, ... wires.
    p2 = 1 << max(0, (k - 1).bit_length())
    net = []
    p = 1
    while p < p2:
        step = p
        while step >= 1:
            j = step % p
            while j <= p2 - 1 - step:
                for i in range(min(step, p2 - j - step)):
                    a, b = i + j, i + j + step
                    if a // (2 * p) == b // (2 * p) and b < k:
                        net.append((a, b, p))
                j += 2 * step
            step //= 2
        p *= 2
    return tuple(net)


@functools.lru_cache(maxsize=256)
def _network(k: int, after: int = 0) -> tuple[tuple[int, int, int], ...]:
    # Backwards from the two middle wires: keep what can reach them, and of a comparator only
    # the half (min or max) whose output is read later. ``after``: only the passes that merge
    # runs of at least that many wires (the earlier ones sort aligned groups of ``after``).
    need = {(k - 1) // 2, k // 2}
    kept = []
    for a, b, p in reversed(_batcher(k)):
        if a in need or b in need:
            if p >= after:
                kept.append((a, b, 0 if a in need and b in need else 1 if a in need else 2))
            need |= {a, b}
    return tuple(reversed(kept))


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

    def call(src: np.ndarray, dst: np.ndarray, like: np.ndarray, segs: np.ndarray) -> bool:
        m = median_block(k, like.itemsize)
        buf = _aligned((k, m + PAD // like.itemsize), like.dtype)
        table = np.empty(k, dtype=np.uint64)
        return bool(_median(src, dst, segs, buf, table, net, cross, lo, hi, m))

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
