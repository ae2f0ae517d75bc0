"""Hostile and careless input through the real command line: ``fedbalance bench hostile``.

Each case is a real process (``fedbalance ...`` or ``python -c``) under a 1 GiB data limit
(``RLIMIT_DATA``; torch's libraries need address space, not data) and a time limit, in a fresh
directory its ``setup`` prepares. A case is *refused clearly* when the process exits 2 with one
error line naming the problem and no traceback, *handled* when it exits 0 doing the documented
thing, and a *failure* otherwise (a traceback, a memory error, a timeout, another message).
``tests/test_hostile_input.py`` runs the same list as regressions; this writes the table and
the counts to ``benchmarks/results/hostile_input.md``::

    fedbalance bench hostile
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedbalance_benchmarks._runs import RESULTS

MEMORY = 1 << 30
SECONDS = 240  # generous: CI runs two suites side by side on two cores
FEDBALANCE = [sys.executable, "-m", "fl_adapters.cli"]
BASE = (
    "framework: fedlab\ndataset: digits\naggregator: fedavgm\nnum_clients: 4\n"
    "clients_per_round: 2\nrounds: 1\n"
)
#: "Billion laughs": 10 strings, then 7 levels of 10 aliases each (10^8 strings expanded).
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{k}: &{k} [{', '.join([f'*{p}'] * 10)}]\n" for p, k in zip("abcdefg", "bcdefgh", strict=True)
)


@dataclass(frozen=True)
class Case:
    """One input: the argv (``{dir}`` is the case's directory), its environment, what ``setup``
    writes first, the words the one error line must hold (``None``: the run must succeed), and
    ``check``, what must hold on disk afterwards."""

    name: str
    argv: Sequence[str]
    words: Sequence[str] | None
    setup: Callable[[Path], None] = lambda _: None
    env: dict[str, str] = field(default_factory=dict)
    check: Callable[[Path], bool] = lambda _: True
    hold_lock: bool = False
    #: An import-time refusal (the autoload stops ``import fedlab``) exits 1 with Python's
    #: traceback ending in the one line; a command exits 2 without one.
    at_import: bool = False


def _write(name: str, text: str) -> Callable[[Path], None]:
    return lambda d: (d / name).write_text(text)


def _labels(d: Path) -> None:
    np.save(d / "labels.npy", np.arange(100) % 3)


def _images_run(
    d: Path,
    test: bool = True,
    extra: str = "",
    x: np.ndarray | None = None,
    y: np.ndarray | None = None,
) -> None:
    """A small ``.npz`` of 20x20 images (``x``, ``y`` if given) and a run config for it."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 60) if y is None else y
    x = rng.integers(0, 256, (len(y), 20, 20), dtype=np.uint8) if x is None else x
    arrays = {"x_train": x, "y_train": y} | ({"x_test": x[:10], "y_test": y[:10]} if test else {})
    np.savez(d / "images.npz", **arrays)
    (d / "run.yaml").write_text(BASE.replace("digits", f"npy:{d}/images.npz") + extra)


def _lying_header(descr: str, count: int) -> bytes:
    """An ``.npy`` file whose header claims ``count`` elements and whose data is 80 bytes."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({count},), }}".ljust(117)
    return (
        b"\x93NUMPY\x01\x00"
        + (len(header) + 1).to_bytes(2, "little")
        + header.encode()
        + (b"\n" + bytes(80))
    )


def _lying_npz(d: Path) -> None:
    import io
    import zipfile

    _images_run(d)
    labels = io.BytesIO()
    np.save(labels, np.arange(9))
    with zipfile.ZipFile(d / "images.npz", "w") as z:
        z.writestr("x_train.npy", _lying_header("|u1", 10**13))
        z.writestr("y_train.npy", labels.getvalue())


def _huge_npy(d: Path) -> None:
    (d / "huge.npy").write_bytes(_lying_header("<i8", 10**13))


def _finished_run(d: Path) -> None:
    (d / "run.yaml").write_text(BASE)
    (d / "out").mkdir()
    (d / "out" / "metrics.jsonl").write_text('{"round": 1}\n')


def _nan_checkpoint(d: Path) -> None:
    import torch

    from fl_adapters.checkpoint import Checkpoint

    (d / "run.yaml").write_text(BASE)
    (d / "out").mkdir()
    Checkpoint(
        config={}, round=1, model=torch.full((4,), float("nan")), aggregator={"round": 1},
        participations={},
    ).save(d / "out" / "checkpoint.pt")  # fmt: skip


RUN = [*FEDBALANCE, "run", "{dir}/run.yaml"]
CHECK = [*RUN, "--check"]
PARTITION = [*FEDBALANCE, "partition", "--scheme", "iid", "--clients", "4"]
CASES: tuple[Case, ...] = (
    Case(
        "YAML bomb in aggregator_args",
        CHECK,
        ["more than 100,000"],
        _write("run.yaml", BASE + BOMB + "aggregator_args: {x: *h}\n"),
    ),
    Case(
        "YAML bomb in a partition without a name",
        CHECK,
        ["more than 100,000"],
        _write("run.yaml", BASE + BOMB + "partition: {beta: *h}\n"),
    ),
    Case(
        "duplicate key", CHECK, ["duplicate key 'rounds'"], _write("run.yaml", BASE + "rounds: 2\n")
    ),
    Case(
        "server_lr: .inf",
        CHECK,
        ["server_lr must be a finite float"],
        _write("run.yaml", BASE + "aggregator_args: {server_lr: .inf}\n"),
    ),
    Case(
        "seed: 2**40",
        CHECK,
        ["seed must be an int in [0, 4294967295]"],
        _write("run.yaml", BASE + "seed: 1099511627776\n"),
    ),
    Case(
        "port: 999999",
        CHECK,
        ["port must be an int in [1024, 65535]"],
        _write("run.yaml", BASE + "port: 999999\n"),
    ),
    Case("lr: 1e-3 (a float)", CHECK, None, _write("run.yaml", BASE + "lr: 1e-3\n")),
    Case(
        "dataset: npy:labels.npy (labels only) in a run config",
        CHECK,
        ["holds labels only", ".npz archive"],
        lambda d: (
            _labels(d),
            (d / "run.yaml").write_text(BASE.replace("digits", f"npy:{d}/labels.npy")),
        ),
    ),
    Case(
        "dataset: npy:images.npz trains",
        [*RUN, "--out", "{dir}/out"],
        None,
        _images_run,
        check=lambda d: len((d / "out" / "metrics.jsonl").read_text().splitlines()) == 1,
    ),
    Case(
        "npy:images.npz without x_test under eval_data: test",
        CHECK,
        ["has no x_test, y_test"],
        lambda d: _images_run(d, test=False, extra="eval_data: test\n"),
    ),
    Case(
        "npy:images.npz whose x_train header claims 10^13 bytes",
        CHECK,
        ["header claims 10,000,000,000,000 bytes"],
        _lying_npz,
    ),
    Case(
        "npy:images.npz with 3 images for 4 labels",
        CHECK,
        ["N = 4 labels", "(3, 20, 20)"],
        lambda d: _images_run(d, x=np.zeros((3, 20, 20), np.uint8), y=np.arange(4) % 2),
    ),
    Case(
        "astraea plan: counts nested 200,000 deep",
        [*FEDBALANCE, "astraea", "plan", "--class-counts", "{dir}/c.json"],
        ["nested too deeply"],
        _write("c.json", "[" * 200_000 + "]" * 200_000),
    ),
    Case(
        "astraea plan: 1,001 x 1,001 counts",
        [*FEDBALANCE, "astraea", "plan", "--class-counts", "{dir}/c.json"],
        ["more than 1,000,000"],
        _write("c.json", json.dumps([[1] * 1001] * 1001)),
    ),
    Case(
        "FEDBALANCE_AGGREGATOR_ARGS nested 30,000 deep (import fedlab)",
        [sys.executable, "-c", "import fedlab"],
        ["FEDBALANCE_AGGREGATOR_ARGS: nested too deeply to read"],
        env={
            "FEDBALANCE_AGGREGATOR": "fedavg",
            "FEDBALANCE_AGGREGATOR_ARGS": "[" * 30_000 + "]" * 30_000,
        },
        at_import=True,
    ),
    Case(
        "a fresh run into a finished run's --out",
        [*RUN, "--out", "{dir}/out"],
        ["holds another run's records (metrics.jsonl)", "--overwrite"],
        _finished_run,
        check=lambda d: (d / "out" / "metrics.jsonl").read_text() == '{"round": 1}\n',
    ),
    Case(
        "a second run on a busy --out",
        [*RUN, "--out", "{dir}/out"],
        ["in use by another fedbalance run"],
        lambda d: ((d / "run.yaml").write_text(BASE), (d / "out").mkdir()),
        hold_lock=True,
    ),
    Case(
        "run --out /dev/full",
        [*RUN, "--out", "/dev/full"],
        ["is not a directory"],
        _write("run.yaml", BASE),
    ),
    Case(
        "run --out an existing file",
        [*RUN, "--out", "{dir}/run.yaml"],
        ["is not a directory"],
        _write("run.yaml", BASE),
    ),
    # The files a run appends to, named by environment variable: refused before any training.
    *(
        Case(
            f"{var}={what}",
            [*RUN, "--out", "{dir}/out"],
            [f"{var}={path} is not a regular file"],
            _write("run.yaml", BASE),
            env={var: path},
            check=lambda d: not (d / "out").exists(),
        )
        for var, path, what in (
            ("FEDBALANCE_RECORD", "/dev/full", "/dev/full"),
            ("FEDBALANCE_TRAIN_CLOCK", "/tmp", "a directory"),
        )
    ),
    Case(
        "partition --out a directory",
        [*PARTITION, "--dataset", "npy:{dir}/labels.npy", "--out", "{dir}"],
        ["is a directory"],
        _labels,
    ),
    Case(
        "partition --out /dev/full",
        [*PARTITION, "--dataset", "npy:{dir}/labels.npy", "--out", "/dev/full"],
        ["cannot write"],
        _labels,
    ),
    Case(
        "an .npy header claiming 10^13 labels",
        [*PARTITION, "--dataset", "npy:{dir}/huge.npy", "--out", "{dir}/p.json"],
        ["cannot read labels"],
        _huge_npy,
    ),
    Case(
        "--resume from an all-NaN checkpoint",
        [*RUN, "--out", "{dir}/out", "--resume"],
        ["NaN or Inf"],
        _nan_checkpoint,
    ),
    Case(
        "FEDBALANCE_DISABLE_HOST_AUTOLOAD=false leaves the autoload on",
        [sys.executable, "-c", "import fl_adapters.autoload as a; assert not a.disabled()"],
        None,
        env={"FEDBALANCE_DISABLE_HOST_AUTOLOAD": "false"},
    ),
)


@dataclass
class Outcome:
    case: Case
    code: int | None
    seconds: float
    peak_mb: float
    line: str
    verdict: str


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY, MEMORY))


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "w") as fh:
        fh.write("pid 4242, started earlier")
        fh.flush()
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def run_case(case: Case, work: Path) -> Outcome:
    """``case`` in ``work`` (prepared by its setup), with the verdict."""
    case.setup(work)
    argv = [a.replace("{dir}", str(work)) for a in case.argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")} | case.env
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    lock = _lock(work / "out" / ".fedbalance.lock") if case.hold_lock else _nothing()
    with lock:
        try:
            out = subprocess.run(
                argv, cwd=work, env=env, capture_output=True, text=True, timeout=SECONDS,
                preexec_fn=_limited,
            )  # fmt: skip
            code, stderr = out.returncode, out.stderr
        except subprocess.TimeoutExpired:
            code, stderr = None, f"timed out after {SECONDS} s"
    seconds = time.perf_counter() - start
    peak = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    errors = [x for x in stderr.splitlines() if "error:" in x or x.startswith("fl_adapters.")]
    line = errors[-1] if errors else (stderr.strip().splitlines() or [""])[-1]
    on_disk = case.check(work)
    if case.words is None:
        verdict = "handled" if code == 0 and on_disk else "FAILED"
    else:
        bounded = "MemoryError" not in stderr and "RecursionError" not in stderr
        clean = case.at_import or "Traceback" not in stderr
        exited = code == (1 if case.at_import else 2)
        named = all(w in line for w in case.words) and len(line) < 600
        verdict = (
            "refused clearly" if bounded and clean and exited and named and on_disk else "FAILED"
        )
    return Outcome(case, code, seconds, peak, line, verdict)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def report(outcomes: list[Outcome], command: str) -> str:
    from fl_adapters._table import markdown_table

    counts = {
        v: sum(o.verdict == v for o in outcomes) for v in ("refused clearly", "handled", "FAILED")
    }
    rows = [
        [
            o.case.name,
            "timeout" if o.code is None else str(o.code),
            o.verdict,
            f"{o.seconds:.1f}",
            f"{o.peak_mb:.0f}",
            o.line.replace("|", "\\|")[:180],
        ]
        for o in outcomes
    ]
    return (
        "# Hostile and careless input\n\n"
        "Each input through a real process under a 1 GiB data limit and a "
        f"{SECONDS} s time limit (see `benchmarks/hostile.py`; the same list runs as "
        "regressions in `tests/test_hostile_input.py`). Peak memory is the largest resident size "
        "of any process so far (torch's import alone is about 650 MB).\n\n"
        f"Tried {len(outcomes)}: refused clearly {counts['refused clearly']}, handled "
        f"{counts['handled']}, failed {counts['FAILED']}.\n\n"
        f"Regenerate: `{command}`\n\n"
        + markdown_table(["input", "exit", "result", "s", "peak MB", "message"], rows)
        + "\n"
    )


#: The reliability reports' hostile-input section lies between these markers.
BEGIN, END = "<!-- hostile-input -->\n", "<!-- /hostile-input -->\n"


def reliability_section(hostile_report: str) -> str:
    """The reliability report's section on hostile input: the counts line of
    ``hostile_input.md`` (``hostile_report``) and a link to its per-input table."""
    counts = next(x for x in hostile_report.splitlines() if x.startswith("Tried "))
    return (
        f"{BEGIN}## Hostile and careless input\n\n"
        f"Each input through a real `fedbalance` process under a 1 GiB data limit and a {SECONDS} s"
        f" time limit. {counts} Per input: [hostile_input.md](hostile_input.md), regenerated"
        f" with this section by `fedbalance bench hostile`.\n{END}"
    )


def with_reliability_section(report: str, hostile_report: str) -> str:
    """``report`` (a reliability report) with its hostile-input section set (appended the
    first time)."""
    section = reliability_section(hostile_report)
    if BEGIN in report and END in report:
        head, rest = report.split(BEGIN, 1)
        return head + section + rest.split(END, 1)[1]
    return report.rstrip("\n") + "\n\n" + section


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fedbalance bench hostile", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    outcomes = []
    for case in CASES:
        with tempfile.TemporaryDirectory(prefix="fedbalance-hostile-") as tmp:
            outcomes.append(run_case(case, Path(tmp)))
            print(f"{outcomes[-1].verdict:16} {case.name}", flush=True)
    text = report(outcomes, "fedbalance bench hostile")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "hostile_input.md").write_text(text)
    print(f"wrote {a.out / 'hostile_input.md'}")
    for reliability in sorted(a.out.glob("reliability_*.md")):
        reliability.write_text(with_reliability_section(reliability.read_text(), text))
        print(f"set the hostile-input section of {reliability}")
    return 0 if all(o.verdict != "FAILED" for o in outcomes) else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
