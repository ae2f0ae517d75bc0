"""Reliability under bad input: what the command line does with broken configs and arguments,
and what one client's lie about its label counts does to Astraea's plan.

The bad-input and Astraea sections of the reliability report
(:mod:`fedbalance_benchmarks.reliability`). Neither trains: each config and command line goes
through ``fedbalance``'s own ``main`` (exit status and message), and the lies change only the
counts the plan is made from.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from fedbalance_benchmarks._runs import path_slug

BASE_CONFIG: dict[str, Any] = {
    "framework": "fedlab",
    "dataset": "digits",
    "num_clients": 4,
    "clients_per_round": 2,
    "rounds": 1,
    "partition": {"name": "label_dirichlet", "beta": 0.5},
    "aggregator": "fedloss",
}
BAD_CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("unknown key", {"learning_rate": 0.1}),
    ("wrong type", {"rounds": "ten"}),
    ("beta <= 0", {"partition": {"name": "label_dirichlet", "beta": 0}}),
    ("sigma < 0", {"partition": {"name": "feature_noise", "sigma": -0.1}}),
    ("unknown aggregator", {"aggregator": "fedprox"}),
    ("gamma < 1", {"aggregator": "astraea", "aggregator_args": {"gamma": 0}}),
    ("tau_d <= 0", {"aggregator": "astraea", "aggregator_args": {"tau_d": -1}}),
    ("loss_clip < 1", {"aggregator_args": {"loss_clip": 0.5}}),
    ("unknown aggregator argument", {"aggregator_args": {"clip": 5}}),
    ("clients_per_round > num_clients", {"clients_per_round": 9}),
    ("more clients than samples", {"num_clients": 5000}),
]
BAD_ARGV: list[tuple[str, list[str]]] = [
    ("negative client count", "partition --dataset digits --clients -3 --out x.json".split()),
    (
        "unknown scheme",
        "partition --dataset digits --clients 4 --scheme nope --out x.json".split(),
    ),
    (
        "bad --set value",
        "partition --dataset digits --clients 4 --scheme label_dirichlet --set beta=abc "
        "--out x.json".split(),
    ),
    ("missing config file", ["run", "does-not-exist.yaml"]),
    ("count matrix with a negative", ["astraea", "plan", "--class-counts", "{counts}"]),
]


def bad_inputs(work: Path) -> list[list[str]]:
    """Run each bad config / command line through the CLI: exit status and first line."""
    import yaml

    from fl_adapters.cli import main

    work.mkdir(parents=True, exist_ok=True)
    counts = work / "counts.json"
    counts.write_text(json.dumps([[3, -1], [2, 2]]))
    cases: list[tuple[str, list[str]]] = []
    for name, change in BAD_CONFIGS:
        path = work / f"{path_slug(name)}.yaml"
        path.write_text(yaml.safe_dump({**BASE_CONFIG, **change}))
        cases.append((f"config: {name}", ["run", str(path), "--out", str(work / "out")]))
    cases += [
        (f"cli: {name}", [a.replace("{counts}", str(counts)) for a in argv])
        for name, argv in BAD_ARGV
    ]
    rows = []
    for name, argv in cases:
        err = io.StringIO()
        traceback = False
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except Exception as e:  # noqa: BLE001 - a traceback is what we are checking for
                code, traceback = -1, True
                err.write(f"{type(e).__name__}: {e}")
        lines = [x for x in err.getvalue().splitlines() if x.strip() and not x.startswith("usage")]
        message = lines[-1] if lines else ""
        rows.append([name, str(code), "traceback" if traceback else "clear error", message[:200]])
    return rows


def astraea_lies(opts: dict[str, Any]) -> list[list[str]]:
    """One client lies about its label counts on a partition like the Astraea benchmark's
    (its earlier design: 100 clients, each client's 70 % training split)."""
    import numpy as np

    from fl_adapters.astraea import label_counts
    from fl_adapters.config import RunConfig
    from fl_adapters.fedlab.astraea import client_labels
    from fl_adapters.fedlab.runner import build
    from fl_aggregators.astraea_plan import plan_rebalance

    config = {  # 100 clients (20 --quick, of 6,000 samples), letters profile, label Dir(0.5)
        "dataset": opts["dataset"],
        "model": "astraea_cnn",
        "partition": {
            "name": "global_imbalance",
            "profile": "letters",
            "then": {"name": "label_dirichlet", "beta": 0.5},
        },
        "aggregator": "astraea",
        "num_clients": 20 if opts["quick"] else 100,
        "max_samples": 6000 if opts["quick"] else None,
        "seed": 0,
    }
    exp = build(RunConfig.from_dict(config))
    honest = np.stack([label_counts(y, exp.num_classes) for y in client_labels(exp.data)]).astype(
        float
    )
    clean = plan_rebalance(honest, 3.5)
    sizes = honest.sum(axis=0)
    smallest, largest = int(np.argmin(sizes)), int(np.argmax(sizes))
    rows = []
    for lie, target, factor in (
        ("claims 1000x its smallest class", smallest, 1000.0),
        ("claims 1000x its largest class", largest, 1000.0),
    ):
        counts = honest.copy()
        counts[0, target] = max(counts[0, target], 1.0) * factor
        for rule, clip in (("paper (plain sum)", None), ("count_clip 20 (default)", 20.0)):
            plan = plan_rebalance(counts, 3.5, clip)
            moved = np.abs(plan.rad - clean.rad).max()
            rows.append(
                [
                    lie,
                    rule,
                    str(clean.augment),
                    str(plan.augment),
                    f"{clean.rad[target]:.2f} -> {plan.rad[target]:.2f}",
                    f"{moved:.2f}",
                ]
            )
    return rows


ASTRAEA_LIES_HEADER = [
    "lie (client 0)",
    "plan rule",
    "augment (honest)",
    "augment (with lie)",
    "rad of that class",
    "max abs Δ rad",
]
