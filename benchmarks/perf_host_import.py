"""What a fresh process pays to import a host, through fedbalance's import hook and stock.

fedbalance's import hook (:mod:`fl_adapters.autoload`) pauses Python's cyclic collector while
a host's package imports, collects what the import left as cyclic garbage, and freezes the rest
(``gc.freeze``). Each sample is one fresh interpreter that runs ``import HOST`` and exits; its
user + system CPU time and peak memory come from ``os.wait4``, so the collector's pass at exit
counts too. Stock (``FEDBALANCE_DISABLE_HOST_AUTOLOAD=1``) and hooked samples alternate, so
load on the machine falls on both alike; the table gives medians and their ratio.

    fedbalance bench host-import [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from fedbalance_benchmarks._overhead import RESULTS

#: FedLab's package imports next to nothing (its modules load later, outside the hook).
HOSTS = ("fedml",)
STEM = "perf_host_import"


def sample(host: str, hooked: bool) -> tuple[float, float]:
    """CPU seconds and peak memory (MiB) of one fresh ``python -c "import host"``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")}
    if not hooked:
        env["FEDBALANCE_DISABLE_HOST_AUTOLOAD"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", f"import {host}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"`import {host}` exited with {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def run(repeats: int = 7, out_dir: Path = RESULTS) -> dict[str, Any]:
    from fl_adapters._table import markdown_table

    record: dict[str, Any] = {"repeats": repeats, "python": platform.python_version(), "hosts": {}}
    rows = []
    for host in HOSTS:
        samples: dict[str, list[tuple[float, float]]] = {"stock": [], "hooked": []}
        sample(host, True)  # warm the page cache
        for _ in range(repeats):
            samples["stock"].append(sample(host, False))
            samples["hooked"].append(sample(host, True))
        cpu = {k: statistics.median(s[0] for s in v) for k, v in samples.items()}
        rss = {k: statistics.median(s[1] for s in v) for k, v in samples.items()}
        record["hosts"][host] = {"cpu_seconds": cpu, "peak_mib": rss, "samples": samples}
        rows.append(
            [
                f"`import {host}`",
                f"{cpu['stock']:.2f}",
                f"{cpu['hooked']:.2f}",
                f"{cpu['hooked'] / cpu['stock']:.2f}x",
                f"{rss['stock']:.0f}",
                f"{rss['hooked']:.0f}",
            ]
        )
    table = markdown_table(
        ["fresh process", "stock CPU s", "hooked CPU s", "ratio", "stock MiB", "hooked MiB"], rows
    )
    text = (
        "# Importing a host: fedbalance's import hook against stock\n\n"
        f"CPU time (user + system) and peak memory of a fresh Python {record['python']} process "
        f"that imports the host and exits; medians of {repeats} alternating samples each.\n"
        "Regenerate: `fedbalance bench host-import`.\n\n"
        f"{table}\n"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{STEM}.md").write_text(text)
    (out_dir / f"{STEM}.json").write_text(json.dumps(record, indent=1) + "\n")
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
