"""What fedbalance reads from a Flower app's run config (``[tool.flwr.app.config]``).

Flower run-config values are scalars (str, int, float, bool) and TOML has no null, while
fedbalance aggregators take ``None`` for "unbounded" (``peer_clip=None`` is the thesis's
FedLoss). So an aggregator's arguments travel as one JSON object in a string,
``aggregator-args = '{"loss_clip": 5.0, "peer_clip": null}'`` (docs/hosts/flower.md), and can
be overridden like any run-config key. Every error names the key, what is allowed and what was
given; unknown aggregators and arguments are reported by the plugin registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fl_adapters.config import ConfigError, check_eval_keys, check_value
from fl_adapters.inputs import InputError, brief, load_json
from fl_checks import check_positive_int

AGGREGATOR_KEY = "aggregator"
ARGS_KEY = "aggregator-args"
SEED_KEY = "seed"
CHECKPOINT_KEY = "checkpoint-dir"
RESUME_KEY = "resume-from"
EVAL_EVERY_KEY = "eval-every"
EVAL_FRACTION_KEY = "eval-fraction"
WHERE = "[tool.flwr.app.config]"


@dataclass(frozen=True)
class AppConfig:
    """fedbalance's part of a Flower run config, validated.

    Attributes
    ----------
    aggregator : a registered aggregator name (``fedbalance list``).
    aggregator_args : keyword arguments for it.
    seed : seeds the strategy's node sampling (and whatever the app derives from it).
    checkpoint_dir : where the strategy checkpoints after every round ("": nowhere).
    resume_from : the checkpoint to continue from ("": start a new run).
    eval_every : evaluate every this many rounds, and the last.
    eval_fraction : the share of nodes that evaluate, drawn per round (``None``: Flower's
        ``fraction_evaluate``).
    """

    aggregator: str = "fedavg"
    aggregator_args: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    checkpoint_dir: str = ""
    resume_from: str = ""
    eval_every: int = 1
    eval_fraction: float | None = None


def parse_run_config(run_config: Mapping[str, Any]) -> AppConfig:
    """fedbalance's keys of ``run_config`` (a Flower ``Context.run_config``), validated.

    Raises
    ------
    ConfigError
        A key with a value of the wrong type or form; the message names the key, what it
        accepts and what it got.
    """
    name = run_config.get(AGGREGATOR_KEY, "fedavg")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(
            f"{WHERE} {AGGREGATOR_KEY} must be a fedbalance aggregator name (see `fedbalance "
            f"list`), got {name!r}"
        )
    raw = run_config.get(ARGS_KEY, "{}")
    if not isinstance(raw, str):
        raise ConfigError(
            f"{WHERE} {ARGS_KEY} must be a JSON object in a string, e.g. "
            f"'{{\"peer_clip\": null}}', got {raw!r} ({type(raw).__name__})"
        )
    try:
        args = load_json(raw, f"{WHERE} {ARGS_KEY}") if raw.strip() else {}
    except InputError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(args, dict):
        raise ConfigError(f"{WHERE} {ARGS_KEY} must be a JSON object, got {brief(raw)}")
    seed = check_value(
        check_positive_int, f"{WHERE} {SEED_KEY}", run_config.get(SEED_KEY, 0), minimum=0
    )
    paths = {}
    for key in (CHECKPOINT_KEY, RESUME_KEY):
        value = run_config.get(key, "")
        if not isinstance(value, str):
            raise ConfigError(
                f'{WHERE} {key} must be a directory path in a string ("" for none), '
                f"got {value!r} ({type(value).__name__})"
            )
        paths[key] = value.strip()
    every, fraction = run_config.get(EVAL_EVERY_KEY, 1), run_config.get(EVAL_FRACTION_KEY)
    check_eval_keys(  # no eval-fraction: Flower's fraction_evaluate
        every,
        1.0 if fraction is None else fraction,
        (f"{WHERE} {EVAL_EVERY_KEY}", f"{WHERE} {EVAL_FRACTION_KEY}"),
    )
    return AppConfig(
        aggregator=name.strip(),
        aggregator_args=args,
        seed=seed,
        checkpoint_dir=paths[CHECKPOINT_KEY],
        resume_from=paths[RESUME_KEY],
        eval_every=every,
        eval_fraction=None if fraction is None else float(fraction),
    )
