"""What every registered host does, the toy host of ``tests/plugins/toy_host.py`` included:
``fedbalance run --check`` passes, a 2-round run writes the same files and keys as every
other host's, and a run stopped after round 1 and resumed ends bit for bit on the
uninterrupted run (model, aggregator state, rows, aggregation record).

FedAvgM is the aggregator: its server momentum is state a resume must carry, and 2 of several
clients a round make the sampler's state matter. The toy host writes none of its files: the
lifecycle does (:func:`fl_adapters.run.lifecycle.in_process`). Flower cannot share this
environment; its suite holds it to the same files and keys (``tests/flower/test_cli.py``) and
to the same resume (``tests/flower/test_resume.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from helpers import check_host_files, records
from test_registry import TOY_HOST, FakeDist, FakeEntryPoint, _module, with_entry_points

from fl_adapters.checkpoint import Checkpoint
from fl_adapters.cli import main

__all__ = ["with_entry_points"]  # the fixture, used by name

FEDAVGM = {"aggregator": "fedavgm", "aggregator_args": {"beta": 0.9}, "seed": 3}
#: One config per registered host (a host added to the registry needs one here), and the
#: host its aggregation record names.
CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "fedlab": (
        {"framework": "fedlab", "dataset": "digits", "num_clients": 6, "clients_per_round": 3,
         "partition": {"name": "label_dirichlet", "beta": 0.5}, "batch_size": 32},
        "fedlab",
    ),
    "fedml": (
        {"framework": "fedml-sp", "dataset": "fmnist", "max_samples": 1000, "num_clients": 6,
         "clients_per_round": 2, "partition": {"name": "label_dirichlet", "beta": 0.5}},
        "fedml-sp",
    ),
    "flower": ({"framework": "flower"}, "flower"),  # tests/flower: not in this environment
    "toy": ({"framework": "toy", "dataset": "digits", "num_clients": 6,
             "clients_per_round": 3}, "toy"),
}  # fmt: skip


@pytest.fixture
def toy(with_entry_points: Any) -> None:
    with_entry_points(
        FakeEntryPoint("toy", "fb_toy", FakeDist("fb-toy"), _module(TOY_HOST, "fb_toy"))
    )


def test_every_registered_host_has_a_contract_config(toy: None) -> None:
    from fl_adapters.registry import Registry

    assert {spec.name for spec in Registry().hosts()} == set(CONFIGS)


def run(tmp_path: Path, name: str, doc: dict[str, Any], *flags: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out" / name.split("-")[0]
    assert main(["run", str(path), "--out", str(out), "--no-progress", *flags]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("host", sorted(CONFIGS))
def test_every_host_keeps_the_contract(host: str, toy: None, tmp_path: Path, capsys: Any) -> None:
    if host == "flower":
        pytest.skip("Flower needs its own environment: tests/flower holds it to this contract")
    fields, record_host = CONFIGS[host]
    doc = {**fields, **FEDAVGM, "rounds": 2, "local_epochs": 1}
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--check"]) == 0
    assert '"config": "ok"' in capsys.readouterr().out

    whole = run(tmp_path, "whole", doc)
    check_host_files(whole, 2, record_host)
    part = run(tmp_path, "part", {**doc, "rounds": 1})
    assert run(tmp_path, "part-resumed", doc, "--resume") == part
    check_host_files(part, 2, record_host)

    want, got = Checkpoint.load(whole / "checkpoint.pt"), Checkpoint.load(part / "checkpoint.pt")
    if isinstance(want.model, dict):
        assert list(want.model) == list(got.model)
        assert all(torch.equal(want.model[k], got.model[k]) for k in want.model)
    else:
        assert torch.equal(want.model, got.model)
    assert want.aggregator.keys() == got.aggregator.keys()
    velocity = want.aggregator["velocity"]  # FedAvgM's momentum, carried over the restart
    assert velocity and all(
        torch.equal(a, b) for a, b in zip(velocity, got.aggregator["velocity"], strict=True)
    )
    assert want.sampler == got.sampler
    rows = {name: records(out / "metrics.jsonl") for name, out in (("w", whole), ("p", part))}
    assert rows["w"] == rows["p"]
    assert records(whole / "aggregations.jsonl") == records(part / "aggregations.jsonl")
