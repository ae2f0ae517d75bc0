"""The CUDA path: aggregators on GPU tensors, fedbalance's training helpers on a GPU model, and
FedLab's stock example with ``cuda=True`` (as FedLab's own examples run) armed with fedbalance.

Run by `make test-cuda` on a machine with a CUDA device; `make test` never collects it (the
main suite passes or fails the same way on every machine). The aggregators' results on the GPU
must equal their CPU results (the compiled kernels there) and stay where the global model is.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import records
from torch import nn
from torch.utils.data import TensorDataset

from fl_adapters._training import evaluate, local_train
from fl_adapters.registry import get_registry
from fl_aggregators import ClientUpdate
from fl_aggregators.functional import BLOCK, NETWORK_MAX_CLIENTS

GPU = torch.device("cuda")
CPU = torch.device("cpu")
HOSTS = Path(__file__).parent.parent / "hosts"
BUILTINS = ["fedavg", "fedavgm", "fedloss", "fedloss_n", "fedmedian"]
#: Arguments beside the defaults: FedAvg's update clip reads per-client norms on the device.
ARGS: dict[str, dict[str, object]] = {"fedavg": {"update_clip": 2.0}}


def model(seed: int, device: torch.device) -> OrderedDict[str, torch.Tensor]:
    """Every dtype a model brings, one tensor over the torch fallback's block size."""
    g = torch.Generator().manual_seed(seed)
    return OrderedDict(
        big=torch.randn(BLOCK + 1000, generator=g).to(device),
        conv=torch.randn(8, 3, 3, 3, generator=g).to(device),
        bias=torch.randn(8, generator=g).double().to(device),
        half=torch.randn(64, generator=g).half().to(device),
        steps=torch.tensor(seed % 50).to(device),
    )


def updates(k: int, device: torch.device) -> list[ClientUpdate]:
    return [
        ClientUpdate(model(s + 1, device), 10 + 7 * s, {"val_loss": 0.2 + 0.1 * s}, client_id=s)
        for s in range(k)
    ]


def assert_same(
    got: OrderedDict[str, torch.Tensor], cpu: OrderedDict[str, torch.Tensor], where: str = "cuda"
) -> None:
    """``got`` equals the CPU result ``cpu`` (to float tolerance) and lives on ``where``."""
    assert list(got) == list(cpu)
    for key, value in got.items():
        assert value.device.type == where, key
        assert value.dtype == cpu[key].dtype, key
        tol = 1e-3 if value.dtype == torch.float16 else 1e-5
        assert torch.allclose(value.cpu().double(), cpu[key].double(), atol=tol, rtol=tol), key


def make(name: str):
    return get_registry().make_aggregator(name, **ARGS.get(name, {}))


@pytest.mark.parametrize("k", [3, NETWORK_MAX_CLIENTS + 6])
@pytest.mark.parametrize("name", BUILTINS)
def test_an_aggregator_on_the_gpu_equals_it_on_the_cpu(name: str, k: int) -> None:
    on_gpu, on_cpu = make(name), make(name)
    for rnd in (1, 2):  # FedAvgM's velocity is kept on the device between rounds
        a = on_gpu.aggregate(model(100 + rnd, GPU), updates(k, GPU))
        b = on_cpu.aggregate(model(100 + rnd, CPU), updates(k, CPU))
        assert not a.skipped and not b.skipped
        assert a.weights == pytest.approx(b.weights, rel=1e-12)
        assert_same(a.params, b.params)


def test_the_gpu_median_equals_numpy_median_nan_included() -> None:
    for k in (4, 5, NETWORK_MAX_CLIENTS + 7, NETWORK_MAX_CLIENTS + 8):
        ups = updates(k, GPU)
        ups[1].params["big"][7] = float("nan")  # type: ignore[index]
        got = make("fedmedian")._combine([], ups, [list(u.params.values()) for u in ups])[0]
        stacked = np.stack([u.params["big"].cpu().numpy() for u in ups])  # type: ignore[index]
        want = np.median(stacked, axis=0)
        assert got[0].device.type == "cuda"
        np.testing.assert_allclose(got[0].cpu().numpy(), want, rtol=1e-6, atol=1e-6)
        assert np.isnan(got[0][7].item())


def test_a_nan_client_on_the_gpu_is_rejected_and_the_rest_averaged() -> None:
    ups = updates(4, GPU)
    ups[2].params["big"][-3] = float("inf")  # type: ignore[index]
    r = make("fedloss").aggregate(model(0, GPU), ups)
    assert [x.client for x in r.rejected] == [2]
    want = make("fedloss").aggregate(model(0, GPU), [u for i, u in enumerate(ups) if i != 2])
    assert_same(r.params, {k: v.cpu() for k, v in want.params.items()})  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["clients-on-gpu", "clients-on-cpu"])
def test_the_result_lives_where_the_global_model_lives(where: str) -> None:
    server, clients = (CPU, GPU) if where == "clients-on-gpu" else (GPU, CPU)
    r = make("fedavgm").aggregate(model(0, server), updates(3, clients))
    ref = make("fedavgm").aggregate(model(0, CPU), updates(3, CPU))
    assert_same(r.params, ref.params, server.type)


def test_the_secure_path_finishes_a_gpu_sum() -> None:
    agg, ups = make("fedloss"), updates(3, GPU)
    weighing = agg.weigh(ups)
    total = [
        sum(w * u.params[key].double() for w, u in zip(weighing.weights, ups, strict=True))  # type: ignore[index]
        for key in ups[0].params
    ]
    summed = OrderedDict(zip(ups[0].params, total, strict=True))
    r = agg.finish(model(0, GPU), summed, weighing)
    ref = make("fedloss").aggregate(model(0, CPU), updates(3, CPU))
    assert not r.skipped
    assert_same(r.params, ref.params)


def test_training_and_evaluation_follow_a_gpu_model() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).to(GPU)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(
        torch.randn(64, 4, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    )
    before = evaluate(net, data)
    n = local_train(net, data, epochs=3, batch_size=16, optimizer="sgd", lr=0.5, seed=2)
    after = evaluate(net, data)
    assert n == 64 and all(p.device.type == "cuda" for p in net.parameters())
    assert after[2] == 64 and after[0] < before[0]


def test_the_bias_counts_of_a_gpu_model_equal_its_cpu_counts() -> None:
    """Per-class counts (one pass, and one pass split into clients, as FedML's server makes
    it) on a GPU model equal the same model's on the CPU."""
    from torch.utils.data import ConcatDataset, DataLoader

    from fl_adapters._training import evaluate_counts, evaluate_counts_in_parts

    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 5))
    g = torch.Generator().manual_seed(3)
    parts = [
        TensorDataset(torch.randn(n, 4, 4, generator=g), torch.randint(0, 5, (n,), generator=g))
        for n in (40, 0, 70)
    ]
    joined = DataLoader(ConcatDataset(parts), batch_size=16)
    sizes = [len(p) for p in parts]
    cpu = [evaluate_counts(net, joined), *evaluate_counts_in_parts(net, joined, sizes)]
    net.to(GPU)
    gpu = [evaluate_counts(net, joined), *evaluate_counts_in_parts(net, joined, sizes)]
    for a, b in zip(gpu, cpu, strict=True):
        assert a.total.tolist() == b.total.tolist() and a.correct.tolist() == b.correct.tolist()
        assert a.loss_sum == pytest.approx(b.loss_sum, rel=1e-5)
    assert gpu[0].n == 110 and sum(c.n for c in gpu[1:]) == 110


# -- FedLab's stock example on the GPU, armed by the environment ---------------------------------
def mnist_like(root: Path, train: int = 1200, test: int = 300) -> Path:
    """Random MNIST-format idx files where torchvision's ``MNIST`` looks (the test machine's
    dataset need not be there); the labels carry a learnable signal in the images."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        images[np.arange(n), labels * 2 + 4, 4:24] = 255  # a bright row per class
        head = (2051).to_bytes(4, "big") + n.to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(head + images.tobytes())
        head = (2049).to_bytes(4, "big") + n.to_bytes(4, "big")
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(head + labels.tobytes())
    return root


needs_fedlab = pytest.mark.skipif(
    importlib.util.find_spec("fedlab") is None, reason="FedLab 1.3.0 is not installed"
)


@needs_fedlab
@pytest.mark.parametrize(
    "aggregator, args",
    [(None, ""), ("fedloss", ""), ("fedmedian", ""), ("astraea", '{"gamma": 2, "tau_d": 2.0}')],
    ids=["stock", "fedloss", "fedmedian", "astraea"],
)
def test_fedlab_stock_example_with_cuda_true(
    tmp_path: Path, aggregator: str | None, args: str
) -> None:
    root = mnist_like(tmp_path / "data")
    script = [str(HOSTS / "fedlab_example_standalone.py"), "--root", str(root)]
    script += ["--path", str(tmp_path / "fed"), "--preprocess", "--cuda"]
    script += ["--total_clients", "10", "--sample_ratio", "0.4"]
    rec = tmp_path / "rec.jsonl"
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "FEDBALANCE_RECORD": str(rec)}
    if aggregator:
        env.update(FEDBALANCE_AGGREGATOR=aggregator, FEDBALANCE_AGGREGATOR_ARGS=args)
    out = subprocess.run(
        [sys.executable, *script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert out.stdout.count("test-acc") == 2
    lines = records(rec) if rec.exists() else []
    if aggregator is None:
        assert lines == []
    else:
        assert [(r["round"], r["aggregator"]) for r in lines] == [(1, aggregator), (2, aggregator)]
        assert all(r["host"] == "fedlab" and not r["skipped"] for r in lines)
