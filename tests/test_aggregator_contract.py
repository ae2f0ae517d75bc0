"""Contract every registered aggregator (built-in or third-party) must meet."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_adapters.registry import get_registry
from fl_aggregators import ClientUpdate

AGGREGATORS = get_registry().names("aggregators")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(name: str, **args: object):  # type: ignore[no-untyped-def]
    # The process's registry: loading a fresh one per call (entry points read again) made these
    # property tests take minutes.
    return get_registry().make_aggregator(name, **args)


#: Arguments that make a server take the whole averaged step: FedAvgM's default server_lr (0.3)
#: moves the model only part of the way to the clients' average, by design.
FULL_STEP: dict[str, dict[str, object]] = {"fedavgm": {"server_lr": 1.0}}


def model(seed: int, scale: float = 1.0) -> OrderedDict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return OrderedDict(
        conv=torch.randn(3, 2, 2, generator=g) * scale,
        bias=(torch.randn(3, generator=g) * scale).double(),
        steps=torch.tensor(seed % 50),
    )


def updates(seeds: list[int], sizes: list[int], losses: list[float]) -> list[ClientUpdate]:
    return [
        ClientUpdate(model(s), n, {"val_loss": loss}, client_id=i)
        for i, (s, n, loss) in enumerate(zip(seeds, sizes, losses, strict=True))
    ]


clients = st.integers(min_value=1, max_value=7)


def test_builtins_are_all_registered() -> None:
    assert {"fedavg", "fedavgm", "fedmedian", "fedloss", "fedloss_n"} <= set(AGGREGATORS)


@pytest.mark.parametrize("name", AGGREGATORS)
@SETTINGS
@given(k=clients, seed=st.integers(0, 1000), data=st.data())
def test_identical_updates_aggregate_to_themselves(name: str, k: int, seed: int, data) -> None:  # type: ignore[no-untyped-def]
    sizes = data.draw(st.lists(st.integers(1, 10_000), min_size=k, max_size=k))
    losses = data.draw(st.lists(st.floats(0.01, 50), min_size=k, max_size=k))
    agg = make(name, **FULL_STEP.get(name, {}))
    r = agg.aggregate(model(seed + 1), updates([seed] * k, sizes, losses))
    for key, value in model(seed).items():
        assert torch.allclose(r.params[key].double(), value.double(), atol=1e-5), key
    assert sum(r.weights) == pytest.approx(1.0)


@pytest.mark.parametrize("name", AGGREGATORS)
@SETTINGS
@given(k=st.integers(2, 7), data=st.data())
def test_client_order_does_not_matter(name: str, k: int, data) -> None:  # type: ignore[no-untyped-def]
    seeds = data.draw(st.lists(st.integers(0, 10_000), min_size=k, max_size=k))
    sizes = data.draw(st.lists(st.integers(1, 10_000), min_size=k, max_size=k))
    losses = data.draw(st.lists(st.floats(0.01, 50), min_size=k, max_size=k))
    perm = data.draw(st.permutations(range(k)))
    ups = updates(seeds, sizes, losses)
    a = make(name).aggregate(model(0), ups)
    b = make(name).aggregate(model(0), [ups[i] for i in perm])
    for key in a.params:
        assert torch.allclose(a.params[key].double(), b.params[key].double(), atol=1e-4), key
    assert [b.weights[perm.index(i)] for i in range(k)] == pytest.approx(a.weights)


@pytest.mark.parametrize("name", AGGREGATORS)
def test_integer_buffers_do_not_depend_on_client_order(name: str) -> None:
    """0.3 * 1 + 0.7 * 46 is 32.5: averaged in float32 (an int64 tensor times a Python float,
    in torch) the two orders gave 32 and 33; in float64 both round half to even."""
    ups = updates([1, 596], [36, 84], [0.5, 0.5])
    a = make(name).aggregate(model(0), ups).params["steps"]
    b = make(name).aggregate(model(0), ups[::-1]).params["steps"]
    assert a.dtype == torch.int64 and torch.equal(a, b)


@pytest.mark.parametrize("name", AGGREGATORS)
def test_output_has_input_shapes_and_dtypes(name: str) -> None:
    r = make(name).aggregate(model(0), updates([1, 2, 3], [5, 6, 7], [0.3, 0.4, 0.5]))
    assert isinstance(r.params, OrderedDict)
    for key, ref in model(0).items():
        assert r.params[key].shape == ref.shape and r.params[key].dtype == ref.dtype
    flat = make(name).aggregate(torch.zeros(4), [ClientUpdate(torch.ones(4), 3, {"val_loss": 1.0})])
    assert isinstance(flat.params, torch.Tensor) and flat.params.shape == (4,)


@pytest.mark.parametrize("name", AGGREGATORS)
def test_rejection_rules_hold(name: str) -> None:
    ups = updates([1, 2], [5, 6], [0.3, 0.4])
    poisoned = model(3)
    poisoned["conv"][0, 0, 0] = float("nan")
    ups.append(ClientUpdate(poisoned, 5, {"val_loss": 0.5}, client_id="nan"))
    ups.append(
        ClientUpdate(
            OrderedDict(conv=torch.zeros(2), bias=torch.zeros(3).double(), steps=torch.tensor(1)),
            5,
            {"val_loss": 0.5},
            client_id="shape",
        )
    )
    r = make(name).aggregate(model(0), ups)
    assert {x.client for x in r.rejected} == {"nan", "shape"}
    assert r.weights[2:] == [0.0, 0.0] and sum(r.weights) == pytest.approx(1.0)
    assert all(torch.isfinite(t).all() for t in r.params.values())
    clean = make(name).aggregate(model(0), ups[:2])
    for key in clean.params:
        assert torch.equal(clean.params[key], r.params[key]), key


@pytest.mark.parametrize("name", AGGREGATORS)
def test_every_client_rejected_skips_the_round(name: str) -> None:
    g = model(0)
    bad = model(1)
    bad["bias"][0] = float("inf")
    r = make(name).aggregate(
        g, [ClientUpdate(bad, 3, {"val_loss": 1.0}), ClientUpdate(model(2), -1, {"val_loss": 1.0})]
    )
    assert r.skipped and r.params is g and r.weights == [0.0, 0.0]


@pytest.mark.parametrize("name", AGGREGATORS)
def test_same_inputs_same_result(name: str) -> None:
    ups = updates([4, 5, 6], [10, 20, 30], [0.2, 0.9, 0.4])
    a, b = make(name), make(name)
    for _ in range(3):
        ra, rb = a.aggregate(model(0), ups), b.aggregate(model(0), ups)
        for key in ra.params:
            assert torch.equal(ra.params[key], rb.params[key])
