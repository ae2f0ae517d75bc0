"""Per-round server cost of fedbalance's Flower strategy against Flower's own ``FedAvg``.

Server side, on the same train replies (real Flower 1.41 ``Message`` objects, thesis CNN
state dicts, ``--clients`` of them, with ``num-examples`` and ``val_loss``): Flower's
message-API ``FedAvg.aggregate_train`` (its weighted average over ``ArrayRecord``\\ s, and with
``weighted_by_key="val_loss"`` the thesis's unbounded FedLoss) against
:class:`~fl_adapters.flower.strategy.FedBalanceStrategy`'s round for ``fedavg`` and
``fedloss``: reading the global ``ArrayRecord`` (``configure_train``), turning each reply into
a ``ClientUpdate``, validating, aggregating and writing the result back as an ``ArrayRecord``.
The difference is set against a whole round of the bundled Flower app in Flower's simulation
engine (digits, ``--clients`` SuperNodes, federated evaluation included), read from Flower's
"Strategy execution finished" log line.

Runs in Flower's environment (``.venv-flower``; ``make setup-flower``)::

    fedbalance bench flower-overhead [--repeats 200] [--rounds 3] [--clients 5]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from fedbalance_benchmarks._overhead import RESULTS, median_time, report


def replies(clients: int, seed: int = 0) -> tuple[Any, list[Any]]:
    """The global ``ArrayRecord`` and one train reply per client (thesis CNN, random values)."""
    from flwr.app import ConfigRecord, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fl_adapters.flower.payload import make_reply, to_array_record
    from fl_adapters.models import ThesisCNN

    # Flower builds messages only inside a run: the ids a ServerApp process has.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    torch.manual_seed(seed)
    arrays = to_array_record(ThesisCNN().state_dict())
    gen = torch.Generator().manual_seed(seed)
    out = []
    for c in range(clients):
        state = {
            k: torch.randn(v.shape, generator=gen) for k, v in ThesisCNN().state_dict().items()
        }
        msg = Message(
            RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": 1})}),
            dst_node_id=100 + c,
            message_type=MessageType.TRAIN,
        )
        loss = float(torch.rand(1, generator=gen)) + 0.5
        out.append(make_reply(msg, state, 100 + 10 * c, {"val_loss": loss}, c))
    return arrays, out


def round_seconds(clients: int, rounds: int, local_epochs: int) -> float:
    """Seconds per round of the bundled app in Flower's simulation engine (from its log)."""
    argv = [sys.executable, "-m", "fl_adapters.flower.app.simulate"]
    argv += ["--num-supernodes", str(clients), "--run-config"]
    argv += [
        f"num-server-rounds={rounds} num-partitions={clients} local-epochs={local_epochs} "
        "aggregator='fedloss' partition='{\"name\": \"mixed\"}'"
    ]
    env = {k: v for k, v in os.environ.items() if k != "FEDBALANCE_RECORD"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"the Flower simulation failed: {(out.stdout + out.stderr)[-2000:]}")
    return seconds_per_round(out.stdout + out.stderr, rounds)


def seconds_per_round(log: str, rounds: int) -> float:
    """Seconds per round of a Flower run, from its "Strategy execution finished" log line."""
    found = re.search(r"Strategy execution finished in ([0-9.]+)s", log)
    if found is None:
        raise RuntimeError(
            f"no 'Strategy execution finished' line in the Flower log: {log[-2000:]}"
        )
    return float(found.group(1)) / rounds


def run(
    repeats: int,
    rounds: int,
    local_epochs: int,
    clients: int,
    out_dir: Path,
    round_s: float | None = None,
) -> str:
    """Time the server paths and write the report; ``round_s`` (seconds per round of a Flower
    run measured elsewhere) spares the simulation that would measure it."""
    from flwr.serverapp.strategy import FedAvg

    from fl_adapters.flower.payload import to_state_dict
    from fl_adapters.flower.strategy import FedBalanceStrategy

    torch.set_num_threads(1)
    arrays, msgs = replies(clients)
    stock = FedAvg()
    t_stock = median_time(lambda: stock.aggregate_train(1, msgs), repeats)
    by_loss = FedAvg(weighted_by_key="val_loss")
    t_by_loss = median_time(lambda: by_loss.aggregate_train(1, msgs), repeats)
    t_ours = {}
    for name in ("fedavg", "fedloss"):
        strategy = FedBalanceStrategy(name)

        def one_round(s: FedBalanceStrategy = strategy) -> None:
            s.global_params = to_state_dict(arrays)  # what configure_train adds to a round
            s.aggregate_train(1, msgs)

        t_ours[name] = median_time(one_round, repeats)
    if round_s is None:
        round_s = round_seconds(clients, rounds, local_epochs)
    header = (
        "# fedbalance on Flower 1.41: per-round server overhead\n\n"
        f"Thesis CNN, {clients} train replies (Flower `Message`s), median of {repeats} "
        f'aggregations, one torch thread; Flower\'s `FedAvg(weighted_by_key="val_loss")` '
        f"(the unbounded FedLoss) took {1e3 * t_by_loss:.3f} ms. A round of the bundled Flower "
        f"app in Flower's simulation engine ({clients} SuperNodes, digits, mixed skew, fedloss, "
        f"{local_epochs} local epoch(s), federated evaluation) took {round_s:.2f} s here "
        f"(Flower's log, {rounds} rounds)."
    )
    record: dict[str, Any] = {
        "clients": clients,
        "repeats": repeats,
        "flower_fedavg_val_loss_seconds": t_by_loss,
    }
    return report(
        host="Flower",
        stem="perf_flower_overhead",
        stock_label="Flower FedAvg.aggregate_train",
        t_stock=t_stock,
        t_ours=t_ours,
        round_s=round_s,
        record=record,
        header=header,
        out_dir=out_dir,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedbalance bench flower-overhead", description=__doc__)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    run(a.repeats, a.rounds, a.local_epochs, a.clients, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
