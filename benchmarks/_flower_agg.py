"""Flower's side of ``perf_aggregate``, and the client data both sides aggregate.

flwr (protobuf>=5) and FedML 0.9.6 (protobuf<4, numpy<2) cannot share an environment, so
``perf_aggregate`` runs this file with the python of Flower's own virtual environment. It
imports only numpy and flwr — never fedbalance — and speaks JSON lines:

    stdin  {"cmd": "setup", "layout": [[name, shape, dtype], ...], "clients": K, "seed": s}
    stdout {"ok": true, "flwr": "1.41.0", "numpy": "...", "generate_s": ...}
    stdin  {"cmd": "run", "check": false}
    stdout {"aggregate": seconds, "aggregate_median": seconds, "check": null}
    stdin  {"cmd": "quit"}  (or end of input)

The main process imports :func:`generate` from here too, so both sides build the same
clients from the same seed (the sanity check in ``perf_aggregate`` compares the results).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np

#: One entry per state-dict tensor, in order: (name, shape, dtype name).
Layout = list[tuple[str, tuple[int, ...], str]]


def numel(layout: Layout) -> int:
    """Elements of every tensor of ``layout``."""
    return sum(int(np.prod(shape)) for _, shape, _ in layout)


def float_numel(layout: Layout) -> int:
    """Elements of the floating-point tensors (what a flat, serialised client carries)."""
    return sum(int(np.prod(shape)) for _, shape, dtype in layout if dtype.startswith("float"))


def generate(
    layout: Layout, clients: int, seed: int
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """Random clients: ``(flats, num_samples, val_losses, steps)``.

    ``flats[i]`` is client ``i``'s floating-point tensors concatenated in layout order
    (float32); its integer buffers (BatchNorm's ``num_batches_tracked``) all hold
    ``steps[i]``, as after local training every BatchNorm of a client has seen the same
    number of batches.
    """
    rng = np.random.default_rng(seed)
    num_samples = rng.integers(100, 5000, size=clients)
    val_losses = rng.uniform(0.2, 2.0, size=clients)
    steps = rng.integers(100, 1000, size=clients)
    n = float_numel(layout)
    flats = [rng.standard_normal(n, dtype=np.float32) for _ in range(clients)]
    return flats, num_samples, val_losses, steps


def ndarrays(layout: Layout, flat: np.ndarray, step: int) -> list[np.ndarray]:
    """One client's tensors as Flower's ``NDArrays`` (views into ``flat``, no copy)."""
    out, offset = [], 0
    for _name, shape, dtype in layout:
        if dtype.startswith("float"):
            size = int(np.prod(shape))
            out.append(flat[offset : offset + size].reshape(shape))
            offset += size
        else:
            out.append(np.full(shape, step, dtype=dtype))
    return out


def checksum(layout: Layout, arrays: list[Any]) -> dict[str, Any]:
    """Float64 sum, absolute sum and first values of the floating-point outputs, in order."""
    floats = [
        np.asarray(a, dtype=np.float64).reshape(-1)
        for a, (_, _, dtype) in zip(arrays, layout, strict=True)
        if dtype.startswith("float")
    ]
    flat = np.concatenate(floats)
    return {
        "sum": float(flat.sum()),
        "abs_sum": float(np.abs(flat).sum()),
        "head": flat[:8].tolist(),
    }


def trim_memory() -> None:
    """Hand freed heap memory back to the OS.

    glibc raises its mmap threshold after the first large free, so later layer-sized
    temporaries come from the heap and stay in the process after ``free``; with two processes
    each holding gigabytes of clients that retained garbage is enough to run out of memory.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _serve() -> None:  # pragma: no cover - runs in Flower's environment
    import flwr
    from flwr.server.strategy.aggregate import aggregate, aggregate_median

    # Keep stdout for the protocol; anything a library prints goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr
    layout: Layout = []
    results: list[tuple[list[np.ndarray], int]] = []
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "setup":
            layout = [(n, tuple(s), d) for n, s, d in msg["layout"]]
            start = time.perf_counter()
            flats, num_samples, _, steps = generate(layout, msg["clients"], msg["seed"])
            results = [
                (ndarrays(layout, f, int(s)), int(n))
                for f, s, n in zip(flats, steps, num_samples, strict=True)
            ]
            reply: dict[str, Any] = {
                "ok": True,
                "flwr": flwr.__version__,
                "numpy": np.__version__,
                "generate_s": time.perf_counter() - start,
            }
        elif msg["cmd"] == "run":
            start = time.perf_counter()
            avg = aggregate(results)
            t_avg = time.perf_counter() - start
            check: dict[str, Any] | None = None
            if msg.get("check"):
                check = {"fedavg": checksum(layout, avg)}
            del avg
            trim_memory()
            start = time.perf_counter()
            med = aggregate_median(results)
            t_med = time.perf_counter() - start
            if check is not None:
                check["median"] = checksum(layout, med)
            del med
            trim_memory()
            reply = {"aggregate": t_avg, "aggregate_median": t_med, "check": check}
        else:
            break
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":  # pragma: no cover
    _serve()
