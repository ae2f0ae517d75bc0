"""Run the app in Flower's simulation engine, with the run config ``flwr run`` would pass.

``flwr.simulation.run_simulation`` hands the apps an empty run config; this fuses the app's
``[tool.flwr.app.config]`` with ``--run-config`` overrides using Flower's own functions (as
``flwr run`` does) and gives the result to the ServerApp::

    python -m fl_adapters.flower.app.simulate --num-supernodes 2 \\
        --run-config "aggregator='fedloss' num-server-rounds=2 out-dir='/tmp/sim'"

``flwr run APP local-simulation`` would start a detached local SuperLink that outlives the
command; this keeps the whole run in one process tree.

The engine polls by message, not by virtual node (:mod:`fl_adapters.flower.engine`), for every
strategy; ``FEDBALANCE_FLOWER_POLLING=flower`` keeps Flower's own per-node polling (the scale
benchmark compares the two). ``FEDBALANCE_FLOWER_ACTORS=N`` runs the clients in exactly ``N``
ClientApp actors (unset: one per CPU core, Flower's default).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from flwr.app import Context
from flwr.common.config import get_fused_config_from_dir, parse_config_args
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fl_adapters.flower.app import (
    ACTORS_ENV,
    POLLING,
    POLLING_ENV,
    backend_config,
    client_app,
    server_app,
)
from fl_adapters.flower.engine import index_message_polling

APP_DIR = Path(__file__).resolve().parent


def main(argv: Sequence[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--num-supernodes", type=int, default=2)
    cli.add_argument("--run-config", action="append", default=[], help="key=value ... (TOML)")
    args = cli.parse_args(argv)
    # fedbalance's INFO lines (what it does once, e.g. finding the nodes' client ids) on stderr
    # beside Flower's own.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("fedbalance %(levelname)s: %(message)s"))
    ours = logging.getLogger("fl_adapters")
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    polling = os.environ.get(POLLING_ENV, POLLING[0])
    if polling not in POLLING:
        cli.error(f"{POLLING_ENV} must be one of {', '.join(POLLING)}, got {polling!r}")
    try:
        backend = backend_config(os.environ.get(ACTORS_ENV))
    except ValueError as e:
        cli.error(str(e))
    run_config = get_fused_config_from_dir(APP_DIR, parse_config_args(args.run_config))
    if int(run_config["num-partitions"]) != args.num_supernodes:
        cli.error(
            f"num-partitions ({run_config['num-partitions']}) must equal --num-supernodes "
            f"({args.num_supernodes}): each supernode holds one partition"
        )
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        server_app.run(grid, run_config)

    if polling == "index":
        index_message_polling()
    run_simulation(
        server_app=app,
        client_app=client_app.app,
        num_supernodes=args.num_supernodes,
        backend_config=backend,
    )


if __name__ == "__main__":
    main()
