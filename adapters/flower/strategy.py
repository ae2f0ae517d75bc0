"""A Flower message-API strategy that aggregates with any fedbalance aggregator.

:class:`FedBalanceStrategy` keeps Flower's ``FedAvg`` for everything but the math and hands
each round's train replies to a fedbalance aggregator, which weighs, rejects and records them
as on FedLab and FedML. Where it departs from ``FedAvg``, and why (docs/hosts/flower.md):
nodes are sampled with a seeded RNG over the nodes ordered by client id (:mod:`.sampling`);
updates are summed in client order and evaluation replies in an order of their content, so a
run is reproducible bit for bit; a run checkpoints and resumes
(:mod:`fl_adapters.flower.checkpoint`); and a malformed reply is rejected by the aggregator
(a warning and a record entry) where ``FedAvg`` fails the round (a round with no acceptable
reply keeps the global model).

Astraea with mediators or rebalancing runs in the subclass
:class:`~fl_adapters.flower.astraea.AstraeaStrategy`; :func:`strategy_from_run_config` picks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result, Strategy

from fl_adapters import bias
from fl_adapters._training import evaluates
from fl_adapters.astraea import refuse_carried_optimizer
from fl_adapters.checkpoint import NAME, Checkpoint, restore_sampler, sampler_state
from fl_adapters.client_metrics import requested
from fl_adapters.config import ConfigError
from fl_adapters.flower import checkpoint, privacy
from fl_adapters.flower.checkpoint import HOST
from fl_adapters.flower.config import AGGREGATOR_KEY, ARGS_KEY, WHERE, parse_run_config
from fl_adapters.flower.membership import member_updates
from fl_adapters.flower.payload import (
    CLIENT_METRICS_KEY,
    content_order,
    log_errors,
    reply_to_update,
    take_counts,
    to_array_record,
    to_state_dict,
    weighs_nothing,
    weighted_metrics,
)
from fl_adapters.flower.sampling import NodeSampling
from fl_adapters.registry import PluginError, build_aggregator, get_registry
from fl_adapters.run.lifecycle import capture
from fl_aggregators import AggregationResult, Aggregator, NothingAggregated

log = logging.getLogger(__name__)
#: Flower's own logger: the strategy's banner goes where a ServerApp shows Flower's.
flower_log = logging.getLogger("flwr")


def make_aggregator(
    aggregator: str | Aggregator, args: Mapping[str, Any] | None, *, mediated: bool = False
) -> Aggregator:
    """:func:`~fl_adapters.registry.build_aggregator`, its errors naming the run config's keys.

    An Astraea aggregator that trains mediators or rebalances is refused unless ``mediated``
    (the caller is :class:`~fl_adapters.flower.astraea.AstraeaStrategy`).
    """
    if isinstance(aggregator, Aggregator):
        return aggregator
    try:
        cls = get_registry().aggregator(aggregator)
    except PluginError as e:
        raise ConfigError(f"{WHERE} {AGGREGATOR_KEY}: {e}") from e
    try:
        agg: Aggregator = build_aggregator(aggregator, args)
    except ValueError as e:  # a ParameterError, named by the run config's key
        raise ConfigError(f"{WHERE} {ARGS_KEY} for {cls.name!r}: {e}") from e
    try:
        where = "each Flower ClientApp trains with its own optimizer"
        refuse_carried_optimizer(agg, where, key=f"{WHERE} {ARGS_KEY}")
    except ValueError as e:  # the ParameterError as the ConfigError every run-config key gives
        raise ConfigError(str(e)) from e
    if needs_mediators(agg) and not mediated:
        # Astraea trains mediator chains and rebalances client data; aggregating its replies
        # as plain updates would be FedAvg under Astraea's name.
        raise ConfigError(
            f"{WHERE} {AGGREGATOR_KEY} = {cls.name!r} trains mediators and rebalances data: "
            f"use AstraeaStrategy (strategy_from_run_config picks it), or "
            f'{ARGS_KEY} = \'{{"mediators": false, "augment": false}}\' for its aggregation only'
        )
    return agg


def needs_mediators(agg: Aggregator) -> bool:
    """Whether ``agg`` is an Astraea that trains mediator chains or rebalances data."""
    return bool(getattr(agg, "mediated", False)) and bool(
        getattr(agg, "mediators", True) or getattr(agg, "augment", True)
    )


class FedBalanceStrategy(NodeSampling, FedAvg):
    """Flower's ``FedAvg`` with a fedbalance aggregator doing the aggregation.

    Parameters
    ----------
    aggregator : a registered name (``"fedloss"``) or an :class:`~fl_aggregators.Aggregator`.
    aggregator_args : keyword arguments for a named aggregator.
    seed : seeds node sampling (see the module docstring).
    on_round : called as ``on_round(strategy, result)`` after every aggregation.
    checkpoint_dir : write ``checkpoint.pt`` there after every round (``None``: nowhere).
    resume_from : continue from this checkpoint (its file or directory) in :meth:`start`.
    run_config : what else defines the run (the app's run config): recorded in the checkpoint,
        and a resumed run must match it (but for :data:`~fl_adapters.flower.checkpoint.
        MAY_CHANGE`).
    evaluate_every : evaluate every this many rounds and the last (1: every round).
    evaluate_fraction : the share of nodes that evaluate a round, drawn per round from ``seed``
        on a stream of its own, the clients every host draws
        (:func:`~fl_adapters._training.evaluated_clients`); ``None``: Flower's
        ``fraction_evaluate``.
    **fedavg_kwargs : Flower ``FedAvg``'s own arguments (``fraction_train``,
        ``min_train_nodes``, ``min_available_nodes``, ...). ``weighted_by_key`` only weighs
        the *evaluation* metrics; training is weighed by the aggregator.
    """

    def __init__(
        self,
        aggregator: str | Aggregator = "fedavg",
        *,
        aggregator_args: Mapping[str, Any] | None = None,
        seed: int = 0,
        on_round: Callable[[FedBalanceStrategy, AggregationResult], None] | None = None,
        mediated: bool = False,
        checkpoint_dir: str | Path | None = None,
        resume_from: str | Path | None = None,
        run_config: Mapping[str, Any] | None = None,
        evaluate_every: int = 1,
        evaluate_fraction: float | None = None,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        if evaluate_fraction is not None and self.fraction_evaluate == 0.0:
            raise ConfigError(
                f"fraction_evaluate=0.0 turns evaluation off, but evaluate_fraction "
                f"(the run config's eval-fraction) asks {evaluate_fraction!r} of the nodes to "
                "evaluate: keep one of the two"
            )
        self.evaluate_every = evaluate_every
        self.evaluate_fraction = evaluate_fraction
        #: The run's rounds, once :meth:`start` knows them (its last round is evaluated).
        self.num_rounds: int | None = None
        self.aggregator = make_aggregator(aggregator, aggregator_args, mediated=mediated)
        self.checkpoint_path = Path(checkpoint_dir) / NAME if checkpoint_dir else None
        self.resume_from = Path(resume_from) if resume_from else None
        self.run_identity = checkpoint.identity(
            {
                "strategy": type(self).__name__,
                "seed": seed,
                "fraction-train": self.fraction_train,
                "min-train-nodes": self.min_train_nodes,
                **dict(run_config or {}),
                AGGREGATOR_KEY: self.aggregator.name,
                ARGS_KEY: json.dumps(dict(aggregator_args or {}), sort_keys=True),
            }
        )
        #: Rounds done before this process started (a resumed run): Flower's loop counts from
        #: 1 again, and every round number the strategy sends, records and returns adds this.
        self.round_offset = 0
        #: Per-round metrics of the whole run (Flower's ``Result`` holds this process's only).
        self.history: dict[str, dict[int, dict[str, Any]]] = {
            "train": {},
            "evaluate": {},
            "server": {},
        }
        #: The global model after the round just aggregated (what the checkpoint keeps).
        self.round_params: dict[str, torch.Tensor] | None = None
        self._evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
        self.init_sampling(seed)
        self.on_round = on_round
        self.host = HOST
        #: The global model the current round's clients started from (what a skipped round
        #: keeps, and what FedAvgM's momentum and the update bounds are measured against).
        self.global_params: dict[str, torch.Tensor] | None = None
        #: The strategy driving this one when it is wrapped (Flower's DP wrappers), found at
        #: the first round; ``None`` while this strategy's own ``start`` drives it.
        self.wrapper: Any = None
        self._driver_known = False
        self._privacy_warned = False
        #: Rounds of this process whose aggregation changed the model (none at the end of a
        #: run that had rounds: :meth:`start` raises :class:`~fl_aggregators.NothingAggregated`).
        self.rounds_aggregated = 0
        #: The latest train reply that carried an error (named when the run learns nothing).
        self.last_failure: str | None = None

    def summary(self) -> None:
        """The banner Flower logs at ``start``: what is sampled and how replies are weighed.

        ``FedAvg``'s own says "Weighted by: 'num-examples'", which here holds for the evaluation
        metrics only: training is weighed by the aggregator.
        """
        agg = self.aggregator
        reads = ", ".join(repr(m) for m in (*agg.required_metrics, "num-examples"))
        flower_log.info("\t├──> fedbalance aggregator: %r (seed %s)", agg, self.seed)
        flower_log.info(
            "\t├──> Sampling: fraction train %.2f, evaluate %.2f; minimum nodes train %d, "
            "evaluate %d, available %d",
            self.fraction_train,
            self.fraction_evaluate,
            self.min_train_nodes,
            self.min_evaluate_nodes,
            self.min_available_nodes,
        )
        flower_log.info(
            "\t├──> Train replies weighed by: fedbalance %r (reads %s)", agg.name, reads
        )
        flower_log.info("\t├──> Evaluate metrics weighted by: %r", self.weighted_by_key)
        flower_log.info(
            "\t└──> Stops after %d rounds in a row with nothing aggregated", agg.max_skipped_rounds
        )

    def _messages(
        self,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        nodes: list[int],
        kind: str,
    ) -> Iterable[Message]:
        log.info("%s round %s: sampled nodes %s", kind, server_round, nodes)
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, nodes, kind)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """This round's train messages (:meth:`train_messages`), the round numbered in the run."""
        if not self._driver_known:
            # The strategy calling this one, if any: a wrapper's own start drives the rounds
            # (Flower's DP wrappers delegate configure_train to the strategy they wrap).
            caller = sys._getframe(1).f_locals.get("self")
            self._driver_known = True
            if isinstance(caller, Strategy) and caller is not self:
                self.wrapped_by(caller)
        self.global_params = to_state_dict(arrays)
        return self.train_messages(server_round + self.round_offset, arrays, config, grid)

    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The train messages of round ``server_round`` (counted from the run's start)."""
        if self.fraction_train == 0.0:
            return []
        nodes = self.sample(grid, self.fraction_train, self.min_train_nodes)
        config[CLIENT_METRICS_KEY] = list(requested(self.aggregator))  # what train_reply sends
        return self._messages(server_round, arrays, config, nodes, MessageType.TRAIN)

    def wrapped_by(self, wrapper: Strategy) -> None:
        """Check, before the first round, that this strategy can serve under ``wrapper``;
        raises :class:`~fl_adapters.config.ConfigError` naming what cannot (see
        :mod:`fl_adapters.flower.privacy`)."""
        self.wrapper = wrapper
        what = f"{type(wrapper).__name__} wrapping {type(self).__name__}({self.aggregator.name!r})"
        if self.resume_from is not None:
            raise ConfigError(
                f"{what}: resume_from is set, but the wrapper's start is Flower's, which knows "
                "no checkpoint and would run every round again from the initial model; resume "
                "without the wrapper, or start afresh"
            )
        if isinstance(wrapper, privacy.DP_WRAPPERS):
            own = self.dp_refusal()
            if own is not None:
                raise ConfigError(f"{what}: {own}")
            reason = privacy.privacy_refusal(self.aggregator)
            if reason is not None:
                raise ConfigError(
                    f"{what}: {reason}. Weighted means that can run under it: fedavg, fedloss, "
                    "fedloss_n, fedavgm with beta 0"
                )
        log.info("FedBalanceStrategy(%r) runs inside %r", self.aggregator.name, wrapper)

    def dp_refusal(self) -> str | None:
        """Why this strategy itself cannot serve under a DP wrapper (``None``: it can)."""
        return None

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.wrapper is not None:
            # The model the wrapper kept (with its noise): what the checkpoint must hold.
            self.round_params = to_state_dict(arrays)
        server_round += self.round_offset
        if not evaluates(server_round, self.evaluate_every, self.num_rounds):
            return []
        if self.evaluate_fraction is not None:
            nodes = self.evaluation_nodes(grid, server_round)
        elif self.fraction_evaluate == 0.0:
            return []
        else:
            nodes = self.sample(grid, self.fraction_evaluate, self.min_evaluate_nodes)
        return self._messages(server_round, arrays, config, nodes, MessageType.EVALUATE)

    # -- aggregation ------------------------------------------------------------------------
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The aggregator's result for this round's replies (``None`` arrays: model kept);
        :meth:`aggregate_replies` with the round numbered in the run."""
        server_round += self.round_offset
        arrays, metrics = self.aggregate_replies(server_round, list(replies))
        if metrics is not None:
            self.history["train"][server_round] = dict(metrics)
        return arrays, metrics

    def aggregate_replies(
        self, server_round: int, replies: list[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate round ``server_round``'s train replies; ends with :meth:`aggregated`."""
        if self.global_params is None:
            raise RuntimeError("aggregate_train before configure_train: no global model")
        failure = log_errors(server_round, replies)
        if failure is not None:
            self.last_failure = failure
        self.check_read_clients(replies)
        answered = [msg for msg in replies if not msg.has_error()]
        updates, refused, _ = member_updates(answered, self.members, reply_to_update)
        with failures_named(failure):
            result = self.aggregator.aggregate(
                self.global_params, updates, round=server_round, host=self.host, refused=refused
            )
        return self.conclude(server_round, updates, result)

    def conclude(
        self, server_round: int, updates: list[Any], result: AggregationResult
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """:meth:`aggregated`, then what ``aggregate_train`` returns for ``result``."""
        self.aggregated(result)
        metrics = MetricRecord(
            {
                "fedbalance-accepted": len(updates) - len(result.rejected),
                "fedbalance-rejected": len(result.rejected),
                **weighted_metrics(updates, result.weights),
                **self.privacy_metrics(server_round, result),
            }
        )
        return (None if result.skipped else to_array_record(result.params)), metrics

    def privacy_metrics(self, server_round: int, result: AggregationResult) -> dict[str, float]:
        """Under a DP wrapper: the round's effective noise multiplier (a warning the first
        time it is below the wrapper's)."""
        if not isinstance(self.wrapper, privacy.DP_WRAPPERS) or result.skipped:
            return {}
        z = float(self.wrapper.noise_multiplier)
        z_eff = privacy.effective_noise_multiplier(self.wrapper, self.aggregator, result.weights)
        if z_eff < z * (1 - 1e-9) and not self._privacy_warned:
            self._privacy_warned = True
            log.warning(
                "round %s: %s weighs clients unequally (largest weight %.3g of %d), so the "
                "wrapper's noise multiplier %.3g protects the heaviest client like %.3g; each "
                "round's value is in the train metrics as %r",
                server_round,
                self.aggregator.name,
                max(result.weights),
                self.wrapper.num_sampled_clients,
                z,
                z_eff,
                privacy.Z_EFFECTIVE,
            )
        return {privacy.Z_EFFECTIVE: z_eff}

    def aggregated(self, result: AggregationResult) -> None:
        """After every aggregation: keep the round's model and call ``on_round``."""
        self.round_params = self.global_params if result.skipped else dict(result.params)
        self.rounds_aggregated += 0 if result.skipped else 1
        if self.on_round is not None:
            self.on_round(self, result)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Flower's weighted evaluation metrics, with the bias figures of the replies' class
        counts (:func:`bias_metrics`); the round is complete (checkpointed here unless
        ``start`` was given an ``evaluate_fn``, which then comes last)."""
        server_round += self.round_offset
        # Replies arrive in any order, and Flower sums them in that order: ordered by content,
        # the same replies give the same averages to the last bit. A node without test data
        # (weight 0) is left out: its NaN loss times 0 is NaN in Flower's weighted sum, and a
        # round where every node has none would divide by zero.
        replies = sorted(replies, key=content_order)
        figures = bias_metrics(server_round, replies)  # takes the counts out of the replies
        kept = [m for m in replies if not weighs_nothing(m, self.weighted_by_key)]
        if len(kept) < len(replies):
            log.info(
                "evaluate round %s: %d node(s) without test data left out of the average",
                server_round,
                len(replies) - len(kept),
            )
        metrics = super().aggregate_evaluate(server_round, kept) if kept else None
        if figures:
            metrics = metrics if metrics is not None else MetricRecord()
            metrics.update(figures)
        if metrics is not None:
            self.history["evaluate"][server_round] = dict(metrics)
        if self._evaluate_fn is None:
            self.save_checkpoint(server_round)
        return metrics

    # -- checkpoints and resume -------------------------------------------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's ``start``, resumed from ``resume_from`` when set: the checkpoint's model
        replaces ``initial_arrays`` and the remaining ``num_rounds - k`` rounds run. Returns
        the whole run's ``Result``, rounds numbered from the run's start."""
        if self.resume_from is not None:
            ckpt = checkpoint.load(self.resume_from, self.run_identity, num_rounds)
            ckpt.check_model(to_state_dict(initial_arrays), self.resume_from)
            self.restore(ckpt)
            initial_arrays = to_array_record(dict(ckpt.model))
            log.info(
                "resumed from %s after round %d of %d; Flower counts the remaining %d from 1",
                self.resume_from,
                ckpt.round,
                num_rounds,
                num_rounds - ckpt.round,
            )
        self._evaluate_fn = evaluate_fn
        self.num_rounds = num_rounds
        super().start(
            grid,
            initial_arrays,
            num_rounds=num_rounds - self.round_offset,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=None if evaluate_fn is None else self._evaluate_then_checkpoint,
        )
        ran = num_rounds - self.round_offset
        if ran > 0 and self.rounds_aggregated == 0:
            raise NothingAggregated(
                f"{self.aggregator.name}: none of the run's {ran} round(s) aggregated anything, "
                "so the model is the initial one; "
                + (
                    f"the last failed reply: {self.last_failure}"
                    if self.last_failure
                    else "see the warnings above for each round's rejections"
                )
            )
        result = Result()
        params = self.round_params if self.round_params is not None else initial_arrays
        result.arrays = params if isinstance(params, ArrayRecord) else to_array_record(params)
        for key, into in (
            ("train", result.train_metrics_clientapp),
            ("evaluate", result.evaluate_metrics_clientapp),
            ("server", result.evaluate_metrics_serverapp),
        ):
            into.update({r: MetricRecord(m) for r, m in sorted(self.history[key].items())})
        return result

    def _evaluate_then_checkpoint(
        self, server_round: int, arrays: ArrayRecord
    ) -> MetricRecord | None:
        assert self._evaluate_fn is not None
        server_round += self.round_offset
        if server_round == self.round_offset and server_round > 0:
            return None  # the initial evaluation was the first run's
        metrics = self._evaluate_fn(server_round, arrays)
        if metrics is not None:
            self.history["server"][server_round] = dict(metrics)
        if server_round > 0:
            self.save_checkpoint(server_round)
        return metrics

    def save_checkpoint(self, server_round: int) -> None:
        """Write round ``server_round``'s checkpoint (atomically), if ``checkpoint_dir`` is set."""
        if self.checkpoint_path is None:
            return
        params = self.round_params if self.round_params is not None else self.global_params
        if params is None:
            raise RuntimeError("save_checkpoint before any round: no global model")
        capture(
            self.checkpoint_path,
            host=HOST,
            config=self.run_identity,
            round_number=server_round,
            model=params,
            aggregator=self.aggregator,
            sampler=sampler_state(self.rng),
            plan=self.checkpoint_plan(),
            history={k: {str(r): m for r, m in v.items()} for k, v in self.history.items()},
        )

    def checkpoint_plan(self) -> dict[str, Any] | None:
        """A plan the checkpoint keeps (Astraea's); ``None`` here."""
        return None

    def restore(self, ckpt: Checkpoint) -> None:
        """Take the checkpoint's state: round, aggregator, sampler and metrics so far."""
        self.round_offset = ckpt.round
        self.aggregator.load_state_dict(ckpt.aggregator)
        restore_sampler(self.rng, ckpt.sampler)
        self.round_params = dict(ckpt.model)
        history = ckpt.history or {}
        for key, rows in self.history.items():
            rows.clear()
            rows.update({int(r): m for r, m in history.get(key, {}).items()})


@contextlib.contextmanager
def failures_named(failure: str | None) -> Iterator[None]:
    """A :class:`~fl_aggregators.NothingAggregated` raised inside names the round's first failed
    reply (the error a ClientApp raised is what the user must fix)."""
    try:
        yield
    except NothingAggregated as e:
        if failure is None:
            raise
        raise NothingAggregated(f"{e}; the round's first failed reply: {failure}") from e


def strategy_from_run_config(
    run_config: Mapping[str, Any], **fedavg_kwargs: Any
) -> FedBalanceStrategy:
    """The strategy a Flower app's run config asks for (see :mod:`fl_adapters.flower.config`):
    :class:`~fl_adapters.flower.astraea.AstraeaStrategy` for an Astraea with mediators or
    rebalancing, :class:`FedBalanceStrategy` for every other aggregator.

    Parameters
    ----------
    run_config : the ServerApp's ``context.run_config``.
    **fedavg_kwargs : passed to Flower's ``FedAvg`` (sampling fractions, minimum nodes).

    Examples
    --------
    >>> strategy = strategy_from_run_config({"aggregator": "fedloss"}, fraction_evaluate=0.0)
    """
    cfg = parse_run_config(run_config)
    agg = make_aggregator(cfg.aggregator, cfg.aggregator_args, mediated=True)
    kwargs: dict[str, Any] = {
        "aggregator_args": cfg.aggregator_args,
        "seed": cfg.seed,
        "checkpoint_dir": cfg.checkpoint_dir or None,
        "resume_from": cfg.resume_from or None,
        "run_config": run_config,
        "evaluate_every": cfg.eval_every,
        "evaluate_fraction": cfg.eval_fraction,
        **fedavg_kwargs,
    }
    if needs_mediators(agg):
        from fl_adapters.flower.astraea import AstraeaStrategy

        return AstraeaStrategy(agg, **kwargs)
    return FedBalanceStrategy(agg, **kwargs)


def bias_metrics(server_round: int, replies: list[Message]) -> dict[str, Any]:
    """The bias figures (:mod:`fl_adapters.bias`) of a round's evaluate replies, as Flower
    metrics: the class figures of their summed class counts, the distribution of the nodes'
    accuracies, and each node's accuracy (``client_ids``, ``client_accuracy``). A class absent
    from every reply has recall NaN (Flower's metrics hold no null). Counts that cannot be
    believed, or a client id given twice, are left out by name (logged); replies without counts
    (a stock ClientApp's) give nothing."""
    per: dict[Any, bias.Counts] = {}
    claimed: dict[Any, list[int]] = {}  # client -> the nodes reporting it
    for msg in replies:
        counts, client, problem = take_counts(msg)
        who = client if isinstance(client, int) else msg.metadata.src_node_id
        if problem is not None:
            log.warning("evaluate round %s: node %s left out of the bias figures: %s",
                        server_round, msg.metadata.src_node_id, problem)  # fmt: skip
        elif counts is not None:
            per[who] = counts
            claimed.setdefault(who, []).append(msg.metadata.src_node_id)
    for who, nodes in claimed.items():
        if len(nodes) > 1:  # which one is the client cannot be told: neither counts
            del per[who]
            log.warning("evaluate round %s: nodes %s left out of the bias figures: each "
                        "reported client %s", server_round, nodes, who)  # fmt: skip
    if not per or bias.total(list(per.values())).n == 0:  # no node had test data
        return {}
    per = dict(sorted(per.items()))
    figures = bias.class_figures(bias.total(list(per.values()))) | bias.client_figures(per)
    out: dict[str, Any] = {
        k: v for k, v in figures.items() if v is not None and k != "class_recall"
    }
    out["class_recall"] = [math.nan if r is None else r for r in figures["class_recall"]]
    accs = bias.client_accuracies(per)
    out["client_ids"] = [int(c) for c in accs]
    out["client_accuracy"] = [math.nan if a is None else a for a in accs.values()]
    # In Flower's log (the round's own lines are there), where a user's `flwr run` shows it.
    flower_log.info("evaluate round %s: balanced accuracy %.4f, worst class %s (recall %.4f), "
                    "client p10 %.4f", server_round, figures["balanced_accuracy"],
                    figures["worst_class"], figures["worst_class_recall"],
                    figures["client_acc_p10"])  # fmt: skip
    return out
