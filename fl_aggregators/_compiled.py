"""The numba kernels of :mod:`fl_aggregators._kernels` (see its docstring for what each does).

A module of their own so that importing fedbalance does not import numba: a process that never
aggregates (a FedLab or FedML client, a Flower ClientApp, ``fedbalance list``) never pays for
it. :func:`fl_aggregators._kernels.compiled` imports this module on the first aggregation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import llvmlite.binding as llvm_binding
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from fl_aggregators._networks import BLOCK, REGISTER_CLIENTS, _batcher, _network


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


#: Bytes of coordinates the weighted sum takes per step from each client: one cache line.
#: Clients' large tensors usually sit at the same offset modulo 4 KiB (each its own page-aligned
#: allocation), so one step's lines of every client share an L1 set; reading a whole line per
#: client per step, not half of one, keeps a line from being evicted between its two halves.
#: Measured, the kernel alone (10 clients of one 11.7 M-value tensor each, against reading them
#: once): 1.64x that floor with 32-byte steps, 1.32-1.40x with 64. The lanes are the same either
#: way (LLVM splits them into the machine's registers), so the results are bit for bit the same.
SUM_LINE = 64


def _lanes(context: Any, like: Any, nbytes: int = 32) -> Any:
    """The LLVM vector of ``nbytes`` of ``like``'s dtype (by default one 32-byte register: 8
    float32, 4 float64)."""
    return ir.VectorType(context.get_value_type(like.dtype), nbytes * 8 // like.dtype.bitwidth)


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
def _sum_registers(typingctx: Any, table: Any, j: Any, o: Any, w: Any, k: Any, like: Any) -> Any:
    """``sum_i w[i] * client_i`` of ``k`` (1 to :data:`REGISTER_CLIENTS`) clients for one
    line of lanes (:data:`SUM_LINE`), in float64 registers: client ``i``'s lanes at
    ``table[i] + j``, the sum (rounded to the values' dtype) to ``o``. Returns the lanes whose
    float64 sum is NaN, +-Inf or beyond the dtype's largest value, as bits. The order of the
    additions is :func:`_weighted_sum_registers`' for single values."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        ptable, off, out, pw, count = args[:5]
        ty = _lanes(context, signature.args[5], SUM_LINE)
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
            builder.store(rounded, _at(builder, out, ty), align=SUM_LINE)
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
    """:func:`_weighted_sum` for up to :data:`REGISTER_CLIENTS` clients: per cache line of
    lanes (:data:`SUM_LINE`), every client's values are read once, weighted and added in
    float64 registers (client 0 first), and the sum written once, to an aligned address. No
    accumulator goes through memory. (Streaming stores past the caches measured no faster
    here, with 32- and with 64-byte steps.)"""
    k = src.shape[0]
    size = like.itemsize
    reg = SUM_LINE
    ptable, pw = table.ctypes.data, w.ctypes.data
    out = 0
    bad = False
    for q in range(segs.shape[0]):
        t, s, e = segs[q, 0], segs[q, 1], segs[q, 2]
        for i in range(k):
            table[i] = src[i, t]
        pd = dst[t]
        o = numba.carray(_ptr(pd, like), e)
        # lanes one by one up to a line-aligned output address (each store fills one cache
        # line), then whole lines, then the last lanes one by one
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
