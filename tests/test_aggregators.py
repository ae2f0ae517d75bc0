"""Aggregators: numbers checked by hand, robustness rules, recording, resumable state."""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fl_aggregators import ClientUpdate, FedAvg, FedAvgM, FedLoss, FedLossN, FedMedian
from fl_aggregators.functional import bound_losses, median, weighted_mean

# Three clients, worked by hand: params, sample counts, validation losses.
P1, P2, P3 = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0]), torch.tensor([8.0, -2.0])
N = (1, 3, 4)
L = (0.5, 1.0, 2.5)


def three_clients() -> list[ClientUpdate]:
    return [
        ClientUpdate(p, n, {"val_loss": loss}, client_id=f"c{i}")
        for i, (p, n, loss) in enumerate(zip((P1, P2, P3), N, L, strict=True))
    ]


def test_fedavg_by_hand() -> None:
    r = FedAvg().aggregate(torch.zeros(2), three_clients())
    # weights 1/8, 3/8, 4/8: [1 + 9 + 32, 2 + 18 - 8] / 8
    assert r.weights == [0.125, 0.375, 0.5]
    assert torch.allclose(r.params, torch.tensor([5.25, 1.5]))


def test_fedloss_by_hand() -> None:
    r = FedLoss(peer_clip=None).aggregate(torch.zeros(2), three_clients())
    # weights 0.5/4, 1/4, 2.5/4: [0.125 + 0.75 + 5, 0.25 + 1.5 - 1.25]
    assert r.weights == [0.125, 0.25, 0.625]
    assert torch.allclose(r.params, torch.tensor([5.875, 0.5]))
    # Default peer bound: the top loss 2.5 counts as the runner-up's 1.0, weights 0.5/2.5, ...
    assert FedLoss().aggregate(torch.zeros(2), three_clients()).weights == [0.2, 0.4, 0.4]


def test_fedloss_n_by_hand() -> None:
    r = FedLossN(peer_clip=None).aggregate(torch.zeros(2), three_clients())
    # n*l = 0.5, 3, 10 (sum 13.5): weights 1/27, 6/27, 20/27
    assert r.weights == pytest.approx([1 / 27, 6 / 27, 20 / 27])
    assert torch.allclose(r.params, torch.tensor([179 / 27, -2 / 27]))
    half = FedLossN(mix=0.5, peer_clip=None).aggregate(torch.zeros(2), three_clients())
    assert half.weights == pytest.approx(
        [0.5 * (1 / 8 + 1 / 27), 0.5 * (3 / 8 + 6 / 27), 0.5 * (4 / 8 + 20 / 27)]
    )
    thesis = FedLossN(size_aware=False, peer_clip=None).aggregate(torch.zeros(2), three_clients())
    assert thesis.weights == pytest.approx([0.125, 0.25, 0.625])


def test_fedmedian_by_hand() -> None:
    r = FedMedian().aggregate(torch.zeros(2), three_clients())
    assert torch.equal(r.params, torch.tensor([3.0, 2.0]))
    assert r.weights == pytest.approx([1 / 3] * 3)
    even = FedMedian().aggregate(
        torch.zeros(2), [*three_clients(), ClientUpdate(torch.tensor([0.0, 0.0]), 1)]
    )
    assert torch.equal(even.params, torch.tensor([2.0, 1.0]))  # means of (1,3) and (0,2)


def test_fedavgm_two_rounds_by_hand() -> None:
    agg = FedAvgM(beta=0.9, server_lr=1.0)
    r1 = agg.aggregate(torch.zeros(2), three_clients())
    # v1 = (0 - avg) = [-5.25, -1.5]; w1 = 0 - v1
    assert torch.allclose(r1.params, torch.tensor([5.25, 1.5]))
    r2 = agg.aggregate(r1.params, three_clients())
    # delta = w1 - avg = 0; v2 = 0.9 v1 = [-4.725, -1.35]; w2 = w1 - v2
    assert torch.allclose(r2.params, torch.tensor([9.975, 2.85]))
    assert torch.allclose(agg.velocity[0], torch.tensor([-4.725, -1.35]))


def test_fedavgm_resumes_exactly_from_its_state() -> None:
    torch.manual_seed(0)
    rounds = [[ClientUpdate(torch.randn(50), n) for n in (3, 5, 9)] for _ in range(5)]
    straight, w = FedAvgM(beta=0.8, server_lr=0.7), torch.zeros(50)
    for ups in rounds:
        w = straight.aggregate(w, ups).params
    first, w2 = FedAvgM(beta=0.8, server_lr=0.7), torch.zeros(50)
    for ups in rounds[:2]:
        w2 = first.aggregate(w2, ups).params
    state = first.state_dict()
    resumed = FedAvgM(beta=0.8, server_lr=0.7)
    resumed.load_state_dict(state)
    for ups in rounds[2:]:
        w2 = resumed.aggregate(w2, ups).params
    assert torch.equal(w, w2)
    assert resumed.round == straight.round == 5


def test_state_survives_a_weights_only_checkpoint(tmp_path: Path) -> None:
    agg = FedAvgM()
    agg.aggregate(torch.zeros(3), [ClientUpdate(torch.ones(3), 2)])
    torch.save(agg.state_dict(), tmp_path / "s.pt")
    other = FedAvgM()
    other.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert torch.equal(other.velocity[0], agg.velocity[0]) and other.round == 1


def test_bad_state_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="'round'"):
        FedAvgM().load_state_dict({"velocity": None})
    with pytest.raises(ValueError, match="velocity"):
        FedAvgM().load_state_dict({"round": 1, "velocity": "junk"})


# -- robustness --------------------------------------------------------------------------------
def test_honest_losses_keep_the_thesis_weights_below_the_top() -> None:
    losses = [0.31, 0.52, 0.74, 0.9, 1.2, 1.45, 0.66]  # spread well within 5x the median
    ups = [ClientUpdate(torch.ones(2), 10, {"val_loss": x}) for x in losses]
    thesis = FedLoss(peer_clip=None).aggregate(torch.zeros(2), ups)
    assert thesis.weights == pytest.approx([x / sum(losses) for x in losses])
    # The default peer bound lowers only the top loss (1.45) to the runner-up's (1.2).
    bounded = [min(x, 1.2) for x in losses]
    r = FedLoss().aggregate(torch.zeros(2), ups)
    assert r.weights == pytest.approx([x / sum(bounded) for x in bounded])


def test_one_inflated_loss_takes_at_most_the_top_honest_share() -> None:
    honest = [0.5, 0.8, 1.0, 1.1, 0.9, 0.7, 1.3, 0.6, 1.2]
    ups = [ClientUpdate(torch.zeros(2), 10, {"val_loss": x}) for x in honest]
    ups.append(ClientUpdate(torch.full((2,), 100.0), 10, {"val_loss": 1e9}))
    r = FedLoss().aggregate(torch.zeros(2), ups)
    assert r.weights[-1] == pytest.approx(max(r.weights[:-1]))  # ties with client 6 (1.3)
    assert r.weights[-1] == pytest.approx(1.3 / (sum(honest) + 1.3))
    assert r.params[0] == pytest.approx(100 * r.weights[-1])
    median_only = FedLoss(peer_clip=None).aggregate(torch.zeros(2), ups)
    assert median_only.weights[-1] == pytest.approx(4.5 / (sum(honest) + 4.5))  # 5x median 0.9
    unbounded = FedLoss(loss_clip=None, peer_clip=None).aggregate(torch.zeros(2), ups)
    assert unbounded.weights[-1] > 0.999999  # the thesis's rule alone is hijacked


def test_colluding_liars_are_held_by_the_median_bound() -> None:
    # 4 of 10 report 1e9: the peer bound cannot separate them, the median bound does.
    losses = [1.0] * 6 + [1e9] * 4
    ups = [ClientUpdate(torch.zeros(2), 10, {"val_loss": x}) for x in losses]
    r = FedLoss().aggregate(torch.zeros(2), ups)
    assert r.weights[-1] == pytest.approx(5 / (6 + 4 * 5))


def test_deflated_losses_only_lower_the_reporters_weight() -> None:
    losses = [1.0, 0.9, 1.1, 1.0, 0.0, 1e-12]
    ups = [ClientUpdate(torch.zeros(2), 10, {"val_loss": x}) for x in losses]
    r = FedLoss().aggregate(torch.zeros(2), ups)
    assert r.weights[4] == 0.0 and r.weights[5] < 1e-11
    assert min(r.weights[:4]) > 0.2


def test_bound_losses_uses_the_lower_median() -> None:
    got = bound_losses(torch.tensor([1.0, 1e6], dtype=torch.float64), 5.0)
    assert got.tolist() == [1.0, 5.0]


def test_peer_bound_needs_three_clients_and_lowers_one_loss() -> None:
    two = torch.tensor([1.0, 3.0], dtype=torch.float64)
    assert bound_losses(two, None, 1.0).tolist() == [1.0, 3.0]
    tied = torch.tensor([2.0, 1.0, 2.0], dtype=torch.float64)
    assert bound_losses(tied, None, 1.0).tolist() == [2.0, 1.0, 2.0]
    spread = torch.tensor([1.0, 4.0, 2.0, 1.5], dtype=torch.float64)
    assert bound_losses(spread, None, 1.5).tolist() == [1.0, 3.0, 2.0, 1.5]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (
            ClientUpdate(torch.tensor([float("nan"), 0.0]), 5, {"val_loss": 1.0}),
            "parameters contain NaN or Inf",
        ),
        (
            ClientUpdate(torch.tensor([float("inf"), 0.0]), 5, {"val_loss": 1.0}),
            "parameters contain NaN or Inf",
        ),
        (
            ClientUpdate(torch.zeros(3), 5, {"val_loss": 1.0}),
            "params has shape (3,), expected (2,)",
        ),
        (
            ClientUpdate(torch.zeros(2, dtype=torch.float64), 5, {"val_loss": 1.0}),
            "params has dtype torch.float64, expected torch.float32",
        ),
        (ClientUpdate(torch.zeros(2), 5, {}), "required metric 'val_loss' is missing"),
        (
            ClientUpdate(torch.zeros(2), 5, {"val_loss": float("nan")}),
            "metric 'val_loss' must be finite and >= 0, got nan",
        ),
        (
            ClientUpdate(torch.zeros(2), 5, {"val_loss": -0.1}),
            "metric 'val_loss' must be finite and >= 0, got -0.1",
        ),
        (
            ClientUpdate(torch.zeros(2), 5, {"val_loss": "high"}),
            "metric 'val_loss' is not a number: 'high'",
        ),
        (
            ClientUpdate(torch.zeros(2), 0, {"val_loss": 1.0}),
            "num_samples must be a positive int, got 0",
        ),
        (ClientUpdate({"w": torch.zeros(2)}, 5, {"val_loss": 1.0}), "not in the same form"),
    ],
    ids=[
        "nan",
        "inf",
        "shape",
        "dtype",
        "missing-metric",
        "nan-loss",
        "negative-loss",
        "str-loss",
        "zero-samples",
        "form",
    ],
)
def test_bad_client_is_rejected_and_named(bad: ClientUpdate, reason: str, caplog) -> None:  # type: ignore[no-untyped-def]
    good = [ClientUpdate(torch.tensor([1.0, 2.0]), 5, {"val_loss": 1.0}, client_id="good")]
    bad = ClientUpdate(bad.params, bad.num_samples, bad.metrics, client_id="mallory")
    with caplog.at_level(logging.WARNING, logger="fl_aggregators"):
        r = FedLoss().aggregate(torch.zeros(2), [*good, bad])
    assert len(r.rejected) == 1 and r.rejected[0].client == "mallory"
    assert reason in r.rejected[0].reason
    assert r.weights == [1.0, 0.0] and not r.skipped
    assert torch.equal(r.params, torch.tensor([1.0, 2.0]))
    assert "rejected client mallory" in caplog.text and reason.split(",")[0] in caplog.text


def test_all_clients_bad_keeps_the_global_model() -> None:
    g = torch.tensor([7.0, 7.0])
    ups = [
        ClientUpdate(torch.tensor([float("nan"), 1.0]), 5, {"val_loss": 1.0}),
        ClientUpdate(torch.zeros(2), 5, {}),
    ]
    r = FedLoss().aggregate(g, ups)
    assert r.skipped and r.params is g and r.weights == [0.0, 0.0] and len(r.rejected) == 2


def test_all_zero_losses_fall_back_to_fedavg() -> None:
    ups = [ClientUpdate(torch.ones(2), n, {"val_loss": 0.0}) for n in (1, 3)]
    assert FedLoss().aggregate(torch.zeros(2), ups).weights == [0.25, 0.75]


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: FedAvgM(beta=1.0), "beta must be a finite float in [0, 1), got 1.0"),
        (lambda: FedAvgM(server_lr=0), "server_lr must be > 0, got 0"),
        (lambda: FedLoss(loss_clip=0.5), "loss_clip must be None or a finite float >= 1, got 0.5"),
        (lambda: FedLoss(peer_clip=0), "peer_clip must be None or a finite float >= 1, got 0"),
        (lambda: FedLossN(mix=2), "mix must be a finite float in [0, 1], got 2"),
    ],
    ids=["beta", "server-lr", "clip", "peer-clip", "mix"],
)
def test_bad_parameters_fail_at_construction(factory, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as err:
        factory()
    assert message in str(err.value)


# -- state dicts, dtypes, recording ------------------------------------------------------------
def bn_state(value: float, batches: int) -> OrderedDict[str, torch.Tensor]:
    return OrderedDict(
        weight=torch.full((4,), value),
        running_mean=torch.full((4,), value, dtype=torch.float64),
        num_batches_tracked=torch.tensor(batches),
    )


@pytest.mark.parametrize("agg", [FedAvg(), FedMedian(), FedAvgM(), FedLoss()], ids=lambda a: a.name)
def test_integer_buffers_keep_their_dtype(agg) -> None:  # type: ignore[no-untyped-def]
    ups = [
        ClientUpdate(bn_state(v, b), 1, {"val_loss": 1.0})
        for v, b in ((1.0, 10), (2.0, 13), (3.0, 20))
    ]
    r = agg.aggregate(bn_state(0.0, 0), ups)
    assert isinstance(r.params, OrderedDict)
    assert {k: v.dtype for k, v in r.params.items()} == {
        "weight": torch.float32,
        "running_mean": torch.float64,
        "num_batches_tracked": torch.int64,
    }
    assert r.params["num_batches_tracked"].item() in (13, 14)


def test_recorder_appends_one_line_per_aggregation(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "agg.jsonl"
    monkeypatch.setenv("FEDBALANCE_RECORD", str(path))
    agg = FedLoss(peer_clip=None)
    agg.aggregate(torch.zeros(2), three_clients())
    agg.aggregate(
        torch.zeros(2), [*three_clients(), ClientUpdate(torch.zeros(2), 1, {}, client_id="x")]
    )
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert {
        "host",
        "round",
        "aggregator",
        "clients",
        "num_samples",
        "metrics",
        "weights",
        "rejected",
    } <= set(first)
    assert first["aggregator"] == "fedloss" and first["round"] == 1 and first["host"] == "python"
    assert first["clients"] == ["c0", "c1", "c2"] and first["num_samples"] == [1, 3, 4]
    assert first["weights"] == [0.125, 0.25, 0.625] and sum(first["weights"]) == 1
    assert lines[1]["rejected"] == [
        {"client": "x", "reason": "required metric 'val_loss' is missing"}
    ]
    assert sum(lines[1]["weights"]) == pytest.approx(1.0)
    assert 0 <= first["elapsed_s"] <= lines[1]["elapsed_s"]  # since the aggregator was made
    # Each aggregation's own seconds: within the time since the aggregator was made.
    assert all(0 < x["aggregate_s"] <= x["elapsed_s"] + 1e-3 for x in lines)


def test_recorder_is_silent_without_the_variable(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("FEDBALANCE_RECORD", raising=False)
    monkeypatch.chdir(tmp_path)
    FedAvg().aggregate(torch.zeros(2), three_clients())
    assert list(tmp_path.iterdir()) == []


# -- the shared math ---------------------------------------------------------------------------
def test_weighted_mean_streams_across_block_boundaries(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fl_aggregators.functional as F

    monkeypatch.setattr(F, "BLOCK", 7)
    ts = [torch.randn(5, 9) for _ in range(4)]
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    assert torch.allclose(
        weighted_mean(ts, w), sum(wi * t for wi, t in zip(w.tolist(), ts, strict=True))
    )


@pytest.mark.parametrize("k", [1, 2, 3, 10, 25, 40], ids=lambda k: f"{k}-clients")
def test_median_matches_numpy(k: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    import fl_aggregators.functional as F

    monkeypatch.setattr(F, "MEDIAN_BLOCK", 1000)  # several blocks on both paths
    ts = [torch.randn(3, 1111) for _ in range(k)]
    ts[-1][1, 5] = float("nan")
    expected = np.median(np.stack([t.numpy() for t in ts]), axis=0)
    got = median(ts).numpy()
    assert np.isnan(got[1, 5]) and np.isnan(got).sum() == 1
    assert np.allclose(got, expected, equal_nan=True)


def test_integer_average_on_a_half_does_not_depend_on_client_order() -> None:
    # Weights 0.3/0.7 of 5 and 20 give 15.5 up to one ulp, on either side depending on order.
    ups = [ClientUpdate(torch.tensor(5), 3), ClientUpdate(torch.tensor(20), 7)]
    a = FedAvg().aggregate(torch.tensor(0), ups).params
    b = FedAvg().aggregate(torch.tensor(0), ups[::-1]).params
    assert a.dtype == torch.int64 and int(a) == int(b) == 16  # round half to even


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_all_finite_finds_one_bad_value_anywhere(dtype, bad, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fl_aggregators.functional as F

    monkeypatch.setattr(F, "BLOCK", 64)  # several blocks, and a short last one
    t = torch.full((1000,), 3e4 if dtype == torch.float16 else 3e38, dtype=dtype)
    assert F.all_finite(t)  # large values whose sum would overflow are still finite
    for i in (0, 63, 64, 999):
        u = t.clone()
        u[i] = bad
        assert not F.all_finite(u)
    assert F.all_finite(torch.arange(10))


# -- update norm bound -------------------------------------------------------------------------
def test_update_clip_shortens_a_scaled_update_to_the_bound() -> None:
    g = torch.zeros(3)
    honest = [
        torch.tensor([1.0, 0.0, 0.0]),
        torch.tensor([0.0, 1.0, 0.0]),
        torch.tensor([0.0, 0.0, 2.0]),
    ]
    scaled = torch.tensor([-100.0, 0.0, 0.0])  # norm 100; lower median norm 1 -> bound 3
    ups = [ClientUpdate(x, 10) for x in [*honest, scaled]]
    r = FedAvg(update_clip=3.0).aggregate(g, ups)
    assert r.weights == [0.25] * 4 and r.extra["update_scale"] == pytest.approx([1, 1, 1, 0.03])
    # g + sum w_i s_i (x_i - g): the liar moves the model by 0.25 * 3, not 0.25 * 100
    assert torch.allclose(r.params, torch.tensor([0.25 - 0.75, 0.25, 0.5]))
    plain = FedAvg().aggregate(g, ups)
    assert plain.params[0] == pytest.approx(-24.75) and "update_scale" not in plain.extra


def test_update_clip_leaves_honest_rounds_alone_and_integer_buffers_intact() -> None:
    g = {"w": torch.zeros(2), "n": torch.tensor(4)}
    ups = [
        ClientUpdate({"w": torch.tensor([1.0, 1.0]), "n": torch.tensor(5)}, 1, {"val_loss": 1.0}),
        ClientUpdate({"w": torch.tensor([2.0, 0.0]), "n": torch.tensor(7)}, 3, {"val_loss": 2.0}),
    ]
    for agg_cls in (FedAvg, FedLoss, FedLossN):
        clipped = agg_cls(update_clip=5.0).aggregate(g, ups)
        plain = agg_cls().aggregate(g, ups)
        assert torch.allclose(clipped.params["w"], plain.params["w"])
        assert clipped.params["n"].dtype == torch.int64 and clipped.params["n"] == plain.params["n"]


def test_update_clip_must_be_at_least_one() -> None:
    with pytest.raises(
        ValueError, match="update_clip must be None or a finite float >= 1, got 0.5"
    ):
        FedLoss(update_clip=0.5)


def test_sample_clip_holds_a_count_liar_to_the_runner_up_by_hand() -> None:
    # Counts 1, 3, 4 with client 2 claiming 4000: trusted it takes 4000/4004 of the weight;
    # with sample_clip 1 (or the default 20) its count is the runner-up's (3): 1/7, 3/7, 3/7.
    ups = three_clients()
    ups[2] = ClientUpdate(P3, 4000, {"val_loss": 2.5}, client_id="c2")
    trusting = FedAvg(sample_clip=None).aggregate(torch.zeros(2), ups)
    assert trusting.weights[2] == pytest.approx(4000 / 4004)
    assert FedAvgM().aggregate(torch.zeros(2), ups).weights[2] == pytest.approx(4000 / 4004)
    assert FedAvg().aggregate(torch.zeros(2), ups).weights == pytest.approx([1 / 7, 3 / 7, 3 / 7])
    for agg in (FedAvg(sample_clip=1.0), FedAvgM(sample_clip=1.0)):
        assert agg.aggregate(torch.zeros(2), ups).weights == pytest.approx([1 / 7, 3 / 7, 3 / 7])
    # A margin: counts within 2x the runner-up's are believed, beyond it counted as its.
    assert FedAvg(sample_clip=2.0).aggregate(torch.zeros(2), three_clients()).weights == (
        pytest.approx([1 / 8, 3 / 8, 4 / 8])
    )
    assert FedAvg(sample_clip=2.0).aggregate(torch.zeros(2), ups).weights == (
        pytest.approx([1 / 7, 3 / 7, 3 / 7])
    )
    two = ups[1:]  # with two clients neither can be told apart from a liar
    assert FedAvg(sample_clip=1.0).aggregate(torch.zeros(2), two).weights == (
        pytest.approx([3 / 4003, 4000 / 4003])
    )


def test_sample_clip_bounds_fedloss_n_counts_before_scoring() -> None:
    ups = three_clients()
    ups[0] = ClientUpdate(P1, 10_000, {"val_loss": 0.5}, client_id="c0")
    w = FedLossN(peer_clip=None, sample_clip=1.0).aggregate(torch.zeros(2), ups).weights
    # counts 1e4 -> 4 (runner-up); scores n*l = 2, 3, 10
    assert w == pytest.approx([2 / 15, 3 / 15, 10 / 15])
    assert FedLossN(peer_clip=None).aggregate(torch.zeros(2), ups).weights == pytest.approx(w)


@pytest.mark.parametrize("value", [0.5, float("nan"), float("inf"), True, "1"])
def test_sample_clip_must_be_at_least_one(value: object) -> None:
    with pytest.raises(ValueError, match="sample_clip must be None or a finite float >= 1, got"):
        FedAvg(sample_clip=value)  # type: ignore[arg-type]


def test_a_round_names_the_clients_whose_value_a_bound_lowered() -> None:
    """What a benchmark record's ``bounded_rounds`` is made of: ``bounded`` lists the clients a
    bound touched, and is absent when none was (the thesis's unbounded rule never has it)."""
    assert FedLoss().aggregate(torch.zeros(2), three_clients()).extra["bounded"] == ["c2"]
    unbounded = FedLoss(loss_clip=None, peer_clip=None).aggregate(torch.zeros(2), three_clients())
    assert "bounded" not in unbounded.extra
    ups = three_clients()
    ups[2] = ClientUpdate(P3, 4000, {"val_loss": 2.5}, client_id="c2")
    assert FedAvg().aggregate(torch.zeros(2), ups).extra["bounded"] == ["c2"]
    assert "bounded" not in FedAvg(sample_clip=None).aggregate(torch.zeros(2), ups).extra
    # FedLoss-n's peer bound acts on the scores n * l: the top score (c2: 4000 * 2.5) is lowered.
    n_bounded = FedLossN(loss_clip=None, sample_clip=None).aggregate(torch.zeros(2), ups)
    assert n_bounded.extra["bounded"] == ["c2"]
    # Each round notes afresh: an honest round after a bounded one has no note.
    agg = FedAvg()
    agg.aggregate(torch.zeros(2), ups)
    assert "bounded" not in agg.aggregate(torch.zeros(2), three_clients()).extra
