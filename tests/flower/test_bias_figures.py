"""The bias figures on Flower: evaluate_reply's class counts, and the strategy's figures from
them, on real Flower messages (what a client may send is checked by name)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from torch.utils.data import TensorDataset

from fl_adapters.flower.payload import to_array_record
from fl_adapters.flower.strategy import FedBalanceStrategy
from fl_adapters.flower.trainer import evaluate_reply


def evaluate_message(node: int = 1) -> Message:
    torch.manual_seed(0)
    arrays = to_array_record(dict(torch.nn.Linear(4, 3).state_dict()))
    content = RecordDict({"arrays": arrays, "config": ConfigRecord()})
    return Message(content, dst_node_id=node, message_type=MessageType.EVALUATE)


def replies(*metrics: dict) -> list[Message]:
    return [
        Message(RecordDict({"metrics": MetricRecord(m)}), reply_to=evaluate_message(200 + i))
        for i, m in enumerate(metrics)
    ]


def node(client: int, total: list, correct: list, **extra: object) -> dict:
    n = sum(total) if all(isinstance(t, int) for t in total) else 0
    acc = sum(correct) / n if n else 0.0
    return {"num-examples": n, "eval_loss": 1.0, "eval_acc": acc, "client-id": client,
            "class-total": total, "class-correct": correct, **extra}  # fmt: skip


def test_evaluate_reply_counts_each_class_in_the_accuracy_pass(flower_task: None) -> None:
    torch.manual_seed(1)
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    model = torch.nn.Linear(4, 3)
    context = Context(1, 1, {"partition-id": 4}, RecordDict(), {"seed": 0})
    reply = evaluate_reply(evaluate_message(), context, model, {"train": TensorDataset(x, y),
                           "test": TensorDataset(x, y)})  # fmt: skip
    m = next(iter(reply.content.metric_records.values()))
    total, correct = m["class-total"], m["class-correct"]
    assert total == torch.bincount(y, minlength=3).tolist() and sum(total) == m["num-examples"]
    assert sum(correct) / sum(total) == pytest.approx(m["eval_acc"]) and m["client-id"] == 4


def test_the_strategy_sums_counts_into_the_bias_figures(flower_task: None) -> None:
    got = FedBalanceStrategy("fedavg").aggregate_evaluate(
        1, replies(node(0, [4, 0, 6], [4, 0, 3]), node(1, [2, 0, 2], [0, 0, 2]))
    )
    assert got is not None
    recall = got["class_recall"]
    assert recall[0] == pytest.approx(4 / 6) and math.isnan(recall[1]) and recall[2] == 5 / 8
    assert got["balanced_accuracy"] == pytest.approx((4 / 6 + 5 / 8) / 2)
    assert (got["worst_class"], got["worst_class_recall"]) == (2, 5 / 8)
    assert got["client_ids"] == [0, 1] and got["client_accuracy"] == [0.7, 0.5]
    assert got["client_acc_mean"] == pytest.approx(0.6) and got["client_acc_min"] == 0.5
    assert got["eval_acc"] == pytest.approx((7 + 2) / 14)  # Flower's weighted average, as before
    assert "class-total" not in got and "client-id" not in got  # never averaged


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (node(7, [3, -1], [1, 0]), "whole numbers in"),
        (node(7, [2.5, 1.0], [1.0, 0.0]), "whole numbers in"),
        (node(7, [3, 1], [1, 0, 0]), "differ in length"),
        (node(7, [3, 1], [4, 0]), "exceeds class-total"),
        (node(7, [3, 1], [1, 0], **{"num-examples": 9}), "not num-examples 9"),
        (node(7, [2**60, 1], [1, 0]), "whole numbers in"),
        (node(7, [0] * 100_001, [0] * 100_001), "a list of at most 100000 counts"),
    ],
    ids=[
        "negative",
        "fraction",
        "lengths",
        "more-correct",
        "not-adding-up",
        "enormous",
        "too-many-classes",
    ],  # fmt: skip
)
def test_counts_that_cannot_be_believed_are_left_out_by_name(
    bad: dict, why: str, flower_task: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="fl_adapters.flower.strategy"):
        got = FedBalanceStrategy("fedavg").aggregate_evaluate(
            1, replies(node(0, [2, 2], [2, 1]), bad)
        )
    assert got is not None and got["client_ids"] == [0] and got["balanced_accuracy"] == 0.75
    assert "left out of the bias figures" in caplog.text and why in caplog.text


def test_two_nodes_reporting_one_client_are_both_left_out(
    flower_task: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="fl_adapters.flower.strategy"):
        got = FedBalanceStrategy("fedavg").aggregate_evaluate(
            1, replies(node(1, [2, 2], [2, 1]), node(0, [3, 1], [1, 1]), node(0, [1], [1]))
        )
    assert got is not None and got["client_ids"] == [1] and got["balanced_accuracy"] == 0.75
    assert "each reported client 0" in caplog.text


def test_a_stock_clientapps_replies_give_flowers_averages_only(flower_task: None) -> None:
    plain = {"num-examples": 10, "eval_loss": 1.0, "eval_acc": 0.5}
    got = FedBalanceStrategy("fedavg").aggregate_evaluate(1, replies(plain, plain))
    assert got is not None and dict(got) == {"eval_loss": 1.0, "eval_acc": 0.5}
