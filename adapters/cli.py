"""The ``fedbalance`` command line.

Every error a user can cause (bad value, unknown name, missing dataset, unreadable file) is
printed as one line naming what was wrong, and the exit status is 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import random
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fl_adapters._table import PARTITION_HEADER, markdown_table, partition_row
from fl_adapters.autoload import HostNotSupported
from fl_adapters.config import RunConfig, RunFailed
from fl_adapters.hosts import RunOptions, builtin_hosts
from fl_adapters.inputs import InputError, load_json, load_yaml
from fl_adapters.registry import build_aggregator, get_registry
from fl_adapters.run.directory import claim
from fl_adapters.run.lifecycle import check_learned
from fl_checks import FedbalanceError

#: What the CLI reports as one line and exit 2: fedbalance's errors about its input, an
#: unsupported host release (``HostNotSupported`` lives in the import-time autoload, which stays
#: free of the core's imports) and the operating system's refusals about the user's paths.
#: Anything else is a bug and keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (
    FedbalanceError,
    HostNotSupported,
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)


#: The most class counts ``astraea plan --class-counts`` reads (clients x classes).
MAX_COUNTS = 1_000_000


class UsageError(FedbalanceError, ValueError):
    """A command-line value that does not fit (exit status 2)."""


def parse_assignments(pairs: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs with YAML values (``beta=0.5``, ``components=[...]``)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects key=value, got {pair!r}")
        try:
            out[key.strip()] = load_yaml(raw, f"--set {key.strip()}")
        except InputError as e:
            raise UsageError(str(e)) from None
    return out


def read_spec(path: str) -> dict[str, Any]:
    try:
        doc = load_yaml(Path(path).read_text(), f"--spec {path}")
    except OSError as e:
        raise UsageError(f"--spec {path}: cannot read a YAML mapping ({e})") from e
    except InputError as e:
        raise UsageError(str(e)) from None
    if not isinstance(doc, dict):
        raise UsageError(
            f"--spec {path}: must hold a mapping with 'name' and parameters, got {type(doc).__name__}"
        )
    return doc


# -- commands ---------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    reg = get_registry().as_dict()
    if args.json:
        print(json.dumps(reg, indent=2))
        return 0
    for kind, infos in reg.items():
        print(f"{kind}:")
        width = max((len(i["name"]) for i in infos), default=0)
        for info in infos:
            print(f"  {info['name'].ljust(width)}  {info['description']}  [{info['source']}]")
        if not infos:
            print("  (none)")
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    from fl_adapters.datasets import load_labels

    spec: dict[str, Any] = read_spec(args.spec) if args.spec else {}
    if args.scheme:
        spec["name"] = args.scheme
    if "name" not in spec:
        raise UsageError("give --scheme NAME or a --spec file with a 'name'")
    spec.update(parse_assignments(args.set))
    partitioner = get_registry().make_partitioner(spec)
    if Path(args.out).is_dir():
        raise UsageError(
            f"--out {args.out} is a directory: name the partition file, e.g. DIR/p.json"
        )
    labels = load_labels(args.dataset, args.data_dir, args.download)
    start = time.perf_counter()
    partition = partitioner.partition(labels, args.clients, seed=args.seed)
    elapsed = time.perf_counter() - start
    out = Path(args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        partition.save(out, extra={"dataset": args.dataset, "elapsed_s": round(elapsed, 6)})
    except OSError as e:
        raise UsageError(
            f"--out {out}: cannot write the partition there ({e.strerror or e})"
        ) from None
    print(
        markdown_table(
            PARTITION_HEADER, [partition_row(partition.spec["name"], partition, elapsed)]
        )
    )
    print(f"wrote {out}")
    if args.plot:
        from fl_partitions.plots import plot_class_bars

        plot_class_bars(partition, args.plot, title=f"{args.dataset}: {partition.spec['name']}")
        print(f"wrote {args.plot}")
        if partition.noise_std.any() and not args.dataset.endswith(".npy"):  # images to show
            from fl_adapters.datasets import load_dataset
            from fl_partitions.plots import plot_partition_noise

            train = load_dataset(args.dataset, train=True, data_dir=args.data_dir)
            noise = plot_partition_noise(
                partition, train, Path(args.plot).with_suffix(".noise.png")
            )
            print(f"wrote {noise} (feature noise, pixel units)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    argv = ["--out", args.out, "--clients", str(args.clients), "--seed", str(args.seed)]
    argv += ["--data-dir", args.data_dir] if args.data_dir else []
    argv += ["--no-train"] if args.no_train else []
    return run_bench("demo", argv)


def load_config(path: str) -> RunConfig:
    """The run config at ``path``; stops before anything runs when fedbalance cannot serve the
    installed host release."""
    config = RunConfig.load(path)
    get_registry().host_for(config.framework).require()
    return config


def cmd_run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.check:
        from fl_adapters.experiment import check

        print(json.dumps({"config": "ok", **check(config)}))
        return 0
    from fl_adapters._training import TRAIN_CLOCK
    from fl_adapters.run.directory import check_record_outside
    from fl_aggregators.record import check_target

    out = Path(args.out)
    check_record_outside(out)  # FEDBALANCE_RECORD: never one of the run's own files
    check_target()  # and a place that can hold the record, before any training
    check_target(env=TRAIN_CLOCK)  # and the training clock's file, if one is asked for
    options = RunOptions(
        progress=not args.no_progress,
        resume=args.resume,
        processes=args.processes,
        config_path=Path(args.config),
    )
    with claim(out, resume=args.resume, overwrite=args.overwrite):
        summary = get_registry().host_for(config.framework).run(config, out, options)
    check_learned(config.framework, summary, out)  # whatever the host said
    print(
        json.dumps(
            {k: summary[k] for k in ("rounds", "final_accuracy", "best_accuracy", "best_round")}
        )
    )
    print(f"wrote {out}/metrics.jsonl and {out}/summary.json")
    return 0


def cmd_astraea_plan(args: argparse.Namespace) -> int:
    from fl_adapters.astraea import AstraeaPlanner
    from fl_adapters.sampling import sample_round
    from fl_aggregators.astraea_plan import check_counts

    if args.config is not None:
        from fl_adapters.experiment import is_mediated, plan_of_run

        config = RunConfig.load(args.config)
        if not is_mediated(config.aggregator):
            raise UsageError(
                f"--config: aggregator must be astraea to preview a plan, got {config.aggregator!r}"
            )
        print(json.dumps(plan_of_run(config), indent=1))
        return 0
    if args.class_counts is None:
        raise UsageError("give --config RUN.yaml (a run's round 1) or --class-counts FILE")
    where = f"--class-counts {args.class_counts}"
    try:
        # A plan is quadratic in the clients: a million counts (1,000 clients x 1,000
        # classes) plans in seconds; beyond that, in minutes.
        doc = load_json(
            Path(args.class_counts).read_bytes(), where, max_bytes=64 << 20, max_nodes=MAX_COUNTS
        )
    except OSError as e:
        raise UsageError(f"{where}: cannot read JSON ({e})") from e
    except InputError as e:
        raise UsageError(str(e)) from None
    counts = check_counts(doc, "--class-counts")
    clients = list(range(counts.shape[0]))
    if args.clients_per_round is not None:
        if args.clients_per_round > len(clients):
            raise UsageError(
                f"--clients-per-round must be at most the number of clients ({len(clients)}), "
                f"got {args.clients_per_round}"
            )
        clients = sample_round(random.Random(args.seed), len(clients), args.clients_per_round)
    aggregator = build_aggregator(
        "astraea",
        {
            "tau_d": args.tau_d,
            "gamma": args.gamma,
            "augment": "paper" if args.augment == "paper" else True,
            "count_clip": args.count_clip,
        },
    )
    print(json.dumps(AstraeaPlanner(counts, aggregator).preview(clients), indent=1))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    return run_bench(args.suite, args.rest)


#: The entry-point group benchmarks register under: ``NAME = "module"``, a module with
#: ``main(argv)`` run by ``fedbalance bench NAME``. fedbalance's own (``demo`` among them) are
#: in its pyproject.toml; the product never imports them by name.
BENCH_GROUP = "fedbalance.bench"


def benches() -> dict[str, importlib.metadata.EntryPoint]:
    """The installed benchmarks by name. Every distribution found is read, not the first of
    each name: a source checkout's stale ``fedbalance.egg-info`` (left by a build, found first
    when the checkout is the working directory) must not hide the installed entry points."""
    return {
        ep.name: ep
        for dist in importlib.metadata.distributions()
        for ep in dist.entry_points
        if ep.group == BENCH_GROUP
    }


def run_bench(name: str, argv: Sequence[str]) -> int:
    found = benches()
    if name not in found:
        raise UsageError(
            f"no benchmark {name!r} is installed (entry-point group {BENCH_GROUP!r}); "
            f"installed: {', '.join(sorted(found)) or 'none'}"
        )
    return int(found[name].load().main(list(argv)))


# -- parser -----------------------------------------------------------------------------------
def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            got = repr(text) if value is None else value
            raise argparse.ArgumentTypeError(f"must be an int >= {minimum}, got {got}")
        return value

    return parse


positive_int, non_negative_int = int_at_least(1), int_at_least(0)


def optional_float(text: str) -> float | None:
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number or 'none', got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedbalance",
        description=f"Bias-mitigation plugins for {', '.join(h.label for h in builtin_hosts())}.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list aggregators and partitioners")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("partition", help="partition a dataset's labels and write JSON")
    p.add_argument(
        "--dataset",
        required=True,
        help="fmnist, digits, cifar10, svhn, emnist, or npy:PATH (.npy labels or .npz images+labels)",
    )
    p.add_argument("--scheme", help="partitioner name (see `fedbalance list`)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="partitioner parameter (YAML value), repeatable",
    )
    p.add_argument("--spec", help="YAML file with a partitioner spec {name: ..., params...}")
    p.add_argument("--clients", type=positive_int, required=True)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--out", required=True, help="output JSON file")
    p.add_argument(
        "--plot",
        help="also write stacked class bars to this PNG (and, for a partition with feature"
        " noise, sample images under it to PLOT.noise.png)",
    )
    p.add_argument(
        "--data-dir", help="where datasets are (default: $FEDBALANCE_DATA, system paths)"
    )
    p.add_argument("--download", action="store_true", help="let torchvision download a dataset")
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("demo", help="the main job: partition with the thesis's scenarios")
    p.add_argument("--out", default="runs/demo", help="directory for tables and plots")
    p.add_argument("--clients", type=positive_int, default=30)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--data-dir")
    p.add_argument("--no-train", action="store_true", help="partitions only, no training")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("run", help="run a federated experiment from a YAML config")
    p.add_argument("config", help="YAML run config (see fl_adapters.config.RunConfig)")
    p.add_argument("--out", default="runs/run", help="directory for metrics.jsonl and summary.json")
    p.add_argument(
        "--processes",
        type=positive_int,
        default=2,
        help="client processes, for a framework whose run starts them (see fedbalance list)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/checkpoint.pt (same config; rounds may grow)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the records of another run in OUT (refused without it)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the config, data and partition without training (exit 2 on an error)",
    )
    p.set_defaults(func=cmd_run)

    for spec in builtin_hosts():  # their own subcommands (a plugin host's are refused)
        if spec.commands is not None:
            spec.commands(sub)

    p = sub.add_parser("astraea", help="Astraea tools")
    astraea = p.add_subparsers(dest="astraea_command", required=True)
    p = astraea.add_parser("plan", help="z-score rebalancing plan and mediator assignment as JSON")
    p.add_argument("--class-counts", help="JSON list of lists: clients x classes counts")
    p.add_argument(
        "--config",
        help="a run config (aggregator: astraea): preview exactly its round 1 instead (the "
        "other options come from the config)",
    )
    p.add_argument(
        "--augment",
        choices=["bounded", "paper"],
        default="bounded",
        help="augmentation formula: the bounded default or the paper's printed one",
    )
    p.add_argument(
        "--tau-d",
        type=float,
        default=3.5,
        help="downsampling threshold tau_d in [0.01, 100] (default 3.5)",
    )
    p.add_argument(
        "--count-clip",
        type=optional_float,
        default=20.0,
        help="bound each client's count of a class at this x the other clients' mean (default"
        " 20; 'none' sums the reports unbounded, as the paper does)",
    )
    p.add_argument(
        "--gamma", type=positive_int, default=10, help="max clients per mediator (default 10)"
    )
    p.add_argument(
        "--clients-per-round",
        type=positive_int,
        default=None,
        help="plan for a random sample of this many clients (default: all)",
    )
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of that sample")
    p.set_defaults(func=cmd_astraea_plan)

    p = sub.add_parser("bench", help="run a bundled benchmark (extra arguments go to it)")
    p.add_argument("suite", choices=sorted(benches()))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of the benchmark")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in "fedbalance fl_adapters fl_aggregators fl_partitions fedbalance_benchmarks".split():
        logging.getLogger(name).setLevel(logging.DEBUG if args.verbose else logging.INFO)
    # torch warns about a deprecated pynvml on import; irrelevant on a CPU command line.
    warnings.filterwarnings("ignore", message=".*pynvml.*", category=FutureWarning)
    try:
        return int(args.func(args))
    except RunFailed as e:  # the run itself failed (a process died, a host exited): exit 1
        print(f"fedbalance {args.command}: failed: {e}", file=sys.stderr)
        return 1
    except USER_ERRORS as e:  # before anything ran: what the user gave (RunFailed is one too)
        print(f"fedbalance {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
