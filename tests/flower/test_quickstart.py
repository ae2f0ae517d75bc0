"""Flower's own app shape, not ours: ``tests/hosts/flower_quickstart`` is laid out as ``flwr new
--framework pytorch`` makes an app (Flower Datasets dict samples in DataLoaders, the template's
train and test functions), changed only by the lines the docs give. Its run that learns is
``test_docs_deployment.py`` (the Flower page's deployment, as written); here, in a real local
deployment (SuperLink, SuperNode, ``flwr run``), the same app whose every round fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from fl_adapters.flower.runner import run_deployment
from fl_adapters.flower.trainer import client_splits

APP = Path(__file__).resolve().parents[1] / "hosts" / "flower_quickstart"


def deployed(tmp_path: Path, nodes: int, *overrides: str) -> tuple[str, list[dict]]:
    record = tmp_path / "record.jsonl"
    dep = run_deployment(
        APP,
        tmp_path / "work",
        num_supernodes=nodes,
        run_config=list(overrides),
        env={"FEDBALANCE_RECORD": str(record)},
        timeout=300,
    )
    rows = [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []
    return dep.log, rows


@pytest.mark.slow
def test_a_quickstart_whose_every_round_fails_ends_the_serverapp_with_the_error(
    tmp_path: Path,
) -> None:
    # Samples under keys fedbalance cannot find: every train reply is an error.
    log, rows = deployed(tmp_path, 2, "rename-keys=true")
    assert [r["skipped"] for r in rows] == [True]
    assert "aggregate_train: Received 0 results and 2 failures" in log
    assert "NothingAggregated: fedloss: none of the run's 1 round(s) aggregated anything" in log
    assert "a dict sample with keys ['pixels', 'target'] has no inputs and labels" in log
    # Flower's own report of a failed ServerApp (`flwr run` itself still exits 0)
    assert "Exit Code: 201" in log


def test_a_dataloader_is_split_into_dataloaders_of_its_kind() -> None:
    from flwr.app import Context, RecordDict

    data = [{"img": torch.zeros(2), "label": i % 3} for i in range(20)]
    loader = DataLoader(data, batch_size=4, shuffle=True)  # type: ignore[arg-type]
    context = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0},
        state=RecordDict(),
        run_config={"seed": 3},
    )
    parts = client_splits(context, loader)
    assert sorted(parts) == ["test", "train", "val"]
    assert {len(p.dataset) for p in parts.values()} == {14, 2, 4}
    for name, part in parts.items():
        assert isinstance(part, DataLoader) and part.batch_size == 4
        assert part.collate_fn is loader.collate_fn
        assert isinstance(part.sampler, RandomSampler) == (name == "train")
