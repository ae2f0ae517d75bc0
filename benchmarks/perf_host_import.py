"""What a fresh process pays for its imports, with fedbalance's paused collector and without.

fedbalance pauses Python's cyclic collector while a fresh process makes its big imports, then
collects once and freezes what survives (:mod:`fl_adapters.collector`): in the import hook
around FedML's package, and in its Flower app's ClientApp, which Flower starts once per
message. Each sample is one fresh interpreter that makes the imports and exits; its user +
system CPU time and peak memory come from ``os.wait4``, so the collector's pass at exit counts
too. Stock (FedML: ``FEDBALANCE_DISABLE_HOST_AUTOLOAD=1``; the ClientApp:
``FEDBALANCE_FREEZE_IMPORTS=0``) and paused samples alternate, so load on the machine falls on
both alike; the table gives medians and their ratio.

Each environment measures the rows it can import (FedML in the main one, the ClientApp in
Flower's) and keeps the other rows of the committed record:

    fedbalance bench host-import [--repeats 7]            # .venv: FedML
    .venv-flower/bin/fedbalance bench host-import         # the ClientApp
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from fedbalance_benchmarks._overhead import RESULTS

#: row -> (the package it needs, what the fresh process runs, the stock arm's environment).
#: FedLab's package imports next to nothing (its modules load later, outside the hook).
ROWS = {
    "`import fedml`": ("fedml", "import fedml", {"FEDBALANCE_DISABLE_HOST_AUTOLOAD": "1"}),
    "a ClientApp process's imports (flwr-clientapp, the bundled app)": (
        "flwr",
        "import flwr.supernode.cli.flwr_clientapp; import fl_adapters.flower.app.client_app",
        {"FEDBALANCE_FREEZE_IMPORTS": "0"},
    ),
}
STEM = "perf_host_import"


def sample(code: str, env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds and peak memory (MiB) of one fresh ``python -c code``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    proc = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", code],
        env=environ | env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"`{code}` exited with {os.waitstatus_to_exitcode(status)}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure(code: str, stock_env: dict[str, str], repeats: int) -> dict[str, Any]:
    sample(code, {})  # warm the page cache
    samples: dict[str, list[tuple[float, float]]] = {"stock": [], "paused": []}
    for _ in range(repeats):
        samples["stock"].append(sample(code, stock_env))
        samples["paused"].append(sample(code, {}))
    return {
        "cpu_seconds": {k: statistics.median(s[0] for s in v) for k, v in samples.items()},
        "peak_mib": {k: statistics.median(s[1] for s in v) for k, v in samples.items()},
        "repeats": repeats,
        "python": platform.python_version(),
        "samples": samples,
    }


def run(repeats: int = 7, out_dir: Path = RESULTS) -> dict[str, Any]:
    from fl_adapters._table import markdown_table

    path = out_dir / f"{STEM}.json"
    record: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"rows": {}}
    measured = [r for r, (package, _, _) in ROWS.items() if importlib.util.find_spec(package)]
    if not measured:
        raise SystemExit(f"none of {sorted(p for p, _, _ in ROWS.values())} is importable here")
    for row in measured:
        _, code, stock_env = ROWS[row]
        record["rows"][row] = measure(code, stock_env, repeats)
    rows = []
    for row in ROWS:
        if row not in record["rows"]:
            continue
        cpu, rss = record["rows"][row]["cpu_seconds"], record["rows"][row]["peak_mib"]
        rows.append(
            [
                row,
                str(record["rows"][row]["repeats"]),
                f"{cpu['stock']:.2f}",
                f"{cpu['paused']:.2f}",
                f"{cpu['paused'] / cpu['stock']:.2f}x",
                f"{rss['stock']:.0f}",
                f"{rss['paused']:.0f}",
            ]
        )
    table = markdown_table(
        [
            "fresh process",
            "samples",
            "stock CPU s",
            "paused CPU s",
            "ratio",
            "stock MiB",
            "paused MiB",
        ],
        rows,
    )
    text = (
        "# A fresh process's imports: fedbalance's paused collector against stock\n\n"
        "CPU time (user + system) and peak memory of a fresh process that makes the imports and "
        f"exits; medians of the samples of each arm, stock and paused alternating, on Python {platform.python_version()}.\n"
        "Regenerate: `fedbalance bench host-import` in the main environment (FedML) and in "
        "Flower's (the ClientApp).\n\n"
        f"{table}\n"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{STEM}.md").write_text(text)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(text)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fedbalance bench host-import", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {a.repeats}")
    run(a.repeats, a.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
