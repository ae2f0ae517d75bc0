"""The shipped Flower app's client functions under SecAggPlusStrategy, in Flower's simulation.

    python tests/hosts/flower_secure_sim.py OUT --aggregator fedloss --rounds 2 --drop 2:2

Writes ``OUT/final.pt`` and, for the test to compute the in-clear aggregate from the very
models the clients masked, ``OUT/clients/r{round}_global.pt`` and ``r{round}_c{id}.pt`` (written
by a test-only mod on the node; the server never holds them). Test-only misbehaviour, each
``ROUND:CLIENT[:...]`` and repeatable:

* ``--drop ROUND:CLIENT[:STAGE]``: that client fails in SecAgg+'s STAGE (``setup``,
  ``share_keys``, ``collect_masked_vectors`` (the default) or ``unmask``) of that round, after it
  was weighed;
* ``--truncate ROUND:CLIENT``: its masked vector misses its last array;
* ``--lie ROUND:CLIENT:FACTOR``: it scales its model by FACTOR times the factor it was given
  (a weight lie, invisible under masking).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fl_adapters.flower.app import ACTORS_ENV, backend_config, client_app, server_app
from fl_adapters.flower.app.task import CLIENT_KEYS, model_of
from fl_adapters.flower.payload import to_array_record, to_state_dict
from fl_adapters.flower.secure import SCALE_KEY, SecAggPlusStrategy, secagg_mod
from fl_adapters.flower.strategy import FedBalanceStrategy
from fl_adapters.flower.trainer import partition_id

cli = argparse.ArgumentParser()
cli.add_argument("out", type=Path)
cli.add_argument("--aggregator", default="fedloss")
cli.add_argument("--aggregator-args", default="{}")
cli.add_argument("--rounds", type=int, default=2)
cli.add_argument("--nodes", type=int, default=3)
cli.add_argument("--drop", action="append", default=[], help="ROUND:CLIENT[:STAGE]")
cli.add_argument("--truncate", action="append", default=[], help="ROUND:CLIENT")
cli.add_argument("--lie", action="append", default=[], help="ROUND:CLIENT:FACTOR")
cli.add_argument("--clear", action="store_true", help="FedBalanceStrategy in clear (timing)")
args = cli.parse_args()
DUMP = args.out / "clients"
DUMP.mkdir(parents=True, exist_ok=True)
RUN_CONFIG: dict[str, Any] = {
    "aggregator": args.aggregator,
    "aggregator-args": args.aggregator_args,
    "seed": 5,
    "num-partitions": args.nodes,
    "dataset": "digits",
    "data-dir": "",
    "partition": '{"name": "label_dirichlet", "beta": 0.3}',
    "split": "[0.7, 0.1, 0.2]",
    "model": "thesis_cnn",
    "local-epochs": 1,
    "batch-size": 32,
    "optimizer": "adam",
    "lr": 0.001,
}


def dump_mod(msg: Message, context: Context, call_next: Any) -> Message:
    """Test only: keep the round's global model and this client's trained model on disk."""
    out = call_next(msg, context)
    if out.has_error() or not out.content.array_records:
        return out
    config = msg.content.config_records["config"]
    r, c = int(config["server-round"]), partition_id(context)
    torch.save(to_state_dict(msg.content.array_records["arrays"]), DUMP / f"r{r}_global.pt")
    torch.save(
        to_state_dict(next(iter(out.content.array_records.values()))), DUMP / f"r{r}_c{c}.pt"
    )
    return out


def _matches(specs: list[str], msg: Message, context: Context) -> list[list[str]]:
    """The specs ``ROUND:CLIENT[:...]`` naming this message's round and this node (the
    rest of each)."""
    r, c = int(msg.metadata.group_id or -1), partition_id(context)
    return [
        rest
        for spec in specs
        for (sr, sc, *rest) in [spec.split(":")]
        if (int(sr), int(sc)) == (r, c)
    ]


def misbehave_mod(msg: Message, context: Context, call_next: Any) -> Message:
    """Test only: the misbehaviour the command line asks of this node in this round."""
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, context)
    stage = msg.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE)
    for rest in _matches(args.drop, msg, context):
        if stage == (rest[0] if rest else Stage.COLLECT_MASKED_VECTORS):
            raise RuntimeError(f"client {partition_id(context)} drops out in {stage}")
    if stage != Stage.COLLECT_MASKED_VECTORS:
        return call_next(msg, context)
    for (factor,) in _matches(args.lie, msg, context):
        config = msg.content.config_records["fitins.config"]
        config[SCALE_KEY] = float(config[SCALE_KEY]) * float(factor)
    out = call_next(msg, context)
    if _matches(args.truncate, msg, context) and not out.has_error():
        record = out.content.config_records[RECORD_KEY_CONFIGS]
        record[Key.MASKED_PARAMETERS] = list(record[Key.MASKED_PARAMETERS])[:-1]
    return out


clients = ClientApp(mods=[] if args.clear else [misbehave_mod, secagg_mod, dump_mod])
clients.train()(client_app.train)
clients.evaluate()(client_app.evaluate)
clients.query()(client_app.query)

server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    torch.set_num_threads(1)
    secure: dict[str, Any] = {"num_shares": args.nodes, "reconstruction_threshold": 2}
    strategy = (FedBalanceStrategy if args.clear else SecAggPlusStrategy)(
        args.aggregator,
        aggregator_args=json.loads(args.aggregator_args),
        seed=5,
        fraction_train=1.0,
        min_train_nodes=args.nodes,
        min_available_nodes=args.nodes,
        fraction_evaluate=0.0,
        run_config=RUN_CONFIG,
        **({} if args.clear else secure),
    )
    torch.manual_seed(5)
    model = model_of(RUN_CONFIG)
    config = ConfigRecord({k: RUN_CONFIG[k] for k in CLIENT_KEYS if k in RUN_CONFIG} | {"seed": 5})
    start = time.perf_counter()
    result = strategy.start(
        grid=grid,
        initial_arrays=to_array_record(model.state_dict()),
        num_rounds=args.rounds,
        train_config=config,
    )
    seconds = time.perf_counter() - start
    server_app.write_outcome(args.out, result)
    (args.out / "timing.json").write_text(json.dumps({"seconds_per_round": seconds / args.rounds}))


if __name__ == "__main__":
    run_simulation(
        server_app=server,
        client_app=clients,
        num_supernodes=args.nodes,
        backend_config=backend_config(os.environ.get(ACTORS_ENV)),
    )
