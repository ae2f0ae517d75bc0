"""fedbalance as users install it: the built sdist and wheel, non-editable, beside their stacks.

The wheel is built from the sdist (``python -m build``), so both are checked: their contents
against the source tree, then the wheel installed into fresh environments shaped like users'
(see :mod:`stacks`): the core alone (torch + numpy), an existing FedLab 1.3.0 stack and an
existing FedML 0.9.6 stack. Every command runs from a directory outside the checkout, so only
the installed copy can be imported.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import stacks
import yaml
from helpers import records

# Tests of this module may run on several xdist workers at once: each worker builds the
# distributions and asks for the stacks, and tests/stacks.py's locks make the builds take turns
# and share one install of the same wheel per stack.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
ROOT = stacks.ROOT
HOSTS = Path(__file__).parent / "hosts"
FMNIST = Path("/usr/share/datasets/fashion-mnist")
needs_fmnist = pytest.mark.skipif(
    not FMNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed (make setup)"
)


def package_roots() -> dict[str, str]:
    """setup.py's import name -> source folder mapping, read without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "ROOTS":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no ROOTS mapping")


def tracked(folder: str) -> list[str]:
    """The source files under ``folder``: committed or new, not ignored (no caches)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", folder],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    with stacks.locked("build"):  # the sdist is built in the checkout: one build at a time
        build = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
            capture_output=True,
            text=True,
        )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return {"wheel": next(out.glob("*.whl")), "sdist": next(out.glob("*.tar.gz"))}


def test_wheel_and_sdist_hold_every_module_and_data_file(dists: dict[str, Path]) -> None:
    """The wheel holds every module and report; the sdist also the per-run records."""
    expected = {"fedbalance_autoload.pth"}
    sources = {"pyproject.toml", "setup.py", "README.md", "MANIFEST.in", "fedbalance_autoload.pth"}
    for name, folder in package_roots().items():
        files = tracked(folder)
        assert files, folder
        # The benchmarks' per-run records go in the sdist only (they rebuild the reports).
        expected |= {name + f.removeprefix(folder) for f in files if "/results/per-run/" not in f}
        sources |= set(files)
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        shipped = {n for n in wheel.namelist() if ".dist-info/" not in n}
        entry_points = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
        # The console script only: the built-in plugins are registered directly.
        assert "[fedbalance]" not in wheel.read(entry_points).decode()
    assert sorted(expected - shipped) == [], "missing from the wheel"
    assert sorted(shipped - expected) == [], "in the wheel but not in the source tree"
    with tarfile.open(dists["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert sorted(sources - names) == [], "missing from the sdist"


def run(
    cmd: list[str], cwd: Path, timeout: float = 600, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FEDBALANCE_", "PYTHON", "VIRTUAL_ENV"))
    }
    return subprocess.run(
        cmd,
        cwd=cwd,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def told(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("fedbalance: ")]


def checksum(stdout: str) -> float:
    return float(next(ln for ln in stdout.splitlines() if ln.startswith("CHECKSUM")).split()[1])


def assert_installed_copy(python: Path, cwd: Path) -> None:
    out = run([str(python), "-c", "import fl_adapters; print(fl_adapters.__file__)"], cwd)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(python.parents[1]), out.stdout  # not ROOT's


# -- the core alone -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def core(dists: dict[str, Path]) -> Path:
    return stacks.install_wheel("core", dists["wheel"])


def test_core_alone_lists_and_partitions_without_any_host(core: Path, tmp_path: Path) -> None:
    assert_installed_copy(core, tmp_path)
    probe = run(
        [
            str(core),
            "-c",
            "import importlib.util as u, fl_aggregators, fl_partitions, fl_adapters.autoload; "
            "print([h for h in ('fedlab', 'fedml') if u.find_spec(h)])",
        ],
        tmp_path,
    )
    assert probe.returncode == 0 and probe.stdout.strip() == "[]", probe.stderr
    fedbalance = str(core.parent / "fedbalance")
    listed = run([fedbalance, "list"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    for name in ("fedloss", "fedloss_n", "astraea", "mixed", "label_dirichlet"):
        assert name in listed.stdout
    labels = np.random.default_rng(0).integers(0, 10, 3000)
    np.save(tmp_path / "labels.npy", labels)
    part = run(
        [fedbalance, "partition", "--dataset", "npy:labels.npy", "--scheme", "mixed"]
        + ["--clients", "7", "--seed", "3", "--out", "p.json"],
        tmp_path,
    )
    assert part.returncode == 0, part.stderr
    doc = json.loads((tmp_path / "p.json").read_text())
    from fl_partitions import make_partitioner  # the same partition as the source tree's

    mine = make_partitioner({"name": "mixed"}).partition(labels, 7, seed=3)
    got = json.dumps(doc)
    assert all(str(len(c)) in got for c in mine.client_indices)
    assert told(listed.stderr + part.stderr) == []


# -- an existing FedLab stack ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def fedlab(dists: dict[str, Path]) -> Path:
    return stacks.install_wheel("fedlab", dists["wheel"], extras="fedlab,bench")


def test_fedlab_stock_script_runs_stock_and_with_the_variable(fedlab: Path, tmp_path: Path) -> None:
    assert_installed_copy(fedlab, tmp_path)
    script = str(HOSTS / "fedlab_stock_standalone.py")
    stock = run([str(fedlab), script, "2"], tmp_path)
    assert stock.returncode == 0, stock.stderr[-3000:]
    assert told(stock.stderr) == []
    rec = tmp_path / "rec.jsonl"
    armed = run(
        [str(fedlab), script, "2"],
        tmp_path,
        FEDBALANCE_AGGREGATOR="fedloss",
        FEDBALANCE_RECORD=str(rec),
    )
    assert armed.returncode == 0, armed.stderr[-3000:]
    lines = records(rec)
    assert [r["round"] for r in lines] == [1, 2] and {r["aggregator"] for r in lines} == {"fedloss"}
    assert all(r["host"] == "fedlab" for r in lines)
    assert checksum(armed.stdout) != checksum(stock.stdout)


@pytest.fixture(scope="module")
def mnist_format(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 6,000 / 2,000 Fashion-MNIST images as idx files where torchvision's ``MNIST``
    looks (same format; fewer samples keep FedLab's per-sample pickling short)."""
    root = tmp_path_factory.mktemp("mnist")
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in FMNIST.glob("*-ubyte.gz"):
        keep = 6000 if f.name.startswith("train") else 2000
        data = gzip.decompress(f.read_bytes())
        header = 16 if "images" in f.name else 8  # magic, count[, rows, cols]: big-endian int32
        item = 28 * 28 if "images" in f.name else 1
        head = data[:4] + keep.to_bytes(4, "big") + data[8:header]
        (raw / f.name.removesuffix(".gz")).write_bytes(head + data[header : header + keep * item])
    return root


@needs_fmnist
def test_fedlab_example_style_runs_stock_and_with_the_variable(
    fedlab: Path, mnist_format: Path, tmp_path: Path
) -> None:
    script = str(HOSTS / "fedlab_example_standalone.py")
    common = [script, "--root", str(mnist_format), "--path", str(tmp_path / "fed")]
    # FedLab's own dataset classes pickle whole objects: a host bug on torch >= 2.6.
    env = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    stock = run([str(fedlab), *common, "--preprocess"], tmp_path, **env)
    assert stock.returncode == 0, stock.stderr[-3000:]
    assert stock.stdout.count("test-acc") == 2 and told(stock.stderr) == []
    # Armed, and with the line docs/run.md gives: bias.figures on FedLab's own loaders (one
    # run for both: each FedLab start of this stack costs seconds of imports).
    rec = tmp_path / "rec.jsonl"
    script = str(HOSTS / "fedlab_example_figures.py")
    shown = run(
        [str(fedlab), script, *common[1:]],
        tmp_path,
        FEDBALANCE_AGGREGATOR="fedavgm",
        FEDBALANCE_RECORD=str(rec),
        **env,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    got = [r["aggregator"] for r in records(rec)]
    assert got == ["fedavgm", "fedavgm"], shown.stderr[-3000:]  # stderr says if it armed
    assert checksum(shown.stdout) != checksum(stock.stdout)
    accs = [float(line.split("test-acc ")[1]) for line in shown.stdout.splitlines()
            if "test-acc" in line]  # fmt: skip
    found = [json.loads(line.split(" ", 1)[1]) for line in shown.stdout.splitlines()
             if line.startswith("FIGURES ")]  # fmt: skip
    assert len(found) == len(accs) == 2
    for acc, fig in zip(accs, found, strict=True):  # FedLab's evaluate, the same pass's figures
        assert round(fig["accuracy"], 4) == acc and fig["samples"] == 2000
        present = [r for r in fig["class_recall"] if r is not None]
        assert fig["balanced_accuracy"] == pytest.approx(sum(present) / len(present))
        assert fig["worst_class_recall"] == min(present)
    per_client = [json.loads(line.split(" ", 2)[2]) for line in shown.stdout.splitlines()
                  if line.startswith("CLIENT FIGURES ")]  # fmt: skip
    assert [f["clients_evaluated"] for f in per_client] == [3, 3]
    assert sorted(per_client[0]["client_accuracy"]) == ["0", "1", "2"]


def test_a_bundled_benchmark_runs_from_the_installed_wheel(fedlab: Path, tmp_path: Path) -> None:
    out = run(
        [str(fedlab.parent / "fedbalance"), "bench", "thesis", "--quick", "--dataset", "digits"]
        + ["--rounds", "1", "--workers", "1", "--scenarios", "mixed", "--aggregators", "fedloss"]
        + ["--out", str(tmp_path / "bench")],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((tmp_path / "bench" / "thesis_digits_quick.json").read_text())
    assert [len(r["accuracy"]) for r in doc["runs"]] == [1]
    assert "| fedloss " in (tmp_path / "bench" / "thesis_digits_quick.md").read_text()


# -- an existing FedML stack ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def fedml(dists: dict[str, Path]) -> Path:
    return stacks.install_wheel("fedml", dists["wheel"], extras="bench")


@needs_fmnist
@pytest.mark.parametrize("aggregator", [None, "fedloss"], ids=["stock", "fedloss"])
def test_fedml_example_host_in_sp(fedml: Path, tmp_path: Path, aggregator: str | None) -> None:
    assert_installed_copy(fedml, tmp_path)
    where = run([str(fedml), "-c", "import fl_adapters as a; print(a.__file__)"], tmp_path)
    example = tmp_path / "example"  # a user copies the bundled example and edits its YAML
    shutil.copytree(Path(where.stdout.strip()).parent / "fedml" / "example", example)
    doc = yaml.safe_load((example / "sp.yaml").read_text())
    doc["data_args"]["max_samples"] = 1000
    doc["train_args"].pop("aggregator")
    if aggregator:
        doc["train_args"]["aggregator"] = aggregator
    (example / "run.yaml").write_text(yaml.safe_dump(doc))
    rec = tmp_path / "rec.jsonl"
    out = run([str(fedml), "main.py", "--cf", "run.yaml"], example, FEDBALANCE_RECORD=str(rec))
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert told(out.stderr) == []
    lines = records(rec)
    if aggregator is None:
        assert lines == []  # stock FedML: fedbalance aggregated nothing
    else:
        assert [r["round"] for r in lines] == [1, 2]
        assert all(r["host"] == "fedml-sp" and r["aggregator"] == "fedloss" for r in lines)
