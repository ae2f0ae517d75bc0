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
import os
import resource
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedbalance_benchmarks._runs import RESULTS
from fedbalance_benchmarks.hostile_cases import CASES, HELD_SOCKETS, Case

MEMORY = 1 << 30
SECONDS = 240  # generous: CI runs two suites side by side on two cores

__all__ = ["CASES", "Case", "Outcome", "report", "run_case", "with_reliability_section"]


@dataclass
class Outcome:
    case: Case
    code: int | None
    seconds: float
    peak_mb: float
    line: str
    verdict: str


def _limited(file_limit: int | None = None) -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY, MEMORY))
    if file_limit is not None:  # a write past it fails with EFBIG, as ENOSPC would
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # kept across exec: ignored stays so
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "w") as fh:
        fh.write("pid 4242, started earlier")
        fh.flush()
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def run_case(case: Case, work: Path) -> Outcome:
    """``case`` in ``work`` (prepared by its setup), with the verdict."""
    work = work.resolve()  # FEDBALANCE_HELD_OUT names a run directory resolved
    case.setup(work)

    def filled(text: str) -> str:
        return text.replace("{dir}", str(work)).replace("{pid}", str(os.getpid()))

    argv = [filled(a) for a in case.argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDBALANCE_")} | {
        k: filled(v) for k, v in case.env.items()
    }
    # One OpenMP thread, as the test suite runs them: each thread's arena counts against the
    # data limit, and with the default count importing torch and FedML alone nears 1 GiB.
    env.setdefault("OMP_NUM_THREADS", "1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    lock = _lock(work / "out" / ".fedbalance.lock") if case.hold_lock else _nothing()
    with lock:
        try:
            out = subprocess.run(
                argv, cwd=work, env=env, capture_output=True, text=True, timeout=SECONDS,
                preexec_fn=lambda: _limited(case.file_limit),
            )  # fmt: skip
            code, stderr = out.returncode, out.stderr
        except subprocess.TimeoutExpired:
            code, stderr = None, f"timed out after {SECONDS} s"
        finally:
            while HELD_SOCKETS:
                HELD_SOCKETS.pop().close()
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
    # The case's own folder is a temporary one of this machine: the report says WORK.
    return Outcome(case, code, seconds, peak, line.replace(str(work), "WORK"), verdict)


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
        f"{SECONDS} s time limit, one OpenMP thread as in the test suite (see `benchmarks/hostile.py`; the same list runs as "
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
