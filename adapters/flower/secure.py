"""FedAvg, FedAvgM, FedLoss and FedLoss-n under Flower's SecAgg+: the server never sees a model.

Flower 1.41's ``SecAggPlusWorkflow`` (legacy API) unmasks ``sum_i n_i x_i / sum_i n_i`` and
hands a strategy only that sum, so a loss-weighted or bounded rule has nothing to weigh. These
aggregators are linear in the client models, with weights computed from scalars, so each round
runs in two phases (:class:`SecAggPlusStrategy`):

1. **Weigh.** The round's train messages go out as usual (marked ``fedbalance-secure =
   "weigh"``); each client trains, and :func:`secagg_mod` keeps the trained model in the node's
   state and replies with its metrics only (``num-examples``, ``val_loss``, ``client-id``,
   in clear). The aggregator turns them into weights (:meth:`~fl_aggregators.Aggregator.weigh`:
   the same checks and bounds as in clear).
2. **Mask.** Flower's own ``SecAggPlusWorkflow`` runs over the accepted clients; each client
   multiplies its kept model by ``m * w_i`` (``m`` the clients weighed; the factor travels in
   its fit instructions) and masks it, weight 1 in the protocol, so the unmasked result is
   ``sum_i w_i x_i``. :meth:`~fl_aggregators.Aggregator.finish` takes it from there (FedAvgM's
   momentum acts on the sum). A client that drops out after phase 1 is left out and the
   others' weights are renormalised; the bounds stay as weighed with it.

The unmasked sum equals the in-clear aggregate up to SecAgg+'s quantization: each client's
values are rounded to ``2 * clipping_range / quantization_range`` (about 4e-6 with the
defaults), and values beyond ``clipping_range`` (8) are clipped, so keep ``m * w_i * x`` inside
it (``clipping_range`` is an argument). Aggregators that need the models are refused when the
strategy is built (:meth:`~fl_aggregators.Aggregator.secure_refusal`). The ClientApp adds one
mod, :func:`secagg_mod` (docs/hosts/beside.md).
"""

from __future__ import annotations

import io
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, cast

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.common.secure_aggregation.secaggplus_constants import Key as SecKey
from flwr.compat.common import recorddict_compat as compat
from flwr.server import ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.serverapp import Grid
from flwr.supercore.primitives.asymmetric import bytes_to_public_key

from fl_adapters.config import ConfigError
from fl_adapters.flower.config import AGGREGATOR_KEY, WHERE
from fl_adapters.flower.membership import member_updates
from fl_adapters.flower.payload import error_line, log_errors, reply_to_update
from fl_adapters.flower.strategy import FedBalanceStrategy, failures_named
from fl_aggregators import UPDATE_NORM
from fl_aggregators.functional import update_norm
from fl_checks import ParameterError

log = logging.getLogger(__name__)

#: Train-config key marking phase 1 ("weigh").
SECURE_KEY = "fedbalance-secure"
#: Fit-instruction key: the factor ``m * w_i`` the client scales its kept model by.
SCALE_KEY = "fedbalance-scale"
#: The node-state ArrayRecord that keeps the trained model between the phases.
KEPT = "fedbalance-secure-model"
PROTOCOL = "secagg+"


class SecAggPlusStrategy(FedBalanceStrategy):
    """:class:`~fl_adapters.flower.strategy.FedBalanceStrategy` whose training rounds run under
    SecAgg+ (see the module docstring).

    Parameters
    ----------
    num_shares, reconstruction_threshold : SecAgg+'s (ints, or fractions of the round's
        clients); a client may drop out while ``reconstruction_threshold`` shares survive.
    clipping_range, quantization_range, modulus_range, timeout : SecAgg+'s quantization and
        per-stage timeout (Flower's defaults).
    **kwargs : :class:`FedBalanceStrategy`'s.
    """

    def __init__(
        self,
        aggregator: Any = "fedavg",
        *,
        num_shares: int | float = 1.0,
        reconstruction_threshold: int | float = 0.5,
        clipping_range: float = 8.0,
        quantization_range: int = 4194304,
        modulus_range: int = 4294967296,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(aggregator, **kwargs)
        reason = self.aggregator.secure_refusal()
        if reason is not None:
            raise ConfigError(
                f"{WHERE} {AGGREGATOR_KEY} = {self.aggregator.name!r} cannot run under SecAgg+: "
                f"{reason}. Those that can: fedavg, fedavgm, fedloss, fedloss_n (without "
                "update_clip)"
            )
        # Flower checks its own parameters here (e.g. the threshold against the shares).
        self.workflow = _Workflow(
            num_shares,
            reconstruction_threshold,
            max_weight=1.0,  # every client weighs 1 in the protocol: its w_i is in its model
            clipping_range=clipping_range,
            quantization_range=quantization_range,
            modulus_range=modulus_range,
            timeout=timeout,
        )
        self._grid: Grid | None = None

    def train_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._grid = grid
        config = ConfigRecord({**dict(config), SECURE_KEY: "weigh"})
        return super().train_messages(server_round, arrays, config, grid)

    def dp_refusal(self) -> str | None:
        """A central-DP wrapper clips what the train replies carry, and under SecAgg+ they
        carry no model (the models travel masked, in the workflow's own messages): its clipping
        would bound nothing and its guarantee would be void, so it is refused."""
        return (
            "under SecAgg+ the train replies carry no model, so the wrapper's clipping would "
            "bound nothing and its noise would protect no one. Use SecAgg+ without the wrapper, "
            "or the wrapper without SecAgg+ (FedBalanceStrategy)"
        )

    def aggregate_replies(
        self, server_round: int, replies: list[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Weigh the clients from their metrics, run SecAgg+ over them, finish the round."""
        if self.global_params is None or self._grid is None:
            raise RuntimeError("aggregate_train before configure_train: no global model")
        ok = [m for m in replies if not m.has_error()]
        failure = log_errors(server_round, replies)
        if failure is not None:
            self.last_failure = failure
        self.check_read_clients(replies)
        updates, refused, nodes = member_updates(
            ok, self.members, lambda m: reply_to_update(m, with_params=False)
        )
        pairs = list(zip(updates, nodes, strict=True))
        weighing = self.aggregator.weigh(
            updates, round=server_round, with_norms=True, refused=refused
        )
        chosen = {
            node: (i, w)
            for i, ((_, node), w) in enumerate(zip(pairs, weighing.weights, strict=True))
            if w > 0
        }
        summed: dict[str, torch.Tensor] | None = None
        dropped: dict[int, str] = {}
        if len(chosen) < 2:
            log.warning(
                "round %s: %d client(s) accepted; secure aggregation needs 2 (the sum of one "
                "model is that model): global model kept",
                server_round,
                len(chosen),
            )
        else:
            summed, survivors = self._secure_sum(server_round, chosen)
            dropped = {
                i: "dropped out after its weight was computed (SecAgg+ "
                + self.workflow.left.get(node, "did not finish")
                + ")"
                for node, (i, _) in chosen.items()
                if node not in survivors
            }
        with failures_named(failure):
            result = self.aggregator.finish(
                self.global_params,
                summed,
                weighing,
                dropped=dropped,
                host=self.host,
                protocol=PROTOCOL,
                resolution=self.workflow.resolution(),
            )
        return self.conclude(server_round, updates, result)

    def _secure_sum(
        self, server_round: int, chosen: dict[int, tuple[int, float]]
    ) -> tuple[dict[str, torch.Tensor] | None, set[int]]:
        """``sum_i w_i x_i`` over the clients that finished SecAgg+, and their node ids."""
        assert self._grid is not None and self.global_params is not None
        m = len(chosen)
        shim = _Round(self._grid, {node: m * w for node, (_, w) in chosen.items()}, server_round)
        context = LegacyContext(
            Context(
                run_id=shim.run_id,
                node_id=0,
                node_config={},
                state=RecordDict(),
                run_config={},
            ),
            config=ServerConfig(num_rounds=1),
            strategy=shim,
            client_manager=SimpleClientManager(),
        )
        context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
            {Key.CURRENT_ROUND: server_round}
        )
        context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        self.workflow.start_round([tuple(t.shape) for t in self.global_params.values()])
        try:
            self.workflow(self._grid, context)
        except Exception as e:  # a reply no check foresaw: the round is lost, not the run
            log.warning(
                "round %s: SecAgg+ failed (%s: %s); global model kept",
                server_round,
                type(e).__name__,
                e,
            )
            return None, set()
        if shim.unmasked is None:
            log.warning("round %s: SecAgg+ did not finish; global model kept", server_round)
            return None, set()
        survivors = {proxy.node_id for proxy in shim.survivors}
        # SecAgg+ divides by the survivors' count (each weighs 1): undo that.
        factor = len(survivors) / m
        keys = list(self.global_params)
        if len(shim.unmasked) != len(keys):
            raise RuntimeError(
                f"SecAgg+ returned {len(shim.unmasked)} arrays for a model of {len(keys)}"
            )
        summed = OrderedDict(
            (k, torch.from_numpy(np.asarray(a, dtype=np.float64) * factor))
            for k, a in zip(keys, shim.unmasked, strict=True)
        )
        return summed, survivors


class _Workflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow, with two repairs it needs to keep its promises.

    * **Dropouts before the masks.** Flower treats every node sampled in the setup stage and
      missing at the end as a dropout whose pairwise masks must be removed, and asks the others
      for its key shares. A node that left during setup or share-keys sent nobody shares and
      was masked with by nobody, so the others fail with a ``KeyError`` and the round is lost.
      After each of those stages the nodes that left are forgotten, as if never sampled.
    * **Malformed replies.** A reply Flower's stages would choke on (a masked vector with a
      missing or extra array, a wrong shape or dtype, values outside the modulus, unreadable
      keys or share lists) is dropped before they read it, and logged with its reason: the node
      counts as a dropout of that stage, and the protocol carries on without it.

    :attr:`left` names, for each node that left this round, the stage and why.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.left: dict[int, str] = {}
        self._shapes: list[tuple[int, ...]] = []

    def start_round(self, shapes: list[tuple[int, ...]]) -> None:
        """Before each run of the protocol: the shapes of the model the clients mask."""
        self.left = {}
        self._shapes = [(1,), *shapes]  # SecAgg+ puts the summed weight first

    def resolution(self) -> float:
        """The largest error per coordinate of the weighted sum ``sum_i w_i x_i``: each of the
        ``s`` surviving values ``m * w_i * x`` is rounded to one quantization step, and the sum
        is divided by ``m >= s``."""
        return 2 * float(self.clipping_range) / float(self.quantization_range)

    def setup_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        go = super().setup_stage(self._checked(grid, "setup", _keys_problem), context, state)
        _forget_absent(state)
        return go

    def share_keys_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        go = super().share_keys_stage(
            self._checked(grid, "share-keys", _shares_problem), context, state
        )
        _forget_absent(state)
        return go

    def collect_masked_vectors_stage(
        self, grid: Grid, context: LegacyContext, state: WorkflowState
    ) -> bool:
        checked = self._checked(grid, "collect-masked-vectors", self._vector_problem)
        return super().collect_masked_vectors_stage(checked, context, state)

    def unmask_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        def problem(configs: ConfigRecord) -> str | None:
            return _unmask_problem(configs, state.sampled_node_ids)

        return super().unmask_stage(self._checked(grid, "unmask", problem), context, state)

    def _checked(
        self, grid: Grid, stage: str, problem: Callable[[ConfigRecord], str | None]
    ) -> Grid:
        return cast(Grid, _CheckedGrid(grid, stage, problem, self.left))

    def _vector_problem(self, configs: ConfigRecord) -> str | None:
        vector = configs.get(SecKey.MASKED_PARAMETERS)
        if not isinstance(vector, list) or len(vector) != len(self._shapes):
            count = len(vector) if isinstance(vector, list) else type(vector).__name__
            return (
                f"a masked vector of {count} arrays where SecAgg+ expects {len(self._shapes)} "
                f"(the model's {len(self._shapes) - 1} and the weight)"
            )
        for i, (raw, shape) in enumerate(zip(vector, self._shapes, strict=True)):
            why = _masked_array_problem(raw, shape, int(self.modulus_range))
            if why is not None:
                return f"masked array {i}: {why}"
        return None


class _CheckedGrid:
    """The grid one SecAgg+ stage talks through: replies ``problem`` finds fault with are
    dropped (logged, and noted in ``left``); nodes that failed or did not reply are noted too."""

    def __init__(
        self,
        grid: Grid,
        stage: str,
        problem: Callable[[ConfigRecord], str | None],
        left: dict[int, str],
    ) -> None:
        self._grid = grid
        self._stage = stage
        self._problem = problem
        self._left = left

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Any:
        messages = list(messages)
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        kept: list[Message] = []
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                self._left.setdefault(
                    node, f"{self._stage} stage: {error_line(reply.error.reason)}"
                )
                kept.append(reply)  # Flower counts it as a failure
                continue
            configs = reply.content.config_records.get(RECORD_KEY_CONFIGS)
            why = "no SecAgg+ record" if configs is None else self._problem(configs)
            if why is None:
                kept.append(reply)
                continue
            log.warning(
                "SecAgg+ %s stage: node %s's reply rejected (%s); it counts as a dropout",
                self._stage,
                node,
                why,
            )
            self._left.setdefault(node, f"{self._stage} stage: reply rejected, {why}")
        answered = {reply.metadata.src_node_id for reply in replies}
        for message in messages:
            if message.metadata.dst_node_id not in answered:
                self._left.setdefault(
                    message.metadata.dst_node_id, f"{self._stage} stage: no reply in time"
                )
        return kept


def _forget_absent(state: WorkflowState) -> None:
    """Nodes that left before the masks were made are no longer part of the round."""
    state.sampled_node_ids = set(state.active_node_ids)
    for nid, neighbours in state.nid_to_neighbours.items():
        state.nid_to_neighbours[nid] = neighbours & state.active_node_ids


def _keys_problem(configs: ConfigRecord) -> str | None:
    for key in (SecKey.PUBLIC_KEY_1, SecKey.PUBLIC_KEY_2):
        raw = configs.get(key)
        if not isinstance(raw, bytes):
            return f"{key} is {type(raw).__name__}, not bytes"
        try:
            bytes_to_public_key(raw)
        except Exception as e:  # noqa: BLE001 - any parse failure makes the key unusable
            return f"{key} is not a public key ({type(e).__name__})"
    return None


def _node_bytes_problem(
    configs: ConfigRecord, ids_key: str, items_key: str, ids: str, items: str
) -> str | None:
    """What is wrong with a reply's pair of parallel lists: node ids and bytes (``None``:
    nothing). ``ids`` and ``items`` name them in the reason."""
    nodes, values = configs.get(ids_key), configs.get(items_key)
    if not isinstance(nodes, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in nodes
    ):
        return f"its {ids} are not a list of node ids"
    if not isinstance(values, list) or not all(isinstance(v, bytes) for v in values):
        return f"its {items} are not a list of bytes"
    if len(nodes) != len(values):
        return f"{len(values)} {items} for {len(nodes)} {ids}"
    return None


def _shares_problem(configs: ConfigRecord) -> str | None:
    return _node_bytes_problem(
        configs, SecKey.DESTINATION_LIST, SecKey.CIPHERTEXT_LIST, "destinations", "ciphertexts"
    )


def _unmask_problem(configs: ConfigRecord, sampled: set[int]) -> str | None:
    why = _node_bytes_problem(configs, SecKey.NODE_ID_LIST, SecKey.SHARE_LIST, "node ids", "shares")
    if why is not None:
        return why
    strangers = sorted(set(cast(list[int], configs[SecKey.NODE_ID_LIST])) - sampled)
    if strangers:
        return f"shares of nodes not in this round: {strangers[:5]}"
    return None


def _masked_array_problem(raw: Any, shape: tuple[int, ...], modulus: int) -> str | None:
    """What is wrong with one serialised masked array (read from its header before any data
    is decoded, so a header claiming a huge shape allocates nothing)."""
    if not isinstance(raw, bytes):
        return f"{type(raw).__name__}, not bytes"
    buf = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(buf)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        got, fortran, dtype = read(buf)
    except Exception as e:  # noqa: BLE001 - not an .npy array, whatever the parser says
        return f"not a NumPy array ({type(e).__name__})"
    if tuple(got) != tuple(shape):
        return f"shape {tuple(got)}, expected {tuple(shape)}"
    if dtype.kind not in "iu":
        return f"dtype {dtype}, not an integer type"
    if len(raw) - buf.tell() != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        return f"{len(raw) - buf.tell()} bytes of data for shape {tuple(shape)} of {dtype}"
    values = np.load(io.BytesIO(raw), allow_pickle=False)
    if values.size and (int(values.min()) < 0 or int(values.max()) >= modulus):
        return f"values outside [0, {modulus})"
    del fortran
    return None


class _Round(LegacyStrategy):
    """The legacy strategy SecAgg+ drives for one round: fit instructions carrying each
    client's scale, and the unmasked sum kept for :class:`SecAggPlusStrategy`."""

    def __init__(self, grid: Grid, scales: dict[int, float], server_round: int) -> None:
        self.grid = grid
        run = getattr(grid, "run", None)
        self.run_id = int(getattr(run, "run_id", 0) or 0)
        self.scales = scales
        self.server_round = server_round
        self.unmasked: list[np.ndarray] | None = None
        self.survivors: list[Any] = []

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any) -> Any:
        empty = Parameters(tensors=[], tensor_type="numpy.ndarray")  # the model stays on the node
        return [
            (
                GridClientProxy(node, self.grid, self.run_id),
                FitIns(empty, {SCALE_KEY: scale, "server-round": self.server_round}),
            )
            for node, scale in sorted(self.scales.items())
        ]

    def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
        if results:
            self.unmasked = parameters_to_ndarrays(results[0][1].parameters)
            self.survivors = [proxy for proxy, _ in results]
        return None, {}  # the outer strategy builds the model

    def initialize_parameters(self, client_manager: Any) -> Any:
        return None

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
        return []

    def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> Any:
        return None, {}

    def evaluate(self, server_round: int, parameters: Any) -> Any:
        return None


# -- the ClientApp side -------------------------------------------------------------------------
def secagg_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """The ClientApp mod for :class:`SecAggPlusStrategy` (see the module docstring).

    Phase 1 (a train message marked ``weigh``): the app's own train handler runs; its trained
    model stays in the node's state and the reply carries its metrics only. Phase 2 (SecAgg+'s
    stages): Flower's ``secaggplus_mod`` masks the kept model, scaled by the factor in the fit
    instructions. Other messages pass through untouched.
    """
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, _kept_model_reply)
    if not any(c.get(SECURE_KEY) == "weigh" for c in msg.content.config_records.values()):
        return call_next(msg, context)
    out = call_next(msg, context)
    if out.has_error():
        return out
    names = list(out.content.array_records.keys())
    if len(names) != 1:
        raise ValueError(f"the train handler replied with {len(names)} ArrayRecords, not 1")
    trained = out.content.array_records[names[0]]
    context.state.array_records[KEPT] = trained
    del out.content[names[0]]  # the model never leaves the node in clear
    given = list(msg.content.array_records.values())
    metrics = list(out.content.metric_records.values())
    if len(given) == 1 and len(metrics) == 1:  # else the server rejects the reply's form
        metrics[0][UPDATE_NORM] = update_norm(
            given[0].to_numpy_ndarrays(), trained.to_numpy_ndarrays()
        )
    return out


def _kept_model_reply(msg: Message, context: Context) -> Message:
    """SecAgg+'s "fit": the model kept in phase 1, times this client's scale, weight 1."""
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    scale = fitins.config.get(SCALE_KEY)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ParameterError(f"SecAgg+ fit instructions carry no {SCALE_KEY!r}: {fitins.config}")
    if KEPT not in context.state.array_records:
        raise ValueError("SecAgg+ asked for a model, but this node trained none this round")
    kept = cast(ArrayRecord, context.state.array_records.pop(KEPT))
    arrays = [np.asarray(a, dtype=np.float64) * float(scale) for a in kept.to_numpy_ndarrays()]
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 1, {})
    return Message(content=compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)
