"""The inputs ``fedbalance bench hostile`` tries (:data:`CASES`), each with what its directory
needs first: hostile and careless configs, files, environments and plugins. How each is run and
judged is :mod:`fedbalance_benchmarks.hostile`."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

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
    """One input: the argv and its environment (where ``{dir}`` is the case's directory and
    ``{pid}`` this process, the case's parent), what ``setup`` writes first, the words the one
    error line must hold (``None``: the run must succeed), and ``check``, what must hold on disk
    afterwards."""

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
    #: Bytes a file may grow to (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored): a disk that fills up.
    file_limit: int | None = None


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


def _stopped_run(d: Path) -> None:
    """``run.yaml`` and, in ``out``, the metrics of a run killed in round 1 (no checkpoint)."""
    (d / "run.yaml").write_text(BASE)
    (d / "out").mkdir()
    (d / "out" / "metrics.jsonl").write_text("")


#: Sockets a case's setup holds open until its process has ended (:func:`run_case`).
HELD_SOCKETS: list[socket.socket] = []


def _port_in_use(d: Path) -> None:
    """A ``fedlab-distributed`` config on a port this process listens on."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    HELD_SOCKETS.append(held)
    port = held.getsockname()[1]
    (d / "run.yaml").write_text(
        BASE.replace("framework: fedlab\n", "framework: fedlab-distributed\n") + f"port: {port}\n"
    )


def _finished_run(d: Path) -> None:
    """``run.yaml`` and, in ``out``, a finished run's metrics and summary."""
    (d / "run.yaml").write_text(BASE)
    (d / "out").mkdir()
    (d / "out" / "metrics.jsonl").write_text('{"round": 1}\n')
    (d / "out" / "summary.json").write_text('{"rounds": 1}\n')


def _nan_checkpoint(d: Path) -> None:
    import torch

    from fl_adapters.checkpoint import Checkpoint

    (d / "run.yaml").write_text(BASE)
    (d / "out").mkdir()
    Checkpoint(
        config={}, round=1, model=torch.full((4,), float("nan")), aggregator={"round": 1},
        participations={}, host="fedlab",
    ).save(d / "out" / "checkpoint.pt")  # fmt: skip


def _zip_bomb(d: Path) -> None:
    """``images.npz`` whose ``x_train`` (a few MB) inflates to more 8-bit zeros than half this
    machine's memory holds once read as float32: one deflated block of zeros written again and
    again (a full flush makes every block's bytes the same), so nothing large is compressed."""
    import io
    import struct
    import zipfile
    import zlib

    from fl_adapters.user_data import _memory_cap

    _images_run(d)
    block = 1 << 24  # 256 images of 256 x 256
    blocks = _memory_cap() // 5 // block + 1  # 5 bytes a pixel once read: uint8 + float32
    header = io.BytesIO()
    shape = (blocks * 256, 256, 256)
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|u1", "fortran_order": False, "shape": shape}
    )
    head, zeros = header.getvalue(), bytes(block)
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = z.compress(head) + z.flush(zlib.Z_FULL_FLUSH)
    body = z.compress(zeros) + z.flush(zlib.Z_FULL_FLUSH)
    last = z.flush()
    crc = zlib.crc32(head)
    for _ in range(blocks):
        crc = zlib.crc32(zeros, crc)
    size, packed = len(head) + blocks * block, len(first) + blocks * len(body) + len(last)
    # Deflated (8), sizes in the ZIP64 extra field (1) as they may pass 4 GiB, at offset 0.
    name, big, zip64 = b"x_train.npy", 0xFFFFFFFF, struct.pack("<HHQQ", 1, 16, size, packed)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 33, crc, big, big, 11, 20)
    central = struct.pack(
        "<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 8, 0, 33, crc, big, big, 11, 20, 0, 0, 0,
        0, 0,
    )  # fmt: skip
    with open(d / "images.npz", "wb") as f:
        f.write(local + name + zip64 + first)
        for _ in range(blocks):
            f.write(body)
        f.write(last)
        directory, at = central + name + zip64, f.tell()
        f.write(directory + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(directory), at, 0))
    labels = io.BytesIO()
    np.save(labels, np.arange(shape[0], dtype=np.uint8) % 3)
    with zipfile.ZipFile(d / "images.npz", "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("y_train.npy", labels.getvalue())


def _odd_members(flags: int = 0, method: int | None = None) -> Callable[[Path], None]:
    """An ``images.npz`` whose members carry general-purpose ``flags`` and compression
    ``method`` in their local and central headers, as another zip tool may write them."""

    def setup(d: Path) -> None:
        _images_run(d)
        data = bytearray((d / "images.npz").read_bytes())
        for signature, flag_at, method_at in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
            at = data.find(signature)
            while at != -1:
                data[at + flag_at] |= flags
                if method is not None:
                    data[at + method_at : at + method_at + 2] = method.to_bytes(2, "little")
                at = data.find(signature, at + 4)
        (d / "images.npz").write_bytes(bytes(data))

    return setup


def _plugin(module: str, source: str) -> Callable[[Path], None]:
    """``run.yaml`` and a plugin ``module`` (``fb_<module>``, its code ``source``) in
    ``site/``, found through its ``.dist-info`` on ``PYTHONPATH``: nothing installed."""

    def setup(d: Path) -> None:
        (d / "run.yaml").write_text(BASE)
        info = d / "site" / f"fb_{module}-0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fb-{module}\nVersion: 0\n")
        (info / "entry_points.txt").write_text(f"[fedbalance]\n{module} = fb_{module}\n")
        (d / "site" / f"fb_{module}.py").write_text(source)

    return setup


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
        ["holds another run's records (metrics.jsonl, summary.json)", "--overwrite"],
        _finished_run,
        check=lambda d: (d / "out" / "metrics.jsonl").read_text() == '{"round": 1}\n',
    ),
    Case(
        "a fresh run into the --out of a run killed before its first checkpoint",
        [*RUN, "--out", "{dir}/out"],
        ["stopped before its first checkpoint", "--overwrite to start it again"],
        _stopped_run,
    ),
    Case(
        "--resume a run killed before its first checkpoint",
        [*RUN, "--out", "{dir}/out", "--resume"],
        ["no checkpoint at", "start the run again without --resume and with --overwrite"],
        _stopped_run,
    ),
    Case(
        "fedlab-distributed on a port another process listens on",
        [*RUN, "--out", "{dir}/out"],
        ["is already in use", "set another port"],
        _port_in_use,
        check=lambda d: not (d / "out" / "metrics.jsonl").exists(),
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
    # Issue #61, the second hostile pass: each fixed with a test of its own, listed here too.
    Case(
        "FEDBALANCE_HELD_OUT naming a finished run's --out",
        [*RUN, "--out", "{dir}/out"],
        ["holds another run's records (metrics.jsonl, summary.json)", "--overwrite"],
        _finished_run,
        env={"FEDBALANCE_HELD_OUT": "{dir}/out|{pid}"},  # {pid}: an ancestor without the lock
        check=lambda d: (d / "out" / "metrics.jsonl").read_text() == '{"round": 1}\n',
    ),
    Case(
        "FEDBALANCE_RECORD inside --out",
        [*RUN, "--out", "{dir}/out"],
        ["/out/metrics.jsonl is inside --out", "point FEDBALANCE_RECORD outside"],
        _write("run.yaml", BASE),
        env={"FEDBALANCE_RECORD": "{dir}/out/metrics.jsonl"},
        check=lambda d: not (d / "out").exists(),
    ),
    Case(
        "a plugin that calls sys.exit(3) on import (list)",
        [*FEDBALANCE, "list"],
        ["plugin 'quits' from fb-quits failed to import (fb_quits): called sys.exit(3)"],
        _plugin("quits", "import sys\n\nsys.exit(3)\n"),
        env={"PYTHONPATH": "{dir}/site"},
    ),
    Case(
        "a plugin whose hook returns a partitioner as an aggregator",
        CHECK,
        [
            "plugin 'liar' from fb-liar: fedbalance_aggregators() returned",
            "not a subclass of fl_aggregators.Aggregator",
        ],
        _plugin(
            "liar",
            "from fl_adapters.hookspecs import hookimpl\nfrom fl_partitions import IID\n\n\n"
            "@hookimpl\ndef fedbalance_aggregators():\n    return [IID]\n",
        ),
        env={"PYTHONPATH": "{dir}/site"},
    ),
    Case(
        "npy:images.npz whose x_train inflates past half the memory (a zip bomb)",
        CHECK,
        ["[x_train]:", "once read as float32) is more than half of this machine's memory"],
        _zip_bomb,
    ),
    Case(
        "npy:images.npz with an encrypted member",
        CHECK,
        ["[x_train]: the member is encrypted; give the arrays unencrypted"],
        _odd_members(flags=0x1),
    ),
    Case(
        "npy:images.npz with zip method 99",
        CHECK,
        ["[x_train]: the member is compressed with zip method 99"],
        _odd_members(method=99),
    ),
    Case(
        "npy:images.npz of 1x1 images",
        CHECK,
        ["at least 16x16 pixels, got 1x1"],
        lambda d: _images_run(d, x=np.arange(60, dtype=np.uint8).reshape(60, 1, 1)),
    ),
    Case(
        "npy:images.npz of float64 pixels beyond float32's range",
        CHECK,
        ["[x_train]: pixel values reach", "beyond float32's range"],
        lambda d: _images_run(d, x=np.random.default_rng(0).random((60, 20, 20)) * 1e300),
    ),
    Case(
        "FEDBALANCE_DISABLE_HOST_AUTOLOAD=1 under framework: fedml-sp",
        [*RUN, "--out", "{dir}/out"],
        [
            "FEDBALANCE_DISABLE_HOST_AUTOLOAD=1 keeps fedbalance out of FedML's processes, so"
            " 'fedbalance run' cannot apply",
            "there: unset it",
        ],
        _write("run.yaml", BASE.replace("fedlab", "fedml-sp")),
        env={"FEDBALANCE_DISABLE_HOST_AUTOLOAD": "1"},
        check=lambda d: not (d / "out" / "metrics.jsonl").exists(),
    ),
    Case(
        "a disk that fills up while round 1's checkpoint is written",
        [*RUN, "--out", "{dir}/out"],
        ["cannot write the checkpoint of round 1", "(File too large;", "no earlier round"],
        _images_run,
        # No .pyc (one cut short at the limit would stay), no numba (whose cache may need
        # writing, and whose compiler needs more than the 1 GiB): the checkpoint is the case.
        env={"PYTHONDONTWRITEBYTECODE": "1", "FEDBALANCE_KERNELS": "0"},
        check=lambda d: not any((d / "out").glob("checkpoint.pt*")),  # no .tmp left either
        file_limit=1 << 16,  # the records fit; the checkpoint (~170 kB) does not
    ),
)
