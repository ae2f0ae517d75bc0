"""The partitioners' pictures for the documentation site, drawn from the code.

``python -m fedbalance_benchmarks.docs_pictures OUT`` partitions a synthetic label array
(10 classes of 600 samples, Fashion-MNIST's class balance at a tenth of its size) over 20
clients with every built-in scheme and draws each as per-client class bars
(:func:`fl_partitions.plots.plot_class_bars`). ``make docs`` runs it before the site is built,
so a page never shows a picture of code that has changed since.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from fl_partitions import make_partitioner
from fl_partitions.plots import plot_class_bars

CLIENTS = 20
SEED = 0
#: Picture file stem -> the spec it draws (the docs' partitioners page shows each).
SPECS: dict[str, dict[str, Any]] = {
    "iid": {"name": "iid"},
    "label_dirichlet": {"name": "label_dirichlet", "beta": 0.5},
    "label_quantity": {"name": "label_quantity", "k": 2},
    "quantity_dirichlet": {"name": "quantity_dirichlet", "beta": 0.5},
    "global_imbalance": {"name": "global_imbalance", "profile": "letters"},
    "mixed": {"name": "mixed"},
}


def labels() -> np.ndarray:
    return np.repeat(np.arange(10), 600)


def draw(out: Path) -> list[Path]:
    """Write one PNG per scheme in :data:`SPECS` to ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, spec in SPECS.items():
        partition = make_partitioner(spec).partition(labels(), CLIENTS, seed=SEED)
        title = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
        title = f"{spec['name']} ({title})" if title else spec["name"]
        written.append(plot_class_bars(partition, out / f"{stem}.png", title=title))
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for the PNG files")
    args = parser.parse_args(argv)
    for path in draw(args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
