"""Fresh virtual environments shaped like users' FL stacks, to install the built wheel into.

Each stack is a venv with torch and torchvision plus what its host needs (FedML 0.9.6 with
its pins, FedLab 1.3.0, or nothing: the core alone). They live in ``.venv-stacks/`` of the
checkout (``FEDBALANCE_STACKS`` to move them) and are rebuilt when missing or when their
recipe, torch or Python changes. (Kept in ``~/.cache`` and shared between clones, the FedLab
example test failed in two full runs for a reason not yet found; in the checkout it passed.)
fedbalance itself is installed from the freshly built wheel whenever its files differ from the
stack's install (the wheel's ``RECORD``), one process at a time.

torch is not installed again per stack: its distributions (torch, torchvision and everything
they require, ~5 GB) are hard-linked from the test environment by their ``RECORD`` files,
which takes seconds. pip and uv see them as installed, exactly as in a user's environment
where torch came first. Flower's stack links only torch, torchvision and the CUDA and Triton wheels
torch requires (:data:`HEAVY`): ``make test`` builds it while the test environment is still
installing, and that install may replace the small ones (FedML pins ``numpy<2``,
``networkx<3``), so pip installs those itself there. The host's own distributions (FedML
0.9.6 with the ~100 packages it pulls, FedLab 1.3.0) are linked the same way when the test
environment holds versions the recipe allows — it installed them from the same index with the
same pins — and installing the recipe then only confirms them; otherwise they come from the
index. The recipe installs as the environments do (``tools/install.py``: uv, else pip; for the
Flower stack 13 s against pip's 32 s here, the same 82 distributions); fedbalance's wheel
installs with pip, as users install it.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
HOME = Path(os.environ.get("FEDBALANCE_STACKS") or ROOT / ".venv-stacks")
#: stack -> what a user of that host has installed before fedbalance
RECIPES: dict[str, list[str]] = {
    "core": [],
    "fedlab": ["fedlab==1.3.0"],
    "fedml": ["fedml==0.9.6", "setuptools<81", "numpy<2", "protobuf<4"],
    # Flower's own environments for tests/flower: flwr needs protobuf>=5, FedML 0.9.6
    # protobuf<4, so neither can be the test environment itself. `make test-flower` runs the
    # suite on the newest release fedbalance supports, `make test-flower-oldest` the smoke
    # lane on the oldest.
    "flower": ["flwr[simulation]==1.42.*"],
    "flower-oldest": ["flwr[simulation]==1.41.*"],
}
SHARED = ("torch", "torchvision")
#: Stacks built beside the test environment's install (``make test``) link only these of the
#: shared closure: torch, torchvision and the CUDA and Triton wheels torch requires at fixed
#: versions or ranges that the rest of that install never replaces (nothing else asks for them).
HEAVY = ("torch", "torchvision", "nvidia-", "cuda-", "triton")
BESIDE_INSTALL = ("flower", "flower-oldest")
PIP = ["-m", "pip", "--disable-pip-version-check", "-q"]
#: tools/install.py: uv where it can be had, else pip (the stacks' host packages).
INSTALL = ROOT / "tools" / "install.py"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(names: tuple[str, ...]) -> list[md.Distribution]:
    """``names`` and every distribution they require (extras and markers honoured) here."""
    installed = {_norm(d.metadata["Name"]): d for d in md.distributions()}
    todo: list[tuple[str, set[str]]] = [(_norm(n), set()) for n in names]
    seen: dict[str, md.Distribution] = {}
    done: set[tuple[str, str]] = set()
    while todo:
        name, extras = todo.pop()
        if name not in installed:
            continue
        seen[name] = installed[name]
        for text in installed[name].requires or []:
            req = Requirement(text)
            wanted = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in wanted):
                continue
            key = (_norm(req.name), ",".join(sorted(req.extras)))
            if key not in done:
                done.add(key)
                todo.append((key[0], set(req.extras)))
    return list(seen.values())


def _link_distribution(dist: md.Distribution, site: Path) -> None:
    base = Path(str(dist.locate_file("")))
    for f in dist.files or []:
        src = (base / f).resolve()
        try:
            rel = src.relative_to(base.resolve())
        except ValueError:  # scripts in bin/ and the like: not needed to import
            continue
        _link(src, site / rel)
        if src.suffix == ".py":
            # uv, unlike pip, leaves the bytecode it compiled out of RECORD; without it every
            # process of the stack would compile torch as it imports it (PYTHONDONTWRITEBYTECODE).
            pyc = Path("__pycache__", f"{src.stem}.{sys.implementation.cache_tag}.pyc")
            _link(src.parent / pyc, (site / rel).parent / pyc)


def _link(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (a copy across file systems), unless there or not a file."""
    if dst.exists() or not src.is_file():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system: copy
        shutil.copy2(src, dst)


def venv_of(stack: str, venv: Path | None = None) -> Path:
    return venv if venv is not None else HOME / stack


def python_of(stack: str, venv: Path | None = None) -> Path:
    return venv_of(stack, venv) / "bin" / "python"


def _site(venv: Path) -> Path:
    return Path(
        subprocess.check_output(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            text=True,
        ).strip()
    )


def _shared(stack: str) -> list[md.Distribution]:
    """What ``stack`` links of torch's closure (see :data:`HEAVY`)."""
    shared = _closure(SHARED)
    if stack in BESIDE_INSTALL:
        shared = [d for d in shared if _norm(d.metadata["Name"]).startswith(HEAVY)]
    return shared


def _stamp(stack: str) -> str:
    shared = {d.metadata["Name"]: d.version for d in _shared(stack)}
    linked = {d.metadata["Name"]: d.version for d in _closure(_satisfied_here(RECIPES[stack]))}
    text = json.dumps(
        [RECIPES[stack], shared, linked, sysconfig.get_python_version()], sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()


@contextmanager
def locked(name: str, home: Path = HOME) -> Iterator[None]:
    """Hold ``home/name.lock``: one process at a time (pytest -n workers, parallel runs)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure(stack: str, venv: Path | None = None) -> Path:
    """The stack's python, building the venv (at ``venv``, default ``HOME/stack``) first if it
    is missing or out of date."""
    where = venv_of(stack, venv)
    with locked(where.name, where.parent):
        return _ensure(stack, where)


def _satisfied_here(recipe: list[str]) -> tuple[str, ...]:
    """The recipe's packages, if this environment has every one at an allowed version."""
    names = []
    for text in recipe:
        req = Requirement(text)
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            return ()
        if not req.specifier.contains(version, prereleases=True):
            return ()
        names.append(req.name)
    return tuple(names)


def _ensure(stack: str, venv: Path) -> Path:
    stamp = venv / ".stack"
    if stamp.exists() and stamp.read_text() == _stamp(stack):
        return python_of(stack, venv)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = _site(venv)
    own = {_norm(d.metadata["Name"]) for d in md.distributions(path=[str(site)])}  # pip, ...
    for dist in [*_shared(stack), *_closure(_satisfied_here(RECIPES[stack]))]:
        if _norm(dist.metadata["Name"]) not in own:
            _link_distribution(dist, site)
    if RECIPES[stack]:  # the user's stack, as it stood before fedbalance (uv, or pip)
        subprocess.run([sys.executable, str(INSTALL), str(venv), *RECIPES[stack]], check=True)
    stamp.write_text(_stamp(stack))
    return python_of(stack, venv)


def install_wheel(stack: str, wheel: Path, extras: str = "") -> Path:
    """Build the stack if needed, then install fedbalance from ``wheel`` (not editable).

    Under the stack's lock, and only when the stack does not already hold a working install of
    a wheel with the same ``RECORD`` (same files, same hashes): two test processes that each
    built the wheel then share one install instead of uninstalling it under each other. The
    install is checked by importing it from the stack; a broken one (an install cut short,
    files removed by hand) is installed again once, then reported with what was found.
    """
    python = ensure(stack)
    record = f"{_wheel_record_hash(wheel)} {extras}"
    stamp = HOME / f"{stack}.wheel"
    with locked(stack):
        if stamp.is_file() and stamp.read_text() == record and _installed_ok(python) is None:
            return python
        stamp.unlink(missing_ok=True)
        target = f"{wheel}[{extras}]" if extras else str(wheel)
        if subprocess.run([str(python), *PIP, "uninstall", "-y", "fedbalance"]).returncode:
            shutil.rmtree(HOME / stack)  # an install pip cannot remove: start from scratch
            python = _ensure(stack, HOME / stack)
        subprocess.run([str(python), *PIP, "install", target], check=True)
        problem = _installed_ok(python)
        if problem is not None:
            print(f"stacks: {stack}: {problem}; installing again", file=sys.stderr)
            again = [str(python), *PIP, "install", "--force-reinstall", "--no-deps", str(wheel)]
            subprocess.run(again, check=True)
            problem = _installed_ok(python)
            if problem is not None:
                raise RuntimeError(f"fedbalance does not import from the {stack} stack: {problem}")
        stamp.write_text(record)
    return python


def _wheel_record_hash(wheel: Path) -> str:
    import zipfile

    with zipfile.ZipFile(wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/RECORD"))
        return hashlib.sha256(whl.read(name)).hexdigest()


def _installed_ok(python: Path) -> str | None:
    """``None`` if the stack imports fedbalance from its own site-packages, else what it saw."""
    probe = (
        "import importlib.metadata as m, fl_adapters, fl_aggregators, fl_partitions; "
        "print(fl_adapters.__file__, m.version('fedbalance'))"
    )
    out = subprocess.run(
        [str(python), "-I", "-c", probe], capture_output=True, text=True, cwd=python.parents[1]
    )
    if out.returncode != 0:
        return f"import failed: {out.stderr.strip()[-500:]}"
    where = out.stdout.split()[0] if out.stdout.split() else ""
    if where == "None" or not Path(where).is_relative_to(python.parents[1]):
        site = _site(python.parents[1]) / "fl_adapters"
        listing = sorted(p.name for p in site.iterdir()) if site.is_dir() else "missing"
        return f"fl_adapters imports from {where!r} (site-packages/fl_adapters: {listing})"
    return None


if __name__ == "__main__":  # `make setup-flower`: python tests/stacks.py flower .venv-flower
    import argparse

    cli = argparse.ArgumentParser(description="Build (or confirm) one stack's venv.")
    cli.add_argument("stack", choices=sorted(RECIPES))
    cli.add_argument("venv", nargs="?", type=Path, help="where (default: HOME/stack)")
    ns = cli.parse_args()
    print(ensure(ns.stack, ns.venv))
