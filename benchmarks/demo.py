"""``fedbalance demo``: the thesis's five scenarios on Fashion-MNIST — partitions, then training.

It partitions with the five scenarios (table and plots), then runs the quick thesis benchmark
(every scenario x every aggregator, a few rounds, in FedLab's standalone pipeline). Falls back
to scikit-learn's bundled digits (saying so) when Fashion-MNIST is not installed.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from fl_adapters._table import PARTITION_HEADER, markdown_table, partition_row
from fl_adapters.registry import get_registry

log = logging.getLogger(__name__)


def run_demo(out_dir: Path, clients: int, seed: int, data_dir: str | None, train: bool) -> int:
    """Partition table and plots, then (``train``) the quick thesis benchmark on FedLab."""
    partition_demo(out_dir, clients, seed, data_dir)
    if not train:
        return 0
    try:
        import fedlab  # noqa: F401
    except ImportError:
        log.warning("FedLab is not installed (pip install 'fedbalance[fedlab]'): skipping training")
        return 0
    from fedbalance_benchmarks import thesis

    print(
        "\nQuick thesis benchmark (FedLab standalone; `fedbalance bench thesis` runs the full grid):\n"
    )
    return thesis.main(["--quick", "--out", str(out_dir / "thesis-quick"), "--seeds", "1"])


def partition_demo(out_dir: Path, clients: int, seed: int, data_dir: str | None) -> None:
    from fedbalance_benchmarks.thesis import SCENARIOS
    from fl_adapters.datasets import dataset_targets, fmnist_available, load_dataset
    from fl_partitions.plots import (  # matplotlib on first use
        plot_class_bars,
        plot_heatmap,
        plot_partition_noise,
    )

    dataset = "fmnist" if fmnist_available(data_dir) else "digits"
    if dataset == "digits":
        log.warning(
            "Fashion-MNIST not found (apt-get install dataset-fashion-mnist); "
            "using scikit-learn's bundled digits instead"
        )
    train = load_dataset(dataset, train=True, data_dir=data_dir)
    labels = dataset_targets(train)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, summary = [], {}
    for scenario, spec in SCENARIOS.items():
        start = time.perf_counter()
        partition = get_registry().make_partitioner(spec).partition(labels, clients, seed=seed)
        elapsed = time.perf_counter() - start
        rows.append(partition_row(scenario, partition, elapsed))
        summary[scenario] = {"spec": partition.spec, "stats": partition.stats()}
        plot_class_bars(partition, out_dir / f"{scenario}_bars.png", title=f"{dataset}: {scenario}")
        plot_heatmap(partition, out_dir / f"{scenario}_heatmap.png", title=f"{dataset}: {scenario}")
        if partition.noise_std.any():
            plot_partition_noise(partition, train, out_dir / f"{scenario}_noise.png")
    table = markdown_table(PARTITION_HEADER, rows)
    print(
        f"Partitions of {dataset} ({len(labels)} training samples) into {clients} clients, seed {seed}:\n"
    )
    print(table)
    (out_dir / "partitions.md").write_text(table + "\n")
    (out_dir / "partitions.json").write_text(
        json.dumps(
            {"dataset": dataset, "seed": seed, "clients": clients, "scenarios": summary}, indent=1
        )
    )
    print(f"\nwrote tables and plots to {out_dir}/")


def main(argv: list[str]) -> int:
    """``fedbalance demo`` (and ``fedbalance bench demo``)."""
    parser = argparse.ArgumentParser(prog="fedbalance demo")
    parser.add_argument("--out", default="runs/demo")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir")
    parser.add_argument("--no-train", action="store_true")
    args = parser.parse_args(argv)
    return run_demo(Path(args.out), args.clients, args.seed, args.data_dir, not args.no_train)
