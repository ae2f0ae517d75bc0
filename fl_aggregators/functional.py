"""The math every aggregator shares, as small pure functions (tested once).

Aggregation is memory-bandwidth bound, so the averages here stream: each output block is
accumulated from every client's block while it is still in cache, and no clients x params
matrix is ever built. Peak extra memory is one output model plus one block per client.

:func:`weighted_means`, :func:`medians` and :func:`all_finite_many` take every tensor of a
model at once and hand float32/float64 ones to the compiled kernels of
:mod:`fl_aggregators._kernels` (one call per round instead of one torch op per tensor, block
and client); the per-tensor functions below are the torch code used for other dtypes and
when numba is missing or ``FEDBALANCE_KERNELS=0``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from fl_aggregators import _kernels

#: Elements per block of the torch weighted mean (the fallback of the compiled kernel, and
#: the path of dtypes it does not take): 512 Ki float32 = 2 MiB, so the accumulator block
#: stays in the last-level cache while each client's block streams past it once, and each op
#: is large enough for torch's intra-op threads to pay off. Measured on this 2-core machine
#: for 10 x 11.7 M values: 32 Ki blocks 0.097 s (single-threaded ops, dispatch-bound),
#: 128 Ki 0.052 s, 512 Ki 0.044 s, against a read floor of 0.020 s
#: (benchmarks/results/perf_aggregate.md has the committed numbers).
BLOCK = 1 << 19
#: Elements per block of the median's min/max network: every client's block is copied and
#: rewritten several times, so all of them must fit in L2 together.
MEDIAN_BLOCK = 1 << 15


def normalize(weights: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Weights divided by their sum (float64); a zero or non-finite sum is a ``ValueError``."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    top = w.max() if len(w) else w.sum()
    if torch.isfinite(top) and top > 0:
        w = w / top  # weights near the float64 maximum must not overflow their sum
    total = w.sum()
    if not torch.isfinite(total) or total <= 0 or (w < 0).any():
        raise ValueError(
            f"weights must be non-negative with a positive finite sum, got {w.tolist()}"
        )
    return w / total


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype.is_floating_point:
        return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    return torch.float64  # integer buffers (e.g. BatchNorm's num_batches_tracked)


def _cast_back(acc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if acc.dtype == dtype:
        return acc
    if dtype.is_floating_point:
        return acc.to(dtype)
    if dtype == torch.bool:
        return acc >= 0.5
    # Round to 6 decimals first: summation order moves an exact .5 by one ulp either way,
    # which would make the result depend on the order of the clients.
    return torch.round(torch.round(acc, decimals=6)).to(dtype)


def weighted_mean(tensors: Sequence[torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """``sum_i w_i t_i`` for same-shaped tensors, in one blocked streaming pass.

    Integer tensors are averaged in float64 and rounded back to their dtype.
    """
    first = tensors[0]
    acc_dtype = _accumulator_dtype(first.dtype)
    w = [float(x) for x in weights]
    out = torch.empty(first.shape, dtype=acc_dtype, device=first.device)
    flat_out = out.view(-1)
    # In the accumulator's dtype: an int64 tensor times a Python float is float32 in torch,
    # which put integer buffers' averages within float32 error of a rounding boundary.
    flats = [t.reshape(-1).to(acc_dtype) for t in tensors]
    n = flat_out.numel()
    for start in range(0, n, BLOCK):
        stop = min(n, start + BLOCK)
        block = flat_out[start:stop]
        torch.mul(flats[0][start:stop], w[0], out=block)
        for flat, wi in zip(flats[1:], w[1:], strict=True):
            block.add_(flat[start:stop], alpha=wi)
    return _cast_back(out, first.dtype)


def columns(client_tensors: Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Per-client tensor lists turned into one list per position (client order kept)."""
    return [list(column) for column in zip(*client_tensors, strict=True)]


def _compiled(columns: Sequence[Sequence[torch.Tensor]]) -> list[int]:
    """Indices of the columns the compiled kernels take (float32/float64 in CPU memory, numba
    present); GPU tensors, for one, stay with torch."""
    if not _kernels.available():
        return []
    return [j for j, c in enumerate(columns) if _kernels.takes(c)]


#: Columns the kernels do not take (e.g. BatchNorm's int64 counters) up to this size are
#: concatenated per dtype and combined in one torch call, not one call each.
SMALL = 4096


def _fill(
    out: list[torch.Tensor | None],
    columns: Sequence[Sequence[torch.Tensor]],
    combine: Callable[[Sequence[torch.Tensor]], torch.Tensor],
) -> None:
    """``out[j] = combine(columns[j])`` where ``out[j]`` is still ``None``; small columns of
    one dtype share a call (each client's small tensors concatenated, the result split)."""
    small: dict[torch.dtype, list[int]] = {}
    for j, column in enumerate(columns):
        if out[j] is not None:
            continue
        if column[0].numel() <= SMALL:
            small.setdefault(column[0].dtype, []).append(j)
        else:
            out[j] = combine(column)
    for group in small.values():
        k = len(columns[group[0]])
        joined = [torch.cat([columns[j][i].reshape(-1) for j in group]) for i in range(k)]
        pieces = combine(joined).split([columns[j][0].numel() for j in group])
        for j, piece in zip(group, pieces, strict=True):
            out[j] = piece.clone().view(columns[j][0].shape)


class Combined(list[torch.Tensor]):
    """Tensors a combine produced, and whether all their values are finite (``None``: not
    known, check them). The compiled kernels learn it while they write the output."""

    finite: bool | None = None


def _combined(
    columns: Sequence[Sequence[torch.Tensor]],
    compiled: Callable[[list[Sequence[torch.Tensor]]], tuple[list[torch.Tensor], bool]],
    fallback: Callable[[Sequence[torch.Tensor]], torch.Tensor],
) -> Combined:
    """``compiled`` on the columns the kernels take, ``fallback`` on the rest."""
    out: list[torch.Tensor | None] = [None] * len(columns)
    fast = _compiled(columns)
    finite = True
    if fast:
        tensors, finite = compiled([columns[j] for j in fast])
        for j, t in zip(fast, tensors, strict=True):
            out[j] = t
    slow = [j for j in range(len(columns)) if out[j] is None]
    _fill(out, columns, fallback)
    result = Combined(out)  # type: ignore[arg-type]
    result.finite = finite and all(all_finite(result[j]) for j in slow)
    return result


def weighted_means(
    columns: Sequence[Sequence[torch.Tensor]],
    weights: torch.Tensor,
    pool: _kernels.OutputPool | None = None,
) -> Combined:
    """:func:`weighted_mean` of every column (one tensor per client) in one pass; ``pool``
    recycles the caller's earlier outputs that nobody holds any more."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    return _combined(
        columns,
        lambda cols: _kernels.weighted_sum(cols, w.numpy(), pool),
        lambda column: weighted_mean(column, weights),
    )


def medians(
    columns: Sequence[Sequence[torch.Tensor]], pool: _kernels.OutputPool | None = None
) -> Combined:
    """:func:`median` of every column (one tensor per client) in one pass."""
    return _combined(columns, lambda cols: _kernels.median(cols, pool), median)


def all_finite_many(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether no tensor holds a NaN or Inf, reading each value once."""
    if _kernels.available():
        if _kernels.any_nonfinite(tensors):  # reads the tensors the kernels take
            return False
        tensors = [t for t in tensors if not _kernels.takes([t])]
    return all(all_finite(t) for t in tensors)


def all_finite(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no NaN or Inf (always true for integer tensors), in one read.

    ``torch.isfinite(t).all()`` writes a boolean tensor as large as ``t`` first; a dot product
    with zeros reads ``t`` once and is NaN exactly when some value is NaN or Inf (0 x Inf is
    NaN, and a sum of zeros cannot overflow).
    """
    if not t.is_floating_point():
        return True
    flat = t.reshape(-1)
    if flat.dtype not in (torch.float32, torch.float64) or flat.numel() <= BLOCK:
        return bool(torch.isfinite(flat).all())
    zeros = torch.zeros(BLOCK, dtype=flat.dtype, device=flat.device)
    n = flat.numel()
    for start in range(0, n, BLOCK):
        stop = min(n, start + BLOCK)
        if not torch.isfinite(torch.dot(flat[start:stop], zeros[: stop - start])):
            return False
    return True


def _select_middle(values: list[torch.Tensor]) -> torch.Tensor:
    """Median of same-shaped tensors elementwise, by a partial min/max bubble network.

    The network moves the largest values to the end with ``minimum``/``maximum`` on whole
    blocks; after ``K - floor((K-1)/2)`` passes the two middle order statistics are in place.
    Vectorised and cache-resident, it beats ``torch.median`` over a stacked matrix ~6x for
    10 clients; for many clients a sort along the client axis is cheaper (see ``median``).
    NaN propagates, so a NaN client shows up as a NaN in the output.
    """
    k = len(values)
    lo, hi = (k - 1) // 2, k // 2
    v = list(values)
    for i in range(k - 1, lo - 1, -1):
        for j in range(i):
            low = torch.minimum(v[j], v[j + 1])
            torch.maximum(v[j], v[j + 1], out=v[j + 1])
            v[j] = low
    return v[lo] if lo == hi else (v[lo] + v[hi]) * 0.5


#: Up to this many clients the min/max network is used; above it a blocked sort (on a GPU,
#: always the sort).
NETWORK_MAX_CLIENTS = 24
#: Values (clients x coordinates) per block of the many-client median on a GPU: 64 MiB of
#: float32, so a sort's working set stays small beside the model.
GPU_MEDIAN_BLOCK = 1 << 24


def median(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Coordinate-wise median (mean of the two middle values for an even count), blocked.

    As ``numpy.median`` along the client axis, which Flower's ``aggregate_median`` uses.
    NaN in any client gives NaN at that coordinate.
    """
    first = tensors[0]
    k = len(tensors)
    acc_dtype = _accumulator_dtype(first.dtype)
    out = torch.empty(first.shape, dtype=acc_dtype, device=first.device)
    flat_out = out.view(-1)
    # In the accumulator's dtype: an int64 tensor times a Python float is float32 in torch,
    # which put integer buffers' averages within float32 error of a rounding boundary.
    flats = [t.reshape(-1).to(acc_dtype) for t in tensors]
    n = flat_out.numel()
    lo, hi = (k - 1) // 2, k // 2
    if not first.is_cpu:
        # On a GPU: a sort along the client axis per block of GPU_MEDIAN_BLOCK values (numpy's
        # introselect below needs CPU memory, and the min/max network's small blocks would
        # be thousands of kernel launches).
        step = max(1, GPU_MEDIAN_BLOCK // k)
        for start in range(0, n, step):
            stop = min(n, start + step)
            stacked = torch.stack([f[start:stop] for f in flats], dim=1)
            part = torch.sort(stacked, dim=1).values
            mid = part[:, lo] if lo == hi else (part[:, lo] + part[:, hi]) * 0.5
            if acc_dtype.is_floating_point:
                mid[stacked.isnan().any(dim=1)] = float("nan")  # as numpy.median
            flat_out[start:stop] = mid
        return _cast_back(out, first.dtype)
    if k <= NETWORK_MAX_CLIENTS:
        for start in range(0, n, MEDIAN_BLOCK):
            stop = min(n, start + MEDIAN_BLOCK)
            blocks = [f[start:stop].to(acc_dtype, copy=True) for f in flats]
            flat_out[start:stop] = _select_middle(blocks)
        return _cast_back(out, first.dtype)
    # Many clients: per block, a (values x clients) matrix, contiguous along the clients, and
    # numpy's introselect for the two middle order statistics (O(k) per coordinate; a sort
    # along the client axis is ~7x slower at 100 clients).
    block_len = max(256, MEDIAN_BLOCK * 4 // k)
    buf = torch.empty((min(n, block_len), k), dtype=acc_dtype)
    for start in range(0, n, block_len):
        stop = min(n, start + block_len)
        b = buf[: stop - start]
        for i, f in enumerate(flats):
            b[:, i].copy_(f[start:stop])
        nan = b.isnan().any(dim=1) if acc_dtype.is_floating_point else None
        part = torch.from_numpy(np.partition(b.numpy(), (lo, hi), axis=1))
        mid = part[:, lo] if lo == hi else (part[:, lo] + part[:, hi]) * 0.5
        if nan is not None:
            mid[nan] = float("nan")  # as numpy.median: NaN anywhere gives NaN
        flat_out[start:stop] = mid
    return _cast_back(out, first.dtype)


def momentum_step(
    global_t: torch.Tensor,
    averaged: torch.Tensor,
    velocity: torch.Tensor | None,
    *,
    beta: float,
    server_lr: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Server momentum (Hsu et al. 2019): ``v <- beta v + (w - avg)``, ``w <- w - lr v``.

    Returns ``(new_global, new_velocity)``; ``velocity=None`` starts from zero.
    """
    delta = global_t.to(averaged.dtype) - averaged
    v = delta if velocity is None else velocity.mul(beta).add_(delta)
    return global_t.to(averaged.dtype) - server_lr * v, v


def bound_losses(
    losses: torch.Tensor, clip: float | None, peer: float | None = None
) -> torch.Tensor:
    """Bound reported losses: at most ``clip`` x the round's lower median and at most
    ``peer`` x the largest loss among the *other* clients (``None`` turns a bound off).

    The lower median (the smaller middle value) keeps the first bound honest with two clients
    and with up to half of the clients inflating their loss. The peer bound only ever lowers
    the single largest loss (every other loss is at most the largest one): with ``peer=1`` a
    lone liar takes exactly the share of the highest honest client in its round, never more.
    It needs three or more clients; with two, neither can be told apart from a liar.
    """
    if len(losses) == 0:
        return losses
    out = losses
    if clip is not None:
        med = torch.sort(losses).values[(len(losses) - 1) // 2]
        if med > 0:
            out = torch.minimum(out, clip * med)
    if peer is not None and len(out) >= 3:
        top2 = torch.topk(out, 2)
        cap = peer * top2.values[1]
        i = int(top2.indices[0])
        if out[i] > cap:
            out = out.clone()
            out[i] = cap
    return out


def update_scales(
    global_tensors: Sequence[torch.Tensor],
    client_tensors: Sequence[Sequence[torch.Tensor]],
    clip: float,
) -> torch.Tensor:
    """Per client, ``min(1, clip * median_norm / norm_i)`` with ``norm_i = ||x_i - g||`` over the
    floating-point tensors and the lower median over clients (float64; a zero norm gives 1)."""
    norms = torch.zeros(len(client_tensors), dtype=torch.float64)
    for i, tensors in enumerate(client_tensors):
        sq = 0.0
        for g, x in zip(global_tensors, tensors, strict=True):
            if g.is_floating_point():
                sq += float(torch.dist(x, g).double() ** 2)
        norms[i] = math.sqrt(sq)
    med = torch.sort(norms).values[(len(norms) - 1) // 2]
    bound = clip * med
    return torch.where(norms > bound, bound / norms.clamp(min=1e-300), torch.ones_like(norms))


def update_norm(
    global_tensors: Sequence[torch.Tensor | np.ndarray],
    trained: Sequence[torch.Tensor | np.ndarray],
) -> float:
    """The L2 norm of ``trained - global`` over floating-point tensors, in float64: what a
    client reports as ``update_norm`` under secure aggregation (integer buffers such as batch
    counters are not parameters and are left out, as the server leaves them out)."""
    if len(global_tensors) != len(trained):
        raise ValueError(f"{len(trained)} trained tensors for a model of {len(global_tensors)}")
    total = 0.0
    for g, t in zip(global_tensors, trained, strict=True):
        g64, t64 = torch.as_tensor(g), torch.as_tensor(t)
        if not g64.is_floating_point():
            continue
        total += float((t64.to(torch.float64) - g64.to(torch.float64)).square().sum())
    return math.sqrt(total)
