"""FedLoss under Flower's SecAgg+ (SecAggPlusStrategy), on Flower's real protocol.

One simulation of three virtual SuperNodes and two rounds, client 2 dropping out of round 2's
masking stage after it was weighed (tests/hosts/flower_secure_sim.py). A test-only mod on the
nodes keeps each round's global model and each client's trained model on disk, so the test
computes the in-clear FedLoss from the very models the clients masked and compares it with the
model SecAgg+ produced.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from flower_runs import simulate_process

from fl_adapters.config import ConfigError
from fl_adapters.flower.secure import SecAggPlusStrategy
from fl_aggregators import ClientUpdate, FedLoss

SIM = Path(__file__).resolve().parents[1] / "hosts" / "flower_secure_sim.py"
#: SecAgg+ rounds every value to 2 * 8 / 4194304 (its clipping and quantization ranges).
QUANTIZATION = 2 * 8 / 4194304


@pytest.fixture(scope="module")
def secure_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("secagg")
    argv = [sys.executable, str(SIM), str(out), "--rounds", "2", "--drop", "2:2"]
    log = simulate_process(argv, out, out / "record.jsonl")
    return out, log


@pytest.mark.slow
@pytest.mark.smoke
def test_fedloss_under_secagg_equals_fedloss_in_clear(secure_run: tuple[Path, str]) -> None:
    out, log = secure_run
    record = [json.loads(line) for line in (out / "record.jsonl").read_text().splitlines()]
    assert [e["round"] for e in record] == [1, 2]
    assert "ArrayRecord(s)" not in log  # phase 1 replies carried metrics only
    for entry in record:
        r = entry["round"]
        assert entry["secure"] == "secagg+" and entry["clients"] == [0, 1, 2]
        assert entry["aggregate_s"] > 0  # the aggregator's finish step, timed like aggregate
        start = torch.load(out / "clients" / f"r{r}_global.pt")
        models = [torch.load(out / "clients" / f"r{r}_c{c}.pt") for c in entry["clients"]]
        updates = [
            ClientUpdate(params=m, num_samples=n, metrics=metrics, client_id=c)
            for m, n, metrics, c in zip(
                models, entry["num_samples"], entry["metrics"], entry["clients"], strict=True
            )
        ]
        got = (
            torch.load(out / "clients" / "r2_global.pt") if r == 1 else torch.load(out / "final.pt")
        )
        if r == 1:  # nobody dropped: exactly FedLoss in clear, up to SecAgg+'s rounding
            expected = FedLoss().aggregate(start, updates)
            assert entry["weights"] == pytest.approx(expected.weights, abs=1e-12)
            want = expected.params
        else:  # client 2 was weighed, then dropped: the others' weights renormalised
            assert entry["rejected"] == [
                {"client": 2, "reason": "dropped out after its weight was computed"}
            ]
            weighed = torch.tensor(FedLoss().weigh(updates).weights, dtype=torch.float64)
            weighed[2] = 0
            weighed /= weighed.sum()
            assert entry["weights"] == pytest.approx(weighed.tolist(), abs=1e-12)
            want = {
                k: sum(float(w) * m[k].double() for w, m in zip(weighed, models, strict=True))
                for k in start
            }
        assert not all(torch.equal(got[k], start[k]) for k in start)  # the model moved
        for key in start:
            diff = (got[key].double() - want[key].double()).abs().max().item()
            assert diff <= 3 * QUANTIZATION, (r, key, diff)


@pytest.mark.parametrize(
    ("aggregator", "args", "words"),
    [
        ("fedmedian", {}, "needs each client's model"),
        ("astraea", {"mediators": False}, "mediator"),
        ("fedloss", {"update_clip": 2.0}, "update_clip"),
    ],
)
def test_what_needs_the_models_refuses_secagg(aggregator: str, args: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as e:
        SecAggPlusStrategy(aggregator, aggregator_args=args, mediated=True)
    assert "cannot run under SecAgg+" in str(e.value)


def test_flower_checks_its_own_secagg_parameters() -> None:
    with pytest.raises(ValueError):
        SecAggPlusStrategy("fedloss", num_shares=3, reconstruction_threshold=5)
