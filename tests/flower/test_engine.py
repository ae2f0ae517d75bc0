"""The simulation engine's message polling by message: what Flower's per-node loop hands out.

Both run against Flower's own link state, set up as ``run_simulation`` sets it up (a run, its
virtual nodes registered by the engine's ``_register_nodes``, messages pushed through the
``InMemoryGrid`` a ServerApp uses).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from queue import Queue

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from fl_adapters.flower import engine

pytestmark = pytest.mark.usefixtures("flower_task")  # run 1, as federation() registers it

SIMULATE = "fl_adapters.flower.app.simulate"
NODES = 50
#: Partition ids that get messages, in the order they are pushed (7 gets three, 3 two).
SENT = [7, 3, 41, 7, 0, 3, 7, 12]


def federation(nodes: int = NODES) -> tuple[object, dict[int, int]]:
    """A link state with one run, ``nodes`` virtual nodes and :data:`SENT`'s messages (each
    naming its rank in ``SENT``); returns the state and the engine's node -> partition map."""
    factory = LinkStateFactory(
        FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
    )
    state = factory.state()
    run = Run.create_empty(run_id=1)
    run.federation_id, run.primary_task_id = NOOP_FEDERATION_ID, 2
    # as run_simulation pre-registers the run and its primary task
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[2] = Task(task_id=2, run_id=run.run_id)
    mapping = vce_api._register_nodes(nodes, factory)
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    node_of = {partition: node for node, partition in mapping.items()}
    grid.push_messages(
        Message(RecordDict({"c": ConfigRecord({"rank": rank})}), node_of[p], "train")
        for rank, p in enumerate(SENT)
    )
    return state, mapping


def flowers_pass(state: object, mapping: dict[int, int]) -> list[Message]:
    """One pass of Flower 1.41's ``add_messages_to_queue`` (its loop body)."""
    return [m for node in mapping for m in state.get_message_ins(node_id=node, limit=1)]  # type: ignore[attr-defined]


def handed_out(one_pass, state: object, mapping: dict[int, int]) -> list[list[tuple[int, int]]]:
    """Each pass's (partition, rank) pairs, passes until one hands out nothing."""
    passes = []
    while got := one_pass(state, mapping):
        assert all(m.metadata.delivered_at != "" for m in got)
        passes.append([(mapping[m.metadata.dst_node_id], m.content["c"]["rank"]) for m in got])
    return passes


def test_one_scan_hands_out_what_flowers_per_node_loop_does() -> None:
    ours = handed_out(
        lambda s, m: engine.pending_messages(s, {n: i for i, n in enumerate(m)}), *federation()
    )
    flowers = handed_out(flowers_pass, *federation())
    assert ours == flowers
    # at most one message per node a pass, the first pushed, nodes in registration order
    assert flowers == [[(0, 4), (3, 1), (7, 0), (12, 7), (41, 2)], [(3, 5), (7, 3)], [(7, 6)]]


def test_an_expired_message_is_dropped_as_flower_drops_it() -> None:
    state, mapping = federation()
    first = next(iter(state.message_ins_store.values()))  # type: ignore[attr-defined]
    first.metadata.__dict__["_ttl"] = 1e-6  # long gone
    got = engine.pending_messages(state, {n: i for i, n in enumerate(mapping)})
    assert [m.content["c"]["rank"] for m in got] == [4, 1, 3, 7, 2]  # 7's first (rank 0) gone
    assert first.metadata.message_id not in state.message_ins_store  # type: ignore[attr-defined]


def test_the_extractor_thread_queues_and_stops_like_flowers() -> None:
    state, mapping = federation()
    queue: Queue[Message] = Queue()
    stop = threading.Event()
    thread = threading.Thread(
        target=engine.add_messages_to_queue, args=(state, queue, mapping, stop)
    )
    thread.start()
    deadline = time.monotonic() + 10
    while queue.qsize() < len(SENT) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert sorted(queue.get_nowait().content["c"]["rank"] for _ in SENT) == list(range(len(SENT)))


def test_another_link_state_gets_flowers_own_loop(caplog: pytest.LogCaptureFixture) -> None:
    sqlite = LinkStateFactory(":memory:", NoOpFederationManager(), ObjectStoreFactory()).state()
    assert not engine.indexable(sqlite)
    assert engine.indexable(federation()[0])
    stopped = threading.Event()
    stopped.set()  # Flower's loop returns at once
    with caplog.at_level("INFO", logger=engine.__name__):
        engine.add_messages_to_queue(sqlite, Queue(), {}, stopped)
    assert "Flower's link state is SqlLinkState: its own message polling runs" in caplog.text


def test_polling_is_swapped_in_flowers_engine_keeping_flowers_loop() -> None:
    try:
        engine.index_message_polling()
        engine.index_message_polling()
        assert vce_api.add_messages_to_queue is engine.add_messages_to_queue
        assert engine._STOCK.__module__ == vce_api.__name__  # Flower's, kept for the fallback
    finally:
        vce_api.add_messages_to_queue = engine._STOCK


def test_the_simulation_refuses_an_unknown_polling_naming_the_choices() -> None:
    done = subprocess.run(
        [sys.executable, "-m", SIMULATE, "--num-supernodes", "2"],
        capture_output=True,
        text=True,
        env={**os.environ, "FEDBALANCE_FLOWER_POLLING": "fast"},
        timeout=120,
    )
    assert done.returncode == 2
    assert "FEDBALANCE_FLOWER_POLLING must be one of index, flower, got 'fast'" in done.stderr


def test_the_actor_count_sets_rays_cpus_or_is_refused_naming_the_range() -> None:
    """``FEDBALANCE_FLOWER_ACTORS``: unset or empty keeps Flower's default (Ray's own CPU
    count, one per client); ``N`` gives Ray ``N`` CPUs, so ``N`` actors; anything else is
    refused with the range (``simulate`` turns it into its usage error)."""
    from fl_adapters.flower.app import MAX_ACTORS, backend_config

    default = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    assert backend_config(None) == backend_config("") == default
    assert backend_config("1") == default | {"init_args": {"num_cpus": 1}}
    assert backend_config(str(MAX_ACTORS))["init_args"] == {"num_cpus": MAX_ACTORS}
    for bad in ("0", "-1", "1.5", "two", "\u00b2", str(MAX_ACTORS + 1), "10" * 20):
        with pytest.raises(ValueError, match=rf"FEDBALANCE_FLOWER_ACTORS must be a whole number "
                           rf"of ClientApp actors in \[1, {MAX_ACTORS}\].*got '{bad}'"):  # fmt: skip
            backend_config(bad)


@pytest.mark.parametrize("nodes", [100, 10_000], ids=["1e2 nodes", "1e4 nodes"])
def test_a_pass_reads_the_messages_not_the_nodes(nodes: int) -> None:
    """Work, not time: the pass touches the stored messages once, whatever the nodes."""
    state, mapping = federation(nodes)
    checked: list[int] = []
    real = state._check_stored_messages  # type: ignore[attr-defined]
    state._check_stored_messages = lambda ids, *a: (checked.append(len(ids)), real(ids, *a))  # type: ignore[attr-defined]
    engine.pending_messages(state, {n: i for i, n in enumerate(mapping)})
    assert checked == [len(SENT)]
