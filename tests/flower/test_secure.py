"""FedLoss under Flower's SecAgg+ (SecAggPlusStrategy), on Flower's real protocol.

One simulation of three virtual SuperNodes and seven rounds (tests/hosts/flower_secure_sim.py):
round 1 honest; after it was weighed, in round 2 client 2 drops out of the masking stage, in
round 3 client 1 out of the share-keys stage, in round 4 client 0's masked vector misses an
array, in round 5 client 1 scales its masked model by 1000 (a weight lie), in round 6 client 0
drops out of the setup stage, in round 7 client 2 out of the unmask stage (its masked vector is
in the sum already: the others' shares unmask it). A test-only mod on
the nodes keeps each round's global model and each client's trained model on disk, so the test
computes the in-clear FedLoss from the very models the clients masked and compares it with the
model SecAgg+ produced.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from flower_runs import simulate_process
from flwr.app import ConfigRecord
from flwr.common.secure_aggregation.secaggplus_constants import Key

from fl_adapters.config import ConfigError
from fl_adapters.flower.secure import (
    SecAggPlusStrategy,
    _masked_array_problem,
    _shares_problem,
    _unmask_problem,
)
from fl_aggregators import ClientUpdate, FedLoss

SIM = Path(__file__).resolve().parents[1] / "hosts" / "flower_secure_sim.py"
#: SecAgg+ rounds every value to 2 * 8 / 4194304 (its clipping and quantization ranges).
QUANTIZATION = 2 * 8 / 4194304
MISBEHAVIOUR = [
    *("--drop", "2:2", "--drop", "3:1:share_keys", "--truncate", "4:0", "--lie", "5:1:1000"),
    *("--drop", "6:0:setup", "--drop", "7:2:unmask"),
]
#: Round -> the client left out of it, and why.
LEFT = {
    2: (2, "SecAgg+ collect-masked-vectors stage: client 2 drops out in collect_masked_vectors"),
    3: (1, "SecAgg+ share-keys stage: client 1 drops out in share_keys"),
    4: (0, "SecAgg+ collect-masked-vectors stage: reply rejected, a masked vector of 10 arrays"),
    6: (0, "SecAgg+ setup stage: client 0 drops out in setup"),
}


@pytest.fixture(scope="module")
def secure_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("secagg")
    argv = [sys.executable, str(SIM), str(out), "--rounds", "7", *MISBEHAVIOUR]
    log = simulate_process(argv, out, out / "record.jsonl")
    return out, log


@pytest.mark.slow
@pytest.mark.smoke
def test_fedloss_under_secagg_equals_fedloss_in_clear(secure_run: tuple[Path, str]) -> None:
    out, log = secure_run
    record = [json.loads(line) for line in (out / "record.jsonl").read_text().splitlines()]
    assert [e["round"] for e in record] == [1, 2, 3, 4, 5, 6, 7]
    assert "ArrayRecord(s)" not in log  # phase 1 replies carried metrics only
    for entry in [*record[:4], *record[5:]]:
        r = entry["round"]
        assert entry["secure"] == "secagg+" and entry["clients"] == [0, 1, 2]
        assert entry["aggregate_s"] > 0  # the aggregator's finish step, timed like aggregate
        assert all(m["update_norm"] > 0 for m in entry["metrics"])  # reported in clear
        start = torch.load(out / "clients" / f"r{r}_global.pt")
        models = [torch.load(out / "clients" / f"r{r}_c{c}.pt") for c in entry["clients"]]
        updates = [
            ClientUpdate(params=m, num_samples=n, metrics=metrics, client_id=c)
            for m, n, metrics, c in zip(
                models, entry["num_samples"], entry["metrics"], entry["clients"], strict=True
            )
        ]
        got = torch.load(out / "clients" / f"r{r + 1}_global.pt" if r < 7 else out / "final.pt")
        if r not in LEFT:  # nobody left out: exactly FedLoss in clear, up to SecAgg+'s rounding
            expected = FedLoss().aggregate(start, updates)
            assert entry["weights"] == pytest.approx(expected.weights, abs=1e-12)
            want = expected.params
        else:  # a client was weighed, then left: the others' weights renormalised
            gone, why = LEFT[r]
            assert [e["client"] for e in entry["rejected"]] == [gone]
            reason = entry["rejected"][0]["reason"]
            assert reason.startswith(f"dropped out after its weight was computed ({why}"), reason
            weighed = torch.tensor(FedLoss().weigh(updates).weights, dtype=torch.float64)
            weighed[gone] = 0
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


@pytest.mark.slow
def test_a_weight_lie_under_masking_skips_its_round(secure_run: tuple[Path, str]) -> None:
    """Client 1 scales its masked model by 1000 in round 5: undetectable per client, but the
    unmasked average moves the model further than any client reported, so the round is
    skipped and the model kept."""
    out, log = secure_run
    last = json.loads((out / "record.jsonl").read_text().splitlines()[4])
    assert last["round"] == 5 and last["skipped"] and last["rejected"] == []
    start, final = (torch.load(out / "clients" / f"r{r}_global.pt") for r in (5, 6))
    assert all(torch.equal(final[k], start[k]) for k in start)
    assert "a client misreported its weight or its model; global model kept" in log


def _npy(values: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, values, allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (_npy(np.zeros((2, 3), np.int64)), None),
        (_npy(np.zeros((3, 2), np.int64)), "shape (3, 2), expected (2, 3)"),
        (_npy(np.zeros((2, 3), np.float64)), "not an integer type"),
        (_npy(np.full((2, 3), 1 << 40, np.int64)), "values outside [0, 4294967296)"),
        (_npy(np.zeros((2, 3), np.int64))[:-8], "bytes of data for shape (2, 3)"),
        (b"not an array", "not a NumPy array"),
        ("text", "str, not bytes"),
        # a header claiming 10^12 values: refused from the header, nothing allocated
        (_npy(np.zeros((2, 3), np.int64)).replace(b"(2, 3)", b"(10**12,)"), "not a NumPy array"),
        (_npy(np.zeros((2, 3), np.int64)).replace(b"(2, 3)", b"(1000000, 1000000)"), "shape"),
    ],
)
def test_a_masked_array_is_checked_before_it_is_read(raw: object, words: str | None) -> None:
    why = _masked_array_problem(raw, (2, 3), 1 << 32)
    assert why is None if words is None else words in str(why), why


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


@pytest.mark.parametrize(
    ("stage", "record", "words"),
    [
        ("shares", {Key.DESTINATION_LIST: [1, 2], Key.CIPHERTEXT_LIST: [b"a", b"b"]}, None),
        ("shares", {Key.DESTINATION_LIST: [1, 2], Key.CIPHERTEXT_LIST: [b"a"]}, "1 ciphertexts"),
        ("shares", {Key.DESTINATION_LIST: [True], Key.CIPHERTEXT_LIST: [b"a"]}, "destinations"),
        ("unmask", {Key.NODE_ID_LIST: [1], Key.SHARE_LIST: [b"a"]}, None),
        ("unmask", {Key.NODE_ID_LIST: [1, 9], Key.SHARE_LIST: [b"a", b"b"]}, "not in this round"),
        ("unmask", {Key.NODE_ID_LIST: [1], Key.SHARE_LIST: ["text"]}, "not a list of bytes"),
        ("unmask", {}, "node ids are not a list"),
    ],
)
def test_key_and_share_lists_are_checked_before_flower_reads_them(
    stage: str, record: dict, words: str | None
) -> None:
    configs = ConfigRecord(record)
    why = _shares_problem(configs) if stage == "shares" else _unmask_problem(configs, {1, 2})
    assert why is None if words is None else words in str(why), why
