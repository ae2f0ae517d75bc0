"""Per-round cost of the fedbalance path in FedLab against FedLab's own FedAvg.

Server side, on the same client buffer (thesis CNN, 5 clients, FedLab's flat parameter
vectors): ``FedBalanceServerHandler.global_update`` (decode the uplink, validate, aggregate,
record) against stock ``SyncServerHandler.global_update`` (FedLab's unweighted
``fedavg_aggregate``). The difference is set against the time of a whole round of the thesis
setting (measured here too, in a short standalone run), which is what a user waits for.

    fedbalance bench fedlab-overhead [--repeats 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def _median_time(fn: Any, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(
    repeats: int = 200, rounds: int = 3, local_epochs: int = 1, out_dir: Path = RESULTS
) -> dict[str, Any]:
    from fedlab.contrib.algorithm.basic_server import SyncServerHandler

    from fedbalance_benchmarks.models import ThesisCNN
    from fl_adapters._table import markdown_table
    from fl_adapters.config import RunConfig
    from fl_adapters.fedlab.handler import FedBalanceServerHandler
    from fl_adapters.fedlab.payload import pack_meta
    from fl_adapters.fedlab.runner import run_standalone

    torch.manual_seed(0)
    model = ThesisCNN()
    n_params = sum(p.numel() for p in model.parameters())
    buffer = [[torch.randn(n_params), pack_meta(c, 1400 + 10 * c, 0.3 + 0.1 * c)] for c in range(5)]
    stock = SyncServerHandler(ThesisCNN(), global_round=10**9, sample_ratio=1.0)
    ours = {
        name: FedBalanceServerHandler(ThesisCNN(), 10**9, 1.0, aggregator=name)
        for name in ("fedavg", "fedloss")
    }
    t_stock = _median_time(lambda: stock.global_update(buffer), repeats)
    t_ours = {
        name: _median_time(lambda h=h: h.global_update(buffer), repeats) for name, h in ours.items()
    }

    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.from_dict(
            dict(
                framework="fedlab",
                dataset="fmnist",
                partition={"name": "mixed"},
                aggregator="fedloss",
                rounds=rounds,
                local_epochs=local_epochs,
                seed=0,
            )
        )
        summary = run_standalone(cfg, Path(tmp), progress=False)
    round_s = summary["elapsed_s"] / rounds
    rows = [["fedlab SyncServerHandler (fedavg_aggregate)", f"{1e3 * t_stock:.3f}", "1.00x", "-"]]
    record: dict[str, Any] = {
        "params": n_params,
        "clients": 5,
        "repeats": repeats,
        "stock_seconds": t_stock,
        "round_seconds": round_s,
        "local_epochs": local_epochs,
        "fedbalance": {},
    }
    for name, t in t_ours.items():
        overhead = (t - t_stock) / round_s
        rows.append(
            [
                f"fedbalance {name}",
                f"{1e3 * t:.3f}",
                f"{t / t_stock:.2f}x",
                f"{100 * overhead:.3f} %",
            ]
        )
        record["fedbalance"][name] = {"seconds": t, "overhead_of_round": overhead}
    table = markdown_table(
        ["server update", "median ms", "vs FedLab", "extra time per round"], rows
    )
    text = (
        f"# fedbalance in FedLab: per-round server overhead\n\nThesis CNN ({n_params} params), 5 clients per "
        f"round, median of {repeats} updates; a round of the thesis setting (30 clients, 5 per round, "
        f"{local_epochs} local epoch(s), Fashion-MNIST, mixed skew) took {round_s:.2f} s here.\n"
        f"Regenerate: `fedbalance bench fedlab-overhead`.\n\n{table}\n"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "perf_fedlab_overhead.md").write_text(text)
    (out_dir / "perf_fedlab_overhead.json").write_text(json.dumps(record, indent=1) + "\n")
    print(text)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fedbalance bench fedlab-overhead", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    run(a.repeats, a.rounds, a.local_epochs, a.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
