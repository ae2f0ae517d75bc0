"""FedML MPI simulation (``fedml.simulation.mpi.fedavg``, one process per client of a round
under ``mpirun``): fedbalance's training and aggregation, Astraea's relay, resume.

Rank 0 samples the round's clients and sends worker ``w`` FedML's ``client_indexes[w-1]``;
FedML's client managers count rounds themselves, so a resumed server tells them its round.
"""

from __future__ import annotations

from typing import Any

from fl_adapters.fedml.adapter import aggregate, current
from fl_adapters.fedml.astraea import with_rad
from fl_adapters.fedml.patches import distributed as shared

HOST = "fedml-mpi"


def client_init(self: Any, original: Any, msg_params: Any) -> Any:
    server_round = shared.downlink_round(msg_params)  # a resumed run's (None: round 1)
    out = original(self, msg_params)  # counts from round 0 and trains it
    if server_round is not None:
        self.args.round_idx = server_round - 1
    # The run's only round (comm_round 1, or a resumed run's last): no sync follows, and
    # FedML's clients finish only after one, so the server's MPI.Finalize would wait forever.
    if (server_round or 1) >= int(self.num_rounds):
        self.finish()
    return out


def client_sync(self: Any, original: Any, msg_params: Any) -> Any:
    server_round = shared.downlink_round(msg_params)
    if server_round is not None:  # FedML adds one, trains, and stops after the last round
        self.args.round_idx = server_round - 2
    return original(self, msg_params)


def client_sampling(self: Any, original: Any, *a: Any, **kw: Any) -> Any:
    sampled = original(self, *a, **kw)
    current().mpi_sampled = [int(c) for c in sampled]  # the relay plans the round from it
    return sampled


def plan(manager: Any) -> Any:
    """MPI simulation: the Astraea relay of the round FedML has just sampled (planned once)."""
    run = current()
    astraea = shared.server_astraea(manager)
    if astraea is not None and run.planned_round != manager.args.round_idx:
        workers = list(range(1, manager.size))  # worker w trains FedML's client_indexes[w-1]
        astraea.plan_round(workers, run.mpi_sampled[: len(workers)])
        run.planned_round = manager.args.round_idx
    return astraea


def send_init(self: Any, original: Any) -> Any:
    shared.resume_server(self)
    if not getattr(current().aggregator, "mediated", False):
        return original(self)

    self.aggregator.client_sampling(
        self.args.round_idx, self.args.client_num_in_total, self.args.client_num_per_round
    )
    astraea = plan(self)
    params = with_rad(
        self.aggregator.get_global_model_params(), astraea.planner.rad, self.args.round_idx + 1
    )
    for hop in astraea.relay.start():  # the round's model goes to each mediator's first worker
        self.send_message_init_config(hop.owner, params, hop.clients[0])
    return None


def receive(self: Any, original: Any, msg_params: Any) -> Any:
    if shared.server_astraea(self) is None:
        return original(self, msg_params)
    from fedml.simulation.mpi.fedavg.message_define import MyMessage

    def pass_on(hop: Any, params: Any) -> None:
        if self.args.round_idx == (current().first_round or 0):  # a worker's first message: init
            self.send_message_init_config(hop.owner, params, hop.clients[0])
        else:
            with shared.forwarding():
                self.send_message_sync_model_to_client(hop.owner, params, hop.clients[0])

    return shared.relay(self, original, msg_params, MyMessage, pass_on, self.aggregator.worker_num)


def send_sync(self: Any, original: Any, receive_id: Any, params: Any, client_index: Any) -> Any:
    run = current()
    if not getattr(run.aggregator, "mediated", False) or run.forwarding:
        return original(self, receive_id, params, client_index)
    astraea = plan(self)
    if int(receive_id) not in astraea.first_receivers():
        return None
    # FedML has counted the finished round before sending the next one's model.
    params = with_rad(params, astraea.planner.rad, self.args.round_idx + 1)
    return original(self, receive_id, params, client_index)


def aggregate_round(self: Any, original: Any) -> Any:
    averaged = aggregate(shared.uploads(self, self.worker_num), self.get_global_model_params())
    self.set_global_model_params(averaged)
    shared.server_checkpoint(self, averaged)
    return averaged


MPI = "fedml.simulation.mpi.fedavg"
SERVER = (f"{MPI}.FedAvgServerManager", "FedAVGServerManager")
CLIENT = (f"{MPI}.FedAvgClientManager", "FedAVGClientManager")
TRAINER = (f"{MPI}.FedAVGTrainer", "FedAVGTrainer")
AGGREGATOR = (f"{MPI}.FedAVGAggregator", "FedAVGAggregator")
#: ``(module, class, method, replacement)``
TARGETS = (
    (*TRAINER, "train", shared.train),
    # Each process's message loop waits for messages instead of polling every 0.1 ms.
    (*SERVER, "run", shared.quiet_run),
    (*CLIENT, "run", shared.quiet_run),
    (*AGGREGATOR, "aggregate", aggregate_round),
    (*AGGREGATOR, "test_on_server_for_all_clients", shared.test_round),
    # Resume: the clients learn the server's round.
    (*SERVER, "send_message_init_config", shared.tag_init),
    (*CLIENT, "handle_message_init", client_init),
    (*CLIENT, "handle_message_receive_model_from_server", client_sync),
    # Astraea: the server relays each mediator's model between workers.
    (*TRAINER, "update_model", shared.update_model),
    (*AGGREGATOR, "client_sampling", client_sampling),
    (*SERVER, "send_init_msg", send_init),
    (*SERVER, "handle_message_receive_model_from_client", receive),
    (*SERVER, "send_message_sync_model_to_client", send_sync),
)
