"""Shared set-up: one hypothesis run for everyone, a per-test limit that really stops a test,
an isolated plugin registry, and torch's import warning kept quiet."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, is_hypothesis_test, settings

# `make test` (and CI, and anyone) draws the same examples on every machine: derandomized,
# no example database (a local .hypothesis/ would replay other examples), and the pinned
# hypothesis release of the dev extra. `make fuzz` explores with random seeds and 10x the
# examples, keeping what it finds in .hypothesis/ (pin each find with @example).
# tests/flower runs in Flower's own environment (`make test-flower`): flwr needs protobuf>=5 and
# cannot be installed beside FedML, so without flwr those tests are not collected at all.
# tests/docs_site opens the built site in a browser from the docs environment (`make test-docs`).
collect_ignore = [] if importlib.util.find_spec("flwr") is not None else ["flower"]
if importlib.util.find_spec("selenium") is None:
    collect_ignore.append("docs_site")
# tests/cuda needs a CUDA device and runs only by `make test-cuda`: on every other machine
# (and in `make test` on one with a GPU) it is not collected, so the suite is the same everywhere.
if os.environ.get("FEDBALANCE_CUDA_TESTS") != "1":
    collect_ignore.append("cuda")

# No per-example deadline and no too-slow health check in `make test`: both time the machine,
# and a slow one (a 274 ms example against hypothesis' 200 ms, in a clean-clone run on a busy
# 2-core machine) would fail where a fast one passes. A test that bounds its own time says so.
settings.register_profile(
    "test",
    derandomize=True,
    database=None,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("fuzz", derandomize=False, print_blob=True)
PROFILE = os.environ.get("FEDBALANCE_HYPOTHESIS", "test")
settings.load_profile(PROFILE)
FUZZ_SCALE = 10


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if PROFILE != "fuzz":
        return
    for item in items:
        test = getattr(item, "obj", None)
        if test is not None and is_hypothesis_test(test):
            # A test's own @settings outrank the profile; scale them here. Internal attribute,
            # read by hypothesis' @given wrapper; exploration only, never in `make test`.
            own = test._hypothesis_internal_use_settings
            test._hypothesis_internal_use_settings = settings(
                own, max_examples=own.max_examples * FUZZ_SCALE, derandomize=False
            )


class TestTimeout(BaseException):
    """A test ran past its limit. A BaseException, so hypothesis does not take it for a failing
    example and go on shrinking (it did: pytest-timeout's own ``pytest.fail`` never stopped
    a shrinking test)."""


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool:
    """pytest-timeout's limit, enforced so that it stops the test and the run goes on.

    SIGALRM raises :class:`TestTimeout` in the test (``subprocess.run`` kills its child on
    it). Should the main thread sit in C code that never returns to Python, pytest-timeout's
    thread method ends the whole run a minute later, printing every thread's stack.
    """
    import pytest_timeout

    def stop(signum: int, frame: Any) -> None:
        raise TestTimeout(f"{item.nodeid} ran past its {settings.timeout:g} s limit")

    backstop = threading.Timer(
        settings.timeout + 60, pytest_timeout.timeout_timer, (item, settings)
    )
    backstop.daemon = True

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        backstop.cancel()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout calls it
    signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    backstop.start()
    return True


CPU_LOG = os.environ.get("FEDBALANCE_TEST_CPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``FEDBALANCE_TEST_CPU=FILE``, one JSON line per test: its worker, start time, wall
    time and the CPU time of the test process and of the processes it started and waited for
    (the 20-minute budget of `make test` is CPU on two cores; wall times of parallel tests hide
    who spends it)."""
    if not CPU_LOG:
        yield
        return
    import json
    import resource
    import time

    def cpu(who: int) -> float:
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime

    def machine() -> float:
        # Busy CPU seconds of the whole machine: counts the processes a test leaves to init
        # (Ray's, Flower's SuperExec), which RUSAGE_CHILDREN never sees. Meaningful per test
        # only when nothing else runs.
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")

    started = time.time()
    wall, own, kids = time.monotonic(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    busy = machine()
    yield
    line = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "started": round(started, 2),
        "wall": round(time.monotonic() - wall, 2),
        "cpu": round(cpu(resource.RUSAGE_SELF) - own, 2),
        "cpu_children": round(cpu(resource.RUSAGE_CHILDREN) - kids, 2),
        "cpu_machine": round(machine() - busy, 2),
    }
    with open(CPU_LOG, "a") as f:
        f.write(json.dumps(line) + "\n")


# One intra-op thread: tests start host processes beside the test process on 2 cores, and
# oversubscribed threads slow every one of them down.
torch.set_num_threads(1)
# The same for the processes the tests start (FedML sp, MPI ranks, FedLab, the CLI), unless the
# environment says otherwise: two FedML tests took 7-10 % less CPU with it, their OpenMP threads
# no longer spinning beside the other processes. Tests that compare runs bit for bit still set
# it themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")

warnings.filterwarnings("ignore", message=".*pynvml.*", category=FutureWarning)


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    """Every test sees a registry built from the entry points as they are during the test."""
    from fl_adapters.registry import reset_registry

    reset_registry()
    yield
    reset_registry()
