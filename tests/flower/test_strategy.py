"""fedbalance's Flower strategy on real Flower messages: weights, rejections, record, config.

Flower 1.41 only builds a ``Message`` inside a run (it stamps the run and task ids from the
process's ``TaskIdentity``); the ``flower_task`` fixture (``conftest.py``) sets those ids as a ServerApp process
has them, so these tests drive the strategy with the messages Flower itself would deliver.
The end-to-end runs are in ``test_runs.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from torch.utils.data import TensorDataset

from fl_adapters.config import ConfigError
from fl_adapters.flower import RELEASES, require_flower
from fl_adapters.flower.config import parse_run_config
from fl_adapters.flower.payload import make_reply, to_array_record
from fl_adapters.flower.strategy import FedBalanceStrategy, strategy_from_run_config
from fl_adapters.flower.trainer import evaluate_reply
from fl_aggregators import ClientUpdate, FedLoss, FedMedian


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "record.jsonl"
    monkeypatch.setenv("FEDBALANCE_RECORD", str(path))
    return path


def model_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return dict(torch.nn.Linear(4, 3).state_dict())


def train_messages(global_state: dict[str, torch.Tensor], nodes: list[int]) -> list[Message]:
    config = ConfigRecord({"server-round": 1})
    content = RecordDict({"arrays": to_array_record(global_state), "config": config})
    return [Message(content, dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes]


def round_with(
    strategy: FedBalanceStrategy,
    clients: list[tuple[dict[str, torch.Tensor], int, float | None]],
) -> tuple[object, object]:
    """One aggregation of replies ``(params, num_examples, val_loss)`` from clients 0, 1, ..."""
    global_state = model_state(0)
    strategy.global_params = global_state  # what configure_train keeps from the global model
    msgs = train_messages(global_state, [100 + i for i in range(len(clients))])
    replies = [
        make_reply(msg, params, n, None if loss is None else {"val_loss": loss}, client)
        for client, (msg, (params, n, loss)) in enumerate(zip(msgs, clients, strict=True))
    ]
    return strategy.aggregate_train(1, list(reversed(replies)))  # arrival order must not matter


def read_record(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_fedloss_weights_are_normalised_validation_losses(flower_task: None, record: Path) -> None:
    strategy = FedBalanceStrategy("fedloss", aggregator_args={"loss_clip": None, "peer_clip": None})
    states = [model_state(s) for s in (1, 2, 3)]
    losses = [0.5, 1.5, 3.0]
    arrays, metrics = round_with(
        strategy, [(s, 10, x) for s, x in zip(states, losses, strict=True)]
    )
    expected = [x / sum(losses) for x in losses]
    (entry,) = read_record(record)
    assert entry["host"] == "flower" and entry["aggregator"] == "fedloss"
    assert entry["clients"] == [0, 1, 2]  # named by partition-id, in client order
    assert entry["weights"] == pytest.approx(expected, rel=1e-12)
    new = {k: torch.from_numpy(v.numpy()) for k, v in arrays.items()}  # type: ignore[attr-defined]
    for key in new:
        want = sum(w * s[key].double() for w, s in zip(expected, states, strict=True))
        assert torch.allclose(new[key].double(), want, atol=1e-6)
    assert metrics["fedbalance-accepted"] == 3  # type: ignore[index]


def test_same_numbers_as_the_aggregator_called_directly(flower_task: None) -> None:
    """The strategy adds transport only: its model equals FedLoss's own result, bit for bit."""
    states = [model_state(s) for s in (4, 5)]
    clients = [(states[0], 30, 0.8), (states[1], 10, 1.9)]
    arrays, _ = round_with(FedBalanceStrategy("fedloss"), clients)
    direct = FedLoss().aggregate(
        model_state(0),
        [ClientUpdate(p, n, {"val_loss": x}, client_id=i) for i, (p, n, x) in enumerate(clients)],
        round=1,
    )
    for key, value in direct.params.items():  # type: ignore[union-attr]
        assert torch.equal(torch.from_numpy(arrays[key].numpy()), value)  # type: ignore[index]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ((float("nan"), 10, 1.0), "parameters contain NaN or Inf"),
        (("no val_loss", 10, None), "required metric 'val_loss' is missing"),
        (("ok", 10, float("inf")), "metric 'val_loss' must be finite and >= 0"),
        (("ok", 0, 1.0), "num_samples must be a positive int, got 0"),
        (("wrong model", 10, 1.0), "weight has shape (3, 5), expected (3, 4)"),
    ],
    ids=["nan-params", "missing-val-loss", "infinite-val-loss", "zero-samples", "other-model"],
)
def test_bad_reply_is_rejected_and_the_round_goes_on(
    flower_task: None, record: Path, bad: tuple[object, int, float | None], reason: str
) -> None:
    kind, n, loss = bad
    params = model_state(7)
    if isinstance(kind, float):
        params = {k: torch.full_like(v, kind) for k, v in params.items()}
    elif kind == "wrong model":
        torch.manual_seed(0)
        params = dict(torch.nn.Linear(5, 3).state_dict())
    good = model_state(8)
    arrays, metrics = round_with(
        FedBalanceStrategy("fedloss"), [(good, 10, 1.0), (params, n, loss)]
    )
    (entry,) = read_record(record)
    assert entry["weights"] == [1.0, 0.0]
    (rejected,) = entry["rejected"]  # type: ignore[misc]
    assert rejected["client"] == 1 and reason in rejected["reason"]
    assert metrics["fedbalance-rejected"] == 1  # type: ignore[index]
    for key, value in good.items():  # the one honest client's model
        assert torch.equal(torch.from_numpy(arrays[key].numpy()), value)  # type: ignore[index]


def test_round_without_acceptable_reply_keeps_the_model(flower_task: None, record: Path) -> None:
    arrays, _ = round_with(FedBalanceStrategy("fedloss"), [(model_state(1), 10, None)])
    assert arrays is None  # Flower's start() keeps the global model on None
    (entry,) = read_record(record)
    assert entry["skipped"] is True and entry["weights"] == [0.0]


def test_fedmedian_through_flower_is_the_coordinate_median(flower_task: None) -> None:
    states = [model_state(s) for s in (1, 2, 3)]
    arrays, _ = round_with(FedBalanceStrategy("fedmedian"), [(s, 10, None) for s in states])
    direct = FedMedian().aggregate(model_state(0), [ClientUpdate(s, 10) for s in states])
    for key, value in direct.params.items():  # type: ignore[union-attr]
        assert torch.equal(torch.from_numpy(arrays[key].numpy()), value)  # type: ignore[index]


def test_fedavgm_keeps_momentum_across_rounds(flower_task: None) -> None:
    strategy = FedBalanceStrategy("fedavgm", aggregator_args={"beta": 0.9, "server_lr": 1.0})
    step1, _ = round_with(strategy, [(model_state(1), 10, None)])
    step2, _ = round_with(strategy, [(model_state(1), 10, None)])
    # Same global and same update twice: the second step also carries 0.9 of the first.
    first = {k: torch.from_numpy(v.numpy()) for k, v in step1.items()}  # type: ignore[attr-defined]
    second = {k: torch.from_numpy(v.numpy()) for k, v in step2.items()}  # type: ignore[attr-defined]
    g, u = model_state(0), model_state(1)
    for key in g:
        assert torch.allclose(first[key], u[key], atol=1e-6)
        assert torch.allclose(second[key], g[key] + 1.9 * (u[key] - g[key]), atol=1e-5)


# -- the run config ----------------------------------------------------------------------------
def test_run_config_selects_aggregator_and_arguments() -> None:
    strategy = strategy_from_run_config(
        {"aggregator": "FedLoss_N", "aggregator-args": '{"mix": 0.5, "peer_clip": null}'},
        fraction_evaluate=0.0,
    )
    assert strategy.aggregator.name == "fedloss_n"
    assert strategy.aggregator.mix == 0.5 and strategy.aggregator.peer_clip is None  # type: ignore[attr-defined]
    assert strategy.fraction_evaluate == 0.0  # Flower's own FedAvg arguments pass through


@pytest.mark.parametrize(
    ("run_config", "message"),
    [
        ({"aggregator": "fedlos"}, "aggregator: unknown aggregator 'fedlos'"),
        ({"aggregator": 3}, "aggregator must be a fedbalance aggregator name"),
        ({"aggregator-args": "{'a': 1}"}, "aggregator-args: not valid JSON"),
        ({"aggregator-args": "[1]"}, "aggregator-args must be a JSON object, got '[1]'"),
        ({"aggregator-args": 5}, "aggregator-args must be a JSON object in a string"),
        ({"aggregator": "fedloss", "aggregator-args": '{"clip": 1}'}, "unknown argument(s) 'clip'"),
        ({"aggregator": "fedloss", "aggregator-args": '{"loss_clip": -1}'}, "loss_clip"),
        ({"seed": -1}, "seed must be an int >= 0, got -1"),
    ],
    ids=["unknown", "not-a-name", "bad-json", "json-list", "not-a-string", "unknown-arg",
         "bad-arg-value", "negative-seed"],
)  # fmt: skip
def test_run_config_errors_name_the_key_and_what_was_given(
    run_config: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as e:
        strategy_from_run_config(run_config)
    assert "[tool.flwr.app.config]" in str(e.value)
    assert message in str(e.value)


def test_unknown_aggregator_lists_the_available_ones() -> None:
    with pytest.raises(ConfigError, match="available: .*fedloss.*did you mean 'fedloss'"):
        strategy_from_run_config({"aggregator": "fedlos"})


def test_astraea_aggregation_alone_runs_as_a_strategy() -> None:
    cfg = {"aggregator": "astraea", "aggregator-args": '{"mediators": false, "augment": false}'}
    strategy = strategy_from_run_config(cfg)
    assert type(strategy) is FedBalanceStrategy and strategy.aggregator.name == "astraea"


def test_astraea_with_mediators_gets_the_astraea_strategy() -> None:
    from fl_adapters.flower.astraea import AstraeaStrategy

    strategy = strategy_from_run_config({"aggregator": "astraea", "aggregator-args": "{}"})
    assert isinstance(strategy, AstraeaStrategy) and strategy.astraea.mediators


def test_plain_strategy_refuses_astraea_with_mediators() -> None:
    with pytest.raises(ConfigError, match="trains mediators and rebalances data: use AstraeaStr"):
        FedBalanceStrategy("astraea")


def test_a_server_app_refuses_a_carried_optimizer_before_any_round() -> None:
    """Each ClientApp trains with an optimizer of its own: one carried along a mediator's
    chain cannot take effect, so the strategy is never built (not silently ignored)."""
    cfg = {"aggregator": "astraea", "aggregator-args": '{"carry_optimizer": true}'}
    with pytest.raises(ConfigError, match="aggregator-args: carry_optimizer: true cannot take"):
        strategy_from_run_config(cfg)


#: fl_adapters.config.check_eval_keys, as RunConfig and FedML's validation_args say it.
SHARE = "(the share of clients evaluated)"


def test_defaults_when_the_app_sets_nothing() -> None:
    cfg = parse_run_config({})
    assert (cfg.aggregator, cfg.aggregator_args, cfg.seed) == ("fedavg", {}, 0)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("eval-every", 0, "eval-every must be an int >= 1, got 0"),
        ("eval-every", True, "eval-every must be an int >= 1, got True"),
        *[
            ("eval-fraction", bad, f"eval-fraction must be a number in (0, 1] {SHARE}, got {bad!r}")
            for bad in (0, 1.5, float("nan"), "half")
        ],
    ],
    ids=["every-zero", "every-bool", "fraction-zero", "above-one", "nan", "string"],
)
def test_the_evaluation_keys_are_refused_in_the_words_of_every_host(
    key: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_run_config({key: value})
    assert str(err.value) == f"[tool.flwr.app.config] {message}"


# -- the version check ----------------------------------------------------------------------
def test_installed_flower_is_accepted() -> None:
    assert any(require_flower().startswith(r + ".") for r in RELEASES)


@pytest.mark.parametrize("installed", ["1.41.0", "1.41.3", "1.42.0"])
def test_every_supported_flower_release_is_served(
    monkeypatch: pytest.MonkeyPatch, installed: str
) -> None:
    import fl_adapters.flower.spec as adapter

    monkeypatch.setattr(adapter, "flwr_version", lambda: installed)
    assert adapter.require_flower() == installed


@pytest.mark.parametrize(
    ("installed", "message"),
    [
        ("1.40.0", "found flwr 1.40.0; fedbalance's Flower adapter supports flwr 1.41.x or 1.42.x"),
        ("1.43.0", "found flwr 1.43.0; fedbalance's Flower adapter supports flwr 1.41.x or 1.42.x"),
        (None, "needs flwr 1.41.x or 1.42.x, which is not installed: pip install"),
    ],
    ids=["older-release", "newer-release", "absent"],
)
def test_other_flower_release_is_refused_naming_both_versions(
    monkeypatch: pytest.MonkeyPatch, installed: str | None, message: str
) -> None:
    import fl_adapters.flower.spec as adapter

    monkeypatch.setattr(adapter, "flwr_version", lambda: installed)
    monkeypatch.delenv("FEDBALANCE_FORCE_HOST", raising=False)
    with pytest.raises(
        ImportError if installed is None else RuntimeError, match=re.escape(message)
    ):
        adapter.require_flower()


def evaluate_round(strategy: FedBalanceStrategy, replies: list[dict[str, float]]) -> object:
    """One evaluation round whose nodes reply ``replies`` (their metrics)."""
    content = RecordDict({"arrays": to_array_record(model_state(0)), "config": ConfigRecord()})
    out = []
    for node, metrics in enumerate(replies):
        msg = Message(content, dst_node_id=200 + node, message_type=MessageType.EVALUATE)
        out.append(Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg))
    return strategy.aggregate_evaluate(1, out)


def test_a_node_without_test_data_is_left_out_of_the_evaluation_average(
    flower_task: None,
) -> None:
    nan = float("nan")
    full = {"num-examples": 30, "eval_loss": 0.9, "eval_acc": 0.6}
    other = {"num-examples": 10, "eval_loss": 1.3, "eval_acc": 0.4}
    none = {"num-examples": 0, "eval_loss": nan, "eval_acc": nan}  # as a third-party app may
    metrics = evaluate_round(FedBalanceStrategy("fedavg"), [full, none, other])
    assert metrics["eval_loss"] == pytest.approx(1.0) and metrics["eval_acc"] == pytest.approx(0.55)  # type: ignore[index]
    # Every node without test data: no average (Flower's own would divide by zero).
    assert evaluate_round(FedBalanceStrategy("fedavg"), [none, none]) is None


def test_evaluate_reply_of_a_client_without_test_data_weighs_nothing(flower_task: None) -> None:
    x, y = torch.randn(2, 4), torch.tensor([0, 1])
    data = {"train": TensorDataset(x, y), "test": TensorDataset(x[:0], y[:0])}
    msg = Message(
        RecordDict({"arrays": to_array_record(model_state(0)), "config": ConfigRecord()}),
        dst_node_id=1,
        message_type=MessageType.EVALUATE,
    )
    context = Context(1, 1, {"partition-id": 0}, RecordDict(), {"seed": 0})
    reply = evaluate_reply(msg, context, torch.nn.Linear(4, 3), data)
    metrics = next(iter(reply.content.metric_records.values()))
    assert dict(metrics) == {
        "num-examples": 0, "eval_loss": 0.0, "eval_acc": 0.0, "client-id": 0,
        "class-total": [], "class-correct": [],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ('{"server_lr": Infinity}', "Infinity is not JSON"),
        ("[" * 30_000 + "]" * 30_000, "nested too deeply"),
        ('{"server_lr": 1e999}', "too large for a float"),
    ],
)
def test_aggregator_args_json_is_bounded_and_finite(raw: str, words: str) -> None:
    from fl_adapters.config import ConfigError
    from fl_adapters.flower.config import parse_run_config

    with pytest.raises(ConfigError, match=words):
        parse_run_config({"aggregator": "fedavgm", "aggregator-args": raw})


def test_evaluation_turned_off_and_an_evaluation_share_are_refused_together() -> None:
    """``fraction_evaluate=0.0`` (no evaluation) beside the run config's ``eval-fraction``
    would silently drop one of the two."""
    with pytest.raises(ConfigError, match="fraction_evaluate=0.0 turns evaluation off"):
        strategy_from_run_config({"eval-fraction": 0.5}, fraction_evaluate=0.0)
    assert strategy_from_run_config({"eval-fraction": 0.5}).evaluate_fraction == 0.5
    assert strategy_from_run_config({}, fraction_evaluate=0.0).evaluate_fraction is None


def test_client_ids_read_from_the_engine_are_checked_against_every_reply(
    flower_task: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Client ids read from Flower's simulation engine (not asked) stay trusted while the train
    replies name the same clients; a reply naming another client turns the read off, with a
    warning, and the nodes are asked from the next round on. Outside the simulation engine
    nothing is read."""
    from fl_adapters.flower.sampling import simulated_partitions

    assert simulated_partitions(object()) is None  # type: ignore[arg-type]
    strategy = FedBalanceStrategy("fedavg")
    state = model_state(1)
    strategy.client_ids = {100: 0, 101: 1}  # what round_with's replies report
    round_with(strategy, [(state, 10, 1.0), (state, 10, 1.0)])
    assert strategy.read_engine and strategy.client_ids == {100: 0, 101: 1}

    strategy.client_ids = {100: 1, 101: 0}  # the read disagrees with both replies
    with caplog.at_level("WARNING"):
        round_with(strategy, [(state, 10, 1.0), (state, 10, 1.0)])
    assert not strategy.read_engine and strategy.client_ids == {}
    assert (
        "node 101 reported client 1, but Flower's simulation engine registered it as partition 0"
        in caplog.text
    )
