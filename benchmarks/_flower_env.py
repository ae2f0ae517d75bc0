"""Flower's own environment for the benchmarks: found or made once, and a worker run in it.

flwr's protobuf cannot live beside FedML's, so the aggregation benchmark runs Flower's
``aggregate`` in ``.venv-flower`` (``make setup-flower``) or, outside a source checkout, an
environment it creates in the user's cache (:func:`ensure_flower`), driving
``_flower_agg.py`` there one JSON line at a time (:class:`FlowerWorker`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from fedbalance_benchmarks._flower_agg import Layout

FLOWER_SCRIPT = Path(__file__).resolve().parent / "_flower_agg.py"
#: flwr 1.42 wants a certifi newer than this project's package registry serves.
FLOWER_SPEC = "flwr<1.42"


def default_flower_venv() -> Path:
    """``.venv-flower`` beside a source checkout, else in the user's cache directory."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "benchmarks").is_dir():
        return root / ".venv-flower"
    return Path.home() / ".cache" / "fedbalance" / "venv-flower"


def _why(e: BaseException) -> str:
    if isinstance(e, subprocess.CalledProcessError):
        tail = (e.stderr or e.stdout or "").strip().splitlines()[-3:]
        return f"`{' '.join(map(str, e.cmd))}` failed: {' | '.join(tail)}"
    return f"{type(e).__name__}: {e}"


def ensure_flower(venv: Path) -> tuple[Path | None, str | None]:
    """Python of a virtual environment with flwr, created on first use; or why there is none."""
    bindir = "Scripts" if os.name == "nt" else "bin"
    python = venv / bindir / ("python.exe" if os.name == "nt" else "python")
    probe = [str(python), "-I", "-c", "import flwr.server.strategy.aggregate"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python, None
    print(f"setting up Flower's environment in {venv} (once) ...", flush=True)
    try:
        if not python.exists():
            subprocess.run(
                [sys.executable, "-m", "venv", str(venv)],
                check=True,
                capture_output=True,
                text=True,
                timeout=600,
            )
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(
            [*pip, FLOWER_SPEC, "numpy"], check=True, capture_output=True, text=True, timeout=1800
        )
        subprocess.run(probe, check=True, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"skipped: no Flower environment at {venv}: {_why(e)}"
    return python, None


class FlowerWorker:
    """``_flower_agg.py`` in Flower's python, driven one JSON line at a time."""

    def __init__(self, python: Path, layout: Layout, clients: int, seed: int) -> None:
        self.log: IO[str] = tempfile.TemporaryFile("w+")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["OMP_NUM_THREADS"] = "1"  # numpy's element-wise ops are single-threaded anyway
        self.proc = subprocess.Popen(
            [str(python), "-I", str(FLOWER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self._send({"cmd": "setup", "layout": layout, "clients": clients, "seed": seed})

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            self.log.seek(0)
            tail = " | ".join(self.log.read().strip().splitlines()[-3:])
            raise RuntimeError(f"Flower worker exited with code {rc}: {tail}")
        return dict(json.loads(line))

    def run(self, check: bool) -> dict[str, Any]:
        self._send({"cmd": "run", "check": check})
        return self.reply()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._send({"cmd": "quit"})
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()
