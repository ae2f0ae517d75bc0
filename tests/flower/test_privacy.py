"""fedbalance's strategy inside Flower's central-DP wrappers, on the real wrappers.

Two simulation runs of the shipped app (``dp`` in its run config wraps the strategy in
Flower's server-side fixed or adaptive clipping): the aggregator's weights are FedLoss's or
FedAvg's, each round's train metrics carry the effective noise multiplier the weights leave,
and the checkpoint holds the model the wrapper kept, noise included. The refusals run the real
wrappers' ``configure_train`` on a real strategy: they stop before any message is built.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from flower_runs import simulate_process
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)
from flwr.supercore.differential_privacy import compute_adaptive_noise_params
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod

from fl_adapters.checkpoint import Checkpoint
from fl_adapters.config import ConfigError
from fl_adapters.flower.privacy import Z_EFFECTIVE, wrap_from_run_config
from fl_adapters.flower.strategy import FedBalanceStrategy
from fl_aggregators import ClientUpdate, FedAvg, FedLoss

NODES = ROUNDS = 3
#: Adaptive clipping also noises its clipped count, which caps z below 2 * NODES / 20.
Z, CLIP = 0.2, 5.0


def simulate(work: Path, run_config: str) -> dict[str, Any]:
    record = work / "record.jsonl"
    argv = [sys.executable, "-m", "fl_adapters.flower.app.simulate"]
    argv += ["--num-supernodes", str(NODES), "--run-config", run_config]
    log = simulate_process(argv, work, record)
    out = work / "out"
    return {
        "log": log,
        "model": torch.load(out / "final.pt"),
        "summary": json.loads((out / "summary.json").read_text()),
        "record": [json.loads(line) for line in record.read_text().splitlines()],
        "checkpoint": Checkpoint.load(out / "ckpt" / "checkpoint.pt"),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dp", "aggregator", "rule"),
    [("server-fixed", "fedloss", FedLoss), ("server-adaptive", "fedavg", FedAvg)],
)
def test_a_dp_wrapper_drives_the_fedbalance_aggregator(
    tmp_path: Path, dp: str, aggregator: str, rule: type
) -> None:
    out = tmp_path / "out"
    run = simulate(
        tmp_path,
        f"num-server-rounds={ROUNDS} num-partitions={NODES} seed=4 "
        f'partition=\'{{"name": "label_dirichlet", "beta": 0.3}}\' '
        f"aggregator='{aggregator}' dp='{dp}' dp-noise-multiplier={Z} dp-clipping-norm={CLIP} "
        f"out-dir='{out}' checkpoint-dir='{out / 'ckpt'}'",
    )
    assert [e["round"] for e in run["record"]] == list(range(1, ROUNDS + 1))
    # The multiplier the wrapper's noise uses: adaptive clipping lowers the given one.
    z = Z if dp == "server-fixed" else compute_adaptive_noise_params(Z, NODES, None)[1]
    for entry in run["record"]:
        assert entry["aggregator"] == aggregator and entry["clients"] == [0, 1, 2]
        scalars = [
            ClientUpdate(params=None, num_samples=n, metrics=m, client_id=c)
            for n, m, c in zip(
                entry["num_samples"], entry["metrics"], entry["clients"], strict=True
            )
        ]
        assert entry["weights"] == pytest.approx(rule().weigh(scalars).weights, abs=1e-12)
        train = run["summary"]["train"][str(entry["round"])]
        assert train[Z_EFFECTIVE] == pytest.approx(z / (NODES * max(entry["weights"])))
    assert any(max(e["weights"]) > 0.34 for e in run["record"])  # skewed: not uniform
    assert "protects the heaviest client like" in run["log"]
    ckpt = run["checkpoint"]  # the model the wrapper kept, with its noise: the final one
    assert ckpt.round == ROUNDS
    for key, value in run["model"].items():
        assert torch.equal(ckpt.model[key], value), key


WRAPPERS = {
    "server-fixed": lambda s: DifferentialPrivacyServerSideFixedClipping(s, 1.0, 1.0, 3),
    "client-fixed": lambda s: DifferentialPrivacyClientSideFixedClipping(s, 1.0, 1.0, 3),
    "server-adaptive": lambda s: DifferentialPrivacyServerSideAdaptiveClipping(s, 0.1, 3),
    "client-adaptive": lambda s: DifferentialPrivacyClientSideAdaptiveClipping(s, 0.1, 3),
}
ARRAYS = ArrayRecord({"w": torch.zeros(2)})


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize(
    ("aggregator", "args", "words"),
    [
        ("fedmedian", {}, "not a weighted mean"),
        ("astraea", {"gamma": 2}, "mediator"),
        ("fedavgm", {"beta": 0.5}, "server momentum"),
    ],
)
def test_what_would_void_the_noise_stops_before_the_first_round(
    wrapper: str, aggregator: str, args: dict, words: str
) -> None:
    from fl_adapters.flower.astraea import AstraeaStrategy

    cls = AstraeaStrategy if aggregator == "astraea" else FedBalanceStrategy
    dp = WRAPPERS[wrapper](cls(aggregator, aggregator_args=args))
    # Refused before any node is sampled or sent anything: no grid is needed to get there.
    with pytest.raises(ConfigError, match=words) as e:
        dp.configure_train(1, ARRAYS, ConfigRecord(), grid=None)  # type: ignore[arg-type]
    assert type(dp).__name__ in str(e.value) and repr(aggregator) in str(e.value)


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_resume_under_a_wrapper_stops(wrapper: str, tmp_path: Path) -> None:
    dp = WRAPPERS[wrapper](FedBalanceStrategy("fedloss", resume_from=tmp_path))
    with pytest.raises(ConfigError, match="resume_from"):
        dp.configure_train(1, ARRAYS, ConfigRecord(), grid=None)  # type: ignore[arg-type]


class _Accountant:
    """The least a ``PrivacyAccountant`` (a Protocol) needs for the wrapper's own check:
    Flower's RDP one needs ``flwr[dp]``, which fedbalance does not install."""

    config = PrivacyConfig(
        1e-5, 3, NeighboringRelation.ADD_OR_REMOVE_ONE, SamplingMethod.NO_AMPLIFICATION
    )


def test_the_accountant_is_refused_by_flower_itself() -> None:
    accountant: Any = _Accountant()
    with pytest.raises(ValueError, match="FedAvg.aggregate_train"):
        DifferentialPrivacyServerSideFixedClipping(
            FedBalanceStrategy("fedavg"), 1.0, 1.0, 3, accountant=accountant
        )


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"dp": "local"}, "dp must be one of"),
        ({"dp": "server-fixed", "dp-noise-multiplier": -1, "dp-clipping-norm": 1.0}, ">= 0"),
        ({"dp": "server-fixed", "dp-noise-multiplier": 1.0, "dp-clipping-norm": 0}, "> 0"),
        ({"dp": "server-adaptive", "dp-noise-multiplier": 1.0}, "dp-clipping-norm"),
        # Flower's own limit: adaptive clipping's clipped-count noise needs z < n / 10
        (
            {"dp": "server-adaptive", "dp-noise-multiplier": 1.0, "dp-clipping-norm": 1.0},
            "clipped_count_stddev",
        ),
    ],
)
def test_bad_dp_settings_name_the_key(config: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        wrap_from_run_config(FedBalanceStrategy("fedloss"), config, 3)


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_dp_wrapper_around_secagg_is_refused_before_the_first_round(wrapper: str) -> None:
    """Under SecAgg+ the train replies carry no model: the wrapper's clipping would bound
    nothing (clip norm 0.01 trained like no clipping), so its guarantee would be void."""
    from fl_adapters.flower.secure import SecAggPlusStrategy

    dp = WRAPPERS[wrapper](SecAggPlusStrategy("fedloss"))
    with pytest.raises(ConfigError) as e:
        dp.configure_train(1, ARRAYS, ConfigRecord(), grid=None)  # type: ignore[arg-type]
    assert str(e.value).startswith(f"{type(dp).__name__} wrapping SecAggPlusStrategy('fedloss'): ")
    assert "under SecAgg+ the train replies carry no model" in str(e.value)
