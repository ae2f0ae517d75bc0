"""Aggregation speed: fedbalance's FedAvg / FedLoss / FedMedian against FedML, FedLab and Flower.

One ResNet-18-sized state dict per client (torchvision's ``resnet18(num_classes=1000)``
layout: 122 tensors, 11.7 M float32 values plus 20 int64 ``num_batches_tracked``), random
values from a fixed seed, 10 and 100 clients. Every implementation aggregates the same
clients in the same process, alternating inside each repeat so machine noise hits all; the
result is the median of ``--repeats`` timed runs after one warm-up.

- fedbalance: ``FedAvg``, ``FedLoss`` (``val_loss`` metrics) and ``FedMedian`` through
  ``Aggregator.aggregate`` — validation and the finiteness check included; with numba's
  compiled kernels unless ``FEDBALANCE_KERNELS=0`` is set (the header says which ran).
- FedML 0.9.6: ``FedMLAggOperator.agg(args, [(num_samples, state_dict)])`` with
  ``args.federated_optimizer = "FedAvg"`` (its ``torch_aggregator``; it overwrites client 0's
  dict, so each call gets a shallow copy of it, made outside the timed region).
- FedLab 1.3.0: ``Aggregators.fedavg_aggregate`` on flat float vectors, as FedLab's
  ``SerializationTool`` would hand them over (built once, outside the timed region).
- torch-stacked: ``torch.median(torch.stack(flats), dim=0)``, the obvious median. Note
  ``torch.median`` returns the *lower* middle value for an even client count, not the mean of
  the two middle values, so it does slightly less work than a true median.
- Flower 1.41: ``aggregate`` and ``aggregate_median`` (numpy, one thread), run by
  ``_flower_agg.py`` in Flower's own virtual environment (flwr's protobuf cannot live beside
  FedML's); the worker builds the same clients from the same seed and is driven step by step,
  so its runs alternate with the others too.
- floor: ``torch.sum`` over every client's flat vector — reading each value once, which is
  what any aggregation has to do at least.

The state dicts' float tensors are views into the flat vectors, so the clients are held in
memory once (47 MB each). Implementations that stack the clients (FedLab, torch-stacked)
need two more copies at their peak; a case is skipped, with a note, when the machine lacks
that much free memory. The report (machine, ratios, how the kernels get there) is written by
:mod:`fedbalance_benchmarks.perf_aggregate_report`.

    python -m fedbalance_benchmarks.perf_aggregate [--clients 10 100] [--repeats 5] [--no-flower]
    fedbalance bench perf-aggregate
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from fedbalance_benchmarks._flower_agg import (
    Layout,
    checksum,
    float_numel,
    generate,
    numel,
    trim_memory,
)
from fedbalance_benchmarks._flower_env import FlowerWorker, default_flower_venv, ensure_flower
from fedbalance_benchmarks.perf_aggregate_report import machine_load, mem_available, write

RESULTS = Path(__file__).resolve().parent / "results"
SEED = 0

#: ~100 k values in a few conv/BatchNorm/linear tensors: the ``--tiny`` smoke run.
TINY_LAYOUT: Layout = [
    ("conv1.weight", (16, 3, 3, 3), "float32"),
    ("bn1.weight", (16,), "float32"),
    ("bn1.bias", (16,), "float32"),
    ("bn1.running_mean", (16,), "float32"),
    ("bn1.running_var", (16,), "float32"),
    ("bn1.num_batches_tracked", (), "int64"),
    ("conv2.weight", (64, 16, 3, 3), "float32"),
    ("bn2.weight", (64,), "float32"),
    ("bn2.bias", (64,), "float32"),
    ("bn2.running_mean", (64,), "float32"),
    ("bn2.running_var", (64,), "float32"),
    ("bn2.num_batches_tracked", (), "int64"),
    ("fc.weight", (100, 860), "float32"),
    ("fc.bias", (100,), "float32"),
]


def resnet18_layout() -> Layout:
    """(name, shape, dtype) of every tensor in torchvision's ``resnet18(num_classes=1000)``."""
    import torchvision

    sd = torchvision.models.resnet18(weights=None, num_classes=1000).state_dict()
    return [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in sd.items()]


# -- clients ----------------------------------------------------------------------------------
@dataclass
class Clients:
    """The same clients in every form the implementations take."""

    layout: Layout
    flats: list[torch.Tensor]  # float tensors concatenated, one per client
    state_dicts: list[OrderedDict[str, torch.Tensor]]  # float entries are views into flats
    num_samples: list[int]
    val_losses: list[float]

    @classmethod
    def make(cls, layout: Layout, clients: int, seed: int) -> Clients:
        flats_np, num_samples, val_losses, steps = generate(layout, clients, seed)
        flats = [torch.from_numpy(f) for f in flats_np]
        sds = []
        for flat, step in zip(flats, steps, strict=True):
            sd: OrderedDict[str, torch.Tensor] = OrderedDict()
            offset = 0
            for name, shape, dtype in layout:
                if dtype.startswith("float"):
                    size = int(np.prod(shape))
                    sd[name] = flat[offset : offset + size].view(shape)
                    offset += size
                else:
                    sd[name] = torch.full(shape, int(step), dtype=getattr(torch, dtype))
            sds.append(sd)
        return cls(layout, flats, sds, [int(n) for n in num_samples], val_losses.tolist())

    def global_params(self) -> OrderedDict[str, torch.Tensor]:
        return OrderedDict(
            (name, torch.zeros(shape, dtype=getattr(torch, dtype)))
            for name, shape, dtype in self.layout
        )

    def bytes_per_copy(self) -> int:
        return copy_bytes(self.layout, len(self.flats))


def copy_bytes(layout: Layout, clients: int) -> int:
    """Bytes of one copy of every client's float32 values."""
    return 4 * clients * float_numel(layout)


# -- what is timed ----------------------------------------------------------------------------
@dataclass
class Case:
    """One implementation: ``make()`` (untimed) returns the call that is timed."""

    impl: str
    operation: str
    params: int
    make: Callable[[], Callable[[], Any]] | None
    note: str | None = None
    #: Bytes the call allocates at its peak: checked against free memory before every run.
    peak_bytes: int = 0
    times: list[float] = field(default_factory=list)
    skipped: int = 0
    output: Any = None  # the warm-up's result, for the sanity checks

    def step(self, warmup: bool) -> None:
        if self.make is None:
            return
        if self.peak_bytes:
            why = fits(self.peak_bytes)
            if why:
                self.skipped += 1
                self.note = f"{why} ({self.skipped} run(s) skipped)"
                return
        call = self.make()
        start = time.perf_counter()
        out = call()
        elapsed = time.perf_counter() - start
        if warmup:
            self.output = out
        else:
            self.times.append(elapsed)
        del out

    def record(self, clients: int) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "impl": self.impl,
            "operation": self.operation,
            "clients": clients,
            "params": self.params,
            "seconds": statistics.median(self.times) if self.times else None,
            "seconds_all": self.times,
            "torch_threads": torch.get_num_threads() if self.impl != "flower" else 1,
        }
        if self.note:
            rec["note"] = self.note
        return rec


def fits(peak_bytes: int) -> str | None:
    """``None`` if ``peak_bytes`` more fit in free memory, else why not."""
    need = peak_bytes + (1 << 30)  # + 1 GB headroom for everything else on the machine
    avail = mem_available()
    if avail is None or avail >= need:
        return None
    return f"skipped: needs ~{need / 1e9:.1f} GB free, {avail / 1e9:.1f} GB available"


def local_cases(c: Clients) -> list[Case]:
    from fl_aggregators import FedAvg, FedLoss, FedMedian
    from fl_aggregators.update import ClientUpdate

    total, flat = numel(c.layout), float_numel(c.layout)
    global_params = c.global_params()
    plain = [ClientUpdate(sd, n) for sd, n in zip(c.state_dicts, c.num_samples, strict=True)]
    with_loss = [
        ClientUpdate(sd, n, {"val_loss": loss})
        for sd, n, loss in zip(c.state_dicts, c.num_samples, c.val_losses, strict=True)
    ]
    fedavg, fedloss, fedmedian = FedAvg(), FedLoss(), FedMedian()
    cases = [
        Case("floor", "read", flat, lambda: lambda: [f.sum() for f in c.flats]),
        Case("fedbalance", "fedavg", total, lambda: lambda: fedavg.aggregate(global_params, plain)),
        Case(
            "fedbalance",
            "fedloss",
            total,
            lambda: lambda: fedloss.aggregate(global_params, with_loss),
        ),
        Case(
            "fedbalance", "median", total, lambda: lambda: fedmedian.aggregate(global_params, plain)
        ),
    ]

    try:
        from fedml.ml.aggregator.agg_operator import FedMLAggOperator
    except ImportError as e:
        cases.append(Case("fedml", "fedavg", total, None, f"skipped: FedML not importable ({e})"))
    else:
        args = SimpleNamespace(federated_optimizer="FedAvg")

        def fedml_call() -> Callable[[], Any]:
            # FedML writes the average into client 0's dict: hand it a shallow copy.
            raw = [(c.num_samples[0], OrderedDict(c.state_dicts[0]))]
            raw += list(zip(c.num_samples[1:], c.state_dicts[1:], strict=True))
            return lambda: FedMLAggOperator.agg(args, raw)

        cases.append(Case("fedml", "fedavg", total, fedml_call))

    try:
        from fedlab.utils.aggregator import Aggregators
    except ImportError as e:
        cases.append(Case("fedlab", "fedavg", flat, None, f"skipped: FedLab not importable ({e})"))
    else:
        cases.append(
            Case(
                "fedlab",
                "fedavg",
                flat,
                lambda: lambda: Aggregators.fedavg_aggregate(c.flats, c.num_samples),
                peak_bytes=2 * c.bytes_per_copy(),  # the stacked matrix and its weighted copy
            )
        )
    cases.append(
        Case(
            "torch-stacked",
            "median",
            flat,
            lambda: lambda: torch.median(torch.stack(c.flats), dim=0).values,
            peak_bytes=2 * c.bytes_per_copy(),  # the stacked matrix and median's working copy
        )
    )
    return cases


# -- Flower, in its own environment (fedbalance_benchmarks._flower_env) -------------------
@dataclass
class FlowerStep:
    """Both Flower operations as one step of a repeat (one round trip to the worker)."""

    avg: Case
    med: Case
    worker: FlowerWorker | None = None
    info: dict[str, Any] = field(default_factory=dict)
    check: dict[str, Any] | None = None

    def start(self, python: Path, layout: Layout, clients: int) -> None:
        """Start the worker; it builds its copy of the clients while the caller goes on."""
        self.worker = FlowerWorker(python, layout, clients, SEED)

    def ready(self) -> None:
        """Wait until the worker holds its clients."""
        if self.worker is None:
            return
        try:
            self.info = self.worker.reply()
        except (OSError, RuntimeError, ValueError) as e:
            self.avg.note = self.med.note = f"failed: {e}"
            self.close()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def step(self, warmup: bool) -> None:
        if self.worker is None:
            return
        try:
            got = self.worker.run(check=warmup)
        except (OSError, RuntimeError, ValueError) as e:
            self.avg.note = self.med.note = f"failed: {e}"
            self.close()
            return
        if warmup:
            self.check = got["check"]
        else:
            self.avg.times.append(got["aggregate"])
            self.med.times.append(got["aggregate_median"])


# -- sanity checks ----------------------------------------------------------------------------
def _float_flat(layout: Layout, params: Any) -> torch.Tensor:
    return torch.cat(
        [
            params[name].reshape(-1).to(torch.float64)
            for name, _, dtype in layout
            if dtype.startswith("float")
        ]
    )


def sanity_checks(layout: Layout, cases: Sequence[Case]) -> list[tuple[str, bool]]:
    """Compare the warm-up results: fedbalance's FedAvg against FedML's and FedLab's."""
    out = {(c.impl, c.operation): c.output for c in cases if c.output is not None}
    checks: list[tuple[str, bool]] = []
    ours = out.get(("fedbalance", "fedavg"))
    if ours is None:
        return checks
    ours_sd = ours.params
    ours_flat = _float_flat(layout, ours_sd)

    def compare(label: str, theirs: torch.Tensor) -> None:
        diff = float((ours_flat - theirs.to(torch.float64)).abs().max())
        ok = bool(torch.allclose(ours_flat, theirs.to(torch.float64), rtol=1e-5, atol=1e-6))
        checks.append((f"fedbalance fedavg vs {label}: max abs diff {diff:.2e}", ok))

    if ("fedml", "fedavg") in out:
        fedml_sd = out[("fedml", "fedavg")]
        compare("FedML", _float_flat(layout, fedml_sd))
        ints = [n for n, _, d in layout if not d.startswith("float")]
        # FedML averages int buffers into floats; fedbalance rounds them back to int64.
        int_ok = all(
            float((ours_sd[n].to(torch.float64) - fedml_sd[n].to(torch.float64)).abs().max())
            <= 0.5 + 1e-3
            for n in ints
        )
        checks.append(
            (f"fedbalance int buffers (x{len(ints)}) == round(FedML's float average)", int_ok)
        )
    if ("fedlab", "fedavg") in out:
        compare("FedLab", out[("fedlab", "fedavg")])
    return checks


def flower_references(layout: Layout, cases: Sequence[Case]) -> dict[str, dict[str, Any]]:
    """Checksums of fedbalance's FedAvg and median results, to compare with Flower's."""
    refs = {}
    for c in cases:
        if c.impl == "fedbalance" and c.operation in ("fedavg", "median") and c.output:
            refs[c.operation] = checksum(layout, [t.numpy() for t in c.output.params.values()])
    return refs


def flower_checks(
    refs: dict[str, dict[str, Any]], flower: dict[str, Any] | None
) -> list[tuple[str, bool]]:
    checks = []
    for op, a in refs.items():
        if flower is None or op not in flower:
            continue
        b = flower[op]
        ok = bool(
            np.allclose(a["head"], b["head"], rtol=1e-5, atol=1e-6)
            and np.isclose(a["abs_sum"], b["abs_sum"], rtol=1e-5)
            and np.isclose(a["sum"], b["sum"], rtol=1e-4, atol=1e-6 * a["abs_sum"])
        )
        checks.append((f"fedbalance {op} vs Flower: sum {a['sum']:.6g} vs {b['sum']:.6g}", ok))
    return checks


# -- the run ----------------------------------------------------------------------------------
def repeat(steps: Sequence[Case | FlowerStep], repeats: int, label: str) -> None:
    """One warm-up, then ``repeats`` timed rounds over ``steps``."""
    for r in range(-1, repeats):
        # Rotate the order each repeat so no implementation always follows the same one.
        k = max(r, 0) % len(steps)
        for s in [*steps[k:], *steps[:k]]:
            s.step(warmup=r < 0)
            gc.collect()
            trim_memory()
        print(f"{label}: {'warm-up' if r < 0 else f'repeat {r + 1}'} done", flush=True)


def run_clients(
    layout: Layout, clients: int, repeats: int, flower_python: Path | None, flower_note: str | None
) -> tuple[list[dict[str, Any]], list[tuple[str, bool]], dict[str, Any]]:
    total = numel(layout)
    label = f"{clients} clients"
    flower = FlowerStep(
        Case("flower", "fedavg", total, None, flower_note),
        Case("flower", "median", total, None, flower_note),
    )
    # Interleaved, Flower's process holds a second copy of the clients while FedLab or
    # torch-stacked hold two more: 4 copies, plus a quarter for the rest of the machine.
    # Without that much memory Flower runs after the others, on its own.
    avail = mem_available()
    interleave = flower_python is not None and (
        avail is None or avail >= 5 * copy_bytes(layout, clients)
    )
    if interleave:
        assert flower_python is not None
        flower.start(flower_python, layout, clients)
    start = time.perf_counter()
    c = Clients.make(layout, clients, SEED)
    print(f"{label}: generated in {time.perf_counter() - start:.1f} s", flush=True)
    try:
        flower.ready()
        cases = local_cases(c)  # after Flower holds its clients: the memory checks count them
        repeat([*cases, flower] if flower.worker else cases, repeats, label)
        checks = sanity_checks(layout, cases)
        refs = flower_references(layout, cases)
    finally:
        flower.close()
    records = [s.record(clients) for s in cases]
    del c, cases
    gc.collect()
    trim_memory()

    if flower_python is not None and not interleave:
        flower.start(flower_python, layout, clients)
        flower.ready()
        try:
            if flower.worker is not None:
                repeat([flower], repeats, f"{label}, Flower")
        finally:
            flower.close()
        for case in (flower.avg, flower.med):
            case.note = case.note or (
                "run after the others, not interleaved: too little memory for a second copy "
                "of the clients"
            )
    checks += flower_checks(refs, flower.check)
    if flower_python is not None or flower_note:
        records += [flower.avg.record(clients), flower.med.record(clients)]
    return records, checks, flower.info


#: Timed runs per implementation and client count (``--repeats``).
REPEATS = 5


def run(
    clients: Sequence[int] = (10, 100),
    repeats: int = REPEATS,
    flower: bool = True,
    tiny: bool = False,
    out_dir: Path = RESULTS,
    flower_venv: Path | None = None,
    threads: int | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """Run every case; returns the records and whether every sanity check passed."""
    if threads is not None:
        torch.set_num_threads(threads)
    layout = TINY_LAYOUT if tiny else resnet18_layout()
    load_start = machine_load()
    flower_python, flower_note = None, None
    if flower:
        flower_python, flower_note = ensure_flower(flower_venv or default_flower_venv())
        if flower_note:
            print(flower_note, flush=True)
    records: list[dict[str, Any]] = []
    checks: list[tuple[str, bool]] = []
    info: dict[str, Any] = {}
    for k in clients:
        recs, chk, inf = run_clients(layout, k, repeats, flower_python, flower_note)
        records += recs
        checks += [(f"{k} clients: {text}", ok) for text, ok in chk]
        info = info or inf
    load = f"load average {load_start} at the start, {machine_load()} at the end"
    command = "fedbalance bench perf-aggregate"
    command += "" if repeats == REPEATS else f" --repeats {repeats}"
    command += "" if threads is None else f" --threads {threads}"
    write(records, checks, info, layout, out_dir, repeats, load, command)
    return records, all(ok for _, ok in checks)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--no-flower", action="store_true", help="skip the Flower comparison")
    ap.add_argument(
        "--flower-venv",
        type=Path,
        default=None,
        help="virtual environment for flwr, created on first use "
        "(default: .venv-flower in a source checkout, else ~/.cache/fedbalance/venv-flower)",
    )
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="smoke run: ~100 k values, 3 clients, 1 repeat, no Flower, results in a temp dir",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=None, help=f"results directory (default {RESULTS})")
    a = ap.parse_args(argv)
    if min(a.clients) < 1 or a.repeats < 1 or (a.threads is not None and a.threads < 1):
        ap.error(
            f"--clients, --repeats and --threads must be >= 1, got {a.clients}, {a.repeats} "
            f"and {a.threads}"
        )
    if a.tiny:
        out = a.out or Path(tempfile.gettempdir()) / "fedbalance-perf-aggregate-tiny"
        _, ok = run((3,), 1, False, True, out, threads=a.threads)
    else:
        _, ok = run(
            a.clients,
            a.repeats,
            not a.no_flower,
            False,
            a.out or RESULTS,
            a.flower_venv,
            a.threads,
        )
    if not ok:
        print("sanity check failed: implementations disagree (see above)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
