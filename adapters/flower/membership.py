"""Which nodes belong to a Flower deployment, and the refusal of train replies that do not.

A local deployment that fedbalance starts (:func:`fl_adapters.flower.runner.run_deployment`)
registers one key per SuperNode with the SuperLink and writes the node ids it got, each with
the partition it serves, to a file named by :data:`MEMBERS_ENV` in the environment of every
process it starts. The strategy then sends messages only to those nodes, trusts their
partitions without asking, and refuses (:func:`refusals`) a train reply

* from a node that is not a member (a node that got in some other way),
* whose ``client-id`` is not the partition its node was registered with, or
* whose ``client-id`` another reply of the same round also claims (with or without a member
  list: on a deployment a user started by hand this is the check there is).

A refused reply goes to the aggregator as ``refused`` (:func:`member_updates`): it is left out
with a logged warning like any rejection and appears in the round's record under ``rejected``,
named by its node (``"node 123"``), never by the client id it claimed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flwr.app import Message

from fl_adapters.config import ConfigError
from fl_adapters.flower.payload import reported_client
from fl_aggregators import ClientUpdate

#: The file of the deployment's members: ``{"<node id>": <partition id>, ...}`` (JSON).
MEMBERS_ENV = "FEDBALANCE_FLOWER_MEMBERS"


def write_members(path: Path, members: Mapping[int, int]) -> None:
    """Write ``members`` (node id -> partition id) for :func:`load_members`."""
    path.write_text(json.dumps({str(n): c for n, c in members.items()}, sort_keys=True))


def load_members(environ: Mapping[str, str] = os.environ) -> dict[int, int] | None:
    """Node id -> partition id of the deployment's members; ``None`` when :data:`MEMBERS_ENV`
    is unset (a simulation, or a deployment not started by fedbalance). A set variable whose
    file cannot be read is an error: a run that was meant to check membership never runs
    without it."""
    where = environ.get(MEMBERS_ENV)
    if not where:
        return None
    try:
        raw = json.loads(Path(where).read_text())
        members = {int(node): int(client) for node, client in raw.items()}
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"{MEMBERS_ENV}={where}: not a readable member list ({e})") from e
    if not members:
        raise ConfigError(f"{MEMBERS_ENV}={where}: the member list is empty")
    return members


def refusals(replies: Sequence[Message], members: Mapping[int, int] | None) -> dict[int, str]:
    """Why each refused reply of a round is refused, by its index in ``replies``."""
    refused: dict[int, str] = {}
    claims: dict[Any, list[int]] = {}
    for i, msg in enumerate(replies):
        node, client = msg.metadata.src_node_id, reported_client(msg)
        if members is not None and node not in members:
            refused[i] = f"node {node} is not a member of this deployment (claims client {client})"
        elif members is not None and client is not None and client != members[node]:
            refused[i] = (
                f"node {node} claims client {client}, but was registered as client {members[node]}"
            )
        else:
            claims.setdefault(node if client is None else client, []).append(i)
    for client, indices in claims.items():
        if len(indices) > 1:
            nodes = ", ".join(str(replies[i].metadata.src_node_id) for i in indices)
            for i in indices:
                refused[i] = (
                    f"client {client} is claimed by more than one node this round ({nodes})"
                )
    return refused


def member_updates(
    replies: Sequence[Message],
    members: Mapping[int, int] | None,
    convert: Callable[[Message], ClientUpdate],
) -> tuple[list[ClientUpdate], dict[int, str], list[int]]:
    """A round's replies as updates sorted by client, the indices (into that list) the
    aggregator must refuse, with why (:func:`refusals`), and the node each update came from. A
    refused update is named by the node that sent it (``"node 123"``), never by the client id
    it claimed.

    Sorted by client: replies arrive in any order, and float sums in a fixed order make the
    same seed give the same model bit for bit, in simulation and deployment alike."""
    refused = refusals(replies, members)
    updates = [convert(msg) for msg in replies]
    for i in refused:
        node = replies[i].metadata.src_node_id
        updates[i] = dataclasses.replace(updates[i], client_id=f"node {node}")
    order = sorted(
        range(len(updates)),
        key=lambda i: (
            not isinstance(updates[i].client_id, int),
            str(updates[i].client_id).zfill(20),
        ),
    )
    at = {old: new for new, old in enumerate(order)}
    return (
        [updates[i] for i in order],
        {at[i]: why for i, why in refused.items()},
        [replies[i].metadata.src_node_id for i in order],
    )
