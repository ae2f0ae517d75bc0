"""Aggregation in two halves for secure aggregation: weights from scalars, then the masked sum.

The hosts' secure-aggregation tests (tests/flower/test_secure.py, tests/test_fedml_secure.py)
run the real protocols; these pin the core: ``weigh`` + ``finish`` on ``sum_i w_i x_i`` is
``aggregate`` for every linear aggregator, and the others refuse.
"""

from __future__ import annotations

import pytest
import torch

from fl_aggregators import (
    Astraea,
    ClientUpdate,
    FedAvg,
    FedAvgM,
    FedLoss,
    FedLossN,
    FedMedian,
)

LINEAR = [
    FedAvg,
    lambda: FedAvgM(beta=0.9, server_lr=0.7),
    FedLoss,
    lambda: FedLoss(loss_clip=None, peer_clip=None),
    FedLossN,
    lambda: Astraea(mediators=False, augment=False),
]


def _round(seed: int, losses: list[float]) -> tuple[dict, list[ClientUpdate]]:
    gen = torch.Generator().manual_seed(seed)
    g = {"w": torch.randn(5, 4, generator=gen), "b": torch.randn(4, generator=gen)}
    updates = [
        ClientUpdate(
            params={k: v + torch.randn(v.shape, generator=gen) for k, v in g.items()},
            num_samples=n,
            metrics={"val_loss": loss},
            client_id=i,
        )
        for i, (n, loss) in enumerate(zip([12, 40, 3, 60, 25], losses, strict=True))
    ]
    return g, updates


def _scalars(updates: list[ClientUpdate]) -> list[ClientUpdate]:
    return [
        ClientUpdate(
            params=None, num_samples=u.num_samples, metrics=u.metrics, client_id=u.client_id
        )
        for u in updates
    ]


def _masked_sum(weights: list[float], updates: list[ClientUpdate], skip=()) -> dict:
    """What the protocol's unmasking yields: each client's model times its weight, summed."""
    return {
        k: sum(
            w * u.params[k].double()
            for i, (w, u) in enumerate(zip(weights, updates, strict=True))
            if i not in skip
        )
        for k in updates[0].params
    }


@pytest.mark.parametrize("make", LINEAR)
def test_weigh_then_finish_is_aggregate_over_rounds(make) -> None:
    clear, secure = make(), make()
    assert secure.secure_refusal() is None
    g_clear = g_secure = None
    for r, losses in enumerate([[0.5, 1.2, 9.0, 0.1, 0.7], [0.4, 0.3, 0.2, 0.0, 1.0]]):
        g, updates = _round(r, losses)
        g_clear = g if g_clear is None else g_clear
        g_secure = g if g_secure is None else g_secure
        expected = clear.aggregate(g_clear, updates, round=r + 1)
        weighing = secure.weigh(_scalars(updates), round=r + 1)
        got = secure.finish(g_secure, _masked_sum(weighing.weights, updates), weighing)
        assert got.weights == pytest.approx(expected.weights, abs=1e-12)
        assert got.extra["secure"] == "secure"
        assert expected.extra.get("bounded") == got.extra.get("bounded")
        for k in g:
            torch.testing.assert_close(got.params[k], expected.params[k], atol=1e-6, rtol=1e-6)
        g_clear, g_secure = expected.params, got.params  # FedAvgM's momentum carries over


def test_a_client_dropped_after_weighing_leaves_the_others_renormalised() -> None:
    g, updates = _round(0, [0.5, 1.2, 0.9, 0.1, 0.7])
    agg = FedLoss()
    weighing = agg.weigh(_scalars(updates))
    got = agg.finish(g, _masked_sum(weighing.weights, updates, skip={1}), weighing, dropped=[1])
    w = torch.tensor(weighing.weights, dtype=torch.float64)
    w[1] = 0
    w /= w.sum()
    assert got.weights == pytest.approx(w.tolist(), abs=1e-12)
    assert [r.client for r in got.rejected] == [1]
    expected = {
        k: sum(float(wi) * u.params[k].double() for wi, u in zip(w, updates, strict=True))
        for k in g
    }
    for k in g:
        torch.testing.assert_close(got.params[k], expected[k].float(), atol=1e-6, rtol=1e-6)


def test_scalars_reject_like_aggregate() -> None:
    _, updates = _round(0, [0.5, float("nan"), 0.9, 0.1, 0.7])
    weighing = FedLoss().weigh(_scalars(updates))
    assert weighing.weights[1] == 0
    assert "val_loss" in weighing.rejected[1]
    assert sum(weighing.weights) == pytest.approx(1.0)


def test_a_non_finite_sum_keeps_the_model() -> None:
    g, updates = _round(0, [0.5, 1.2, 0.9, 0.1, 0.7])
    agg = FedAvg()
    weighing = agg.weigh(_scalars(updates))
    masked = _masked_sum(weighing.weights, updates)
    masked["b"][0] = float("inf")
    got = agg.finish(g, masked, weighing)
    assert got.skipped and got.params is g and sum(got.weights) == 0


@pytest.mark.parametrize(
    ("agg", "words"),
    [
        (FedMedian(), "needs each client's model"),
        (Astraea(), "mediator"),
        (Astraea(mediators=False), "mediator"),
        (FedLoss(update_clip=3.0), "update_clip"),
    ],
)
def test_what_needs_the_models_refuses(agg, words: str) -> None:
    assert words in agg.secure_refusal()
    with pytest.raises(ValueError, match="secure aggregation"):
        agg.weigh([])
