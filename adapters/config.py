"""Run configuration for ``fedbalance run`` and the benchmarks, validated at the boundary.

Every field is checked when the config is read; an error names the field, the allowed values
and what was given, before any data is loaded or process started.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fl_adapters.hosts import HostSpec, builtin_hosts
from fl_adapters.inputs import InputError, brief, check_tree, load_yaml
from fl_checks import (
    FedbalanceError,
    ParameterError,
    check_fractions,
    check_int_range,
    check_positive_float,
    check_positive_int,
)
from fl_partitions.partition import SPLIT_NAMES

DATASETS = ("fmnist", "digits", "cifar10", "svhn", "emnist")
MODELS = ("thesis_cnn", "astraea_cnn")
OPTIMIZERS = ("adam", "sgd")
#: ``clients``: every client's test split, weighted by size (the thesis); ``test``: the
#: dataset's own test set (balanced for Fashion-MNIST; what Astraea reports); ``val``: every
#: client's validation split, weighted by size (what a hyper-parameter sweep may score on,
#: never the test data).
EVAL_DATA = ("clients", "test", "val")
#: How FedML cross-silo's processes talk: ``mpi`` (one ``mpirun``) or FedML's ``grpc`` backend
#: (one process per rank on 127.0.0.1, started by ``fedbalance run``).
BACKENDS = ("mpi", "grpc")


class RunFailed(FedbalanceError, RuntimeError):
    """A run that started but could not finish (a process died, a host exited); the message
    says what survived and how to go on."""


class ConfigError(ParameterError):
    """A configuration value outside what is allowed (the message names the field)."""


#: Seeds reach numpy's legacy ``np.random.seed`` (FedML), which takes at most 2**32 - 1.
MAX_SEED = 2**32 - 1


def check_value(check: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A check of :mod:`fl_checks` (one wording for every parameter fedbalance
    takes), its refusal raised as a :class:`ConfigError`."""
    try:
        return check(*args, **kwargs)
    except ParameterError as e:
        raise ConfigError(str(e)) from None


def check_eval_keys(
    every: Any, fraction: Any, keys: tuple[str, str] = ("eval_every", "eval_fraction")
) -> None:
    """How often (``eval_every``) and on what share of the clients (``eval_fraction``) a run
    evaluates, checked in the same words on every host; ``keys``: the host's names for them."""
    check_value(check_positive_int, keys[0], every)
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, (int, float))
        or not 0 < fraction <= 1
    ):
        raise ConfigError(
            f"{keys[1]} must be a number in (0, 1] (the share of clients evaluated), "
            f"got {brief(fraction)}"
        )


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


@dataclass
class RunConfig:
    """One federated run: data, partition, model, aggregator and training schedule."""

    #: Default: the first built-in host's first framework.
    framework: str = field(default_factory=lambda: builtin_hosts()[0].frameworks[0])
    dataset: str = "fmnist"
    data_dir: str | None = None
    model: str = "thesis_cnn"
    partition: dict[str, Any] = field(default_factory=lambda: {"name": "iid"})
    aggregator: str = "fedavg"
    aggregator_args: dict[str, Any] = field(default_factory=dict)
    num_clients: int = 30
    clients_per_round: int = 5
    rounds: int = 50
    local_epochs: int = 10
    optimizer: str = "adam"
    lr: float = 1e-3
    batch_size: int = 64
    seed: int = 0
    split: list[float] = field(default_factory=lambda: [0.7, 0.1, 0.2])
    max_samples: int | None = None
    eval_every: int = 1
    eval_fraction: float = 1.0
    eval_data: str = "clients"
    port: int = 29500
    backend: str = "mpi"

    def __post_init__(self) -> None:
        host = self.host()  # the framework values the registered hosts serve
        if isinstance(self.dataset, str) and self.dataset.startswith("npy:"):
            if not self.dataset[4:]:
                raise ConfigError("dataset npy:PATH needs a path, e.g. npy:data/mine.npz")
        elif self.dataset not in DATASETS:
            raise ConfigError(
                f"dataset must be one of {', '.join(DATASETS)} or npy:PATH (an .npz archive of "
                f"images and labels); got {brief(self.dataset)}"
            )
        if self.data_dir is not None and (not isinstance(self.data_dir, str) or not self.data_dir):
            raise ConfigError(f"data_dir must be a directory path or null, got {self.data_dir!r}")
        _choice("model", self.model, MODELS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("eval_data", self.eval_data, EVAL_DATA)
        _choice("backend", self.backend, BACKENDS)
        if self.backend != BACKENDS[0] and (self.framework, self.backend) not in host.backends:
            takes = [f for h in builtin_hosts() for f, b in h.backends if b == self.backend]
            raise ConfigError(
                f"backend: {self.backend} is for framework: {', '.join(takes)}; got framework: "
                f"{self.framework}"
            )
        if isinstance(self.partition, str):
            self.partition = {"name": self.partition}
        if not isinstance(self.partition, dict) or not isinstance(self.partition.get("name"), str):
            raise ConfigError(
                f"partition must be a mapping with a 'name', got {brief(self.partition)}"
            )
        if not isinstance(self.aggregator, str) or not self.aggregator:
            raise ConfigError(
                f"aggregator must be a plugin name (see `fedbalance list`), got {self.aggregator!r}"
            )
        if not isinstance(self.aggregator_args, dict):
            raise ConfigError(
                f"aggregator_args must be a mapping, got {brief(self.aggregator_args)}"
            )
        self.num_clients = check_value(check_positive_int, "num_clients", self.num_clients)
        self.clients_per_round = check_value(
            check_positive_int, "clients_per_round", self.clients_per_round
        )
        if self.clients_per_round > self.num_clients:
            raise ConfigError(
                f"clients_per_round must be between 1 and num_clients={self.num_clients}, got {self.clients_per_round}"
            )
        self.rounds = check_value(check_positive_int, "rounds", self.rounds)
        self.local_epochs = check_value(check_positive_int, "local_epochs", self.local_epochs)
        self.lr = check_value(check_positive_float, "lr", self.lr)
        self.batch_size = check_value(check_positive_int, "batch_size", self.batch_size)
        self.seed = check_value(check_int_range, "seed", self.seed, 0, MAX_SEED)
        check_eval_keys(self.eval_every, self.eval_fraction)
        if self.eval_fraction < 1.0 and self.eval_data == "test":
            raise ConfigError(
                "eval_fraction samples clients: it is for eval_data: clients or val, not test "
                "(the dataset's test set is one evaluation)"
            )
        self.port = check_value(check_int_range, "port", self.port, 1024, 65535)
        if self.max_samples is not None:
            self.max_samples = check_value(check_positive_int, "max_samples", self.max_samples)
        self.split = list(
            check_value(
                check_fractions, "split", self.split, 3, labels=SPLIT_NAMES, first_positive=True
            )
        )
        self._check_carried_optimizer(host)
        host.check(self)  # the host's own rules (its spec's check)

    def _check_carried_optimizer(self, host: HostSpec) -> None:
        """An optimizer carried along a mediator's chain (Astraea's ``carry_optimizer``) takes
        effect only where the host trains a mediator's members in one process of fedbalance's
        own, and only for an optimizer that has state to carry."""
        if self.aggregator_args.get("carry_optimizer") is not True:
            return
        if self.framework not in host.carries_optimizer:
            where = ", ".join(
                f"framework: {f}" for h in builtin_hosts() for f in h.carries_optimizer
            )
            raise ConfigError(
                f"aggregator_args: carry_optimizer: true cannot take effect in framework: "
                f"{self.framework}, whose clients each train with an optimizer of their own "
                f"process or of the host's trainer; it runs in {where or 'no framework'}. Drop "
                f"carry_optimizer, or run there"
            )
        if self.optimizer == "sgd":
            raise ConfigError(
                "aggregator_args: carry_optimizer: true carries the optimizer's state (Adam's "
                "moments) from member to member; optimizer: sgd (no momentum) has none, so it "
                "would change nothing. Use optimizer: adam, or drop carry_optimizer"
            )

    def host(self) -> HostSpec:
        """The spec of the host that serves :attr:`framework` (the built-in hosts first: the
        plugins are loaded only for a framework none of them serves)."""
        for spec in builtin_hosts():
            if self.framework in spec.frameworks:
                return spec
        from fl_adapters.registry import get_registry

        registry = get_registry()
        _choice("framework", self.framework, tuple(registry.frameworks()))
        return registry.host_for(self.framework)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> RunConfig:
        if not isinstance(doc, dict):
            raise ConfigError(f"a run config must be a mapping, got {type(doc).__name__}")
        try:
            check_tree(doc, "run config")
        except InputError as e:
            raise ConfigError(str(e)) from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ConfigError(
                f"unknown config key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(known))}"
            )
        return cls(**doc)

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        try:
            doc = load_yaml(Path(path).read_text(), str(path))
        except OSError as e:
            raise ConfigError(f"{path}: cannot read a YAML mapping ({e})") from e
        except InputError as e:
            raise ConfigError(str(e)) from None
        return cls.from_dict(doc)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
