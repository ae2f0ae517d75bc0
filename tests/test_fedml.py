"""The FedML adapter against real FedML 0.9.6: sp simulation, MPI simulation, MPI cross-silo.

The host is ``adapters/fedml/example/main.py``, written as FedML's examples are, with no
fedbalance import; only its YAML changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from helpers import check_fedloss_records, records

from fl_adapters._training import TRAIN_CLOCK
from fl_adapters.fedml.runner import FIGURES_LINE
from fl_aggregators import ClientUpdate, FedLoss
from fl_checks import ParameterError

pytest.importorskip("fedml")

EXAMPLE = Path(__file__).resolve().parents[1] / "adapters" / "fedml" / "example"
HOSTS = Path(__file__).resolve().parent / "hosts"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
needs_mpi = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed"
)


def config(tmp_path: Path, name: str, **train_args: object) -> Path:
    doc = yaml.safe_load((EXAMPLE / name).read_text())
    doc["data_args"]["max_samples"] = 2000
    for key, value in train_args.items():
        if value is None:
            doc["train_args"].pop(key, None)
        else:
            doc["train_args"][key] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def run_host(
    tmp_path: Path,
    cfg: Path,
    processes: int | None = None,
    script: Path = EXAMPLE / "main.py",
    **env: str,
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(script), "--cf", str(cfg)]
    if processes:
        cmd = [*MPIRUN, "-np", str(processes), *[a for k in env for a in ("-x", k)], *cmd]
    return subprocess.run(
        cmd, cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=600
    )


def final_test_metrics(out: str) -> list[str]:
    return re.findall(r"\{'test_acc': [^}]*\}", out)


@pytest.mark.slow
def test_sp_simulation_aggregates_with_fedloss(tmp_path: Path) -> None:
    rec, clock = tmp_path / "rec.jsonl", tmp_path / "clock.txt"
    out = run_host(
        tmp_path,
        config(tmp_path, "sp.yaml"),
        FEDBALANCE_RECORD=str(rec),
        **{TRAIN_CLOCK: str(clock)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = records(rec)
    check_fedloss_records(lines, "fedml-sp", rounds=2)
    # The training clock: each round's clients, one line each, round after round.
    steps = [line.split() for line in clock.read_text().splitlines()]
    trained = [sorted(int(c) for _, _, c in steps[i : i + 2]) for i in range(0, len(steps), 2)]
    assert trained == [sorted(r["clients"]) for r in lines]
    assert all(float(start) <= float(end) for start, end, _ in steps)


@pytest.mark.slow
@needs_mpi
def test_mpi_simulation_aggregates_with_fedloss(tmp_path: Path) -> None:
    """The shipped ``mpi.yaml`` launched by hand, with fedbalance's ``eval_every: 2`` beside
    ``aggregator: fedloss``: FedLoss aggregates every round, and the server tests rounds 2 and
    3 (the last), not FedML's own round 1 (index 0)."""
    rec, cfg = tmp_path / "rec.jsonl", config(tmp_path, "mpi.yaml", comm_round=3)
    doc = yaml.safe_load(cfg.read_text())
    doc["validation_args"]["eval_every"] = 2
    cfg.write_text(yaml.safe_dump(doc))
    out = run_host(tmp_path, cfg, processes=3, FEDBALANCE_RECORD=str(rec))
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    check_fedloss_records(records(rec), "fedml-mpi", rounds=3)
    assert re.findall(r"test_on_server_for_all_clients : (\d+)", log) == ["1", "2"]
    # one accuracy a tested round: what `fedbalance run` maps to rounds 2 and 3 (collect_rows)
    assert len(final_test_metrics(log)) == 2
    # FedML's test of a round is answered from the figures' pass (one pass, the same samples)
    accs = [float(a) for a in re.findall(r"'test_acc': ([0-9.eE+-]+)", log)]
    figures = [json.loads(f) for f in re.findall(FIGURES_LINE, log)]
    assert accs == [f["accuracy"] for f in figures] and len(accs) == 2
    assert "one evaluation pass more" not in log
    # every rank's message loop waited for messages instead of polling every 0.1 ms
    assert log.count("FedML's MPI receive loop waits for messages instead of spinning") == 3


@pytest.mark.slow
@needs_mpi
def test_a_one_round_mpi_simulation_finishes(tmp_path: Path) -> None:
    """FedML 0.9.6's MPI clients finish only after a round's sync message; a 1-round run sends
    none, so its server waited in MPI.Finalize for clients that never finished."""
    from fl_adapters.run.processes import start_logged, watch

    rec, cfg, log = (
        tmp_path / "rec.jsonl",
        config(tmp_path, "mpi.yaml", comm_round=1),
        tmp_path / "log",
    )
    cmd = [*MPIRUN, "-np", "3", "-x", "FEDBALANCE_RECORD", sys.executable, str(EXAMPLE / "main.py"),
           "--cf", str(cfg)]  # fmt: skip
    env = {**os.environ, "FEDBALANCE_RECORD": str(rec)}
    failed = watch([("FedML", start_logged(cmd, log, cwd=tmp_path, env=env))], timeout=120)
    assert failed is None, f"{failed}: {log.read_text()[-3000:]}"  # every rank stopped if not
    check_fedloss_records(records(rec), "fedml-mpi", rounds=1)


@pytest.mark.slow
@needs_mpi
def test_cross_silo_with_a_user_supplied_client_trainer(tmp_path: Path) -> None:
    rec, log = tmp_path / "rec.jsonl", tmp_path / "trainer.log"
    out = run_host(
        tmp_path,
        config(tmp_path, "cross_silo.yaml"),
        processes=3,
        script=Path(__file__).parent / "hosts" / "fedml_custom_trainer.py",
        FEDBALANCE_RECORD=str(rec),
        CUSTOM_TRAINER_LOG=str(log),
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    check_fedloss_records(records(rec), "fedml-cross-silo", rounds=2)
    calls = log.read_text().splitlines()
    assert len(calls) == 4 and all(int(c.split()[1]) > 0 for c in calls)  # 2 clients x 2 rounds


@pytest.mark.slow
def test_without_the_key_fedml_runs_stock(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    cfg = config(tmp_path, "sp.yaml", aggregator=None)
    armed = run_host(tmp_path, cfg, FEDBALANCE_RECORD=str(rec))
    off = run_host(tmp_path, cfg, FEDBALANCE_DISABLE_HOST_AUTOLOAD="1")
    assert armed.returncode == 0 and off.returncode == 0, armed.stderr[-2000:] + off.stderr[-2000:]
    got, want = (
        final_test_metrics(armed.stdout + armed.stderr),
        final_test_metrics(off.stdout + off.stderr),
    )
    assert got and got == want
    assert not rec.exists()


@pytest.mark.slow
def test_a_typo_stops_the_run_before_training(tmp_path: Path) -> None:
    out = run_host(tmp_path, config(tmp_path, "sp.yaml", aggregator="fedlos"))
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "unknown aggregator 'fedlos'" in text and "did you mean 'fedloss'?" in text
    assert "Communication round" not in text


def test_payload_keys_survive_and_are_stripped() -> None:
    import torch

    from fl_adapters.fedml.payload import attach, decode, metric_key, strip

    params = {"w": torch.ones(2), "n": torch.tensor(3)}
    sent = attach(params, client=7, metrics={"val_loss": 0.25})
    key = metric_key("val_loss")
    assert list(sent)[:2] == ["w", "n"] and float(sent[key]) == 0.25 and sent[key].dim() == 0
    clean, client, metrics = strip(sent)
    assert list(clean) == ["w", "n"] and client == 7 and metrics == {"val_loss": 0.25}
    torch.nn.Module().load_state_dict({}, strict=True)  # the clean dict has no reserved key left
    assert all(not k.startswith("__fedbalance") for k in clean)
    up = decode(torch.tensor(12), sent, "#0")  # FedML's (sample_num, params) entry
    assert (up.num_samples, up.client_id, up.metrics) == (12, 7, {"val_loss": 0.25})
    assert list(up.params) == ["w", "n"]
    stock = decode(30, {"w": torch.ones(2)}, "#3")  # a stock client: no reserved keys
    assert (stock.client_id, stock.metrics) == ("#3", {})


def make_fake_cifar10(
    root: Path, per_batch: int = 120, test: int = 60, seed: int = 0
) -> np.ndarray:
    """torchvision's on-disk CIFAR-10 format with synthetic pixels; returns the train labels."""
    import pickle

    rng = np.random.default_rng(seed)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    labels = []
    for name, n in [*((f"data_batch_{i}", per_batch) for i in range(1, 6)), ("test_batch", test)]:
        y = rng.integers(0, 10, n)
        if name != "test_batch":
            labels.append(y)
        with open(d / name, "wb") as fh:
            pickle.dump(
                {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": y.tolist()}, fh
            )
    with open(d / "batches.meta", "wb") as fh:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, fh)
    return np.concatenate(labels)


@pytest.mark.slow
def test_fedml_loader_partitions_with_a_fedbalance_scheme(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import types

    import fedml
    import torchvision.datasets as tvd

    from fl_adapters.registry import get_registry

    # The fake files have no official checksums; without this torchvision would try to download.
    monkeypatch.setattr(tvd.CIFAR10, "train_list", [[n, None] for n, _ in tvd.CIFAR10.train_list])
    monkeypatch.setattr(tvd.CIFAR10, "test_list", [[n, None] for n, _ in tvd.CIFAR10.test_list])
    monkeypatch.setattr(tvd.CIFAR10, "meta", dict(tvd.CIFAR10.meta, md5=None))
    y_train = make_fake_cifar10(tmp_path)

    def load(method: str, **extra: object) -> list:
        args = types.SimpleNamespace(
            training_type="simulation",
            backend="sp",
            dataset="cifar10",
            data_cache_dir=str(tmp_path),
            partition_method=method,
            partition_alpha=0.5,
            client_num_in_total=4,
            batch_size=8,
            process_id=0,
            rank=0,
            model="lr",
            random_seed=3,
            **extra,
        )
        dataset, _ = fedml.data.load(args)
        return dataset

    ours = load("label_quantity", partition_args={"k": 3})
    expected = (
        get_registry()
        .make_partitioner({"name": "label_quantity", "k": 3})
        .partition(y_train, 4, seed=3)
    )
    assert ours[4] == {
        c: len(ix) for c, ix in enumerate(expected.client_indices)
    }  # train_data_local_num_dict
    for c in range(4):  # every client holds only its 3 classes
        seen = np.unique(np.concatenate([np.asarray(y) for _, y in ours[5][c]]))
        assert len(seen) <= 3 and set(seen) <= set(np.flatnonzero(expected.class_counts[c]))
    homo = load("homo")
    assert sorted(homo[4].values()) == [150, 150, 150, 150]  # FedML's own name keeps its meaning
    with pytest.raises(Exception, match="did you mean 'label_dirichlet'"):
        load("label_dirichlett")


@pytest.mark.slow
def test_thesis_bench_runs_on_fedml_sp(tmp_path: Path) -> None:
    from fl_adapters.cli import main

    common = "--quick --dataset digits --rounds 2 --workers 1 --scenarios mixed".split()
    common += ["--aggregators", "fedloss", "--out", str(tmp_path)]
    assert main(["bench", "thesis", *common]) == 0  # FedLab's runs, to compare with
    code = main(["bench", "thesis", "--framework", "fedml-sp", *common])
    assert code == 0
    table = (tmp_path / "thesis_digits_fedml-sp_quick.md").read_text()
    assert "FedML sp simulation" in table and "| fedloss " in table
    doc = json.loads((tmp_path / "thesis_digits_fedml-sp_quick.json").read_text())
    assert [len(r["accuracy"]) for r in doc["runs"]] == [2]
    fedlab = json.loads((tmp_path / "thesis_digits_quick.json").read_text())["runs"][0]
    beside = table.split("FedLab standalone vs FedML sp,")[1]  # not the bias table
    row = next(line for line in beside.splitlines() if line.startswith("| mixed    | fedloss"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"{100 * max(fedlab['accuracy']):.2f} (n = 1)"  # FedLab's best, same seed
    assert cells[3] == f"{100 * max(doc['runs'][0]['accuracy']):.2f} (n = 1)"


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize(
    ("name", "processes", "message"),
    [
        ("mpi.yaml", 2, "FedML simulation over MPI needs client_num_per_round + 1 = 3 processes"),
        # Cross-silo's own check ("Invalid number of mpi processes") is FedML's, untouched.
    ],
)
def test_wrong_mpi_process_count_fails_fast_with_the_rule(
    name: str, processes: int, message: str, tmp_path: Path
) -> None:
    # Unchecked, FedML 0.9.6 runs MPI simulation under -np 2 training one client a round.
    start = time.monotonic()
    out = run_host(tmp_path, config(tmp_path, name), processes=processes)
    assert out.returncode != 0
    assert message in out.stdout + out.stderr, (out.stdout + out.stderr)[-3000:]
    assert time.monotonic() - start < 120


@pytest.mark.slow
@needs_mpi
def test_missing_dataset_fails_every_mpi_process_with_how_to_get_it(tmp_path: Path) -> None:
    cfg = config(tmp_path, "mpi.yaml", client_num_per_round=1)  # a server and one client rank
    doc = yaml.safe_load(cfg.read_text())
    doc["data_args"]["dataset"] = "cifar10"
    doc["device_args"]["worker_num"] = 1
    cfg.write_text(yaml.safe_dump(doc))
    out = run_host(tmp_path, cfg, processes=2, FEDBALANCE_DATA=str(tmp_path / "empty"))
    assert out.returncode != 0
    assert "cifar10 not found under" in out.stdout + out.stderr


# -- beside FedML's other algorithms: fedbalance applies, or the run stops (issue #31) ---------
def refusal(optimizer: str, host: str) -> str:
    return f"aggregator: fedloss cannot take effect with federated_optimizer: {optimizer} in {host}"


#: Fixed point with 20 fractional bits modulo a prime below 2**30 (fl_adapters.fedml.secure).
LSA_ARGS = {"federated_optimizer": "LSA", "prime_number": 1073741789, "precision_parameter": 20}


def lsa_run(
    tmp_path: Path, timeout: float = 240, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """The example's cross-silo LightSecAgg run over ``mpirun -np 3`` with the dumping host
    (tests/hosts/fedml_lsa_dump.py); ``env`` its switches. (its output, its wall time)"""
    dump = tmp_path / "dump"
    dump.mkdir(exist_ok=True)
    env = {"FEDBALANCE_RECORD": str(tmp_path / "rec.jsonl"), "FEDBALANCE_DUMP": str(dump)} | env
    cfg = tmp_path / "cross_silo.yaml"
    if not cfg.exists():
        config(tmp_path, "cross_silo.yaml", **LSA_ARGS)
    cmd = [*MPIRUN, "-np", "3", *[a for k in env for a in ("-x", k)], sys.executable]
    cmd += [str(HOSTS / "fedml_lsa_dump.py"), "--cf", str(cfg)]
    start = time.monotonic()
    out = subprocess.run(
        cmd, cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    return out, time.monotonic() - start


@pytest.mark.slow
@needs_mpi
def test_lightsecagg_fedloss_equals_fedloss_in_clear_and_bad_silos_cost_a_round(
    tmp_path: Path,
) -> None:
    """One cross-silo LightSecAgg run over MPI with ``aggregator: fedloss``, 4 rounds.

    Rounds 1-2, honest: this used to hang on an IndexError in the clients' masking. Now every
    client scales its model by its FedLoss weight before masking, and the server's unmasked
    result is FedLoss of the very models the clients trained (saved on the clients by a
    test-only hook), up to LightSecAgg's 2**-20 rounding.

    Round 3: silo rank 1 sends its validation loss as text in the clear phase (a test-only
    switch). The server's handler used to raise on it and the whole mpirun hung until killed;
    now the aggregator rejects the silo for the round with a logged reason, it masks zeros, and
    the round is the other silo's model (weight 1). Round 4: silo rank 2 masks its model times
    5, within the field, so nothing wraps and the server cannot see it one silo at a time; the
    unmasked average moves the model far beyond either silo's reported ``update_norm`` (the
    length of its update, sent in clear), which no honest weighted average can, so the round is
    skipped and the model kept (the rule of Flower's SecAgg+ too). The run ends with exit 0.
    (One run, not two: each MPI start costs three FedML processes.)"""
    config(tmp_path, "cross_silo.yaml", comm_round=4, **LSA_ARGS)
    out, wall = lsa_run(
        tmp_path, FEDBALANCE_BAD_LOSS='3@1:"not a number"', FEDBALANCE_INFLATE="4@2:5"
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert wall < 240
    entries, dump = records(tmp_path / "rec.jsonl"), tmp_path / "dump"
    assert [e["round"] for e in entries] == [1, 2, 3, 4]
    assert {e["secure"] for e in entries} == {"lightsecagg"}
    for entry in entries[:2]:  # honest: FedLoss of the trained models
        r = entry["round"]
        assert entry["host"] == "fedml-cross-silo"
        models = [torch.load(dump / f"r{r}_c{rank}.pt") for rank in (1, 2)]  # in sender order
        updates = [
            ClientUpdate(params=m, num_samples=n, metrics=metrics, client_id=c)
            for m, n, metrics, c in zip(
                models, entry["num_samples"], entry["metrics"], entry["clients"], strict=True
            )
        ]
        clear = FedLoss().aggregate(models[0], updates)
        assert entry["weights"] == pytest.approx(clear.weights, abs=1e-12)
        assert entry["weights"][0] != pytest.approx(0.5, abs=1e-3)  # not a uniform mean
        got = torch.load(dump / f"r{r}_server.pt")
        for key, value in clear.params.items():
            diff = (got[key].double() - value.double()).abs().max().item()
            assert diff <= 2 * 2**-20, (r, key, diff)
        # FedML seeds numpy alike on every rank; the masks now come from os.urandom.
        masks = {(dump / f"r{r}_c{rank}.mask").read_text() for rank in (1, 2)}
        assert len(masks) == 2
    third, fourth = entries[2:]
    bad, _ = third["clients"]  # in sender order: rank 1, rank 2
    assert not third["skipped"] and third["weights"] == [0.0, 1.0]
    assert third["rejected"] == [
        {"client": bad, "reason": "metric 'val_loss' is not a number: 'not a number'"}
    ]
    assert f"silo rank 1 (client {bad}) rejected, it masks zeros this round" in log
    # round 3 is the accepted silo's model, to LightSecAgg's rounding
    got, kept = torch.load(dump / "r3_server.pt"), torch.load(dump / "r3_c2.pt")
    for key, value in kept.items():
        diff = (got[key].double() - value.double()).abs().max().item()
        assert diff <= 2 * 2**-20, (key, diff)
    # round 4: the lie, the round skipped, the model kept
    assert fourth["skipped"] and fourth["rejected"] == []
    assert "a client misreported its weight or its model; global model kept" in log
    final = torch.load(dump / "r4_server.pt")
    assert all(torch.equal(final[k], got[k]) for k in got)
    for entry in entries:
        norms = [m["update_norm"] for m in entry["metrics"]]
        assert all(isinstance(n, float) and 0 < n < float("inf") for n in norms), norms
    # Round 4's update norm is the honest silo's trained model minus round 3's result.
    trained = torch.load(dump / "r4_c1.pt")
    norm = sum(float((trained[k].double() - got[k].double()).square().sum()) for k in trained)
    assert fourth["metrics"][0]["update_norm"] == pytest.approx(norm**0.5, rel=1e-6)


@pytest.mark.slow
@needs_mpi
def test_a_silo_model_beyond_the_field_stops_the_job_instead_of_wrapping(tmp_path: Path) -> None:
    """Silo rank 1's model, times 10,000 (a test-only switch), exceeds what prime_number
    1073741789 with precision_parameter 20 holds (|value| <= 256 for 2 silos): its quantised sum
    would wrap around the field into garbage. The silo stops the job before it masks, naming
    both fields; mpirun ends every rank; no round is aggregated."""
    out, wall = lsa_run(tmp_path, timeout=180, FEDBALANCE_INFLATE="1:10000")
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert (
        "fedbalance: FedML LightSecAgg silo rank 1 stops the job: round 1: its model times its "
        "weight factor"
    ) in log, log[-3000:]
    assert "but prime_number 1073741789 with precision_parameter 20 holds |value| <=" in log
    assert not (tmp_path / "rec.jsonl").exists()
    assert wall < 120


def test_the_field_rule_knows_primes_and_int64() -> None:
    """Miller-Rabin against trial division below 5,000, on primes near the int64 limits and
    on strong pseudoprimes; the int64 rule's largest prime for 2 silos is 2**31 - 1."""
    from fl_adapters.fedml.field import (
        INT64_MAX,
        is_prime,
        largest_prime_below,
        largest_prime_field,
        value_bound,
    )

    trial = [n for n in range(5000) if n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))]
    assert [n for n in range(5000) if is_prime(n)] == trial
    for prime in (2**31 - 1, 2**61 - 1, 2**63 - 25, 1073741789, 1997):
        assert is_prime(prime), prime
    # Carmichael numbers and strong pseudoprimes to the first bases
    for composite in (561, 41041, 3215031751, 3825123056546413051, 10**9, (2**31 - 1) ** 2):
        assert not is_prime(composite), composite
    for silos in (1, 2, 3, 10, 1000):
        top = largest_prime_field(silos)
        assert silos * (top - 1) ** 2 <= INT64_MAX < silos * top**2
    assert largest_prime_below(largest_prime_field(2)) == 2**31 - 1
    # the example's field holds |value| <= 256 for 2 silos; FedML's own example values 0.487
    assert value_bound(1073741789, 20, 2) == pytest.approx(256, abs=1e-4)
    assert value_bound(1997, 10, 2) == pytest.approx(0.4868, abs=1e-4)


@pytest.mark.parametrize(
    ("loss", "reason"),
    [
        ("not a number", "metric 'val_loss' is not a number: 'not a number'"),
        (float("nan"), "metric 'val_loss' must be finite and >= 0, got nan"),
        ([1.0, 2.0], "metric 'val_loss' is not a number: [1.0, 2.0]"),
        ("x" * 10_000, "metric 'val_loss' is not a number: 'xxxxxxxxxxxx"),
        (None, "required metric 'val_loss' is missing"),
    ],
    ids=["text", "nan", "list", "long-text", "missing"],
)
def test_a_malformed_clear_phase_loss_is_a_rejection_with_its_reason(
    loss: object, reason: str
) -> None:
    """What the LightSecAgg server makes of a silo's clear-phase loss (the real run with text:
    test_a_silo_sending_a_malformed_loss_is_rejected_for_its_round_and_the_run_goes_on): a
    rejection naming it, weight 0, the other silo weight 1; a huge value is shown cut short."""
    from collections import OrderedDict

    from fl_adapters.fedml.secure import kept

    updates = [
        ClientUpdate(
            params=OrderedDict(),
            num_samples=kept(n),
            metrics={} if value is None else {"val_loss": kept(value)},
            client_id=i,
        )
        for i, (n, value) in enumerate([(100, loss), (80, 0.4)])
    ]
    weighing = FedLoss().weigh(updates, round=1)
    assert weighing.weights == [0.0, 1.0]
    assert weighing.rejected[0].startswith(reason) and len(weighing.rejected[0]) < 200


#: Field parameters FedML 0.9.6 cannot compute with for 2 silos, and what the refusal says.
BAD_FIELDS = {
    "int64-overflow": (
        {"prime_number": 2**63 - 25},
        "prime_number must be a prime p with worker_num * (p - 1)**2 <= 2**63 - 1",
        "at most 2147483647 for worker_num 2; got 9223372036854775783, which is too large",
    ),
    "sum-wraps": (
        {"precision_parameter": 40},
        "prime_number 1073741789 with precision_parameter 40 holds |value| <= "
        "((p - 1) / (2 * worker_num) - 1/2) / 2**precision_parameter = 0.0002441",
        "use precision_parameter <= 30, or a larger prime_number (at most 2147483647)",
    ),
}


@pytest.mark.parametrize(
    ("prime", "precision", "words"),
    [
        (10**9, 20, "got 1000000000, which is not prime"),
        (2**63 - 25, 20, "at most 2147483647 for worker_num 2; got 9223372036854775783"),
        (2, 20, "prime_number must be at least worker_num + 1 = 3"),
        (1073741789, 0, "precision_parameter (a positive int"),
        (1073741789, 63, "precision_parameter"),
    ],
)
def test_the_field_parameters_are_checked_with_the_rule_and_the_value(
    prime: int, precision: int, words: str
) -> None:
    """What ``fedml.init()`` runs (the real-process cases below show it there): each refusal
    names the rule and the value given."""
    from fl_adapters.fedml.field import check_field

    with pytest.raises(ParameterError, match=re.escape(words)):
        check_field(prime, precision, 2)
    check_field(1073741789, 20, 2)  # the example's values pass


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_a_lightsecagg_field_fedml_cannot_compute_in_stops_before_round_1(
    tmp_path: Path, case: str
) -> None:
    """Each of these used to train on under LightSecAgg to a loss of 8e14 or NaN and exit 0
    (issue #61). The example's cross-silo server over gRPC, started as FedML's docs start it (one
    process a rank: every rank runs the same checks), now stops before round 1, saying the
    rule, the allowed values and the value given: the prime in ``fedml.init()``, the precision
    once the model exists (it holds |value| <= 0.2 here). No silo is needed to get there."""
    from fl_adapters.fedml.ipconfig import write_ipconfig
    from fl_adapters.run.processes import free_ports

    pytest.importorskip("grpc")
    change, *words = BAD_FIELDS[case]
    cfg = config(tmp_path, "cross_silo_grpc.yaml", **(LSA_ARGS | change))
    doc = yaml.safe_load(cfg.read_text())
    doc["comm_args"]["grpc_ipconfig_path"] = str(
        write_ipconfig(tmp_path / "grpc_ipconfig.csv", free_ports(3))
    )
    cfg.write_text(yaml.safe_dump(doc))
    rec = tmp_path / "rec.jsonl"
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(EXAMPLE / "main.py"), "--cf", str(cfg), "--rank", "0", "--role",
         "server"],
        cwd=tmp_path, env={**os.environ, "FEDBALANCE_RECORD": str(rec)}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert log.strip().splitlines()[-1].startswith("fl_checks.ParameterError: "), log[-3000:]
    for w in words:
        assert w in log, log[-3000:]
    assert "Started gRPC server" not in log  # stopped before FedML's server came up
    assert not rec.exists()
    assert time.monotonic() - start < 60


#: The modes a ``federated_optimizer`` is refused in, by the test below: every value in sp; in MPI
#: simulation those it has a simulator for; cross-silo accepts only FedAvg, LSA (which fedbalance
#: runs: the test above) and SA. Cross-silo runs over gRPC here: one process is a whole rank there
#: (over MPI FedML's own init first asks for worker_num + 1 processes); the refusal is the same.
BYPASS_MODES = (
    ("sp.yaml", "fedml-sp", None),  # None: all of fl_adapters.fedml.adapter.BYPASSING
    ("mpi.yaml", "fedml-mpi", ["Async_FedAvg", "FedAvg_seq", "FedNova", "FedOpt", "FedProx"]),
    ("cross_silo_grpc.yaml", "fedml-cross-silo", ["SA"]),
)


def bypass_optimizers(optimizers: list[str] | None) -> list[str]:
    from fl_adapters.fedml.adapter import BYPASSING

    return sorted(BYPASSING) if optimizers is None else optimizers


@pytest.fixture(scope="module")
def init_probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """What the real ``fedml.init()`` did in each case of the two tests below, by job name.

    One process (tests/hosts/fedml_init_probe.py) pays ``import fedml`` once and forks a fresh
    child per job (a config and its command line), so no job sees what another's init left."""
    jobs: list[dict[str, object]] = []
    lsa = tmp_path_factory.mktemp("lsa")
    jobs.append(
        {
            "name": "lsa",
            "cf": str(config(lsa, "cross_silo_grpc.yaml", **LSA_ARGS)),
            "cwd": str(lsa),
            "argv": ["--rank", "0", "--role", "server"],
            "cases": {
                "fedloss": {},
                "fedmedian": {"aggregator": "fedmedian"},
                "astraea": {"aggregator": "astraea"},
                "update_clip": {"aggregator_args": {"update_clip": 2.0}},
                "checkpoint": {"checkpoint_dir": str(lsa / "ckpt")},
                "no_prime": {"prime_number": None},
                # FedML's own LightSecAgg example (prime_number: 1997, precision_parameter: 10)
                "fedml_example_field": {"prime_number": 1997, "precision_parameter": 10},
                "largest_prime": {"prime_number": 2**31 - 1},
                "not_prime": {"prime_number": 10**9},
            },
        }
    )
    shutil.copy(EXAMPLE / "grpc_ipconfig.csv", lsa)  # read by fedml.init over gRPC
    bypass = tmp_path_factory.mktemp("bypass")
    for name, host, optimizers in BYPASS_MODES:
        opts = bypass_optimizers(optimizers)
        cases: dict[str, dict[str, Any]] = {
            opt: {"federated_optimizer": opt, "random_seed": 1000 + i} for i, opt in enumerate(opts)
        }
        # the last optimizer without fedbalance: FedML's own run
        cases["stock"] = {"federated_optimizer": opts[-1], "aggregator": None, "random_seed": 999}
        cfg = config(bypass, name)
        jobs.append({"name": host, "cf": str(cfg), "cwd": str(bypass), "argv": [], "cases": cases})
    for job in jobs:
        job["result"] = str(tmp_path_factory.getbasetemp() / f"probe-{job['name']}.json")
    spec = tmp_path_factory.getbasetemp() / "probe-jobs.json"
    spec.write_text(json.dumps(jobs))
    argv = [sys.executable, str(HOSTS / "fedml_init_probe.py"), str(spec)]
    out = subprocess.run(argv, cwd=bypass, capture_output=True, text=True, timeout=600)
    got: dict[str, dict[str, Any]] = {}
    for job in jobs:
        result = Path(str(job["result"]))
        assert result.exists(), (job["name"], (out.stdout + out.stderr)[-3000:])
        got[str(job["name"])] = json.loads(result.read_text())
    return got


@pytest.mark.slow
def test_lightsecagg_refuses_what_needs_the_models(init_probes: dict[str, dict[str, Any]]) -> None:
    """In the real ``fedml.init()`` (cross-silo over gRPC: one process is a whole rank)."""
    got = init_probes["lsa"]
    assert got["fedloss"] == "ran"
    for case, words in [
        ("fedmedian", "needs each client's model"),
        ("astraea", "mediator"),
        ("update_clip", "update_clip"),
    ]:
        assert (
            got[case].startswith("aggregator: ")
            and "cannot run under federated_optimizer: LSA" in got[case]
        )
        assert words in got[case], got[case]
    assert "checkpoint_dir cannot take effect with federated_optimizer: LSA" in got["checkpoint"]
    assert "needs prime_number" in got["no_prime"]
    # the field's rule (fl_adapters.fedml.field) passes FedML's own values and the largest
    # prime 2 silos can compute with, and stops a prime that is not one in fedml.init()
    assert got["fedml_example_field"] == "ran" and got["largest_prime"] == "ran"
    assert "got 1000000000, which is not prime" in got["not_prime"]


@pytest.mark.slow
def test_every_bypassing_optimizer_is_refused_by_fedml_init(
    init_probes: dict[str, dict[str, Any]],
) -> None:
    """Each ``federated_optimizer`` value whose path bypasses the wrapped aggregation point
    (fl_adapters.fedml.adapter.BYPASSING), in each mode, stops in the real ``fedml.init()``
    before FedML's own init (which seeds torch with ``random_seed``: the refused calls leave
    torch's seed alone); stock FedML (no ``aggregator``) is left to run them. FedML's FedProx
    simulator, for one, never reaches the wrapped ``FedAvgAPI._aggregate``: an sp run used to
    finish with exit 0 and no FedLoss record (a refused init ends the user's script before
    training: ``test_a_typo_stops_the_run_before_training``)."""
    for _name, host, optimizers in BYPASS_MODES:
        got = init_probes[host]
        for i, opt in enumerate(bypass_optimizers(optimizers)):
            assert got[opt].startswith(refusal(opt, host)), (opt, got[opt])
            assert got[f"{opt} seed"] != 1000 + i, opt  # refused before FedML's init ran
            assert "Use federated_optimizer: FedAvg with aggregator: fedloss" in got[opt], opt
        assert got["stock"] == "ran" and got["stock seed"] == 999
