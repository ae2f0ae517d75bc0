"""FedML's MPI and cross-silo servers: where the global test set is the union of the clients'
test splits, the bias figures are counted in one pass over it, per client, and that pass
answers FedML's own server test of the round (``DefaultServerAggregator``, real): a tested
round evaluates the model once, not twice."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

pytest.importorskip("fedml")

from fedml.ml.aggregator.default_aggregator import DefaultServerAggregator  # noqa: E402

from fl_adapters.fedml import adapter  # noqa: E402
from fl_adapters.fedml.patches import distributed  # noqa: E402
from fl_aggregators import FedAvg  # noqa: E402


class Counting(nn.Module):
    """A linear model that counts the samples it is asked about."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += len(x)
        return self.lin(x)


def server(union: bool, sizes: tuple[int, ...] = (7, 0, 12)) -> Any:
    torch.manual_seed(0)
    held = {
        c: DataLoader(TensorDataset(torch.randn(n, 4), torch.randint(0, 3, (n,))), batch_size=5)
        for c, n in enumerate(sizes)
    }
    parts = [held[c].dataset for c in held] if union else [held[0].dataset]
    args = SimpleNamespace(dataset="fmnist", enable_wandb=False, round_idx=3)
    model = Counting()
    return SimpleNamespace(
        aggregator=DefaultServerAggregator(model, args),
        test_data_local_dict=held,
        test_global=DataLoader(ConcatDataset(parts), batch_size=5),
        args=args,
    )


@pytest.fixture(autouse=True)
def run_state(monkeypatch: pytest.MonkeyPatch) -> None:
    state = adapter.RunState(("fedml-mpi", "fedavg", ""), "fedml-mpi", FedAvg(), (), 0.0, 0)
    monkeypatch.setattr(adapter, "_RUN", state)


def stock_metrics(agg: Any) -> dict[str, Any]:
    fresh = server(union=True)
    fresh.aggregator.model.load_state_dict(agg.aggregator.model.state_dict())
    return DefaultServerAggregator._test(fresh.aggregator, fresh.test_global, "cpu", fresh.args)  # type: ignore[no-any-return]


def test_the_figures_pass_answers_fedmls_test_on_the_union() -> None:
    agg = server(union=True)
    model = agg.aggregator.model
    distributed.clients_figures(agg)
    assert model.seen == 19  # the figures' pass: each sample once, over FedML's test set
    got = agg.aggregator._test(agg.test_global, "cpu", agg.args)
    assert model.seen == 19  # FedML's test took no pass of its own
    want = stock_metrics(agg)
    assert (got["test_correct"], got["test_total"]) == (want["test_correct"], want["test_total"])
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-6)


def test_another_round_or_another_test_set_gets_fedmls_own_pass() -> None:
    agg = server(union=True)
    model = agg.aggregator.model
    distributed.clients_figures(agg)
    agg.args.round_idx = 4  # a round the figures' pass did not count
    agg.aggregator._test(agg.test_global, "cpu", agg.args)
    assert model.seen == 19 + 19
    agg.aggregator._test(agg.test_data_local_dict[0], "cpu", agg.args)
    assert model.seen == 19 + 19 + 7


def test_a_test_set_that_is_not_the_union_keeps_fedmls_pass_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agg = server(union=False)
    model = agg.aggregator.model
    with caplog.at_level(logging.INFO, logger=distributed.__name__):
        distributed.clients_figures(agg)
        distributed.clients_figures(agg)
    assert "_test" not in vars(agg.aggregator)
    agg.aggregator._test(agg.test_global, "cpu", agg.args)
    assert model.seen == 2 * 19 + 7
    assert sum("one evaluation pass more" in r.message for r in caplog.records) == 1


def test_a_server_aggregator_with_its_own_test_keeps_it() -> None:
    class Own(DefaultServerAggregator):
        def _test(self, test_data: Any, device: Any, args: Any) -> Any:
            return {"test_correct": 1, "test_loss": 0.0, "test_total": 1}

    agg = server(union=True)
    agg.aggregator = Own(agg.aggregator.model, agg.args)
    distributed.clients_figures(agg)
    assert agg.aggregator._test(agg.test_global, "cpu", agg.args)["test_total"] == 1
