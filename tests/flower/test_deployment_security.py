"""A deployment fedbalance starts admits only its own members (issue #61).

One real local deployment (``run_deployment``: SuperLink, two SuperNodes, ``flwr run`` of the
quickstart-shaped app, one round) is attacked while it runs, each intruder a real Flower
process with a ``FLWR_HOME`` of its own that trusts the run's CA certificate (so what stops it
is authentication, not an unknown certificate):

* a ``flower-supernode`` with a key of its own, and one with none, try to join;
* ``flwr supernode register`` tries to register the intruder's key;
* ``flwr run`` of another app (``adapters/flower/app``), without the run's token and with a
  guessed one, tries to start a run on the SuperLink;
* a ``flower-superexec`` without the run's secret polls a member's Runtime API for its tasks.

Then the run's record must name only the member clients. The membership refusal inside the
strategy (a reply from a node outside the deployment, or a client id claimed twice) is checked
on real Flower messages without processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cryptography import x509
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fl_adapters.config import ConfigError
from fl_adapters.flower.membership import MEMBERS_ENV, write_members
from fl_adapters.flower.payload import make_reply, to_array_record
from fl_adapters.flower.pki import make_run_keys, node_key_pair, write_private, write_public
from fl_adapters.flower.runner import FEDERATION, IP, Deployment, run_deployment
from fl_adapters.flower.secure import SecAggPlusStrategy
from fl_adapters.flower.strategy import FedBalanceStrategy
from fl_adapters.flower.superlink import write_cli_credentials
from fl_adapters.run.processes import free_ports, stop
from fl_aggregators import UPDATE_NORM

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "tests" / "hosts" / "flower_quickstart"
OTHER_APP = ROOT / "adapters" / "flower" / "app"
BIN = Path(sys.executable).parent


class Intruders:
    """The foreign processes, started while the run goes on; each one's output in a file."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def home(self, name: str, dep: Deployment, token: str | None = None) -> dict[str, str]:
        """An environment with a ``FLWR_HOME`` of its own for the run's SuperLink."""
        assert dep.keys is not None
        home = self.work / f"home-{name}"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{FEDERATION}"\n\n[superlink.{FEDERATION}]\n'
            f'address = "{IP}:{dep.superlink_port}"\n'
            f"root-certificates = {json.dumps(str(dep.keys.ca_cert))}\n"
        )
        if token is not None:
            write_cli_credentials(home, f"{IP}:{dep.superlink_port}", token)
        path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "FLWR_HOME": str(home), "PATH": path}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self.work / f"{name}.log", "wb") as fh:
            self.procs[name] = subprocess.Popen(
                argv, env=env, cwd=self.work, stdout=fh, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def wait(self, names: list[str], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        for name in names:
            try:
                self.procs[name].wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    def outcome(self) -> dict[str, tuple[int | None, str]]:
        """Exit code (``None``: still running, then stopped) and output of each intruder."""
        codes = {name: proc.poll() for name, proc in self.procs.items()}
        for proc in self.procs.values():
            stop(proc)
        return {
            name: (codes[name], (self.work / f"{name}.log").read_text(errors="replace"))
            for name in self.procs
        }

    def attack(self, dep: Deployment) -> None:
        """``run_deployment``'s ``on_started``: every intruder at once, then a wait (up to 40 s)
        for the SuperNodes' refusal, so that one let in would be connected when the
        ServerApp picks the round's nodes."""
        assert dep.keys is not None
        key, pub = node_key_pair()
        write_private(self.work / "intruder.key", key)
        write_public(self.work / "intruder.pub", pub)
        link = f"{IP}:{dep.superlink_port}"
        node = [str(BIN / "flower-supernode"), "--superlink", link, "--root-certificates"]
        node += [str(dep.keys.ca_cert), "--node-config", "partition-id=1 num-partitions=2"]
        node += ["--host", IP, "--max-retries", "3"]
        env = self.home("nodes", dep)
        ports = free_ports(2, IP)
        self.start(
            "keyed-node",
            [*node, "--port", str(ports[0]), "--auth-supernode-private-key",
             str(self.work / "intruder.key")],
            env,
        )  # fmt: skip
        self.start("keyless-node", [*node, "--port", str(ports[1])], env)
        flwr = str(BIN / "flwr")
        self.start(
            "register",
            [flwr, "supernode", "register", str(self.work / "intruder.pub"), FEDERATION],
            self.home("register", dep),
        )
        other_run = [flwr, "run", str(OTHER_APP), FEDERATION, "--stream"]
        self.start("foreign-run", other_run, self.home("foreign-run", dep))
        self.start("guessed-token-run", other_run, self.home("guess", dep, token="x" * 43))
        self.start(
            "superexec",
            [str(BIN / "flower-superexec"), "--insecure", "--runtime-api-address",
             f"{IP}:{dep.supernode_ports[1]}"],
            env,
        )  # fmt: skip
        self.wait(["keyed-node", "keyless-node"], 40.0)


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("attacked")
    intruders = Intruders(work)
    record = work / "record.jsonl"
    try:
        dep = run_deployment(
            APP,
            work / "deployment",
            num_supernodes=2,
            run_config=["fraction-evaluate=0.0"],  # one round of training is all it takes
            env={"FEDBALANCE_RECORD": str(record)},
            timeout=240,
            on_started=intruders.attack,
        )
    finally:
        outcome = intruders.outcome()
    rows = [json.loads(x) for x in record.read_text().splitlines()]
    yield {
        "dep": dep,
        "rows": rows,
        "intruders": outcome,
        "logs": {k: p.read_text(errors="replace") for k, p in dep.logs.items()},
    }


@pytest.mark.slow
def test_the_run_is_served_and_recorded_for_its_members_only(attacked: dict[str, Any]) -> None:
    dep, (row,) = attacked["dep"], attacked["rows"]
    assert sorted(dep.members.values()) == [0, 1]  # two registered nodes, one per partition
    assert row["clients"] == [0, 1] and row["rejected"] == [] and not row["skipped"]
    assert "aggregate_train: Received 2 results and 0 failures" in dep.log


@pytest.mark.slow
def test_a_foreign_supernode_cannot_join(attacked: dict[str, Any]) -> None:
    code, log = attacked["intruders"]["keyed-node"]
    assert code not in (None, 0), log[-2000:]  # it gave up by itself, refused
    assert "Exit Code: 305" in log  # Flower's code for "no connection to the SuperLink"
    assert "[code: 2004] Failed to activate SuperNode" in log
    code, log = attacked["intruders"]["keyless-node"]
    assert code not in (None, 0) and "Exit Code: 305" in log, log[-2000:]
    assert "SuperNode authentication is enabled. All SuperNodes must be registered" in log
    link = attacked["logs"]["superlink"]
    assert "[/v1/fleet/activate-node][ApiError:2004]" in link
    assert "[/v1/fleet/register-node][ApiError:2001]" in link
    # Only the members were activated
    activated = [line for line in link.splitlines() if "[Fleet.ActivateNode] Activated" in line]
    assert sorted(int(line.rsplit("=", 1)[1]) for line in activated) == sorted(
        attacked["dep"].members
    )


@pytest.mark.slow
def test_a_foreign_process_cannot_register_a_supernode_key(attacked: dict[str, Any]) -> None:
    code, log = attacked["intruders"]["register"]
    assert code != 0 and "Authentication failed" in log, log[-2000:]
    link = attacked["logs"]["superlink"]
    assert link.count("[ControlServicer.RegisterNode] Created node_id=") == 2


@pytest.mark.slow
def test_a_foreign_flwr_run_of_another_app_is_refused(attacked: dict[str, Any]) -> None:
    for name in ("foreign-run", "guessed-token-run"):
        code, log = attacked["intruders"][name]
        assert code != 0 and "Authentication failed" in log, (name, log[-2000:])
        assert "Successfully started run" not in log
    link = attacked["logs"]["superlink"]
    assert link.count('"POST /v1/control/start-run HTTP/1.1" 401') == 2
    assert link.count('"POST /v1/control/start-run HTTP/1.1" 200') == 1  # the run's own
    # Every message the members received belongs to the run's own run.
    (own,) = re.findall(r"Successfully started run (\d+)", attacked["dep"].log)
    nodes = attacked["logs"]["supernode 0"] + attacked["logs"]["supernode 1"]
    assert set(re.findall(r"\[RUN (\d+)", nodes)) == {own}


@pytest.mark.slow
def test_a_foreign_superexec_gets_no_task_from_a_member(attacked: dict[str, Any]) -> None:
    _, log = attacked["intruders"]["superexec"]
    assert "Start `flwr-clientapp` process" not in log, log[-2000:]
    node = attacked["logs"]["supernode 1"]
    assert "SuperExec authentication failed for /flwr.proto.Runtime/AcquireTask" in node
    own = attacked["logs"]["supernode 1 superexec"]
    assert "Start `flwr-clientapp` process" in own  # the member's task went to its own


@pytest.mark.slow
def test_the_run_keys_stay_private_in_the_run_directory(attacked: dict[str, Any]) -> None:
    keys = attacked["dep"].keys
    private = [keys.server_key, *keys.node_keys, keys.control_token, keys.superexec_secret]
    for path in private:
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert keys.dir.stat().st_mode & 0o777 == 0o700
    creds = keys.dir.parent / "flwr-home" / "credentials.yaml"
    assert creds.stat().st_mode & 0o777 == 0o600
    assert not list(keys.dir.glob("ca*key*"))  # the CA's key was never written


# -- without processes -----------------------------------------------------------------------
def test_the_server_certificate_is_the_run_cas_for_this_machine(tmp_path: Path) -> None:
    keys = make_run_keys(tmp_path / "keys", 1)
    ca = x509.load_pem_x509_certificate(keys.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(keys.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    other = make_run_keys(tmp_path / "other", 1)  # every run its own CA
    assert other.ca_cert.read_bytes() != keys.ca_cert.read_bytes()
    assert other.token() != keys.token()


def replies_from(nodes: list[tuple[int, int]]) -> tuple[dict[str, torch.Tensor], list[Message]]:
    """Train replies of ``(node id, claimed client id)`` pairs, as Flower delivers them."""
    torch.manual_seed(0)
    state = dict(torch.nn.Linear(4, 3).state_dict())
    content = RecordDict(
        {"arrays": to_array_record(state), "config": ConfigRecord({"server-round": 1})}
    )
    replies = []
    for node, client in nodes:
        msg = Message(content, dst_node_id=node, message_type=MessageType.TRAIN)
        trained = {k: v + 0.01 * (client + 1) for k, v in state.items()}
        replies.append(make_reply(msg, trained, 10, {"val_loss": 1.0}, client))
    return state, replies


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "record.jsonl"
    monkeypatch.setenv("FEDBALANCE_RECORD", str(path))
    return path


def one_round(nodes: list[tuple[int, int]], record: Path) -> dict[str, Any]:
    strategy = FedBalanceStrategy("fedavg")
    state, replies = replies_from(nodes)
    strategy.global_params = state
    strategy.aggregate_train(1, replies)
    (row,) = [json.loads(x) for x in record.read_text().splitlines()]
    return row


def test_a_reply_from_a_node_outside_the_deployment_is_refused_and_recorded(
    flower_task: None, record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_members(tmp_path / "members.json", {11: 0, 12: 1})
    monkeypatch.setenv(MEMBERS_ENV, str(tmp_path / "members.json"))
    row = one_round([(11, 0), (12, 1), (99, 1)], record)
    assert row["clients"] == [0, 1, "node 99"]
    assert row["rejected"] == [
        {
            "client": "node 99",
            "reason": "node 99 is not a member of this deployment (claims client 1)",
        }
    ]
    assert row["weights"][:2] == pytest.approx([0.5, 0.5]) and row["weights"][2] == 0


def test_a_member_claiming_another_members_client_is_refused(
    flower_task: None, record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_members(tmp_path / "members.json", {11: 0, 12: 1})
    monkeypatch.setenv(MEMBERS_ENV, str(tmp_path / "members.json"))
    row = one_round([(11, 1), (12, 1)], record)
    assert row["rejected"] == [
        {"client": "node 11", "reason": "node 11 claims client 1, but was registered as client 0"}
    ]
    assert row["clients"] == [1, "node 11"] and row["weights"] == [1.0, 0.0]


def test_a_client_id_claimed_twice_in_a_round_is_refused_for_both(
    flower_task: None, record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MEMBERS_ENV, raising=False)  # a deployment started by hand
    row = one_round([(11, 0), (12, 1), (13, 1)], record)
    assert row["clients"] == [0, "node 12", "node 13"]
    reason = "client 1 is claimed by more than one node this round (12, 13)"
    assert row["rejected"] == [
        {"client": "node 12", "reason": reason},
        {"client": "node 13", "reason": reason},
    ]
    assert row["weights"] == [1.0, 0.0, 0.0]


def test_under_secagg_a_reply_from_outside_the_deployment_is_refused_before_weighing(
    flower_task: None, record: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SecAggPlusStrategy weighs the clients from their clear metrics first: an outsider is
    refused there, so it is never given a weight or asked to mask."""
    write_members(tmp_path / "members.json", {11: 0, 12: 1})
    monkeypatch.setenv(MEMBERS_ENV, str(tmp_path / "members.json"))
    strategy = SecAggPlusStrategy("fedavg", num_shares=3, reconstruction_threshold=2)
    state, replies = replies_from([(11, 0), (99, 1)])
    for reply in replies:  # phase 1 of SecAgg+: metrics only, the update's length in clear
        del reply.content["arrays"]
        next(iter(reply.content.metric_records.values()))[UPDATE_NORM] = 0.5
    strategy.global_params, strategy._grid = state, object()  # type: ignore[assignment]
    strategy.aggregate_train(1, replies)
    (row,) = [json.loads(x) for x in record.read_text().splitlines()]
    assert row["rejected"] == [
        {
            "client": "node 99",
            "reason": "node 99 is not a member of this deployment (claims client 1)",
        }
    ]
    assert row["weights"] == [0.0, 0.0] and row["skipped"]  # one member left: nothing to sum


def test_a_member_list_that_cannot_be_read_stops_the_strategy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MEMBERS_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match=f"{MEMBERS_ENV}=.*missing.json: not a readable"):
        FedBalanceStrategy("fedavg")


class Grid:
    """What sampling reads of Flower's grid: the connected node ids."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return self.nodes


def test_messages_go_to_members_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_members(tmp_path / "members.json", {11: 0, 12: 1})
    monkeypatch.setenv(MEMBERS_ENV, str(tmp_path / "members.json"))
    strategy = FedBalanceStrategy("fedavg", min_available_nodes=2, min_train_nodes=2)
    assert strategy.sample(Grid([12, 99, 11]), 1.0, 2) == [11, 12]  # type: ignore[arg-type]
    assert strategy.client_ids == {11: 0, 12: 1}  # known without asking the nodes
