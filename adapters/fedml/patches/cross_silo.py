"""FedML cross-silo (one process per silo and one server, over MPI or FedML's gRPC):
fedbalance's training and aggregation (behind FedML's DP and defence hooks), Astraea's relay,
resume, a gRPC silo that waits for its server, a receive loop that waits instead of spinning,
and LightSecAgg (:mod:`fl_adapters.fedml.secure`).
"""

from __future__ import annotations

import logging
from typing import Any

from fl_adapters.fedml import secure
from fl_adapters.fedml.adapter import aggregate, current
from fl_adapters.fedml.astraea import with_rad
from fl_adapters.fedml.ipconfig import expect_silos, wait_for_server
from fl_adapters.fedml.patches import distributed as shared

HOST = "fedml-cross-silo"
#: How long a process's gRPC server, once its run is over, lets calls in flight finish before
#: it cancels them (the wait ends as soon as they have).
STOP_GRACE_S = 5.0

log = logging.getLogger(__name__)


def client_init(self: Any, original: Any, msg_params: Any) -> Any:
    server_round = shared.downlink_round(msg_params)
    out = original(self, msg_params)  # trains round 0 and counts it
    if server_round is not None:
        self.round_idx = server_round
    return out


def client_sync(self: Any, original: Any, msg_params: Any) -> Any:
    server_round = shared.downlink_round(msg_params)
    if server_round is not None:  # FedML trains while its count is below comm_round
        self.round_idx = server_round - 1
    return original(self, msg_params)


def send_init(self: Any, original: Any) -> Any:
    astraea = shared.server_astraea(self)
    if astraea is None:
        return original(self)
    astraea.plan_round(self.client_id_list_in_this_round, self.data_silo_index_list)
    current().planned_round = "init"
    params = with_rad(
        self.aggregator.get_global_model_params(), astraea.planner.rad, self.args.round_idx + 1
    )
    for hop in astraea.relay.start():  # the round's model goes to each mediator's first silo
        self.send_message_init_config(hop.owner, params, hop.clients[0], None, None)
    return None


def receive(self: Any, original: Any, msg_params: Any) -> Any:
    if shared.server_astraea(self) is None:
        return original(self, msg_params)
    from fedml.cross_silo.server.message_define import MyMessage

    def pass_on(hop: Any, params: Any) -> None:
        with shared.forwarding():
            self.send_message_sync_model_to_client(hop.owner, params, hop.clients[0])

    return shared.relay(self, original, msg_params, MyMessage, pass_on, self.aggregator.client_num)


def send_sync(
    self: Any, original: Any, receive_id: Any, params: Any, client_index: Any, *a: Any, **kw: Any
) -> Any:
    run = current()
    astraea = shared.server_astraea(self)
    # Not mediated, a model passed along a chain, or the final model (every silo, then finish).
    if astraea is None or run.forwarding or self.args.round_idx + 1 >= self.round_num:
        return original(self, receive_id, params, client_index, *a, **kw)
    if run.planned_round != self.args.round_idx:  # FedML has picked the next round
        astraea.plan_round(self.client_id_list_in_this_round, self.data_silo_index_list)
        run.planned_round = self.args.round_idx
    if int(receive_id) not in astraea.first_receivers():
        return None, None
    # FedML sends the next round's model before it counts the round it has just finished.
    params = with_rad(params, astraea.planner.rad, self.args.round_idx + 2)
    return original(self, receive_id, params, client_index, *a, **kw)


def client_connection_ready(self: Any, original: Any, msg_params: Any) -> Any:
    if str(getattr(self.args, "backend", "")) == "GRPC" and not self.has_sent_online_msg:
        wait_for_server(self.args)  # FedML's silo dies if its one status send finds no server
    return original(self, msg_params)


def server_connection_ready(self: Any, original: Any, msg_params: Any) -> Any:
    if not self.is_initialized:
        shared.resume_server(self)  # before FedML picks the first round's silos
    if str(getattr(self.args, "backend", "")) == "GRPC" and not self.is_initialized:
        expect_silos(self)  # FedML's server would wait forever for a silo never started
    return original(self, msg_params)


def aggregate_round(self: Any, original: Any) -> Any:
    # FedML's DP/defence hooks
    model_list, idxes = self.aggregator.on_before_aggregation(shared.uploads(self, self.client_num))
    averaged = aggregate(model_list, self.get_global_model_params())
    averaged = self.aggregator.on_after_aggregation(averaged)
    self.set_global_model_params(averaged)
    shared.server_checkpoint(self, averaged)
    return averaged, model_list, idxes


def graceful_finish(self: Any, original: Any) -> Any:
    """FedML's ``finish``, over gRPC after the process's gRPC server has stopped with a grace
    period, so calls in flight end first (over MPI there is no gRPC server: FedML's alone).

    FedML 0.9.6's ``GRPCCommManager.stop_receive_message`` stops it with ``stop(None)``, which
    cancels every call in flight. A silo finishes while handling the final model, and the call
    that delivered that model may not have sent its answer yet (FedML's servicer queues the
    message before it answers): the server's ``send_message`` then raises ``Cancelling all
    calls`` and the server dies after its last round. Stock FedML loses this race too
    (``benchmarks/results/grpc_shutdown.md``); FedML's own stop is then a no-op.
    """
    server = getattr(self.com_manager, "grpc_server", None)
    if server is not None:
        server.stop(STOP_GRACE_S).wait()
    return original(self)


SILO = "fedml.cross_silo"
SERVER = (f"{SILO}.server.fedml_server_manager", "FedMLServerManager")
CLIENT = (f"{SILO}.client.fedml_client_master_manager", "ClientMasterManager")
TRAINER = (f"{SILO}.client.fedml_trainer", "FedMLTrainer")
AGGREGATOR = (f"{SILO}.server.fedml_aggregator", "FedMLAggregator")
#: ``(module, class, method, replacement)``
TARGETS = (
    (*TRAINER, "train", shared.train),
    # Each process's message loop waits for messages instead of spinning.
    (*SERVER, "run", shared.quiet_run),
    (*CLIENT, "run", shared.quiet_run),
    (*AGGREGATOR, "aggregate", aggregate_round),
    (*AGGREGATOR, "test_on_server_for_all_clients", shared.test_round),
    # Resume: the silos learn the server's round.
    (*SERVER, "send_message_init_config", shared.tag_init),
    (*CLIENT, "handle_message_init", client_init),
    (*CLIENT, "handle_message_receive_model_from_server", client_sync),
    # Astraea: the server relays each mediator's model between silos.
    (*TRAINER, "update_model", shared.update_model),
    (*SERVER, "send_init_msg", send_init),
    (*SERVER, "handle_message_receive_model_from_client", receive),
    (*SERVER, "send_message_sync_model_to_client", send_sync),
    # gRPC: start-up order.
    (*CLIENT, "handle_message_connection_ready", client_connection_ready),
    (*SERVER, "handle_message_connection_ready", server_connection_ready),
    # gRPC: shutting down lets the answers in flight go out (see graceful_finish).
    (*SERVER, "finish", graceful_finish),
    (*CLIENT, "finish", graceful_finish),
    *secure.TARGETS,
)
