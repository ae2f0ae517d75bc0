"""Attacks on real FedLab standalone runs, at CI size: the reliability report's checks.

Clients misbehave inside FedLab's own pipeline (the trainer's uplink hook rewrites what they
send); the assertions are the report's targets: a loss liar takes no more than the top honest
client of its round, and every bad uplink is rejected with a reason, leaving a finite model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fedlab")

from helpers import digits_run

from fedbalance_benchmarks.reliability import Attack, main, run_stats
from fl_adapters.checkpoint import Checkpoint
from fl_adapters.config import RunConfig
from fl_adapters.fedlab.runner import build, run_standalone


def config(**overrides: Any) -> RunConfig:
    base = {"partition": {"name": "label_dirichlet", "beta": 0.5}, "aggregator": "fedloss"}
    return digits_run(
        {**base, "num_clients": 10, "clients_per_round": 10, "rounds": 3, "seed": 1}, overrides
    )


def attacked(tmp_path: Path, attack: Attack, **overrides: Any) -> list[dict[str, Any]]:
    out = tmp_path / f"{attack.kind}-{attack.liars}-{attack.params}"
    run_standalone(config(**overrides), out, progress=False, uplink_hook=attack)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("factor", [1e3, 1e9])
@pytest.mark.parametrize("aggregator", ["fedloss", "fedloss_n"])
def test_one_loss_liar_takes_at_most_the_top_honest_share(
    aggregator: str, factor: float, tmp_path: Path
) -> None:
    rows = attacked(tmp_path, Attack("inflate", 1, factor), aggregator=aggregator)
    stats = run_stats(rows, liars=1)
    assert stats["rejected"] == 0
    for liar, top in zip(stats["liar_each"], stats["top_honest"], strict=True):
        assert 0 < liar <= top + 1e-9


def test_without_bounds_the_liar_takes_the_model(tmp_path: Path) -> None:
    rows = attacked(
        tmp_path,
        Attack("inflate", 1, 1e6),
        aggregator_args={"loss_clip": None, "peer_clip": None},
    )
    assert min(run_stats(rows, liars=1)["liar_share"]) > 0.999


@pytest.mark.parametrize("aggregator", ["fedavg", "fedavgm", "fedloss_n"])
def test_one_sample_count_liar_takes_the_model_unless_bounded(
    aggregator: str, tmp_path: Path
) -> None:
    lie = Attack("samples", 1, 1e3)
    trust = {"sample_clip": None}
    trusting = run_stats(
        attacked(tmp_path / "trust", lie, aggregator=aggregator, aggregator_args=trust), liars=1
    )
    # sample_clip 1 everywhere; FedAvg's and FedLoss-n's default (20) holds the liar too.
    clip = {} if aggregator in ("fedavg", "fedloss_n") else {"sample_clip": 1.0}
    bounded = run_stats(
        attacked(tmp_path / "clip", lie, aggregator=aggregator, aggregator_args=clip), liars=1
    )
    if aggregator == "fedloss_n":  # its peer bound on n_i * l_i already holds the liar
        assert max(trusting["liar_share"]) < 0.5
    else:
        assert min(trusting["liar_share"]) > 0.9
    for stats in [bounded] + ([trusting] if aggregator == "fedloss_n" else []):
        for liar, top in zip(stats["liar_each"], stats["top_honest"], strict=True):
            assert 0 < liar <= top + 1e-9


def test_astraea_holds_a_sample_count_liar_to_its_own_data(tmp_path: Path) -> None:
    """Without augmentation a mediator's honest n_m is exactly its members' reported label
    counts, so the bound from the plan gives the liar's mediator its honest weight, no more."""
    args = {"gamma": 3, "augment": False}
    honest = attacked(tmp_path, Attack(), aggregator="astraea", aggregator_args=args)
    lied = attacked(tmp_path, Attack("samples", 1, 1e3), aggregator="astraea", aggregator_args=args)
    assert [r["mediators"] for r in lied] == [r["mediators"] for r in honest]
    assert [r["weights"] for r in lied] == [r["weights"] for r in honest]


def test_stock_fedlab_astraea_holds_a_sample_count_liar_to_its_mediators_data(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same bound where ``FEDBALANCE_AGGREGATOR=astraea`` arms a stock FedLab handler (its
    ``global_update`` is FedLabArming's): an honest mediator keeps its count, an inflated one
    is held to what its members' data allows."""
    from fedlab.contrib.algorithm.basic_server import SyncServerHandler

    from fl_adapters.astraea import AstraeaPlanner
    from fl_adapters.fedlab.patches import FedLabArming
    from fl_adapters.fedlab.payload import encode
    from fl_aggregators.astraea import Astraea

    arming = FedLabArming("astraea", {"augment": False})
    arming.planner = AstraeaPlanner(torch.tensor([[3, 1], [2, 2], [5, 0]]).numpy(), Astraea())
    arming.mediators = [[0, 1], [2]]
    model = torch.nn.Linear(2, 1)
    handler = SyncServerHandler(model, global_round=1, sample_ratio=1.0)
    params = handler.model_parameters
    buffer = [encode(params, 0, 8), encode(params, 1, 10**6)]
    with caplog.at_level("WARNING", logger="fl_adapters.astraea"):
        arming.global_update(handler, buffer)
    assert [int(payload[1][1]) for payload in buffer] == [8, 5]
    assert "reported 1000000 samples, at most 5" in caplog.text


def test_astraea_bound_never_lowers_an_honest_mediator(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level("WARNING", logger="fl_adapters.astraea"):
        attacked(tmp_path, Attack(), aggregator="astraea", aggregator_args={"gamma": 3})
    assert not [r for r in caplog.records if "bounded" in r.getMessage()]


def test_colluding_liars_are_bounded_by_the_median(tmp_path: Path) -> None:
    rows = attacked(tmp_path, Attack("inflate", 3, 1e6))
    # Each of 3 liars counts at most 5x the lower median loss: together < 3*5/(3*5 + 7*min).
    for share in run_stats(rows, liars=3)["liar_share"]:
        assert share < 0.75


def test_zero_loss_reporters_only_lose_their_own_weight(tmp_path: Path) -> None:
    rows = attacked(tmp_path, Attack("zero_loss", 3))
    stats = run_stats(rows, liars=3)
    assert stats["liar_share"] == [0.0] * 3 and stats["rejected"] == 0


@pytest.mark.parametrize("kind", ["nan", "inf", "shape", "dtype", "missing_loss"])
def test_bad_uplinks_are_rejected_and_the_model_stays_finite(kind: str, tmp_path: Path) -> None:
    rows = attacked(tmp_path, Attack(kind, 1))
    assert [r["rejected"] for r in rows] == [1, 1, 1]
    assert all(not r["skipped"] for r in rows)
    assert all(
        w == 0.0 for r in rows for c, w in zip(r["clients"], r["weights"], strict=True) if c == 0
    )
    model = Checkpoint.load(tmp_path / f"{kind}-1-honest" / "checkpoint.pt").model
    assert torch.isfinite(model).all()


def test_missing_loss_is_fine_for_an_aggregator_that_does_not_need_it(tmp_path: Path) -> None:
    rows = attacked(tmp_path, Attack("missing_loss", 1), aggregator="fedavg")
    assert [r["rejected"] for r in rows] == [0, 0, 0]


def test_when_every_client_is_bad_the_global_model_is_kept(tmp_path: Path) -> None:
    rows = attacked(tmp_path, Attack("nan", 10))
    assert [r["skipped"] for r in rows] == [True] * 3
    from fedlab.utils import SerializationTool

    initial = SerializationTool.serialize_model(build(config()).model)
    kept = Checkpoint.load(tmp_path / "nan-10-honest" / "checkpoint.pt").model
    assert torch.equal(kept, initial)


@pytest.mark.slow
def test_reliability_bench_quick_writes_the_report(tmp_path: Path) -> None:
    assert main(["--quick", "--dataset", "digits", "--workers", "2", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "reliability_digits_quick.md").read_text()
    for section in ("## Attacks", "## What `sample_clip` costs", "## Faults", "## Bad input"):
        assert section in text
    assert "traceback" not in text.split("## Bad input")[1].split("## Astraea")[0]
    doc = json.loads((tmp_path / "reliability_digits_quick.json").read_text())
    one_liar = [
        s
        for s in doc["summary"]
        if (s["attack"], s["setting"]) == ("loss inflation", "1 of 10, x1e6")
        and s["aggregator"] in ("fedloss", "fedloss_n")
    ]
    assert len(one_liar) == 2 and all(s["liar_within_top_honest"] for s in one_liar)
    sample_liar = {
        s["aggregator"]: s["liar_within_top_honest"]
        for s in doc["summary"]
        if s["attack"] == "sample-count inflation"
    }
    assert sample_liar["fedavg"] is False and sample_liar["fedavg (sample_clip 1)"] is True
    assert [(q["aggregator"], q["sample_clip"]) for q in doc["quantity"]][:3] == [
        ("fedavg", None),
        ("fedavg", 1.0),
        ("fedavg", 20.0),
    ]
    assert (tmp_path / "reliability_digits_quick.png").stat().st_size > 10_000


def test_update_clip_shortens_a_scaled_update_in_a_real_run(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rec = tmp_path / "rec.jsonl"
    monkeypatch.setenv("FEDBALANCE_RECORD", str(rec))
    attacked(tmp_path, Attack("inflate", 1, 1e6, "scaled"), aggregator_args={"update_clip": 3.0})
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    assert len(lines) == 3
    for line in lines:
        scale = dict(zip(line["clients"], line["update_scale"], strict=True))
        assert scale[0] < 0.5  # the x10 update is cut to at most 3x the median length
        assert all(s == 1.0 for c, s in scale.items() if c != 0)
