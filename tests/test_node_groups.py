"""Several clients per simulated node (``simulated-clients``): the wire format, the grid that
shows each client as a node, the ClientApp's refusals, and how pflower-sim chooses and passes
the grouping. That a grouped run gives the numbers of one client a node, for every method and
schedule, through crashes and failed messages, is asserted in test_resume_sweep and
test_failed_messages; on Flower in test_simulation."""

from __future__ import annotations

import importlib
import uuid

import pytest
import torch
from conftest import InProcessGrid, run_config, with_metadata
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from pflower import node_groups
from pflower.build import build_strategy
from pflower.config import ConfigError, load_settings
from pflower.records import payload_bytes
from pflower.strategies.grouped_grid import GroupedGrid, NodeGroupError

client_app = importlib.import_module("pflower.client_app.app")
pytestmark = pytest.mark.usefixtures("no_figures")


@pytest.mark.parametrize(("clients", "nodes"), [(3, 2), (10, 4), (100, 8), (7, 7), (1000, 3)])
def test_nodes_serve_every_client_once_and_any_run_of_ids_spreads_over_them(clients, nodes):
    served = [node_groups.members(g, nodes, clients) for g in range(nodes)]
    assert sorted(c for block in served for c in block) == list(range(clients))
    assert max(map(len, served)) - min(map(len, served)) <= 1
    node = {c: g for g, block in enumerate(served) for c in block}
    assert all(len({node[c] for c in range(start, start + nodes)}) == nodes for start in range(clients - nodes + 1))


def test_a_packed_message_gives_each_client_its_records_and_a_shared_model_travels_once():
    model = ArrayRecord({"w": torch.arange(1000, dtype=torch.float32)})
    own = ArrayRecord({"w": torch.zeros(1000)})
    contents = [(4, "train", RecordDict({"arrays": model, "config": ConfigRecord({"server-round": 2, "state-round": 1})})),
                (5, "train", RecordDict({"arrays": model, "config": ConfigRecord({"server-round": 2, "state-round": 0})})),
                (6, "evaluate", RecordDict({"arrays": own, "config": ConfigRecord({"server-round": 2})}))]  # fmt: skip
    packed = node_groups.pack(contents)
    assert node_groups.is_group(packed) and not node_groups.asks_members(packed)
    out = node_groups.unpack(packed)
    assert list(out) == [4, 5, 6] and node_groups.types(packed) == {4: "train", 5: "train", 6: "evaluate"}
    for cid, _, content in contents:
        assert dict(out[cid]["config"]) == dict(content["config"])
        assert out[cid]["arrays"]["w"].numpy().tolist() == content["arrays"]["w"].numpy().tolist()
    alone = sum(payload_bytes(c) for _, _, c in contents)
    assert payload_bytes(packed) < alone - 3900  # the shared model's 4,000 bytes once, not twice


def test_a_packed_reply_keeps_each_clients_reply_and_error_apart():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # as in a ServerApp
    msg = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    ok = Message(RecordDict({"metrics": MetricRecord({"client-id": 1, "num-examples": 3})}), reply_to=msg)
    failed = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="ValueError: no"), reply_to=msg)
    packed = Message(node_groups.pack_replies([(1, ok), (2, failed)]), reply_to=msg)
    parts = node_groups.split_reply(packed)
    assert list(parts) == [1, 2]
    assert dict(parts[1]["metrics"]) == {"client-id": 1, "num-examples": 3}
    assert isinstance(parts[2], Error) and (parts[2].code, parts[2].reason) == (ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "ValueError: no")


def _grouped_grid(cfg: dict, nodes: int, **kw) -> InProcessGrid:
    return InProcessGrid(client_app.app, cfg, nodes, simulation=True, **kw)


def test_the_grid_shows_a_node_per_client_and_one_message_a_node_carries_them(tmp_path):
    cfg = {**run_config(samples_per_client=40, local_epochs=1, num_server_rounds=1, method="fedavg"), "simulated-clients": 5,
           "results-dir": str(tmp_path)}  # fmt: skip
    inner = _grouped_grid(cfg, 2)
    grid = GroupedGrid(inner, timeout=10)
    ids = grid.get_node_ids()
    assert len(ids) == 5 and len(set(ids)) == 5
    assert sorted(grid.served.values()) == [[0, 2, 4], [1, 3]]
    build_strategy(load_settings(cfg)).start(grid=inner)
    after_query = [m for m in inner.sent if m.metadata.message_type != MessageType.QUERY]
    assert len(after_query) == 2 * 2  # round 1's training and its evaluation: one message per node each
    assert sorted(len(node_groups.unpack(m.content)) for m in after_query) == [2, 2, 3, 3]


def test_a_node_without_pflowers_clientapp_is_named(tmp_path):
    bare = ClientApp()

    @bare.train()
    def train(msg, context):  # pragma: no cover - never reached
        return Message(RecordDict(), reply_to=msg)

    grid = GroupedGrid(InProcessGrid(bare, run_config(), 2), timeout=5)
    with pytest.raises(NodeGroupError, match=r"node 10[01] did not say which clients it serves \(simulated-clients needs pflower.s ClientApp on every node\)"):
        grid.get_node_ids()


def test_a_node_whose_message_failed_whole_fails_each_of_its_clients(tmp_path):
    """A packed message answered with an error (its actor died): every client of it gets that error."""
    cfg = {**run_config(samples_per_client=40), "simulated-clients": 3}

    class Dying(InProcessGrid):
        def push_messages(self, messages):
            ids = []
            for msg in messages:
                if msg.metadata.message_type != MessageType.TRAIN:
                    ids += super().push_messages([msg])
                    continue
                msg = with_metadata(msg, message_id=uuid.uuid4().hex)
                ids.append(msg.metadata.message_id)
                self.replies[msg.metadata.message_id] = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="actor died"), reply_to=msg)
            return ids

    grid = GroupedGrid(Dying(client_app.app, cfg, 2), timeout=5)
    nodes = grid.get_node_ids()
    sent = [Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes]
    ids = grid.push_messages(sent)
    assert grid.pull_messages(ids) == []  # the first pull sends them, one message a node
    replies = grid.pull_messages(ids)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == sorted(ids)
    assert {(r.error.code, r.error.reason) for r in replies} == {(ErrorCode.NODE_UNAVAILABLE, "actor died")}
    assert sorted(r.metadata.src_node_id for r in replies) == sorted(nodes)


def test_a_node_that_serves_several_clients_refuses_a_message_that_names_none(tmp_path):
    """A ServerApp that is not pflower's (one message a node) on nodes that serve several clients:
    refused, naming why, instead of training node 1 as client 1 of 2."""
    cfg = {**run_config(samples_per_client=40), "simulated-clients": 5}
    context = Context(1, 1, {"partition-id": 1, "num-partitions": 2}, RecordDict(), cfg)
    with pytest.raises(ValueError, match=r"simulated-clients=5: this node serves several clients, and a message for them names them"):
        client_app.runtime(context)


def test_a_message_naming_a_client_another_node_serves_is_refused():
    cfg = {**run_config(samples_per_client=40), "simulated-clients": 5}
    context = Context(1, 1, {"partition-id": 0, "num-partitions": 2}, RecordDict(), cfg)
    content = node_groups.pack([(3, "evaluate", RecordDict({"config": ConfigRecord({"server-round": 1})}))])
    with pytest.raises(ValueError, match=r"the message names clients \[3\], which this node does not serve \(\[0, 2, 4\]\.\.\.\)"):
        client_app.app(Message(content, dst_node_id=1, message_type=MessageType.EVALUATE), context)


def test_a_deployment_refuses_simulated_clients_before_anything_runs(tmp_path):
    from pflower.server_app.app import main

    cfg = {**run_config(), "simulated-clients": 4, "results-dir": str(tmp_path / "run")}

    class DeployedGrid:  # any grid but the simulation engine's
        pass

    with pytest.raises(ConfigError, match=r"'simulated-clients' = 4 is not allowed: simulation only: a deployed SuperNode serves one client"):
        main(DeployedGrid(), Context(1, 0, {}, RecordDict(), cfg))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("clients", "cores", "cpus", "want"), [(100, 2, 1, 25), (10, 2, 1, 1), (16, 2, 1, 4), (1000, 2, 1, 250), (8, 2, 2, 4), (7, 2, 2, 1), (3, 16, 1, 1)]
)
def test_auto_grouping_gives_each_actor_two_nodes(monkeypatch, clients, cores, cpus, want):
    from pflower import launcher

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: cores)
    assert launcher.auto_clients_per_node(clients, cpus, 0.0) == want
    nodes = launcher.nodes_for(clients, want)
    assert nodes * want >= clients and (nodes - 1) * want < clients
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a cluster's actors: not this machine's to count
    assert launcher.auto_clients_per_node(clients, cpus, 0.0) == 1


def test_pflower_sim_passes_the_grouping_and_refuses_it_in_the_run_config(monkeypatch, capsys, tmp_path):
    from pflower import launcher

    started = []
    monkeypatch.setattr(launcher, "simulate", lambda *a, **k: started.append(a) or (1, "finished:completed"))
    app = str(launcher.Path(__file__).resolve().parents[1])
    out = ["-c", f"results-dir='{tmp_path / 'results'}'"]
    assert launcher.main(["--num-clients", "10", "--clients-per-node", "3", "--app", app, *out]) == 0
    assert started[-1][-1] == 3
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 2)
    assert launcher.main(["--num-clients", "100", "--app", app, *out]) == 0
    assert started[-1][-1] == 25
    (tmp_path / "keys.toml").write_text("simulated-clients = 10\n")
    capsys.readouterr()
    for given in ("simulated-clients=10", "'simulated-clients'=10", str(tmp_path / "keys.toml")):
        assert launcher.main(["--num-clients", "10", "--app", app, "-c", given]) == 2
        err = capsys.readouterr()
        assert "simulated-clients is set by --clients-per-node" in err.err and "checking" not in err.out
    with pytest.raises(SystemExit):
        launcher.main(["--clients-per-node", "0", "--app", app])
    assert "'0' is not a number of clients per node, or 'auto'" in capsys.readouterr().err


def test_submit_sends_the_nodes_and_the_clients_they_serve(monkeypatch, tmp_path):
    from pflower import launcher

    seen = {}

    class Stop(Exception):
        pass

    def popen(cmd, **kw):
        seen["cmd"] = cmd
        raise Stop

    monkeypatch.setattr(launcher.subprocess, "Popen", popen)
    with pytest.raises(Stop):
        launcher.submit(launcher.Path(__file__).resolve().parents[1], tmp_path, "lr=0.1", num_clients=10, clients_per_node=3)
    cmd = seen["cmd"]
    assert cmd[cmd.index("--federation-config") + 1].startswith("num-supernodes=4 ")
    assert cmd[cmd.index("--run-config") + 1] == "lr=0.1 simulated-clients=10"
    with pytest.raises(Stop):
        launcher.submit(launcher.Path(__file__).resolve().parents[1], tmp_path, "lr=0.1", num_clients=10)
    assert "simulated-clients" not in " ".join(seen["cmd"]) and "num-supernodes=10 " in " ".join(seen["cmd"])
    # a TOML file, which Flower reads only alone: a copy with the key, its keys kept
    (tmp_path / "run.toml").write_text('method = "fedprox"\nlr = 0.05\n\n[fedprox]\nmu = 0.5\n')
    copies = []

    def popen_reading(cmd, **kw):
        copies.append(cmd[cmd.index("--run-config") + 1])
        from flwr.common.config import parse_config_args

        seen["parsed"] = parse_config_args([copies[-1]])
        raise Stop

    monkeypatch.setattr(launcher.subprocess, "Popen", popen_reading)
    with pytest.raises(Stop):
        launcher.submit(launcher.Path(__file__).resolve().parents[1], tmp_path, str(tmp_path / "run.toml"), num_clients=10, clients_per_node=3)
    assert seen["parsed"] == {"simulated-clients": 10, "method": "fedprox", "lr": 0.05, "fedprox.mu": 0.5}


def test_a_run_config_refuses_simulated_clients_with_nodes_own_data():
    with pytest.raises(ConfigError, match=r"'simulated-clients' = 4 is not allowed: only for a pool the run shares out"):
        load_settings({**run_config(), "dataset": "node", "simulated-clients": 4})


class _LateGrid(InProcessGrid):
    """A simulation grid whose replies come only at the pull after the push (a busy engine):
    records the most messages any node had unanswered at once, and each packed message's types."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unanswered: dict[str, int] = {}  # message id -> its node
        self.most = 0
        self.kinds: list[set[str]] = []

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for mid, msg in zip(ids, messages):
            self.unanswered[mid] = msg.metadata.dst_node_id
            if node_groups.is_group(msg.content) and not node_groups.asks_members(msg.content):
                self.kinds.append(set(node_groups.types(msg.content).values()))
        nodes = list(self.unanswered.values())
        self.most = max(self.most, *(nodes.count(n) for n in nodes))
        return ids

    def pull_messages(self, message_ids):
        replies = super().pull_messages(message_ids)
        for r in replies:
            self.unanswered.pop(r.metadata.reply_to_message_id, None)
        return replies


@pytest.mark.parametrize("window", [64, 2])
def test_a_node_never_has_two_messages_in_flight_and_gets_its_training_and_evaluation_in_one(tmp_path, monkeypatch, window):
    """Flower's engine would hand two messages for one node to two actors, each with a copy of the
    node's context, and keep the last one written back: a phase with a training for some of a
    node's clients and an evaluation alone for others sends the node one message holding both,
    and a node's later messages wait for its reply. The numbers are those of one client a node,
    also where a phase holds only ``window`` clients' messages at once."""
    from pflower.strategies import federation

    monkeypatch.setattr(federation, "SIMULATION_WINDOW", window)
    cfg = {**run_config(samples_per_client=40, local_epochs=1, num_server_rounds=3, fraction_train=0.5, method="fedavg")}
    rows = {}
    for grouped in (False, True):
        run = {**cfg, "results-dir": str(tmp_path / str(grouped)), **({"simulated-clients": 6} if grouped else {})}
        grid = _LateGrid(client_app.app, run, 2 if grouped else 6, simulation=True)
        build_strategy(load_settings(run)).start(grid=grid)
        doc = __import__("json").loads((tmp_path / str(grouped) / "metrics.json").read_text())
        rows[grouped] = [{k: v for k, v in r.items() if k != "wall-seconds"} for r in doc["rounds"]]
        if grouped:
            assert grid.most == 1
            assert window < 6 or {"train", "evaluate"} in grid.kinds  # round 2: a training and an evaluation alone, one message
    assert rows[True] == rows[False]


def test_a_node_that_fails_to_say_its_clients_once_is_asked_again(tmp_path):
    """A members query answered with an error (an actor that could not load the app, once) is
    asked again, as the federation asks a node whose ClientApp could not start; when every node
    answers so, the run stops naming them."""
    from flwr.app import Error as FlowerError

    class FlakyFirst(InProcessGrid):
        failures = 1

        def push_messages(self, messages):
            out = []
            for msg in messages:
                ids = super().push_messages([msg])
                if self.failures and msg.metadata.dst_node_id == 101:
                    self.failures -= 1
                    self.replies[ids[0]] = Message(FlowerError(code=ErrorCode.LOAD_CLIENT_APP_EXCEPTION, reason="No module named 'pflower'"),
                                                   reply_to=self.sent[-1])  # fmt: skip
                out += ids
            return out

    cfg = {**run_config(samples_per_client=40, local_epochs=1, num_server_rounds=1), "simulated-clients": 4, "results-dir": str(tmp_path / "a")}
    build_strategy(load_settings(cfg)).start(grid=FlakyFirst(client_app.app, cfg, 2, simulation=True), timeout=5)
    assert __import__("json").loads((tmp_path / "a" / "metrics.json").read_text())["num-clients"] == 4
    grid = FlakyFirst(client_app.app, cfg, 1, simulation=True)
    grid.contexts = {101: grid.contexts[100]}
    with pytest.raises(NodeGroupError, match=r"no simulated node could start \(all 1 answered with an error\): node 101: No module named 'pflower'"):
        GroupedGrid(grid, timeout=5).get_node_ids()
