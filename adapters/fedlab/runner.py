"""Config-driven FedLab runs: standalone (``StandalonePipeline``) and cross-process (``DistNetwork``).

Rounds run in FedLab's own loop (cross-process: FedLab's managers over ``torch.distributed``,
gloo on 127.0.0.1, its rendezvous bound there: :mod:`fl_adapters.fedlab.network`). This module builds the pieces from a :class:`~fl_adapters.config.RunConfig`
and, after every aggregation, evaluates the global model and writes the run's records and
checkpoint, from which ``resume=True`` continues (``docs/run.md``). A cross-process run's
launcher is :mod:`fl_adapters.fedlab.launch`.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fedlab.utils import SerializationTool

from fl_adapters import bias
from fl_adapters._training import evaluate_counts, evaluated_clients, evaluates
from fl_adapters.astraea import label_counts
from fl_adapters.checkpoint import (
    Checkpoint,
    check_plan,
    recording_to,
    restore_sampler,
    sampler_state,
)
from fl_adapters.client_metrics import requested
from fl_adapters.config import RunConfig
from fl_adapters.experiment import is_mediated, metric_prefix, training_data
from fl_adapters.fedlab.astraea import (
    AstraeaSerialTrainer,
    AstraeaServerHandler,
    client_labels,
    param_bytes,
    receive_counts,
    relay_rounds,
    report_counts,
)
from fl_adapters.fedlab.data import PartitionedDataset
from fl_adapters.fedlab.handler import FedBalanceServerHandler
from fl_adapters.fedlab.launch import check_processes, load_checkpoint
from fl_adapters.fedlab.trainer import FedBalanceSerialTrainer, LocalConfig, UplinkHook
from fl_adapters.registry import build_aggregator, get_registry
from fl_adapters.run.lifecycle import Rounds, open_for_resume
from fl_aggregators import AggregationResult
from fl_aggregators.astraea_plan import client_kl, mediator_kl
from fl_checks import ParameterError

log = logging.getLogger(__name__)


@dataclass
class Experiment:
    """Everything a run needs, built the same way in every process of a run."""

    config: RunConfig
    data: PartitionedDataset
    model: torch.nn.Module
    local: LocalConfig
    num_classes: int


def build(config: RunConfig) -> Experiment:
    """Dataset, partition, initial model and local training settings for ``config``.

    The model is initialised from ``torch.manual_seed(config.seed)``, so the server and every
    client process start from the same weights.
    """
    from fl_adapters.datasets import image_spec
    from fl_adapters.models import model_for

    aggregator_cls = get_registry().aggregator(config.aggregator)
    train, _, partition = training_data(config)
    model = model_for(config.model, config.dataset, config.data_dir, seed=config.seed)
    num_classes = image_spec(config.dataset, config.data_dir)[2]
    local = LocalConfig(
        epochs=config.local_epochs,
        batch_size=config.batch_size,
        optimizer=config.optimizer,
        lr=config.lr,
        seed=config.seed,
        metrics=requested(aggregator_cls),
    )
    return Experiment(config, PartitionedDataset(train, partition), model, local, num_classes)


class MetricsWriter:
    """Evaluates the global model after each aggregation and reports each round's row and
    state to the run's :class:`~fl_adapters.run.lifecycle.Rounds`, which writes them."""

    def __init__(self, exp: Experiment, rounds: Rounds, progress: bool = True) -> None:
        self.exp = exp
        self.run = rounds
        self.files = rounds.files
        self.rows = rounds.rows
        #: ``eval_data: test``: the dataset's test set; otherwise each round's evaluated
        #: clients' splits are read when they evaluate (:meth:`evaluation_data`).
        self.test: list[Any] | None = None
        if exp.config.eval_data == "test":
            from fl_adapters.datasets import load_dataset

            cfg = exp.config
            self.test = [load_dataset(cfg.dataset, train=False, data_dir=cfg.data_dir)]
        self.param_bytes = param_bytes(exp.model)
        self.astraea: Any = None  # the AstraeaPlanner of an Astraea run
        #: Standalone: the serial trainer, whose counts of samples trained (and, for Astraea,
        #: of the labels of the rebalanced data) the rows report.
        self.trainer: Any = None
        self._passes = 0
        self.started = rounds.started
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=exp.config.rounds,
                initial=len(self.rows),
                desc=f"{exp.config.aggregator} rounds",
                unit="round",
                leave=False,
                disable=None,
            )

    def evaluation_data(self, round_number: int) -> dict[Any, Any]:
        """What round ``round_number`` is evaluated on: the test set (one part, ``"test"``),
        or the test (``eval_data: val``: validation) splits of the clients
        :func:`evaluated_clients` draws, by client."""
        if self.test is not None:
            return {"test": self.test[0]}
        cfg, data = self.exp.config, self.exp.data
        chosen = evaluated_clients(data.num, cfg.eval_fraction, cfg.seed, round_number)
        return {c: data.get_dataset(c, metric_prefix(cfg)) for c in chosen}

    def evaluate(self, model: Any, round_number: int) -> dict[str, Any]:
        """Round ``round_number``'s evaluation: loss, accuracy and samples (prefixed ``test_``
        or ``val_``), the class figures and, on clients' data, the client figures
        (:mod:`fl_adapters.bias`), from one pass over each part; each client's accuracy goes
        to ``clients.jsonl``."""
        parts = self.evaluation_data(round_number)
        per = {c: evaluate_counts(model, ds) for c, ds in parts.items()}
        counts = bias.total(list(per.values()))
        pre = metric_prefix(self.exp.config)
        row: dict[str, Any] = {f"{pre}_loss": counts.loss, f"{pre}_accuracy": counts.accuracy}
        row[f"{pre}_samples"] = counts.n
        row.update(bias.class_figures(counts, self.exp.num_classes))
        if self.test is None:
            row.update(bias.client_figures(per))
            self.files.add_clients(round_number, bias.client_accuracies(per))
        return row

    def __call__(
        self,
        handler: FedBalanceServerHandler,
        result: AggregationResult,
        bytes_up: int | None = None,
        bytes_down: int | None = None,
    ) -> None:
        rnd = handler.round + 1
        k = len(result.weights)
        row: dict[str, Any] = {
            "round": rnd,
            "clients": result.clients,
            "weights": result.weights,
            "rejected": len(result.rejected),
            "skipped": result.skipped,
        }
        if evaluates(rnd, self.exp.config.eval_every, self.exp.config.rounds):
            row.update(self.evaluate(handler.model, rnd))
        # bounded: clients whose count or loss a bound lowered; update_scale: update_clip's cuts
        row.update({k: result.extra[k] for k in ("bounded", "update_scale") if k in result.extra})
        traffic = result.extra.get("bytes")
        if traffic is not None:  # Astraea: server and mediator hops
            if bytes_down is None:  # standalone: the protocol's traffic (measured cross-process)
                hops = traffic["mediator_clients"] // 2
                bytes_down, bytes_up = traffic["server_down"] + hops, traffic["server_up"] + hops
            row.update(mediators=result.extra["mediators"], mediator_kl=result.extra["kl"])
            trained = self._trained_counts()
            if trained:  # standalone: KL of the data the mediators actually trained on
                counts = np.zeros((self.exp.data.num, self.exp.num_classes), np.int64)
                for c, n in trained.items():
                    counts[c] = n
                row["mediator_kl_trained"] = mediator_kl(counts, row["mediators"])
        if self.trainer is not None:  # standalone: samples trained this round, x local epochs
            row["sample_passes"] = self.trainer.sample_passes - self._passes
            self._passes = self.trainer.sample_passes
        # Parameters down to each sampled client and up again, plus fedbalance's 3-float meta.
        row["bytes_down"] = bytes_down if bytes_down is not None else k * self.param_bytes
        row["bytes_up"] = bytes_up if bytes_up is not None else k * (self.param_bytes + 12)
        row["elapsed_s"] = round(time.perf_counter() - self.started, 3)
        self.run.done(row, **self.state(handler))
        if self.bar is not None:
            self.bar.update(1)
            if "test_accuracy" in row or "val_accuracy" in row:
                acc = row.get("test_accuracy", row.get("val_accuracy"))
                self.bar.set_postfix(acc=f"{acc:.4f}")

    def _trained_counts(self) -> dict[int, np.ndarray]:
        """Standalone Astraea: the label counts of each client's data as it trains on it (its
        rebalanced data, counted once, when first built)."""
        rebalanced = getattr(self.trainer, "rebalanced", None)
        return rebalanced.trained_counts if rebalanced is not None else {}

    def state(self, handler: FedBalanceServerHandler) -> dict[str, Any]:
        """What the checkpoint keeps of ``handler`` after its round
        (:func:`~fl_adapters.run.lifecycle.capture`'s keywords)."""
        planner = getattr(handler, "planner", None)
        return dict(
            model=SerializationTool.serialize_model(handler.model),
            aggregator=handler.aggregator,
            participations=handler.participations,
            sampler=sampler_state(handler.rng),
            plan=planner.plan.as_dict() if planner is not None else None,
        )

    def summary(self) -> dict[str, Any]:
        if self.bar is not None:
            self.bar.close()
        doc: dict[str, Any] = {
            "bytes_up": sum(r["bytes_up"] for r in self.rows),
            "bytes_down": sum(r["bytes_down"] for r in self.rows),
        }
        if self.astraea is not None:
            kl = self.astraea.client_kl()
            med = [v for r in self.rows for v in r.get("mediator_kl", [])]
            doc["astraea"] = {
                **self.astraea.plan.as_dict(),
                "client_kl_before": kl["before"],
                "client_kl_after": kl["after"],
                "mediator_kl_mean": sum(med) / len(med) if med else None,
            }
            counts, expected = self.astraea.counts, self.astraea.expected
            doc["astraea"]["data_added"] = {"expected": float(expected.sum() / counts.sum() - 1)}
            trained = self._trained_counts()
            if trained:  # the clients' rebalanced data as built (every client that trained)
                ids = sorted(c for c in trained if trained[c].sum() > 0)
                doc["astraea"]["client_kl_after_trained"] = dict(
                    zip(ids, client_kl(np.stack([trained[c] for c in ids])), strict=True)
                )
                built = sum(int(trained[c].sum()) for c in ids)
                doc["astraea"]["data_added"]["trained"] = built / counts[ids].sum() - 1
        return self.run.finish(doc)


def make_handler(exp: Experiment, on_round: Any = None) -> FedBalanceServerHandler:
    cfg = exp.config
    kwargs: dict[str, Any] = dict(
        aggregator=cfg.aggregator,
        aggregator_args=cfg.aggregator_args,
        seed=cfg.seed,
        clients_per_round=cfg.clients_per_round,
        host="fedlab" if cfg.framework == "fedlab" else "fedlab-distributed",
        on_round=on_round,
    )
    rounds, ratio = cfg.rounds, cfg.clients_per_round / cfg.num_clients
    if is_mediated(cfg.aggregator):
        counts = [label_counts(y, exp.num_classes) for y in client_labels(exp.data)]
        return AstraeaServerHandler(exp.model, rounds, ratio, class_counts=counts, **kwargs)
    return FedBalanceServerHandler(exp.model, rounds, ratio, **kwargs)


def restore(handler: FedBalanceServerHandler, ckpt: Checkpoint) -> None:
    """Put ``handler`` (model, round, aggregator state, sampler) where ``ckpt`` left it."""
    # load_checkpoint has refused another host's; check_model refuses another shape or dtype.
    ckpt.check_model(SerializationTool.serialize_model(handler.model), Path("checkpoint.pt"))
    planner = getattr(handler, "planner", None)
    if planner is not None:
        check_plan(ckpt.plan, planner.plan.as_dict())
    SerializationTool.deserialize_model(handler.model, ckpt.model)
    handler.round = ckpt.round
    handler.aggregator.load_state_dict(ckpt.aggregator)
    handler.participations = dict(ckpt.participations)
    restore_sampler(handler.rng, ckpt.sampler)
    log.info("resumed after round %d of %d", ckpt.round, handler.global_round)


def run_standalone(
    config: RunConfig,
    out_dir: Path,
    progress: bool = True,
    uplink_hook: UplinkHook | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """One run in FedLab's ``StandalonePipeline``; returns the summary.

    ``uplink_hook`` rewrites what clients send (with mediators: what each member reports to
    its mediator): see :class:`~fl_adapters.fedlab.trainer.FedBalanceSerialTrainer`. ``resume`` continues from
    ``out_dir/checkpoint.pt``.
    """
    from fedlab.core.standalone import StandalonePipeline

    class Pipeline(StandalonePipeline):
        def evaluate(self) -> None:  # evaluation happens after each aggregation (on_round)
            pass

    ckpt = load_checkpoint(config, out_dir) if resume else None
    exp = build(config)
    writer = MetricsWriter(exp, Rounds(config, out_dir, "fedlab", ckpt), progress)
    handler = make_handler(exp, on_round=writer)
    model = copy.deepcopy(exp.model)
    trainer: FedBalanceSerialTrainer
    if isinstance(handler, AstraeaServerHandler):
        trainer = AstraeaSerialTrainer(
            model,
            exp.data,
            exp.local,
            handler.astraea.mediator_epochs,
            uplink_hook=uplink_hook,
            carry_optimizer=handler.astraea.carry_optimizer,
        )
        writer.astraea = handler.planner
    else:
        trainer = FedBalanceSerialTrainer(model, exp.data, exp.local, uplink_hook=uplink_hook)
    writer.trainer = trainer
    if ckpt is not None:
        restore(handler, ckpt)
        trainer.participations = dict(ckpt.participations)
        if isinstance(trainer, AstraeaSerialTrainer):
            trainer.rounds = ckpt.round
    with recording_to(writer.files.record):
        Pipeline(handler, trainer).main()
    return writer.summary()


# -- cross-process ----------------------------------------------------------------------------
def client_slices(num_clients: int, processes: int) -> list[list[int]]:
    """Contiguous client-id ranges, one per client process (FedLab's Coordinator maps them so)."""
    return [ids.tolist() for ids in np.array_split(np.arange(num_clients), processes)]


def run_server(
    config: RunConfig,
    out_dir: Path,
    world_size: int,
    host: str = "127.0.0.1",
    progress: bool = True,
    resume: bool = False,
) -> dict[str, Any]:
    """The server role of a cross-process run (rank 0)."""
    from fedlab.core.server.manager import SynchronousServerManager

    from fl_adapters.fedlab.network import BoundNetwork

    ckpt = load_checkpoint(config, out_dir) if resume else None
    exp = build(config)
    writer = MetricsWriter(exp, Rounds(config, out_dir, "fedlab", ckpt), progress)
    network = BoundNetwork((host, str(config.port)), world_size=world_size, rank=0)
    sent = {"down": 0, "up": 0}

    def on_round(handler: FedBalanceServerHandler, result: AggregationResult) -> None:
        down, up = network.send_volume_intotal, network.recv_volume_intotal
        writer(handler, result, bytes_up=up - sent["up"], bytes_down=down - sent["down"])
        sent.update(down=down, up=up)

    handler = make_handler(exp, on_round=on_round)
    if ckpt is not None:
        restore(handler, ckpt)
    manager_cls: Any = SynchronousServerManager
    if isinstance(handler, AstraeaServerHandler):
        writer.astraea = handler.planner
        astraea = handler

        class AstraeaServerManager(SynchronousServerManager):
            def setup(self) -> None:
                super().setup()
                reported = receive_counts(self._network, exp.num_classes)
                if not np.array_equal(reported, astraea.planner.counts):
                    raise RuntimeError(
                        "the client processes reported label counts that differ from this "
                        "config's partition: every process must run the same config"
                    )

            def main_loop(self) -> None:
                relay_rounds(self, astraea.planner, astraea.plan_round)

        manager_cls = AstraeaServerManager
    with recording_to(writer.files.record):
        manager_cls(network=network, handler=handler, mode="LOCAL").run()
    return writer.summary()


def run_client(
    config: RunConfig,
    rank: int,
    world_size: int,
    host: str = "127.0.0.1",
    resume_from: Path | None = None,
) -> None:
    """Client process ``rank`` (1..world_size-1): simulates its slice of the clients.

    ``resume_from``: the server's checkpoint, for how often each client has trained.
    """
    from fedlab.core.client.manager import PassiveClientManager

    from fl_adapters.fedlab.network import BoundNetwork

    check_processes(config, world_size - 1)
    if not 1 <= rank < world_size:
        raise ParameterError(
            f"rank must be between 1 and world_size-1={world_size - 1}, got {rank}"
        )
    exp = build(config)
    ids = client_slices(config.num_clients, world_size - 1)[rank - 1]
    trainer: FedBalanceSerialTrainer
    manager_cls: Any = PassiveClientManager
    if is_mediated(config.aggregator):
        epochs = build_aggregator(config.aggregator, config.aggregator_args).mediator_epochs
        trainer = AstraeaSerialTrainer(exp.model, exp.data, exp.local, epochs, client_ids=ids)
        labels = client_labels(exp.data)
        counts = np.stack([label_counts(labels[c], exp.num_classes) for c in ids])

        class AstraeaClientManager(PassiveClientManager):
            def setup(self) -> None:
                super().setup()
                report_counts(self._network, counts)  # the clients' label counts, once

        manager_cls = AstraeaClientManager
    else:
        trainer = FedBalanceSerialTrainer(exp.model, exp.data, exp.local, client_ids=ids)
    if resume_from is not None:
        ckpt = open_for_resume(resume_from, "fedlab", config.to_dict())
        trainer.participations = {c: k for c, k in ckpt.participations.items() if c in ids}
    network = BoundNetwork((host, str(config.port)), world_size=world_size, rank=rank)
    manager_cls(trainer=trainer, network=network).run()
