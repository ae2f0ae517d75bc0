"""Under secure aggregation the server cannot see a client's model, so a client that scales
its own masked model (a weight lie) is invisible per client. Each client reports the length of
its update in clear, and :meth:`Aggregator.finish` holds the unmasked average to those reports:
a weighted average of honest updates moves the model no further than the longest of them.
The real protocols' runs are in tests/flower/test_secure.py and tests/test_fedml*.py.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from fl_aggregators import UPDATE_NORM, ClientUpdate, FedAvg, FedLoss
from fl_aggregators.functional import update_norm


def _round(lie: float = 1.0, claims: list[float] | None = None):
    gen = torch.Generator().manual_seed(3)
    g = {"w": torch.randn(6, 5, generator=gen), "steps": torch.tensor(7)}
    models = [
        {"w": g["w"] + 0.1 * torch.randn(6, 5, generator=gen), "steps": torch.tensor(7 + 40)}
        for _ in range(4)
    ]
    norms = [update_norm(list(g.values()), list(m.values())) for m in models]
    if claims is not None:
        norms = claims
    updates = [
        ClientUpdate(params=None, num_samples=10 + i, metrics={UPDATE_NORM: n}, client_id=i)
        for i, n in enumerate(norms)
    ]
    return g, models, updates, lie


def _unmasked(weights: list[float], models: list[dict], lie_at: int, lie: float) -> dict:
    return {
        k: sum(
            (lie if i == lie_at else 1.0) * w * m[k].double()
            for i, (w, m) in enumerate(zip(weights, models, strict=True))
        )
        for k in models[0]
    }


def test_update_norm_counts_floating_tensors_only() -> None:
    g = [torch.zeros(3), torch.tensor(5)]
    assert update_norm(g, [torch.tensor([3.0, 4.0, 0.0]), torch.tensor(900)]) == 5.0


@pytest.mark.parametrize(
    ("aggregator", "lie", "skipped"),
    [(FedAvg, 1.0, False), (FedLoss, 1.0, False), (FedAvg, 1000.0, True), (FedAvg, 30.0, True)],
)
def test_the_unmasked_average_is_held_to_the_reported_norms(
    aggregator, lie: float, skipped: bool, caplog: pytest.LogCaptureFixture
) -> None:
    g, models, updates, _ = _round()
    if aggregator is FedLoss:
        updates = [
            ClientUpdate(
                params=None,
                num_samples=u.num_samples,
                metrics={**u.metrics, "val_loss": 1.0 + i},
                client_id=u.client_id,
            )
            for i, u in enumerate(updates)
        ]
    agg = aggregator()
    weighing = agg.weigh(updates, round=1, with_norms=True)
    with caplog.at_level(logging.WARNING):
        result = agg.finish(g, _unmasked(weighing.weights, models, 2, lie), weighing)
    assert result.skipped is skipped
    if skipped:
        assert result.params is g and "misreported its weight or its model" in caplog.text
    else:
        assert not torch.equal(result.params["w"], g["w"])


def test_a_huge_report_does_not_lift_the_bound() -> None:
    """A liar that also claims a huge update counts only up to 4x the median report."""
    g, models, updates, _ = _round()
    honest = [u.metrics[UPDATE_NORM] for u in updates]
    _, _, updates, _ = _round(claims=[*honest[:2], 1e9, honest[3]])
    agg = FedAvg()
    weighing = agg.weigh(updates, round=1, with_norms=True)
    assert agg.finish(g, _unmasked(weighing.weights, models, 2, 1000.0), weighing).skipped


def test_the_protocols_rounding_is_allowed() -> None:
    """Every client made the same update d: the honest average moves the model by exactly
    |d|, the longest report. Rounding of 1e-4 per coordinate away from it is a lie when the
    protocol claims exact sums, and allowed when it says it rounds to 1e-4."""
    g = {"w": torch.zeros(6, 5, dtype=torch.float64)}
    d = torch.randn(6, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    claims = [float(d.norm())] * 3
    updates = [
        ClientUpdate(params=None, num_samples=5, metrics={UPDATE_NORM: c}, client_id=i)
        for i, c in enumerate(claims)
    ]
    rounded = {"w": d + 1e-4 * d.sign()}
    for resolution, skipped in [(0.0, True), (1e-4, False)]:
        agg = FedAvg()
        weighing = agg.weigh(updates, round=1, with_norms=True)
        assert agg.finish(g, rounded, weighing, resolution=resolution).skipped is skipped


@pytest.mark.parametrize("bad", [None, math.nan, -1.0, math.inf, True, "0.5"])
def test_a_client_without_a_usable_norm_is_rejected(bad: object) -> None:
    updates = [
        ClientUpdate(params=None, num_samples=5, metrics={UPDATE_NORM: 1.0}, client_id=0),
        ClientUpdate(
            params=None,
            num_samples=5,
            metrics={} if bad is None else {UPDATE_NORM: bad},
            client_id=1,
        ),
    ]
    weighing = FedAvg().weigh(updates, round=1, with_norms=True)
    assert weighing.weights == [1.0, 0.0]
    assert (
        "update_norm" in weighing.rejected[1] and "bounds the unmasked sum" in weighing.rejected[1]
    )


def test_without_norms_nothing_changes() -> None:
    g, models, updates, _ = _round()
    agg = FedAvg()
    weighing = agg.weigh(updates, round=1)
    assert weighing.norms is None
    assert not agg.finish(g, _unmasked(weighing.weights, models, 2, 1000.0), weighing).skipped
