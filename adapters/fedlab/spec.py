"""FedLab as fedbalance serves it: its host spec, light (no FedLab, no torch imported).

FedLab has no config file: a stock FedLab script asks for fedbalance by setting
:data:`AGGREGATOR_ENV` before ``import fedlab``, which the autoload then arms (or refuses,
naming why). ``fedbalance fedlab-server`` and ``fedlab-client`` start the roles of a
cross-process run by hand, one per machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fl_adapters.collector import paused_collector
from fl_adapters.hosts import HostSpec, RunOptions

if TYPE_CHECKING:
    import argparse

    from fl_adapters.config import RunConfig

#: The variable a stock FedLab script sets to ask for an aggregator (its value: the name).
AGGREGATOR_ENV = "FEDBALANCE_AGGREGATOR"


def run(config: RunConfig, out: Path, options: RunOptions) -> dict[str, Any]:
    if config.framework == "fedlab-distributed":  # the launcher alone: no FedLab, no torch
        from fl_adapters.fedlab.launch import run_distributed

        return run_distributed(
            config,
            out,
            client_processes=options.processes,
            config_path=options.config_path,
            resume=options.resume,
        )
    with paused_collector():  # FedLab and torch: see fl_adapters.collector
        from fl_adapters.fedlab.runner import run_standalone

    return run_standalone(config, out, progress=options.progress, resume=options.resume)


def require() -> None:
    from fl_adapters.autoload import require_host

    require_host("fedlab")


def asked() -> str | None:
    """Why this process asked for fedbalance before ``import fedlab`` (``None``: it did not)."""
    return f"{AGGREGATOR_ENV} is set" if os.environ.get(AGGREGATOR_ENV, "").strip() else None


def commands(sub: argparse._SubParsersAction[Any]) -> None:
    """``fedbalance fedlab-server`` and ``fedbalance fedlab-client``."""
    from fl_adapters.cli import positive_int

    p = sub.add_parser("fedlab-server", help="the server role of a FedLab cross-process run")
    p.add_argument("config")
    p.add_argument("--out", default="runs/run")
    p.add_argument(
        "--world-size", type=positive_int, required=True, help="1 server + client processes"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--overwrite", action="store_true", help="replace another run's records in OUT")
    p.set_defaults(func=server)

    p = sub.add_parser("fedlab-client", help="one client process of a FedLab cross-process run")
    p.add_argument("config")
    p.add_argument("--rank", type=positive_int, required=True)
    p.add_argument("--world-size", type=positive_int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--resume-from", default=None, help="the server's checkpoint.pt, when resuming a run"
    )
    p.set_defaults(func=client)


def server(args: argparse.Namespace) -> int:
    from fl_adapters.cli import load_config
    from fl_adapters.run.directory import claim

    with paused_collector():  # a process of its own: see fl_adapters.collector
        from fl_adapters.fedlab.runner import run_server

    config = load_config(args.config)
    with claim(Path(args.out), resume=args.resume, overwrite=args.overwrite):
        run_server(
            config,
            Path(args.out),
            args.world_size,
            args.host,
            progress=not args.no_progress,
            resume=args.resume,
        )
    return 0


def client(args: argparse.Namespace) -> int:
    from fl_adapters.cli import load_config

    with paused_collector():  # a process of its own: see fl_adapters.collector
        from fl_adapters.fedlab.runner import run_client

    resume_from = Path(args.resume_from) if args.resume_from else None
    run_client(load_config(args.config), args.rank, args.world_size, args.host, resume_from)
    return 0


FEDLAB = HostSpec(
    name="fedlab",
    label="FedLab",
    frameworks=("fedlab", "fedlab-distributed"),
    releases=("1.3.0",),
    # Standalone trains a mediator's chain in one process (a relay hop stops at its process).
    carries_optimizer=("fedlab",),
    run=run,
    require=require,
    arm="fl_adapters.fedlab.patches",
    description="FedLab: standalone pipeline and DistNetwork processes",
    asked=asked,
    commands=commands,
)
