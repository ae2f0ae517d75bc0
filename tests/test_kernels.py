"""The compiled kernels (numba) against float64 / numpy references and the torch fallback."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from fl_aggregators import ClientUpdate, FedAvg, FedMedian, _kernels
from fl_aggregators.functional import all_finite_many, medians, weighted_means

B = _kernels.BLOCK
M = _kernels.MEDIAN_BLOCK
# Block edges on both sides, a tensor that is not contiguous, and more than one block.
SIZES = [(1,), (B - 1,), (B,), (B + 1,), (3 * B + 5,), (M + 3,)]


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Split even small inputs across two threads (the split is otherwise for big models)."""
    monkeypatch.setattr(_kernels, "MIN_PARALLEL", 100)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def make_columns(k: int, dtype: torch.dtype, seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    cols = [[torch.randn(s, generator=g, dtype=dtype) for _ in range(k)] for s in SIZES]
    cols.append([torch.randn(9, 13, generator=g, dtype=dtype).t() for _ in range(k)])
    return cols


def test_the_kernels_are_what_runs_here() -> None:
    # numba is a dependency: CI must measure and test the compiled path, not the fallback.
    assert _kernels.available()


def test_numba_is_imported_by_the_first_aggregation_not_before() -> None:
    """A process that only builds aggregators and adapters (a client, a rank, the CLI) does
    not load numba; the first aggregation does."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "import fl_aggregators, fl_adapters.fedlab.runner, fl_adapters.cli\n"
        "from fl_aggregators import ClientUpdate, FedAvg, astraea_plan\n"
        "agg = FedAvg()\n"
        "astraea_plan.assign_mediators([[1, 2], [3, 4]], 2)\n"
        "print('before', 'numba' in sys.modules)\n"
        "sd = {'w': torch.ones(4)}\n"
        "agg.aggregate(sd, [ClientUpdate(sd, 1), ClientUpdate(sd, 2)])\n"
        "print('after', 'numba' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["before", "False", "after", "True"], out.stdout + out.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8, 9, 10, 16, 17, 33])
def test_weighted_sum_rounds_the_exact_sum_once(k: int, dtype: torch.dtype, two_threads) -> None:  # type: ignore[no-untyped-def]
    cols = make_columns(k, dtype, seed=k)
    w = torch.rand(k, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
    w /= w.sum()
    got = weighted_means(cols, w)
    for col, out in zip(cols, got, strict=True):
        exact = sum(float(wi) * t.double() for wi, t in zip(w, col, strict=True))
        assert out.dtype == dtype and out.shape == col[0].shape
        if dtype == torch.float32:
            # float64 accumulation: within one float32 rounding of the exact weighted sum
            eps = torch.finfo(torch.float32).eps
            assert torch.allclose(out.double(), exact, rtol=eps, atol=eps)
        else:  # the float64 reference is itself rounded, in another order
            eps = 8 * k * torch.finfo(torch.float64).eps
            assert torch.allclose(out, exact, rtol=eps, atol=eps)


@pytest.mark.parametrize("k", [6, 20])  # in registers, and through the float64 block
def test_weighted_sum_does_not_depend_on_the_thread_split(k: int, two_threads) -> None:  # type: ignore[no-untyped-def]
    # A split puts a coordinate in a whole register or among the lanes done one by one (at
    # either end of a thread's share): both must add in the same order.
    cols = make_columns(k, torch.float32)
    w = torch.rand(k, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    split = weighted_means(cols, w / w.sum())
    torch.set_num_threads(1)
    whole = weighted_means(cols, w / w.sum())
    assert all(torch.equal(a, b) for a, b in zip(split, whole, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 24, 25, 100])
def test_median_is_numpy_median_exactly(k: int, dtype: torch.dtype, two_threads) -> None:  # type: ignore[no-untyped-def]
    cols = make_columns(k, dtype, seed=100 + k)
    # Infinities are ordinary values to a median; a NaN anywhere gives NaN (as numpy).
    cols[4][0][7] = float("inf")
    cols[4][-1][8] = float("-inf")
    cols[4][k // 2][9] = float("nan")
    cols[4][0][10] = float("nan")
    got = medians(cols)
    for col, out in zip(cols, got, strict=True):
        expected = np.median(np.stack([t.numpy() for t in col]), axis=0)
        assert out.dtype == dtype and out.shape == col[0].shape
        np.testing.assert_array_equal(out.numpy(), expected.astype(out.numpy().dtype))
    assert torch.isnan(got[4][9]) and torch.isnan(got[4][10])
    assert torch.isnan(got[4]).sum() == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_is_found_anywhere(dtype: torch.dtype, bad: float, two_threads) -> None:  # type: ignore[no-untyped-def]
    big = torch.finfo(dtype).max
    ts = [torch.full((3 * B + 5,), big, dtype=dtype), torch.full((B,), -big, dtype=dtype)]
    assert all_finite_many(ts)  # values whose sum overflows are still finite
    for which, i in [(0, 0), (0, B), (0, 3 * B + 4), (1, 0), (1, B - 1)]:
        us = [t.clone() for t in ts]
        us[which][i] = bad
        assert not all_finite_many(us), (which, i)


def test_a_column_of_mixed_sizes_is_refused_not_read_past_its_end() -> None:
    col = [torch.zeros(10), torch.zeros(9)]
    with pytest.raises(ValueError, match="share dtype and size"):
        _kernels.weighted_sum([col], np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="share dtype and size"):
        _kernels.median([col])
    with pytest.raises(ValueError, match="float32 or float64 tensors in CPU memory"):
        _kernels.median([[torch.zeros(3, dtype=torch.int64)] * 2])
    with pytest.raises(ValueError, match="at least one client"):
        _kernels.median([[]])
    with pytest.raises(ValueError, match="one weight per client"):
        _kernels.weighted_sum([[torch.zeros(3)] * 2], np.array([1.0]))


def test_tensors_outside_cpu_memory_stay_with_torch() -> None:
    # The kernels read raw addresses: a GPU tensor must go to torch instead (a "meta" tensor
    # stands in for one here, where there is no GPU).
    meta = [torch.empty(5, device="meta") for _ in range(2)]
    assert not _kernels.takes(meta)
    assert _kernels.takes([torch.zeros(5), torch.zeros(5)])
    with pytest.raises(ValueError, match="CPU memory"):
        _kernels.weighted_sum([meta], np.array([0.5, 0.5]))


def state_dicts(k: int) -> list[OrderedDict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [
        OrderedDict(
            conv=torch.randn(8, 3, 3, 3, generator=g),
            bn=torch.randn(3 * B, generator=g, dtype=torch.float64),
            half=torch.randn(5000, generator=g).half(),
            steps=torch.tensor(10 * i + 3),
            small_int=torch.arange(4) * i,
        )
        for i in range(k)
    ]


@pytest.mark.parametrize("agg", [FedAvg, FedMedian], ids=lambda a: a.name)
def test_fallback_without_numba_gives_the_same_model(agg, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    sds = state_dicts(5)
    ups = [ClientUpdate(sd, n) for sd, n in zip(sds, [3, 1, 4, 1, 5], strict=True)]
    glob = OrderedDict((k, torch.zeros_like(v)) for k, v in sds[0].items())
    compiled = agg().aggregate(glob, ups).params
    monkeypatch.setenv("FEDBALANCE_KERNELS", "0")
    assert not _kernels.available()
    fallback = agg().aggregate(glob, ups).params
    for key, value in compiled.items():
        assert value.dtype == fallback[key].dtype and value.shape == fallback[key].shape
        if value.is_floating_point():
            tol = 1e-3 if value.dtype == torch.float16 else 1e-6
            assert torch.allclose(value.double(), fallback[key].double(), rtol=tol, atol=tol), key
        else:
            assert torch.equal(value, fallback[key]), key


def test_kernels_report_a_non_finite_output() -> None:
    big = torch.full((B + 3,), 3e38)
    assert _kernels.weighted_sum([[big, big]], np.array([0.5, 0.5]))[1]
    assert not _kernels.weighted_sum([[big, big]], np.array([1.0, 1.0]))[1]  # > float32 max
    nan = torch.zeros(B + 3)
    nan[B + 1] = float("nan")
    # a NaN client is seen even at weight 0 (0 x NaN is NaN), so it is found and rejected
    assert not _kernels.weighted_sum([[torch.zeros(B + 3), nan]], np.array([1.0, 0.0]))[1]
    inf = torch.full((M + 1,), float("inf"))
    zero = torch.zeros(M + 1)
    assert _kernels.median([[inf, zero, zero]])[1]  # a lone Inf is outvoted
    assert not _kernels.median([[inf, inf, zero]])[1]


# -- recycled outputs --------------------------------------------------------------------------
def rounds() -> tuple[OrderedDict[str, torch.Tensor], list[list[ClientUpdate]]]:
    sds = state_dicts(4)
    glob = OrderedDict((k, torch.zeros_like(v)) for k, v in sds[0].items())
    # Each round's models differ (scaled), so an overwritten result cannot go unnoticed.
    ups = [
        [
            ClientUpdate(OrderedDict((k, v * (r + 1)) for k, v in sd.items()), n + r)
            for n, sd in enumerate(sds, 1)
        ]
        for r in range(3)
    ]
    return glob, ups


def fresh(agg_cls, glob, ups):  # type: ignore[no-untyped-def]
    return agg_cls().aggregate(glob, ups).params


@pytest.mark.skipif(not _kernels.RECYCLE, reason="recycling is off on this interpreter")
@pytest.mark.parametrize("agg_cls", [FedAvg, FedMedian], ids=lambda a: a.name)
def test_an_output_nobody_holds_is_recycled(agg_cls) -> None:  # type: ignore[no-untyped-def]
    glob, ups = rounds()
    agg = agg_cls()
    first_ptr = agg.aggregate(glob, ups[0]).params["bn"].data_ptr()  # result dropped at once
    second = agg.aggregate(glob, ups[1]).params
    assert second["bn"].data_ptr() == first_ptr  # same memory, no new pages
    for key, value in fresh(agg_cls, glob, ups[1]).items():
        assert torch.equal(second[key], value), key


@pytest.mark.parametrize(
    "keep",
    [
        lambda p: p,  # the whole result
        lambda p: p["bn"],  # one tensor
        lambda p: p["bn"][10:20],  # a view of it
        lambda p: p["bn"].numpy(),  # a numpy array on its memory
        lambda p: {"renamed": p["bn"]},  # inside another container
    ],
    ids=["dict", "tensor", "view", "numpy", "container"],
)
@pytest.mark.parametrize("agg_cls", [FedAvg, FedMedian], ids=lambda a: a.name)
def test_an_output_someone_holds_is_never_overwritten(agg_cls, keep) -> None:  # type: ignore[no-untyped-def]
    glob, ups = rounds()
    agg = agg_cls()
    first = agg.aggregate(glob, ups[0]).params
    kept = keep(first)
    snapshot = first["bn"].clone()
    del first
    agg.aggregate(glob, ups[1])
    agg.aggregate(glob, ups[2])
    if isinstance(kept, dict):
        kept = next(iter(kept.values())) if "renamed" in kept else kept["bn"]
    now = torch.as_tensor(kept)
    assert torch.equal(now, snapshot[10:20] if now.numel() == 10 else snapshot)


def test_chained_rounds_match_a_fresh_aggregator_each_round() -> None:
    # The usual loop: each result becomes the next global model (so it is held, not reused).
    glob, ups = rounds()
    agg, g = FedAvg(update_clip=2.0), glob
    for r in range(3):
        expected = FedAvg(update_clip=2.0).aggregate(g, ups[r]).params
        g = agg.aggregate(g, ups[r]).params
        for key, value in expected.items():
            assert torch.equal(g[key], value), (r, key)


# -- the median's comparator networks ----------------------------------------------------------
def _bitwise(got: np.ndarray, expected: np.ndarray) -> None:
    """Equal bit for bit, except that any NaN equals any NaN and -0.0 equals 0.0 (they tie:
    which one a selection returns depends on its order of comparisons, numpy's as well)."""
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)  # NaN where numpy has NaN, zeros equal
    plain = ~np.isnan(expected) & (expected != 0)
    ints = np.int32 if got.dtype == np.float32 else np.int64
    np.testing.assert_array_equal(got[plain].view(ints), expected[plain].view(ints))


@pytest.mark.parametrize("k", range(1, 13))
def test_median_network_is_right_for_every_zero_one_input(k: int) -> None:
    # The 0-1 principle: a comparator network that places every 0/1 input right places
    # every input right.
    net = _kernels.median_network(k)
    x = (np.arange(1 << k)[:, None] >> np.arange(k)) & 1  # every 0/1 input, one per row
    for a, b, kind in net:
        lo, hi = np.minimum(x[:, a], x[:, b]), np.maximum(x[:, a], x[:, b])
        if kind != 2:
            x[:, a] = lo
        if kind != 1:
            x[:, b] = hi
    s = np.sort((np.arange(1 << k)[:, None] >> np.arange(k)) & 1, axis=1)
    for wire in {(k - 1) // 2, k // 2}:
        np.testing.assert_array_equal(x[:, wire], s[:, wire])


def test_median_network_sizes() -> None:
    # Pruned to what reaches the middle wires: far below a full sort of the next power of two.
    assert len(_kernels.median_network(10)) == 29
    assert len(_kernels.median_network(100)) == 898
    assert len(_kernels.median_network(1)) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_median_is_numpy_median_bit_for_bit_for_1_to_130_clients(dtype, two_threads) -> None:  # type: ignore[no-untyped-def]
    # Up to REGISTER_CLIENTS the network runs in registers, above it in groups then on rows;
    # lengths: several whole blocks plus a tail that is no whole register (copied, all of the
    # network on rows), and a short odd tensor that is all tail.
    g = torch.Generator().manual_seed(7)
    for k in range(1, 131):
        m = _kernels.median_block(k, torch.empty(0, dtype=dtype).element_size())
        sizes = [2 * m + 16 + 5, 7]
        cols = [[torch.randn(s, generator=g, dtype=dtype) for _ in range(k)] for s in sizes]
        big = cols[0]
        big[k - 1][3] = float("nan")  # in a block of whole registers
        big[0][2 * m + 16 + 2] = float("nan")  # in the tail
        big[k // 2][m + 1] = float("inf")
        big[0][m + 2] = float("-inf")
        big[(k - 1) // 2][m + 3] = big[k // 2][m + 3] = 0.0  # ties
        big[-1][m + 4] = -0.0 if k > 1 else 0.0
        got, finite = _kernels.median(cols)
        for col, out in zip(cols, got, strict=True):
            expected = np.median(np.stack([t.numpy() for t in col]), axis=0)
            _bitwise(out.numpy(), expected.astype(out.numpy().dtype))
        assert not finite  # the NaNs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_median_of_two_huge_middle_values_overflows_as_numpy(dtype: torch.dtype) -> None:
    # numpy averages the two middle values in their own dtype: float32 3e38 + 3e38 is inf.
    top = torch.finfo(dtype).max
    for k in (2, 4, 20):  # in registers, and sorted groups merged on rows
        # 40 values: whole registers; 5: a tail, copied
        cols = [
            [torch.full((n,), top if i >= k // 2 - 1 else -top, dtype=dtype) for i in range(k)]
            for n in (40, 5)
        ]
        got, finite = _kernels.median(cols)
        for col, out in zip(cols, got, strict=True):
            with np.errstate(over="ignore"):
                expected = np.median(np.stack([t.numpy() for t in col]), axis=0)
            assert np.isposinf(expected).all()
            _bitwise(out.numpy(), expected)
        assert not finite


def test_median_of_integer_buffers_rounds_numpy_median() -> None:
    # int64 (BatchNorm's counters) are not the kernels': torch takes them, in float64, rounded
    # back half to even, next to float columns that the kernels take.
    g = torch.Generator().manual_seed(3)
    for k in (2, 3, 10, 25, 40):
        ints = [torch.randint(0, 1000, (4, 1111), generator=g) for _ in range(k)]
        floats = [torch.randn(3000, generator=g) for _ in range(k)]
        got = medians([ints, floats])
        expected = np.median(np.stack([t.numpy() for t in ints]), axis=0)
        assert got[0].dtype == torch.int64
        np.testing.assert_array_equal(got[0].numpy(), np.round(expected).astype(np.int64))
        _bitwise(got[1].numpy(), np.median(np.stack([t.numpy() for t in floats]), axis=0))
