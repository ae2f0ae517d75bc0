"""The app's ServerApp: one fedbalance call picks the strategy from the run config."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fl_adapters.collector import paused_collector

with paused_collector():  # Flower starts a ServerApp process per run: see fl_adapters.collector
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg, Result

    from fl_adapters.flower.app.task import CLIENT_KEYS, model_of, run_config_of
    from fl_adapters.flower.payload import to_array_record, to_state_dict
    from fl_adapters.flower.privacy import wrap_from_run_config
    from fl_adapters.flower.strategy import FedBalanceStrategy, strategy_from_run_config
    from fl_checks import ParameterError, shown

log = logging.getLogger(__name__)
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run(grid, context.run_config)


def run(grid: Grid, run_config: Mapping[str, Any]) -> Result:
    """Train ``num-server-rounds`` rounds on every node; write the outcome to ``out-dir``."""
    torch.set_num_threads(1)
    cfg = run_config_of(run_config)  # validate the app's keys before any node gets work
    nodes, per_round = cfg.num_clients, cfg.clients_per_round
    chosen = str(run_config.get("strategy", "fedbalance"))
    if chosen in STOCK:
        strategy: Any = stock_fedavg(run_config, nodes, per_round, seeded=chosen == SEEDED)
    elif chosen == "fedbalance":
        strategy = strategy_from_run_config(
            run_config,
            fraction_train=per_round / nodes,
            min_train_nodes=per_round,  # the seeded sampler takes max(fraction * nodes, this)
            min_available_nodes=nodes,
            min_evaluate_nodes=nodes,
        )
    else:
        raise ParameterError(
            f"strategy must be one of 'fedbalance', {', '.join(map(repr, STOCK))}; "
            f"got {shown(chosen)}"
        )
    torch.manual_seed(int(run_config["seed"]))  # the initial model, as the other hosts seed it
    model = model_of(run_config)
    client_config = {k: run_config[k] for k in CLIENT_KEYS}
    # Flower's DP wrapper around it when the run config asks (dp = "server-fixed", ...).
    driver = wrap_from_run_config(strategy, run_config, per_round)
    result = driver.start(
        grid=grid,
        initial_arrays=to_array_record(model.state_dict()),
        num_rounds=int(run_config["num-server-rounds"]),
        train_config=ConfigRecord(dict(client_config)),
        evaluate_config=ConfigRecord(dict(client_config)),
    )
    out = str(run_config.get("out-dir", ""))
    if out:
        write_outcome(Path(out), result)
    return result


#: The benchmarks' stock references: Flower's own ``FedAvg`` with Flower's sampler, and the
#: same ``FedAvg`` sending to the nodes fedbalance's strategy draws for the seed.
SEEDED = "flower-fedavg-seeded"
STOCK = ("flower-fedavg", SEEDED)


def stock_fedavg(
    run_config: Mapping[str, Any], nodes: int, per_round: int, *, seeded: bool = False
) -> Any:
    """Flower's own ``FedAvg`` doing the fedbalance strategy's work (a reference for the
    benchmarks): the same number of nodes trained and evaluated a round, evaluation every
    round. Its nodes are drawn by Flower's sampler (the global ``random``, not by client), or,
    ``seeded``, they are the clients fedbalance's strategy draws for the run's seed
    (:class:`SeededFedAvg`)."""
    if int(run_config.get("eval-every", 1)) != 1:
        raise ParameterError(
            f"strategy {' and '.join(map(repr, STOCK))} evaluate every round: set eval-every = 1"
        )
    fraction = float(run_config.get("eval-fraction", 1.0))
    kwargs: dict[str, Any] = {
        "fraction_train": per_round / nodes,
        "min_train_nodes": per_round,
        "fraction_evaluate": fraction,
        "min_evaluate_nodes": min(nodes, max(1, round(fraction * nodes))),
        "min_available_nodes": nodes,
    }
    if not seeded:
        return FedAvg(**kwargs)
    chooser = strategy_from_run_config(
        run_config, fraction_train=per_round / nodes, min_train_nodes=per_round,
        min_available_nodes=nodes, min_evaluate_nodes=nodes,
    )  # fmt: skip
    return SeededFedAvg(chooser, **kwargs)


class SeededFedAvg(FedAvg):
    """Flower's own ``FedAvg`` whose train and evaluate messages go to the nodes ``chooser``
    (a :class:`~fl_adapters.flower.strategy.FedBalanceStrategy` of the same run config) draws:
    the clients fedbalance's strategy trains and evaluates, their ids found as it finds them
    (read from the simulation engine, else asked once). Everything else -- messages, reply
    checks, aggregation, metrics -- is Flower's."""

    def __init__(self, chooser: FedBalanceStrategy, **fedavg_kwargs: Any) -> None:
        super().__init__(**fedavg_kwargs)
        self.chooser = chooser
        #: The grid and round of the messages being configured.
        self.grid: Grid | None = None
        self.round = 0

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.grid, self.round = grid, server_round
        return super().configure_train(server_round, arrays, config, grid)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.grid, self.round = grid, server_round
        return super().configure_evaluate(server_round, arrays, config, grid)

    def _construct_messages(
        self, record: RecordDict, node_ids: list[int], message_type: str
    ) -> Iterable[Message]:
        # FedAvg has just drawn its own nodes; only which nodes changes.
        assert self.grid is not None
        if message_type == MessageType.TRAIN:
            node_ids = self.chooser.sample(self.grid, self.fraction_train, self.min_train_nodes)
        elif message_type == MessageType.EVALUATE:
            node_ids = self.chooser.evaluation_nodes(self.grid, self.round)
        return super()._construct_messages(record, node_ids, message_type)


def write_outcome(out: Path, result: Result) -> None:
    """``final.pt`` (the global model's state dict) and ``summary.json`` (per-round metrics)."""
    out.mkdir(parents=True, exist_ok=True)
    if result.arrays is not None:
        torch.save(to_state_dict(result.arrays), out / "final.pt")
    summary = {
        "train": {r: dict(m) for r, m in result.train_metrics_clientapp.items()},
        "evaluate": {r: dict(m) for r, m in result.evaluate_metrics_clientapp.items()},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    log.info("wrote %s", out)
