"""The same partition under every numpy: digests of every built-in partitioner's output.

Flower's environment has numpy 2.x and the main one numpy 1.26 (FedML 0.9.6 pins it), so the
"same" scenario on two hosts is the same data only if every partitioner gives the same indices,
local splits and label flips included, under both. :func:`digests` partitions labels of several
sizes and seeds with every scheme (composed ones too) and hashes the result; ``tests/data/
partition_digests.json`` holds the digests, and a test in each suite compares its numpy's with
them. Regenerate (only when a partitioner's output is meant to change):

    .venv/bin/python tests/partition_digests.py > tests/data/partition_digests.json
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

GOLDEN = Path(__file__).resolve().parent / "data" / "partition_digests.json"
SPECS: dict[str, dict[str, Any]] = {
    "iid": {"name": "iid"},
    "label_dirichlet": {"name": "label_dirichlet", "beta": 0.5},
    "label_quantity": {"name": "label_quantity", "k": 2},
    "quantity_dirichlet": {"name": "quantity_dirichlet", "beta": 0.5},
    "feature_noise": {"name": "feature_noise", "sigma": 0.1},
    "global_imbalance": {"name": "global_imbalance"},
    "global_imbalance_half_normal": {
        "name": "global_imbalance",
        "profile": "half_normal",
        "then": {"name": "label_dirichlet", "beta": 0.3},
    },
    "global_imbalance_letters": {"name": "global_imbalance", "profile": "letters"},
    "mixed": {"name": "mixed"},
    "mixed_imbalance_quantity": {
        "name": "mixed",
        "components": [
            {"name": "global_imbalance", "exponent": 0.7},
            {"name": "quantity_dirichlet", "beta": 1.0},
            {"name": "feature_noise", "sigma": 0.2},
        ],
    },
    "label_noise": {"name": "label_noise"},
    "mixed_label_noise_pair": {
        "name": "mixed",
        "components": [
            {"name": "label_dirichlet", "beta": 0.5},
            {"name": "feature_noise", "sigma": 0.1},
            {"name": "label_noise", "share": 0.5, "rate": 0.2, "mode": "pair"},
        ],
    },
}
#: (samples, classes, clients): the sizes each scheme is run on, each with several seeds.
SIZES = ((1_000, 10, 10), (20_000, 10, 20), (6_000, 26, 30))
SEEDS = (0, 7, 11)


def digest(partition: Any) -> str:
    h = hashlib.sha256()
    for c in range(partition.num_clients):
        h.update(np.asarray(partition.client_indices[c], np.int64).tobytes())
        for split in ("train", "val", "test"):
            h.update(np.asarray(partition.splits[c][split], np.int64).tobytes())
    h.update(np.asarray(partition.noise_std, np.float64).tobytes())
    # Label flips only where there are any, so the digests of earlier schemes stay as they were.
    for c, flips in sorted((partition.label_flips or {}).items()):
        h.update(np.asarray([c], np.int64).tobytes())
        h.update(np.asarray(flips.indices, np.int64).tobytes())
        h.update(np.asarray(flips.labels, np.int64).tobytes())
    return h.hexdigest()[:16]


def digests() -> dict[str, str]:
    from fl_partitions.builtin import make_partitioner

    out = {}
    for name, spec in SPECS.items():
        for n, classes, clients in SIZES:
            for seed in SEEDS:
                labels = np.random.default_rng(1000 + seed).integers(0, classes, n)
                part = make_partitioner(spec).partition(labels, clients, seed=seed)
                out[f"{name}/n{n}/c{classes}/k{clients}/seed{seed}"] = digest(part)
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    json.dump({"numpy": np.__version__, "digests": digests()}, sys.stdout, indent=1)
    sys.stdout.write("\n")
