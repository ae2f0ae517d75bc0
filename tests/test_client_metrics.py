"""Client metrics by name (fl_adapters.client_metrics): what an aggregator asks for is what
every host's clients measure and send, through one table."""

from __future__ import annotations

import logging
from typing import ClassVar

import pytest
import torch

from fl_adapters.client_metrics import CLIENT_METRICS, Evaluation, measure, requested, splits
from fl_aggregators import FedAvg, FedLoss
from fl_checks import ParameterError


class NeedsUnknown(FedAvg):
    name = "needs_unknown"
    required_metrics: ClassVar[tuple[str, ...]] = ("val_loss", "val_f1")


def test_an_aggregator_asks_by_name_and_an_unknown_name_is_refused() -> None:
    assert requested(FedLoss) == ("val_loss",) and requested(FedLoss()) == ("val_loss",)
    assert requested(FedAvg) == () and splits(requested(FedLoss)) == {"val"}
    with pytest.raises(ParameterError, match=r"'needs_unknown' needs client metrics \['val_f1'\]"):
        requested(NeedsUnknown)


def test_measure_evaluates_once_and_only_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def evaluate() -> Evaluation:
        calls.append(1)
        return Evaluation(0.5, 0.75, 40)

    assert measure((), evaluate, 3) == {} and calls == []  # FedAvg: nothing is evaluated
    assert measure(("val_loss",), evaluate, 3) == {"val_loss": 0.5} and calls == [1]
    with caplog.at_level(logging.WARNING, logger="fl_adapters.client_metrics"):
        assert measure(("val_loss",), lambda: Evaluation(float("nan"), float("nan"), 0), 3) == {}
        assert measure(("val_loss",), lambda: None, 4) == {}
    assert "client 3 has an empty validation split" in caplog.text


def test_every_table_entry_is_named_by_its_key_and_computes_a_number() -> None:
    for name, metric in CLIENT_METRICS.items():
        assert metric.name == name and metric.split in ("val",) and metric.doc
        assert isinstance(metric.value(Evaluation(0.25, 0.5, 8)), float)


def test_fedlab_and_fedml_payloads_carry_every_table_metric_by_name() -> None:
    from fl_adapters.fedlab.payload import META_FIELDS, decode, encode
    from fl_adapters.fedml.payload import attach, strip

    sent = {name: 0.125 * (i + 1) for i, name in enumerate(CLIENT_METRICS)}
    assert META_FIELDS == ("client_id", "num_samples", *CLIENT_METRICS)
    assert decode(encode(torch.ones(2), 1, 5, sent)).metrics == sent
    assert strip(attach({"w": torch.ones(2)}, 1, sent))[2] == sent
