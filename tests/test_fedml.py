"""The FedML adapter against real FedML 0.9.6: sp simulation, MPI simulation, MPI cross-silo.

The host is ``benchmarks/fedml_example/main.py``, written as FedML's examples are, with no
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
from fl_aggregators import ClientUpdate, FedLoss

pytest.importorskip("fedml")

EXAMPLE = Path(__file__).resolve().parents[1] / "benchmarks" / "fedml_example"
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


@pytest.mark.slow
@needs_mpi
def test_a_one_round_mpi_simulation_finishes(tmp_path: Path) -> None:
    """FedML 0.9.6's MPI clients finish only after a round's sync message; a 1-round run sends
    none, so its server waited in MPI.Finalize for clients that never finished."""
    from fl_adapters.processes import start_logged, watch

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

    from fl_adapters.fedml.payload import KEY_LOSS, attach, decode, strip

    params = {"w": torch.ones(2), "n": torch.tensor(3)}
    sent = attach(params, client=7, val_loss=0.25)
    assert (
        list(sent)[:2] == ["w", "n"] and float(sent[KEY_LOSS]) == 0.25 and sent[KEY_LOSS].dim() == 0
    )
    clean, client, loss = strip(sent)
    assert list(clean) == ["w", "n"] and client == 7 and loss == 0.25
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
    row = next(line for line in table.splitlines() if line.startswith("| mixed    | fedloss"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"{100 * max(fedlab['accuracy']):.2f} ± 0.00"  # FedLab's best, same seed
    assert cells[3] == f"{100 * max(doc['runs'][0]['accuracy']):.2f} ± 0.00"


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
    cfg = config(tmp_path, "mpi.yaml")
    doc = yaml.safe_load(cfg.read_text())
    doc["data_args"]["dataset"] = "cifar10"
    cfg.write_text(yaml.safe_dump(doc))
    out = run_host(tmp_path, cfg, processes=3, FEDBALANCE_DATA=str(tmp_path / "empty"))
    assert out.returncode != 0
    assert "cifar10 not found under" in out.stdout + out.stderr


# -- beside FedML's other algorithms: fedbalance applies, or the run stops (issue #31) ---------
def refusal(optimizer: str, host: str) -> str:
    return f"aggregator: fedloss cannot take effect with federated_optimizer: {optimizer} in {host}"


#: Fixed point with 20 fractional bits modulo a prime below 2**30 (fl_adapters.fedml.secure).
LSA_ARGS = {"federated_optimizer": "LSA", "prime_number": 1073741789, "precision_parameter": 20}


@pytest.mark.slow
@needs_mpi
def test_fedloss_under_lightsecagg_equals_fedloss_in_clear(tmp_path: Path) -> None:
    """Cross-silo LightSecAgg over MPI with ``aggregator: fedloss`` used to hang on an
    IndexError in the clients' masking. Now every client scales its model by its FedLoss weight
    before masking, and the server's unmasked result is FedLoss of the very models the clients
    trained (saved on the clients by a test-only hook), up to LightSecAgg's 2**-20 rounding."""
    rec, dump = tmp_path / "rec.jsonl", tmp_path / "dump"
    dump.mkdir()
    start = time.monotonic()
    out = run_host(
        tmp_path, config(tmp_path, "cross_silo.yaml", **LSA_ARGS), processes=3,
        script=HOSTS / "fedml_lsa_dump.py", FEDBALANCE_RECORD=str(rec), FEDBALANCE_DUMP=str(dump),
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert time.monotonic() - start < 120
    entries = records(rec)
    assert [e["round"] for e in entries] == [1, 2]
    for entry in entries:
        r = entry["round"]
        assert entry["host"] == "fedml-cross-silo" and entry["secure"] == "lightsecagg"
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
