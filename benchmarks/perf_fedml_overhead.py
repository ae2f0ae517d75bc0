"""Per-round cost of the fedbalance path in FedML sp simulation against FedML's own FedAvg.

Server side, on the same ``w_locals`` (thesis CNN state dicts, 5 clients): stock
``FedAvgAPI._aggregate`` (FedML's FedAvg) against fedbalance's replacement (strip the reserved
keys, validate, aggregate, record), for ``fedavg`` and ``fedloss``. The difference is set
against the time of a whole round of a FedML sp run of the thesis setting, read from FedML's
own log (the time between its "Communication round" lines).

    fedbalance bench fedml-overhead [--repeats 200] [--rounds 3]
"""

from __future__ import annotations

import copy
import re
import tempfile
import types
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from fedbalance_benchmarks._overhead import RESULTS, median_time, report
from fedbalance_benchmarks._overhead import main as overhead_main


def round_seconds(log_text: str) -> float:
    """Mean time between FedML's consecutive "Communication round" log lines."""
    stamps = [
        datetime.strptime(m[:32], "%a, %d %b %Y %H:%M:%S.%f")
        for m in re.findall(
            r"\[(\w{3}, \d{2} \w{3} \d{4} [\d:.]+)\] \[INFO\] \[fedavg_api\.py:\d+:train\] #+Communication round",
            log_text,
        )
    ]
    if len(stamps) < 2:
        raise RuntimeError("FedML's log has fewer than two round markers")
    return (stamps[-1] - stamps[0]).total_seconds() / (len(stamps) - 1)


def run(
    repeats: int = 200, rounds: int = 3, local_epochs: int = 1, out_dir: Path = RESULTS
) -> dict[str, Any]:
    from fedml.simulation.sp.fedavg.fedavg_api import FedAvgAPI

    from fl_adapters.config import RunConfig
    from fl_adapters.fedml import adapter
    from fl_adapters.fedml.payload import attach
    from fl_adapters.fedml.runner import run_fedml
    from fl_adapters.models import ThesisCNN

    torch.manual_seed(0)
    states = [ThesisCNN().state_dict() for _ in range(5)]
    global_params = ThesisCNN().state_dict()
    stock_aggregate = getattr(FedAvgAPI._aggregate, "__wrapped__", FedAvgAPI._aggregate)
    t_stock = median_time(
        lambda: stock_aggregate(None, [(1400 + c, copy.copy(s)) for c, s in enumerate(states)]),
        repeats,
    )
    record: dict[str, Any] = {
        "clients": 5,
        "repeats": repeats,
        "stock_seconds": t_stock,
        "fedbalance": {},
    }
    t_ours = {}
    for name in ("fedavg", "fedloss"):
        args = types.SimpleNamespace(
            aggregator=name, training_type="simulation", backend="sp", random_seed=0
        )
        adapter.state_for(args, "fedml-sp")
        payload = [(1400 + c, attach(s, c, 0.3 + 0.1 * c)) for c, s in enumerate(states)]
        t_ours[name] = median_time(lambda p=payload: adapter.aggregate(p, global_params), repeats)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.from_dict(
            dict(
                framework="fedml-sp",
                dataset="fmnist",
                partition={"name": "mixed"},
                aggregator="fedloss",
                rounds=rounds,
                local_epochs=local_epochs,
                seed=0,
            )
        )
        run_fedml(cfg, Path(tmp))
        round_s = round_seconds((Path(tmp) / "fedml.log").read_text())
    header = (
        f"# fedbalance in FedML sp simulation: per-round server overhead\n\nThesis CNN, 5 clients per round, "
        f"median of {repeats} aggregations; a FedML sp round of the thesis setting (30 clients, 5 per round, "
        f"{local_epochs} local epoch(s), Fashion-MNIST, mixed skew, fedloss) took {round_s:.2f} s here "
        f"(from FedML's log)."
    )
    report(
        host="FedML",
        stem="perf_fedml_overhead",
        stock_label="FedML FedAvgAPI._aggregate (FedAvg)",
        t_stock=t_stock,
        t_ours=t_ours,
        round_s=round_s,
        record=record,
        header=header,
        out_dir=out_dir,
    )
    return record


def main(argv: list[str] | None = None) -> int:
    return overhead_main("fedbalance bench fedml-overhead", __doc__ or "", run, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
