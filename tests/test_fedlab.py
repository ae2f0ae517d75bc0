"""The FedLab adapter against real FedLab 1.3.0: standalone pipeline, cross-process, stock scripts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("fedlab")

from helpers import check_bias_rows, digits_run, fedloss_weights, records

from fl_adapters.config import RunConfig
from fl_adapters.fedlab import FedBalancePartitioner, FedBalanceServerHandler, PartitionedDataset
from fl_adapters.fedlab.launch import run_distributed
from fl_adapters.fedlab.payload import decode, encode
from fl_adapters.fedlab.runner import run_standalone
from fl_adapters.run.processes import free_ports
from fl_partitions import make_partitioner

HOSTS = Path(__file__).parent / "hosts"
AGGREGATORS = ["fedavg", "fedavgm", "fedmedian", "fedloss", "fedloss_n"]


def tiny_config(**overrides: object) -> RunConfig:
    base = {"partition": {"name": "mixed"}, "aggregator": "fedloss", "num_clients": 6}
    return digits_run({**base, "clients_per_round": 3, "rounds": 3, "seed": 3}, overrides)


@pytest.mark.parametrize("aggregator", AGGREGATORS)
def test_standalone_pipeline_runs_every_aggregator(
    aggregator: str, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    rec = tmp_path / "rec.jsonl"
    monkeypatch.setenv("FEDBALANCE_RECORD", str(rec))
    summary = run_standalone(tiny_config(aggregator=aggregator), tmp_path / "out", progress=False)
    assert summary["rounds"] == 3 and 0.0 <= summary["final_accuracy"] <= 1.0
    lines = records(rec)
    assert [r["round"] for r in lines] == [1, 2, 3]
    for r in lines:
        assert r["host"] == "fedlab" and r["aggregator"] == aggregator and len(r["clients"]) == 3
        assert sum(r["weights"]) == pytest.approx(1.0) and r["rejected"] == []
        if aggregator == "fedloss":
            losses = [m["val_loss"] for m in r["metrics"]]
            assert r["weights"] == pytest.approx(fedloss_weights(losses))
        if aggregator == "fedavg":
            assert r["weights"] == pytest.approx(
                [n / sum(r["num_samples"]) for n in r["num_samples"]]
            )
    metrics = records(tmp_path / "out" / "metrics.jsonl")
    assert len(metrics) == 3 and all("test_accuracy" in m and m["bytes_up"] > 0 for m in metrics)


def test_training_actually_learns(tmp_path: Path) -> None:
    summary = run_standalone(
        tiny_config(partition={"name": "iid"}, rounds=4, aggregator="fedavg"),
        tmp_path,
        progress=False,
    )
    assert summary["best_accuracy"] > 0.5  # digits, 10 classes: chance is 0.1


@pytest.mark.slow
def test_cross_process_matches_standalone_in_round_one(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cfg = tiny_config(port=free_ports(1)[0])
    monkeypatch.setenv("FEDBALANCE_RECORD", str(tmp_path / "standalone.jsonl"))
    run_standalone(cfg, tmp_path / "sa", progress=False)
    monkeypatch.setenv("FEDBALANCE_RECORD", str(tmp_path / "dist.jsonl"))
    cfg.framework = "fedlab-distributed"
    summary = run_distributed(cfg, tmp_path / "dist", client_processes=2, timeout=600)
    assert summary["rounds"] == 3
    sa, dist = records(tmp_path / "standalone.jsonl"), records(tmp_path / "dist.jsonl")
    assert [r["round"] for r in dist] == [1, 2, 3] and {r["host"] for r in dist} == {
        "fedlab-distributed"
    }
    # The server process records under its --out as well, the same lines as the user's file.
    assert records(tmp_path / "dist" / "aggregations.jsonl") == dist
    for r in dist:  # fedloss weights are the reported losses, normalised
        assert r["weights"] == pytest.approx(fedloss_weights([m["val_loss"] for m in r["metrics"]]))
    by_client = lambda r: {c: w for c, w in zip(r["clients"], r["weights"], strict=True)}  # noqa: E731
    assert by_client(dist[0]) == pytest.approx(by_client(sa[0]), rel=1e-5)
    check_bias_rows(tmp_path / "dist", evaluated=3)  # the server evaluates as standalone does


def test_the_cross_process_launcher_imports_neither_torch_nor_fedlab() -> None:
    """``fedbalance run`` on fedlab-distributed only starts and watches the processes that
    train; importing FedLab's runner for it cost that process about 4.5 CPU-s more."""
    code = (
        "import sys\n"
        "import fl_adapters.hosts, fl_adapters.fedlab.launch\n"
        "print([m for m in ('torch', 'torchvision', 'fedlab') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


#: A cross-process run through ``fedbalance run`` (one round on digits).
DISTRIBUTED = {
    "framework": "fedlab-distributed",
    "dataset": "digits",
    "partition": {"name": "mixed"},
    "aggregator": "fedloss",
    "num_clients": 6,
    "clients_per_round": 3,
    "rounds": 1,
    "local_epochs": 1,
    "seed": 3,
}


def cli(work: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``fedbalance run run.yaml --out out ARGS`` in ``work``, without the caller's
    FEDBALANCE_* switches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    argv = [sys.executable, "-m", "fl_adapters.cli", "run", "run.yaml", "--out", "out", *args]
    return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_cross_process_run_listens_on_loopback_only(tmp_path: Path) -> None:
    """torch's TCPStore (FedLab's rendezvous, rank 0) listened on every interface (``*:PORT``)
    and took unauthenticated reads and writes; now it, and every gloo socket, is on 127.0.0.1."""
    from test_fedml_loopback import exposed, listeners_of_a_run

    (port,) = free_ports(1)
    seen, wall = listeners_of_a_run(tmp_path, DISTRIBUTED | {"port": port})
    assert exposed(seen) == [], seen
    assert ("python", "127.0.0.1", port) in seen, seen  # the store, where it was asked to be
    assert len(seen) >= 4, seen  # and gloo's sockets, one per process
    assert wall < 60


def test_a_port_in_use_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    """A second run on a port already taken used to fail after 29 s with "server exited with
    code 1"; now it stops at once, naming the port and what to do, having started nothing."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(DISTRIBUTED | {"port": port}))
        start = time.monotonic()
        done = cli(tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"fedbalance run: error: fedlab-distributed: port {port} on 127.0.0.1 is already in "
        "use (another process listens there: a run still alive?); stop that process or set "
        "another port: in the config"
    )
    assert time.monotonic() - start < 30  # no process was started, no rendezvous waited for
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_run_stopped_before_its_first_checkpoint_is_told_to_start_again(tmp_path: Path) -> None:
    """The server is killed before round 1 ends: the error, a second start and a ``--resume``
    each say to start again with ``--overwrite`` (there is nothing to resume; the run used to
    be sent to ``--resume``, which then found no checkpoint)."""
    from fl_adapters.run.processes import descendants

    def server() -> list[int]:
        found = []
        for pid in descendants(launcher.pid):
            try:
                if b"fedlab-server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                continue
        return found

    (port,) = free_ports(1)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(DISTRIBUTED | {"port": port}))
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    argv = [sys.executable, "-m", "fl_adapters.cli", "run", "run.yaml", "--out", "out"]
    launcher = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").exists() or not server():  # the server has started
        assert launcher.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    assert not (out / "checkpoint.pt").exists()
    for pid in server():
        os.kill(pid, signal.SIGKILL)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 1
    assert "fedlab-distributed: server was killed by signal 9" in err, err[-2000:]
    assert (
        "no round had completed, so there is no checkpoint to resume: start the run again with "
        "`fedbalance run --overwrite` (without --resume)"
    ) in err
    found = ", ".join(n for n in ("metrics.jsonl", "summary.json", "aggregations.jsonl")
                      if (out / n).exists())  # fmt: skip
    again = cli(tmp_path, timeout=60)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1] == (
        f"fedbalance run: error: --out out holds the records of a run that stopped before its "
        f"first checkpoint ({found}; no checkpoint.pt), so there is nothing to --resume: "
        "--overwrite to start it again, or choose another --out"
    )
    resumed = cli(tmp_path, "--resume", timeout=60)
    assert resumed.returncode == 2
    assert resumed.stderr.strip().splitlines()[-1] == (
        f"fedbalance run: error: --resume: no checkpoint at out/checkpoint.pt (a run writes one "
        f"after each round it completes), so there is nothing to resume: start the run again "
        f"without --resume and with --overwrite (it holds that run's {found})"
    )


@pytest.mark.slow
def test_stock_fedlab_script_switches_by_environment(tmp_path: Path) -> None:
    script = HOSTS / "fedlab_stock_standalone.py"
    rec = tmp_path / "rec.jsonl"
    env = {**os.environ, "FEDBALANCE_AGGREGATOR": "fedloss", "FEDBALANCE_RECORD": str(rec)}
    out = subprocess.run(
        [sys.executable, str(script), "3"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = records(rec)
    assert [r["round"] for r in lines] == [1, 2, 3]
    for r in lines:
        losses = [m["val_loss"] for m in r["metrics"]]
        assert len(losses) == 3 and all(x > 0 for x in losses)
        assert r["weights"] == pytest.approx(fedloss_weights(losses))
        assert r["aggregator"] == "fedloss" and r["host"] == "fedlab"


@pytest.mark.slow
def test_stock_script_untouched_without_the_variable(tmp_path: Path) -> None:
    script = HOSTS / "fedlab_stock_standalone.py"
    rec = tmp_path / "rec.jsonl"
    base = {k: v for k, v in os.environ.items() if k != "FEDBALANCE_AGGREGATOR"}
    plain = subprocess.run(
        [sys.executable, str(script)],
        env={**base, "FEDBALANCE_RECORD": str(rec)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    off = subprocess.run(
        [sys.executable, str(script)],
        env={**base, "FEDBALANCE_DISABLE_HOST_AUTOLOAD": "1", "FEDBALANCE_AGGREGATOR": "fedloss"},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    checksum = [line for line in plain.stdout.splitlines() if line.startswith("CHECKSUM")]
    assert checksum and checksum == [
        line for line in off.stdout.splitlines() if line.startswith("CHECKSUM")
    ]
    assert not rec.exists()


@pytest.mark.slow
def test_stock_script_with_a_typo_fails_at_import(tmp_path: Path) -> None:
    env = {**os.environ, "FEDBALANCE_AGGREGATOR": "fedlos"}
    out = subprocess.run(
        [sys.executable, str(HOSTS / "fedlab_stock_standalone.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "unknown aggregator 'fedlos'" in out.stderr and "did you mean 'fedloss'?" in out.stderr
    assert "CHECKSUM" not in out.stdout


# -- pieces ------------------------------------------------------------------------------------
def test_fedlab_partitioner_interface() -> None:
    labels = np.repeat(np.arange(10), 50)
    p = FedBalancePartitioner(
        labels, 7, {"name": "label_dirichlet", "beta": 0.3, "min_size": 5}, seed=2
    )
    assert len(p) == 7 and set(p.client_dict) == set(range(7))
    assert sorted(np.concatenate([p[i] for i in range(7)]).tolist()) == list(range(500))
    same = FedBalancePartitioner(
        labels, 7, make_partitioner({"name": "label_dirichlet", "beta": 0.3, "min_size": 5}), seed=2
    )
    assert all(np.array_equal(p[i], same[i]) for i in range(7))


def test_partitioned_dataset_gives_noisy_splits() -> None:
    x = torch.zeros(60, 1, 4, 4)
    ds = torch.utils.data.TensorDataset(x, torch.arange(60) % 3)
    part = make_partitioner({"name": "feature_noise", "sigma": 1.0}).partition(
        np.arange(60) % 3, 3, seed=0
    )
    fed = PartitionedDataset(ds, part)
    sizes = [len(fed.get_dataset(c, s)) for c in range(3) for s in ("train", "val", "test")]
    assert sum(sizes) == 60 and sizes[:3] == [14, 2, 4]
    assert torch.count_nonzero(fed.get_dataset(0, "train")[0][0]) == 0  # client 0: noise std 0
    assert float(fed.get_dataset(2, "train")[0][0].std()) > 0.3  # last client: std 1
    with pytest.raises(ValueError, match="type must be one of train, val, test, got 'dev'"):
        fed.get_dataset(0, "dev")


def test_payload_round_trip_and_stock_uplink() -> None:
    up = decode(encode(torch.ones(3), 5, 120, {"val_loss": 0.25}))
    assert (up.client_id, up.num_samples, up.metrics) == (5, 120, {"val_loss": 0.25})
    assert torch.equal(up.params, torch.ones(3))
    assert decode(encode(torch.ones(3), 5, 120)).metrics == {}
    bare = decode([torch.ones(3)], "#4")  # a stock trainer's: no count, named by its place
    assert bare.client_id == "#4" and bare.num_samples == 1 and bare.metrics == {}
    odd = decode([torch.ones(3), torch.tensor([2.5, float("inf"), 0.1])], "#0")
    assert odd.client_id == "#0" and odd.num_samples == 1


def test_handler_rejects_a_poisoned_client_and_keeps_going(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Linear(2, 1)
    h = FedBalanceServerHandler(model, global_round=1, sample_ratio=1.0, aggregator="fedloss")
    good = torch.full_like(h.model_parameters, 0.5)
    bad = torch.full_like(h.model_parameters, float("nan"))
    h.global_update([encode(good, 0, 10, {"val_loss": 1.0}), encode(bad, 1, 10, {"val_loss": 1e9})])
    assert torch.equal(h.model_parameters, good)
    assert h.last_result is not None and [r.client for r in h.last_result.rejected] == [1]


# -- beside FedLab's other algorithms: fedbalance applies, or the run stops (issue #31) --------
#: FedLab 1.3.0's classes whose own code keeps the patched SyncServerHandler.global_update /
#: SGD trainers' local_process (fedbalance applies); every other class is refused when built.
APPLIES = {
    "basic_client.SGDClientTrainer",
    "basic_client.SGDSerialClientTrainer",
    "basic_server.SyncServerHandler",
    "ditto.DittoServerHandler",
    "fedavg.FedAvgServerHandler",
    "fedavg.FedAvgClientTrainer",
    "fedavg.FedAvgSerialClientTrainer",
    "fedprox.FedProxServerHandler",
    "powerofchoice.Powerofchoice",
    "powerofchoice.PowerofchoiceSerialClientTrainer",
}


def probe_fedlab(result: Path, **env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    out = subprocess.run(
        [sys.executable, str(HOSTS / "fedlab_algorithms_probe.py"), str(result)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(result.read_text())


@pytest.mark.slow
def test_every_fedlab_algorithm_class_applies_fedloss_or_is_refused_when_built(
    tmp_path: Path,
) -> None:
    got = probe_fedlab(tmp_path / "armed.json", FEDBALANCE_AGGREGATOR="fedloss")
    assert {c for c, v in got.items() if v == "ok"} == APPLIES
    refused = {c: v for c, v in got.items() if c not in APPLIES}
    assert (
        len(refused) == 14
    )  # 6 handlers (FedNova, SCAFFOLD, FedDyn, qFFL, IFCA, async), 8 trainers
    for cls, verdict in refused.items():
        short = cls.split(".")[1]
        assert verdict.startswith(
            f"refused: FEDBALANCE_AGGREGATOR=fedloss cannot take effect with FedLab's {short}: "
        ), verdict
        assert "so fedloss would be silently unused" in verdict
        assert f"unset FEDBALANCE_AGGREGATOR to run {short} stock" in verdict
    assert (
        "its global_update (fedlab.contrib.algorithm.fednova.FedNovaServerHandler)"
        in (refused["fednova.FedNovaServerHandler"])
    )
    # Without the variable FedLab is stock: nothing is refused (a class FedLab itself cannot
    # build with these arguments fails as it does without fedbalance).
    stock = probe_fedlab(tmp_path / "stock.json")
    assert stock.keys() == got.keys() and not any(v.startswith("refused") for v in stock.values())
    assert all(stock[c] == "ok" for c in APPLIES)


def test_evaluation_every_k_rounds_on_a_seeded_share_of_the_clients(tmp_path: Path) -> None:
    """``eval_every: 2, eval_fraction: 0.5``: rounds 2 and 3 (the last) are evaluated, each on
    the test splits of the clients :func:`evaluated_clients` draws for it; training is the
    run's that evaluates everyone every round (evaluation draws from a stream of its own)."""
    from fl_adapters._training import evaluated_clients
    from fl_adapters.experiment import training_data

    base = {"partition": {"name": "label_dirichlet", "beta": 0.5}, "aggregator": "fedloss"}
    base |= {"num_clients": 6, "clients_per_round": 3, "rounds": 3, "seed": 5}
    every = digits_run(base, {})
    sampled = digits_run(base, {"eval_every": 2, "eval_fraction": 0.5})
    run_standalone(every, tmp_path / "every", progress=False)
    run_standalone(sampled, tmp_path / "sampled", progress=False)
    rows = {k: records(tmp_path / k / "metrics.jsonl") for k in ("every", "sampled")}
    assert [("test_accuracy" in r) for r in rows["sampled"]] == [False, True, True]
    splits = training_data(sampled)[2].splits
    for row in rows["sampled"][1:]:
        chosen = evaluated_clients(6, 0.5, 5, row["round"])
        assert len(chosen) == 3
        assert row["test_samples"] == sum(len(splits[c]["test"]) for c in chosen)
    assert rows["every"][-1]["test_samples"] == sum(len(s["test"]) for s in splits)
    for a, b in zip(rows["every"], rows["sampled"], strict=True):
        assert (a["clients"], a["weights"]) == (b["clients"], b["weights"])
    check_bias_rows(tmp_path / "every", evaluated=3)  # all 6 clients every round
    check_bias_rows(tmp_path / "sampled", evaluated=2)  # 3 of them, rounds 2 and 3
