"""Install packages into a virtual environment: with uv where it can be had, else with pip.

    python3 tools/install.py VENV REQUIREMENT... (what ``pip install`` takes: ``-e ".[all]"``)

uv downloads, unpacks and compiles bytecode in parallel. In ``make test`` from a clean clone on a
2-core machine (the docs and Flower environments installing beside it), the main environment
(torch, then ``-e ".[all]"``) was ready after 118 s with uv and 232 s with pip: the same
distributions at the same versions. uv does not read pip's configuration, so this carries
it over (``pip config list``, the environment's ``PIP_*`` included: index URLs, find-links,
constraints, certificate, timeout) and resolves as pip does (``--index-strategy
unsafe-best-match``: the best version over every index). uv itself comes from the package index
into ``.venv-uv`` beside the environments, once.

pip installs instead, and says why, when ``FEDBALANCE_INSTALLER=pip`` asks for it, when uv
cannot be installed, when pip's configuration has a setting this does not carry over, or when
uv's install fails. Standard library only: it runs before any environment exists.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UV_VENV = ROOT / ".venv-uv"
UV_SPEC = "uv==0.13.9"
#: pip settings with a uv flag that takes one value of the setting each.
LIST_FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
#: pip settings that change nothing about what is installed.
HARMLESS = {
    "disable-pip-version-check",
    "quiet",
    "progress-bar",
    "root-user-action",
    "no-cache-dir",
}
#: ``pip config list`` sections that apply to ``pip install``, lowest precedence first.
SECTIONS = ("global", "install", ":env:")


def pip_settings(python: Path) -> dict[str, str]:
    """pip's effective install settings (``key -> value``) as ``pip config list`` prints them."""
    out = subprocess.run(
        [str(python), "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    found: dict[tuple[str, str], str] = {}
    for line in out.splitlines():
        name, sep, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if sep and section in SECTIONS:
            found[section, key] = value.strip().strip("'\"")
    return {key: value for s in SECTIONS for (section, key), value in found.items() if section == s}


def uv_arguments(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's flags and environment for pip's ``settings``; ValueError names one it cannot carry."""
    flags, env = ["--index-strategy", "unsafe-best-match"], {}
    for key, value in settings.items():
        if key in LIST_FLAGS:
            flags += [x for item in value.split() for x in (LIST_FLAGS[key], item)]
        elif key == "no-index":
            flags += ["--no-index"] if value.lower() in ("1", "true", "yes", "on") else []
        elif key == "cert":
            env["SSL_CERT_FILE"] = value
        elif key in ("timeout", "default-timeout"):
            env["UV_HTTP_TIMEOUT"] = value
        elif key not in HARMLESS:
            raise ValueError(f"pip setting {key}={value!r} has no uv equivalent here")
    return flags, env


def uv() -> Path:
    """uv from ``.venv-uv``, installed there first if missing (one process at a time)."""
    with open(f"{UV_VENV}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        exe = UV_VENV / "bin" / "uv"
        if not exe.is_file():
            subprocess.run([sys.executable, "-m", "venv", str(UV_VENV)], check=True)
            # Bounded: where the index cannot be reached, pip installs in a minute, not after
            # pip's default retries.
            pip = [str(UV_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
            subprocess.run([*pip, "--timeout", "20", "--retries", "1", UV_SPEC], check=True)
        return exe


def install_with_uv(python: Path, requirements: list[str]) -> str | None:
    """Install with uv; ``None`` if it did, else why not."""
    if os.environ.get("FEDBALANCE_INSTALLER", "uv") == "pip":
        return "FEDBALANCE_INSTALLER=pip"
    try:
        flags, env = uv_arguments(pip_settings(python))
        exe = uv()
    except (ValueError, OSError, subprocess.CalledProcessError) as e:
        return str(e)
    command = [str(exe), "pip", "install", "-q", "--python", str(python), "--compile-bytecode"]
    done = subprocess.run([*command, *flags, *requirements], env={**os.environ, **env})
    return None if done.returncode == 0 else f"uv exited with status {done.returncode}"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    python, requirements = Path(argv[0]) / "bin" / "python", argv[1:]
    why = install_with_uv(python, requirements)
    if why is None:
        return 0
    print(f"install.py: installing with pip ({why})", file=sys.stderr)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    return subprocess.run([*pip, *requirements]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
