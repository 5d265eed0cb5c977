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
from pflower.strategies.grouped_grid import GroupedGrid, NotGroupedError

client_app = importlib.import_module("pflower.client_app.app")
pytestmark = pytest.mark.usefixtures("no_figures")


@pytest.mark.parametrize(("clients", "nodes"), [(3, 2), (10, 4), (100, 8), (7, 7), (1000, 3)])
def test_nodes_serve_every_client_once_in_contiguous_blocks_as_even_as_can_be(clients, nodes):
    served = [node_groups.members(g, nodes, clients) for g in range(nodes)]
    assert [c for block in served for c in block] == list(range(clients))
    assert max(map(len, served)) - min(map(len, served)) <= 1


def test_a_packed_message_gives_each_client_its_records_and_a_shared_model_travels_once():
    model = ArrayRecord({"w": torch.arange(1000, dtype=torch.float32)})
    own = ArrayRecord({"w": torch.zeros(1000)})
    contents = [(4, RecordDict({"arrays": model, "config": ConfigRecord({"server-round": 2, "state-round": 1})})),
                (5, RecordDict({"arrays": model, "config": ConfigRecord({"server-round": 2, "state-round": 0})})),
                (6, RecordDict({"arrays": own, "config": ConfigRecord({"server-round": 2})}))]  # fmt: skip
    packed = node_groups.pack(contents)
    assert node_groups.is_group(packed) and not node_groups.asks_members(packed)
    out = node_groups.unpack(packed)
    assert list(out) == [4, 5, 6]
    for cid, content in contents:
        assert dict(out[cid]["config"]) == dict(content["config"])
        assert out[cid]["arrays"]["w"].numpy().tolist() == content["arrays"]["w"].numpy().tolist()
    alone = sum(payload_bytes(c) for _, c in contents)
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
    assert sorted(grid.served.values()) == [[0, 1], [2, 3, 4]]
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
    with pytest.raises(NotGroupedError, match=r"node 10[01] did not say which clients it serves \(simulated-clients needs pflower's ClientApp\)"):
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
    content = node_groups.pack([(3, RecordDict({"config": ConfigRecord({"server-round": 1})}))])
    with pytest.raises(ValueError, match=r"the message names clients \[3\], which this node does not serve \(0\.\.1\)"):
        client_app.app(Message(content, dst_node_id=1, message_type=MessageType.EVALUATE), context)


def test_a_deployment_refuses_simulated_clients_before_anything_runs(tmp_path):
    from pflower.server_app.app import main

    cfg = {**run_config(), "simulated-clients": 4, "results-dir": str(tmp_path / "run")}

    class DeployedGrid:  # any grid but the simulation engine's
        pass

    with pytest.raises(ConfigError, match=r"'simulated-clients' = 4 is not allowed: simulation only: a deployed SuperNode serves one client"):
        main(DeployedGrid(), Context(1, 0, {}, RecordDict(), cfg))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("clients", "cores", "cpus", "want"), [(100, 2, 1, 13), (10, 2, 1, 2), (1000, 2, 1, 125), (8, 2, 2, 2), (3, 16, 1, 1)])
def test_auto_grouping_gives_each_actor_about_four_nodes(monkeypatch, clients, cores, cpus, want):
    from pflower import launcher

    monkeypatch.setattr(launcher.os, "cpu_count", lambda: cores)
    assert launcher.auto_clients_per_node(clients, cpus, 0.0) == want
    nodes = launcher.nodes_for(clients, want)
    assert nodes * want >= clients and (nodes - 1) * want < clients


def test_pflower_sim_passes_the_grouping_and_refuses_it_in_the_run_config(monkeypatch, capsys, tmp_path):
    from pflower import launcher

    started = []
    monkeypatch.setattr(launcher, "simulate", lambda *a, **k: started.append(a) or (1, "finished:completed"))
    app = str(launcher.Path(__file__).resolve().parents[1])
    out = ["-c", f"results-dir='{tmp_path / 'results'}'"]
    assert launcher.main(["--num-clients", "10", "--clients-per-node", "3", "--app", app, *out]) == 0
    assert started[-1][-1] == 3
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 2)
    assert launcher.main(["--num-clients", "10", "--app", app, *out]) == 0
    assert started[-1][-1] == 2
    assert launcher.main(["--num-clients", "10", "--app", app, "-c", "simulated-clients=10"]) == 2
    assert "simulated-clients is set by --clients-per-node" in capsys.readouterr().err
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


def test_a_run_config_refuses_simulated_clients_with_nodes_own_data():
    with pytest.raises(ConfigError, match=r"'simulated-clients' = 4 is not allowed: only for a pool the run shares out"):
        load_settings({**run_config(), "dataset": "node", "simulated-clients": 4})
