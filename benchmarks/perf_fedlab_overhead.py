"""Per-round cost of the fedbalance path in FedLab against FedLab's own FedAvg.

Server side, on the same client buffer (thesis CNN, 5 clients, FedLab's flat parameter
vectors): ``FedBalanceServerHandler.global_update`` (decode the uplink, validate, aggregate,
record) against stock ``SyncServerHandler.global_update`` (FedLab's unweighted
``fedavg_aggregate``). The difference is set against the time of a whole round of the thesis
setting (measured here too, in a short standalone run), which is what a user waits for.

    fedbalance bench fedlab-overhead [--repeats 200] [--rounds 3]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from fedbalance_benchmarks._overhead import RESULTS, median_time, report
from fedbalance_benchmarks._overhead import main as overhead_main


def run(
    repeats: int = 200, rounds: int = 3, local_epochs: int = 1, out_dir: Path = RESULTS
) -> dict[str, Any]:
    from fedlab.contrib.algorithm.basic_server import SyncServerHandler

    from fl_adapters.config import RunConfig
    from fl_adapters.fedlab.handler import FedBalanceServerHandler
    from fl_adapters.fedlab.payload import encode
    from fl_adapters.fedlab.runner import run_standalone
    from fl_adapters.models import ThesisCNN

    torch.manual_seed(0)
    n_params = sum(p.numel() for p in ThesisCNN().parameters())
    buffer = [
        encode(torch.randn(n_params), c, 1400 + 10 * c, {"val_loss": 0.3 + 0.1 * c})
        for c in range(5)
    ]
    stock = SyncServerHandler(ThesisCNN(), global_round=10**9, sample_ratio=1.0)
    ours = {
        name: FedBalanceServerHandler(ThesisCNN(), 10**9, 1.0, aggregator=name)
        for name in ("fedavg", "fedloss")
    }
    t_stock = median_time(lambda: stock.global_update(buffer), repeats)
    t_ours = {
        name: median_time(lambda h=h: h.global_update(buffer), repeats) for name, h in ours.items()
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
        round_s = run_standalone(cfg, Path(tmp), progress=False)["elapsed_s"] / rounds
    record: dict[str, Any] = {
        "params": n_params,
        "clients": 5,
        "repeats": repeats,
        "local_epochs": local_epochs,
    }
    header = (
        f"# fedbalance in FedLab: per-round server overhead\n\nThesis CNN ({n_params} params), 5 clients "
        f"per round, median of {repeats} updates; a round of the thesis setting (30 clients, 5 per round, "
        f"{local_epochs} local epoch(s), Fashion-MNIST, mixed skew) took {round_s:.2f} s here."
    )
    report(
        host="FedLab",
        stem="perf_fedlab_overhead",
        stock_label="fedlab SyncServerHandler (fedavg_aggregate)",
        t_stock=t_stock,
        t_ours=t_ours,
        round_s=round_s,
        record=record,
        header=header,
        out_dir=out_dir,
    )
    return record


def main(argv: list[str] | None = None) -> int:
    return overhead_main("fedbalance bench fedlab-overhead", __doc__ or "", run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
