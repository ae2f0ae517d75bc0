"""What the bundled benchmarks share: running FedLab/FedML jobs in worker processes, where
their tables and runs go, and how a cell of a table is written."""

from __future__ import annotations

import json
import os
import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
#: RunConfig fields added after committed records were made, with the value all of those ran
#: with: a record key leaves them out at that value, so the records still match their runs.
LATER_DEFAULTS: dict[str, Any] = {"eval_fraction": 1.0}
#: The same for aggregator arguments (a record of resolved defaults lists every argument):
#: Astraea's ``carry_optimizer``, off in every committed run.
LATER_ARGUMENTS: dict[str, Any] = {"carry_optimizer": False}


def record_key(cfg: dict[str, Any], leave_out: tuple[str, ...]) -> dict[str, Any]:
    """What defines a run for a benchmark's records: its config with every default resolved,
    less the fields in ``leave_out`` (where it ran), and :data:`LATER_DEFAULTS` and
    :data:`LATER_ARGUMENTS` at their value."""
    import dataclasses

    from fl_adapters.config import RunConfig

    key = dataclasses.asdict(RunConfig.from_dict(cfg))
    for k in leave_out:
        key.pop(k, None)
    for k, value in LATER_DEFAULTS.items():
        if key.get(k) == value:
            key.pop(k)
    args = key.get("aggregator_args") or {}
    for k, value in LATER_ARGUMENTS.items():
        if k in args and args[k] is value:
            args.pop(k)
    return json.loads(json.dumps(key))


def worker_init() -> None:
    import torch

    torch.set_num_threads(1)  # one process per core beats two threads per process here
    # ... and the same for the FedML process a worker starts. With torch's default of one
    # thread per core, two FedML sp runs beside each other oversubscribe the cores: two
    # 2-round, 10-epoch thesis runs took 327 s each here, against 24 s with one thread each.
    os.environ["OMP_NUM_THREADS"] = "1"


def run_one(cfg: dict[str, Any], out_dir: str, hook: Any = None) -> dict[str, Any]:
    import logging

    from fl_adapters.config import RunConfig

    logging.getLogger("fl_aggregators").setLevel(logging.ERROR)
    config = RunConfig.from_dict(cfg)
    if config.framework == "fedml-sp":
        from fl_adapters.fedml.runner import run_fedml

        return run_fedml(config, Path(out_dir))
    if config.framework == "flower":  # in Flower's environment (.venv-flower)
        from fl_adapters.flower.runner import run_flower

        return run_flower(config, Path(out_dir))
    if config.framework == "fedlab-distributed":  # a server and 2 client processes, 1 thread each
        import dataclasses

        from fl_adapters.fedlab.launch import run_distributed
        from fl_adapters.run.processes import free_ports

        # Parallel workers' runs must not share FedLab's default port.
        config = dataclasses.replace(config, port=free_ports(1)[0])
        return run_distributed(config, Path(out_dir), client_processes=2)
    from fl_adapters.fedlab.runner import run_standalone

    return run_standalone(config, Path(out_dir), progress=False, uplink_hook=hook)


def run_jobs(
    jobs: list[tuple[dict[str, Any], Path]],
    workers: int,
    desc: str,
    hooks: list[Any] | None = None,
) -> None:
    """Run each ``(config, out_dir)`` whose ``summary.json`` is missing, in worker processes
    (``hooks[i]``, if given, is job ``i``'s FedLab uplink hook: a picklable callable)."""
    from tqdm import tqdm

    hooks = hooks if hooks is not None else [None] * len(jobs)
    todo = [
        (cfg, out, hook)
        for (cfg, out), hook in zip(jobs, hooks, strict=True)
        if not (out / "summary.json").exists()
    ]
    if not todo:
        return
    with ProcessPoolExecutor(max_workers=workers, initializer=worker_init) as pool:
        futures = [pool.submit(run_one, cfg, str(out), hook) for cfg, out, hook in todo]
        for fut in tqdm(as_completed(futures), total=len(futures), desc=f"{desc} runs", unit="run"):
            fut.result()


def output_dirs(
    out: Path | None, runs_dir: Path | None, quick: bool, stem: str, cache: str
) -> tuple[Path, Path]:
    """Where a benchmark writes its tables (made) and keeps its runs: ``runs/bench-quick`` and
    its ``runs/STEM`` for ``--quick``; committed results and ``~/.cache/fedbalance/CACHE/STEM``
    otherwise."""
    out_dir = out or (Path("runs/bench-quick") if quick else RESULTS)
    runs = runs_dir or (
        out_dir / "runs" / stem if quick else Path.home() / ".cache" / "fedbalance" / cache / stem
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir, runs


def matching_record(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The per-run record at ``path`` if it is of the run ``key`` describes (its ``config``),
    else ``None`` (none there, unreadable, or another run's: that run is done again)."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if rec.get("config") == key else None


#: Options that name folders of the machine that ran a benchmark (its output and its runs):
#: never written into a committed report (:func:`public`).
MACHINE_KEYS = ("out", "out_dir", "runs_dir", "modes_dir")


def public(opts: dict[str, Any]) -> dict[str, Any]:
    """A benchmark's options as its committed report keeps them: without the folders of the
    machine that ran it (:data:`MACHINE_KEYS`)."""
    return {k: v for k, v in opts.items() if k not in MACHINE_KEYS}


def scrubbed(value: Any, folders: dict[str, str]) -> Any:
    """``value`` (JSON-like) with each of ``folders``' paths in its strings replaced by its
    name (``{"/root/.cache/fedbalance/runs": "RUNS"}``): error messages that name files of the
    machine that ran a benchmark, as a committed report keeps them."""
    if isinstance(value, str):
        for path, name in folders.items():
            value = value.replace(path, name)
        return value
    if isinstance(value, dict):
        return {k: scrubbed(v, folders) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v, folders) for v in value]
    return value


def path_slug(*parts: str) -> str:
    """``parts`` joined by ``-`` as a file name: anything but ``[A-Za-z0-9-_.]`` becomes ``_``."""
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in "-".join(parts))
    return keep.strip("_")


def read_metrics(out_dir: Path) -> list[dict[str, Any]]:
    """A run's ``metrics.jsonl``: one dict per round."""
    return [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]


def mean_std(values: list[float], scale: float = 100.0, digits: int = 2, sign: str = "") -> str:
    """``mean ± std`` of fractions, in percent (``scale``); the sample std (n - 1).
    ``sign="+"`` writes differences signed. One value has no spread: ``mean (n = 1)``."""
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean_spread(scale * statistics.mean(values), scale * sd, len(values), digits, sign)


def mean_spread(mean: float, sd: float, n: int, digits: int = 2, sign: str = "") -> str:
    """``mean ± sd`` of ``n`` values, or ``mean (n = 1)``: a single value prints no spread."""
    if n == 1:
        return f"{mean:{sign}.{digits}f} (n = 1)"
    return f"{mean:{sign}.{digits}f} ± {sd:.{digits}f}"
