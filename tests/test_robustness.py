"""Robustness: corrupt replies never reach server state (property-based), robust aggregation."""

from __future__ import annotations

import copy
from functools import cache

import numpy as np
import pytest
import torch
from conftest import InProcessGrid, assert_same_state, run_config, with_metadata
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pflower.build import build_strategy
from pflower.config import ConfigError, load_settings
from pflower.methods import declarations
from pflower.records import from_record, to_record

N = 4
MAX_NORM = 1e3
#: Every method whose server takes training replies (the declarations; FedeRiCo's relay has its
#: own gate tests), with its example config, and FedAvg's two robust averages.
METHODS = {
    **{name: dict(m.example) for name, m in declarations().items() if m.strategy != declarations()["federico"].strategy},
    "fedavg-median": {"method": "fedavg", "aggregation": "median"},
    "fedavg-trimmed": {"method": "fedavg", "aggregation": "trimmed-mean", "trim-fraction": 0.25},
}

# Each corruption and the reason it must be counted under.
CORRUPTIONS = {
    "error": "client-error",
    "missing-array": "keys",
    "extra-array": "keys",
    "shape": "shape",
    "dtype": "dtype",
    "nan": "non-finite",
    "inf": "non-finite",
    "nan-metric": "non-finite",
    "zero-examples": "num-examples",
    "float-examples": "num-examples",
    "inflated-examples": "num-examples",
    "wrong-client-id": "client-id",
    "two-records": "malformed",
    "huge-update": "update-norm",
}
ARRAY_CORRUPTIONS = {"missing-array", "extra-array", "shape", "dtype", "nan", "inf", "huge-update", "two-records"}


@cache
def _round_one(name: str):
    """A strategy after discovery, its round-1 messages and the genuine replies (built once)."""
    extra = dict(METHODS[name])
    method = extra.pop("method", name)
    cfg = {**run_config(method=method, local_epochs=1, max_update_norm=MAX_NORM, results_dir="/tmp/pflower-robustness"), **extra}
    strategy = build_strategy(load_settings(cfg))
    from pflower.client_app.app import app

    grid = InProcessGrid(app, cfg, N)
    strategy.connect(grid, timeout=5)
    msgs = strategy.configure_train(1, strategy.global_arrays(), ConfigRecord({"server-round": 1}), grid)
    replies = grid.send_and_receive(msgs)
    return strategy, msgs, [(r.metadata.src_node_id, r.content) for r in replies]


def _reply(msg: Message, content: RecordDict | None, error: bool = False) -> Message:
    if error:
        return Message(Error(code=0, reason="boom"), reply_to=msg)
    return Message(content, reply_to=msg)


def _corrupt(kind: str, content: RecordDict) -> RecordDict:
    content = copy.deepcopy(content)
    metrics = dict(content["metrics"])
    arrays = from_record(content["arrays"]) if "arrays" in content else {}
    if kind in ARRAY_CORRUPTIONS and not arrays:
        kind = "nan-metric"  # Local uploads no arrays: corrupt what it does send
    key = next(iter(arrays), None)
    if kind == "missing-array":
        del arrays[key]
    elif kind == "extra-array":
        arrays["intruder"] = torch.zeros(3)
    elif kind == "shape":
        arrays[key] = arrays[key].reshape(-1)[:-1].clone()
    elif kind == "dtype":
        arrays[key] = arrays[key].double()
    elif kind in ("nan", "inf"):
        arrays[key].view(-1)[0] = float("nan") if kind == "nan" else float("inf")
    elif kind == "huge-update":
        arrays[key] = arrays[key] + 1e6
    elif kind == "nan-metric":
        metrics["train-loss"] = float("nan")
    elif kind == "zero-examples":
        metrics["num-examples"] = 0
    elif kind == "float-examples":
        metrics["num-examples"] = 12.5
    elif kind == "inflated-examples":
        metrics["num-examples"] = metrics["num-examples"] * 100
    elif kind == "wrong-client-id":
        metrics["client-id"] = metrics["client-id"] + 1000
    out = RecordDict({"arrays": to_record(arrays), "metrics": MetricRecord(metrics)})
    if kind == "two-records":
        out["more"] = to_record(arrays)
    return out


@pytest.mark.parametrize("name", sorted(METHODS))
@hsettings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.sampled_from([None, *sorted(CORRUPTIONS)]), min_size=N, max_size=N), unknown=st.booleans())
def test_corrupt_replies_never_change_the_aggregate(name, plan, unknown):
    """Mix genuine and corrupt replies: same server state as the genuine ones alone, every corrupt one counted."""
    base, msgs, genuine = _round_one(name)
    by_node = {m.metadata.dst_node_id: m for m in msgs}
    mixed, valid, expected = [], [], {}
    for (node, content), kind in zip(genuine, plan):
        msg = by_node[node]
        if kind is None:
            mixed.append(_reply(msg, copy.deepcopy(content)))
            valid.append(_reply(msg, copy.deepcopy(content)))
            continue
        reason = CORRUPTIONS[kind]
        if kind in ARRAY_CORRUPTIONS and not len(content["arrays"]):
            reason = "non-finite"
        mixed.append(_reply(msg, _corrupt(kind, content), error=kind == "error"))
        expected[reason] = expected.get(reason, 0) + 1
    if unknown:  # a reply from a node that is not a known client
        stranger = with_metadata(_reply(msgs[0], copy.deepcopy(genuine[0][1])), src_node_id=999)
        mixed.append(stranger)
        expected["unknown-node"] = expected.get("unknown-node", 0) + 1

    corrupted, clean = copy.deepcopy(base), copy.deepcopy(base)
    corrupted.gate.new_round()
    corrupted.aggregate_train(1, mixed)
    clean.gate.new_round()
    clean.aggregate_train(1, valid)
    assert dict(corrupted.gate.rejected) == expected
    assert dict(clean.gate.rejected) == {}
    assert_same_state(corrupted.state_dict(), clean.state_dict())


@pytest.mark.parametrize("aggregation,flower_fn", [("median", "aggregate_median"), ("trimmed-mean", "aggregate_trimmed_avg")])
def test_robust_aggregation_matches_flower(aggregation, flower_fn):
    from flwr.server.strategy import aggregate as flwr_aggregate

    from pflower.strategies.fedavg import robust_average

    rows = torch.randn(7, 11, dtype=torch.float64)
    got = robust_average(rows, aggregation, trim_fraction=0.2)
    fn = getattr(flwr_aggregate, flower_fn)
    args = ([([r.numpy()], 1) for r in rows],) + ((0.2,) if aggregation == "trimmed-mean" else ())
    assert np.allclose(got.numpy(), fn(*args)[0])


def test_median_ignores_one_wild_client():
    rows = torch.tensor([[1.0, 2.0], [1.1, 2.1], [0.9, 1.9], [1e9, -1e9], [1.0, 2.0]])
    from pflower.strategies.fedavg import robust_average

    assert torch.allclose(robust_average(rows, "median", 0.2), torch.tensor([1.0, 2.0]))
    # 20% of 5 rows: the lowest and highest value of each coordinate are cut, the wild one among them.
    assert torch.allclose(robust_average(rows, "trimmed-mean", 0.2), torch.tensor([3.1 / 3, 5.9 / 3]))


def test_robust_aggregation_is_only_for_averaging_methods():
    with pytest.raises(ConfigError, match="run config key 'aggregation' = 'median' is not allowed: only for"):
        load_settings(run_config(method="pfedla", aggregation="median"))


def test_too_few_valid_replies_stop_the_run_with_the_reasons(tmp_path, grid_factory):
    from pflower.strategies.loop import RoundFailedError

    def strip(cid, reply):
        if cid == 0 and not reply.has_error() and "arrays" in reply.content:
            reply.content["arrays"] = ArrayRecord()
        return reply

    cfg = run_config(method="fedavg", local_epochs=1, min_replies=3, results_dir=str(tmp_path))
    with pytest.raises(RoundFailedError, match=r"round 1: 2 valid training replies of 3 sampled clients, fewer than min-replies=3: client 0: missing arrays"):
        build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, 3, tamper=strip))


def test_a_client_that_cannot_start_stops_discovery_at_once(tmp_path, grid_factory):
    from pflower.strategies.federation import NoClientsError

    server_cfg = run_config(results_dir=str(tmp_path), round_timeout=600.0)
    grid = grid_factory(run_config(lr=-1.0), 2)  # every client gets a config it rejects
    with pytest.raises(NoClientsError, match=r"no client could start \(2 of 2 nodes .*run config key 'lr' = -1.0 is not allowed"):
        build_strategy(load_settings(server_cfg)).connect(grid, timeout=600)


class _SlowGrid:
    """Replies to message i become available ``delays[i]`` seconds after the push (None: never)."""

    def __init__(self, delays):
        self.delays, self.pulls = delays, 0

    def push_messages(self, messages):
        import time

        self.t0 = time.monotonic()
        self.msgs = [with_metadata(m, message_id=f"m{i}") for i, m in enumerate(messages)]
        return [m.metadata.message_id for m in self.msgs]

    def pull_messages(self, ids):
        import time

        self.pulls += 1
        now = time.monotonic() - self.t0
        return [Message(RecordDict(), reply_to=m) for m, d in zip(self.msgs, self.delays)
                if m.metadata.message_id in ids and d is not None and d <= now]  # fmt: skip


def test_send_and_receive_returns_what_came_by_the_timeout_and_polls_sparingly():
    import time

    from flwr.supercore.task_identity import TaskIdentity

    from pflower.strategies.federation import send_and_receive

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    msgs = [Message(RecordDict(), dst_node_id=n, message_type="train") for n in (1, 2, 3)]
    grid = _SlowGrid([0.0, 0.3, None])
    t0 = time.monotonic()
    replies = send_and_receive(grid, msgs, timeout=1.0)
    took = time.monotonic() - t0
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1"]
    assert 1.0 <= took < 3.0
    assert grid.pulls < 80  # 5 % of the elapsed time between pulls (about 67 in 1 s), not a busy loop

    grid = _SlowGrid([0.0, 0.3])
    t0 = time.monotonic()
    assert len(send_and_receive(grid, msgs[:2], timeout=10.0)) == 2
    assert time.monotonic() - t0 < 2.0  # returns when all replies came, not at the timeout


class _WindowGrid:
    """Each reply comes ``delay`` seconds after its message was pushed; counts the most in flight."""

    def __init__(self, delay: float):
        self.delay, self.pushed, self.in_flight, self.most = delay, {}, set(), 0

    def push_messages(self, messages):
        import time

        ids = []
        for m in messages:
            i = f"m{len(self.pushed)}"
            self.pushed[i] = (with_metadata(m, message_id=i), time.monotonic())
            self.in_flight.add(i)
            ids.append(i)
        self.most = max(self.most, len(self.in_flight))
        return ids

    def pull_messages(self, ids):
        import time

        now = time.monotonic()
        ready = [i for i in ids if i in self.in_flight and now - self.pushed[i][1] >= self.delay]
        self.in_flight.difference_update(ready)
        return [Message(RecordDict(), reply_to=self.pushed[i][0]) for i in ready]


def test_a_windowed_phase_keeps_at_most_the_window_in_flight_and_sends_no_more_after_the_timeout():
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.superlink.grid import InMemoryGrid

    from pflower.strategies.federation import SIMULATION_WINDOW, send_and_receive, window_for

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    msgs = [Message(RecordDict(), dst_node_id=n, message_type="train") for n in range(1, 11)]
    grid = _WindowGrid(0.01)
    replies = send_and_receive(grid, msgs, timeout=10.0, window=3)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == sorted(f"m{i}" for i in range(10)) and grid.most == 3
    grid = _WindowGrid(0.3)
    replies = send_and_receive(grid, msgs, timeout=0.5, window=4)  # 4 answered by 0.3 s, 4 more pushed then, none after 0.5 s
    assert len(replies) == 4 and len(grid.pushed) == 8
    assert window_for(object.__new__(InMemoryGrid)) == SIMULATION_WINDOW and window_for(grid) is None


def test_an_outbox_builds_each_message_as_it_is_sent_at_most_a_window_ahead_of_the_replies():
    from collections.abc import Mapping

    from flwr.app import ArrayRecord
    from flwr.supercore.task_identity import TaskIdentity

    from pflower.strategies.federation import Federation, send_and_receive

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    built: list[int] = []

    class Counted(Mapping):
        def __getitem__(self, cid):
            built.append(cid)
            return ArrayRecord()

        def __iter__(self):
            return iter(range(10))

        def __len__(self):
            return 10

    class Checked(_WindowGrid):
        def push_messages(self, messages):
            answered = len(self.pushed) - len(self.in_flight)
            assert len(built) <= answered + 3
            return super().push_messages(messages)

    federation = Federation()
    federation.node_of = {c: 100 + c for c in range(10)}
    federation.client_of = {100 + c: c for c in range(10)}
    outbox = federation.outbox(range(10), "train", Counted(), {"server-round": 1})
    assert built == [] and len(outbox) == 10
    grid = Checked(0.01)
    replies = send_and_receive(grid, outbox, timeout=10.0, window=3)
    assert built == list(range(10)) and len(replies) == 10 and grid.most == 3
    assert [m.metadata.dst_node_id for m, _ in grid.pushed.values()] == [100 + c for c in range(10)]


@pytest.mark.parametrize("method", ["fedavg", "heurpfedla"])
def test_a_windowed_run_has_the_metrics_of_one_that_sends_each_phase_at_once(tmp_path, monkeypatch, no_figures, method):
    from conftest import in_process_rounds

    cfg = run_config(method=method, num_server_rounds=2, local_epochs=1, samples_per_client=60)
    at_once = in_process_rounds(cfg, tmp_path / "at-once", 4)
    monkeypatch.setattr("pflower.strategies.federation.window_for", lambda grid: 2)
    assert in_process_rounds(cfg, tmp_path / "windowed", 4) == at_once


def _identity_tamper(client: int, change: dict):
    def tamper(partition: int, reply: Message) -> Message:
        if partition == client and reply.metadata.message_type == "query" and not reply.has_error():
            reply.content["metrics"] = MetricRecord({**dict(reply.content["metrics"]), **change})
        return reply

    return tamper


@pytest.mark.parametrize("change", [{"client-id": 7}, {"num-clients": 2**40}], ids=["client-id", "num-clients"])
@pytest.mark.parametrize("method", ["pfedla", "pfedhn", "fedfomo"])
def test_an_identity_beyond_the_federation_is_refused(tmp_path, method, change):
    """A node that says it is client 7 of 3, or one of 2**40 clients: refused at identity (the
    server keeps state per client and never sizes it from such a reply); the others run."""
    cfg = run_config(method=method, num_server_rounds=1, local_epochs=1, results_dir=str(tmp_path))
    from pflower.client_app.app import app

    strategy = build_strategy(load_settings(cfg))
    strategy.connect(InProcessGrid(app, cfg, 3, tamper=_identity_tamper(2, change)), timeout=1)
    assert strategy.federation.ids == [0, 1] and strategy.federation.num_clients == 3


@pytest.mark.parametrize(("client", "stated"), [(0, 100000), (2, 100000), (1, 2)])
def test_a_node_stating_another_federation_size_is_refused_naming_it(tmp_path, client, stated, caplog):
    """One of 3 nodes says the federation has 100000 clients (within what any reply may say), or
    2: the size most clients state holds, that node is refused with a line naming what it said,
    and discovery ends with the others (100000: it waited out the timeout for clients that do not
    exist, then sized FedFomo's per-client state from that reply; 2: it was kept, training on its
    half of a 2-way split, which holds the data of clients 1 and 2 of the 3-way one). A node with
    its own data saying 4 where 4 nodes are (one joined a federation of 3) is kept: test_deployment.py."""
    from pflower.client_app.app import app

    cfg = run_config(method="fedfomo", num_server_rounds=1, local_epochs=1, results_dir=str(tmp_path))
    strategy = build_strategy(load_settings(cfg))
    grid = InProcessGrid(app, cfg, 3, tamper=_identity_tamper(client, {"num-clients": stated}))
    strategy.connect(grid, timeout=60)
    assert strategy.federation.num_clients == 3 and strategy.federation.ids == [c for c in range(3) if c != client]
    assert f"(client {client}) is refused: it reads its share of {stated} partitions, the others of 3: their data would overlap" in caplog.text
    assert len(grid.sent) == 3  # one query each: nothing waited for a fourth client


def test_two_nodes_with_one_partition_id_the_second_is_refused_at_once(tmp_path, caplog):
    """Nodes 100 and 101 both say they are client 0: each displaced the other at every query
    until the timeout, and client 0's messages then went to either. The second is refused naming
    the first, and discovery ends without waiting (the refused node counts as answered)."""
    from pflower.client_app.app import app

    cfg = run_config(method="fedavg", num_server_rounds=1, local_epochs=1, results_dir=str(tmp_path))
    strategy = build_strategy(load_settings(cfg))
    grid = InProcessGrid(app, cfg, 3, node_configs={1: {"partition-id": 0}})
    strategy.connect(grid, timeout=60)
    federation = strategy.federation
    assert federation.ids == [0, 2] and federation.node_of[0] == min(grid.get_node_ids())
    assert "answered as client 0 too (two nodes with one partition-id)" in caplog.text
    assert len(grid.sent) == 3


def test_label_counts_of_another_length_leave_the_client_out_of_the_figure(tmp_path, grid_factory):
    """One client's label counts with a class too many: the run ends with its figures; the
    partition figure and metrics.json have the others' counts."""
    from pflower.client_app.app import app

    cfg = run_config(method="fedavg", num_server_rounds=1, local_epochs=1, results_dir=str(tmp_path))
    strategy = build_strategy(load_settings(cfg))
    strategy.start(grid=InProcessGrid(app, cfg, 3, tamper=_identity_tamper(1, {"label-counts": [1] * 11})))
    import json

    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert sorted(doc["client-label-counts"]) == ["0", "2"] and (tmp_path / "partition.png").is_file()


def test_a_failed_round_keeps_the_evaluation_that_came_back_with_it(tmp_path, grid_factory):
    """Round 2's training replies are all NaN (the round fails): round 1's evaluation, which
    rode on round 2's messages and came back valid, is in round 1's row."""
    import json

    from pflower.client_app.app import app
    from pflower.strategies.loop import RoundFailedError

    def nan_in_round_2(partition: int, reply: Message) -> Message:
        if reply.metadata.message_type == "train" and not reply.has_error() and "arrays" in reply.content:
            arrays = from_record(reply.content["arrays"])
            if reply.content["metrics"]["num-examples"] and len(arrays) and _round_two[0]:
                key = next(iter(arrays))
                arrays[key] = torch.full_like(arrays[key], float("nan"))
                reply.content["arrays"] = to_record(arrays)
        return reply

    _round_two = [False]
    cfg = run_config(method="fedavg", num_server_rounds=3, local_epochs=1, results_dir=str(tmp_path))
    strategy = build_strategy(load_settings(cfg))
    real = strategy.run_round

    def run_round(grid, rnd, *args):
        _round_two[0] = rnd == 2
        return real(grid, rnd, *args)

    strategy.run_round = run_round
    with pytest.raises(RoundFailedError, match="round 2"):
        strategy.start(grid=InProcessGrid(app, cfg, 3, tamper=nan_in_round_2))
    rows = json.loads((tmp_path / "metrics.json").read_text())["rounds"]
    assert rows[0]["evaluated"] == 3 and rows[0]["accuracy"] is not None


def _away(node: int):
    """The ClientApp, with node ``node`` never answering the identity query (its data unmounted)."""
    from pflower.client_app.app import app

    def client(msg, context):
        if msg.metadata.message_type == "query" and context.node_id == node:
            raise RuntimeError("disk not mounted")
        return app(msg, context)

    return client


def test_a_client_that_never_answered_blocks_no_cluster_split_and_no_federico_plan(tmp_path):
    """Discovery goes on without a client that never answered (a warning). It stayed in the
    server's view: Clustered FL's first cluster waited for its reply to split, so it never split
    (FedAvg without a word); FedeRiCo refused every plan naming it as 'malformed', so the client
    whose first contact it was never trained."""
    cfl = {**run_config(method="cfl", num_server_rounds=3, local_epochs=1, samples_per_client=60, partition="label-groups",
           cfl__warmup_rounds=1, cfl__eps1=100.0, cfl__eps2=0.0, cfl__gamma_max=0.5), "results-dir": str(tmp_path / "cfl"), "round-timeout": 2.0}  # fmt: skip
    strategy = build_strategy(load_settings(cfl))
    strategy.start(grid=InProcessGrid(_away(104), cfl, 5))
    assert strategy.federation.ids == [0, 1, 2, 3] and len(strategy.clusters) > 1, strategy.clusters

    fed = {
        **run_config(method="federico", num_server_rounds=3, local_epochs=1, samples_per_client=60),
        "results-dir": str(tmp_path / "f"),
        "round-timeout": 2.0,
    }
    strategy = build_strategy(load_settings(fed))
    strategy.start(grid=InProcessGrid(_away(103), fed, 4))
    import json

    doc = json.loads((tmp_path / "f" / "metrics.json").read_text())
    assert all("malformed" not in row["rejected"] for row in doc["rounds"]), [row["rejected"] for row in doc["rounds"]]
    assert strategy.federation.trained == {0: 3, 1: 3, 2: 3}  # every client here finished every round


def test_a_restarted_node_of_a_mixed_federation_takes_its_client_id_back(tmp_path):
    """Three pflower nodes (num-partitions 3) and one without a query handler: the federation has
    4 clients. Node 101 restarts as node 201, stating 3 as before: it was refused ('it says the
    federation has 3 clients, where it has 4') and client 1's messages went to the dead node."""
    import importlib.util

    from conftest import ROOT
    from flwr.app import Context, RecordDict

    from pflower.client_app.app import app

    spec = importlib.util.spec_from_file_location("quickstart_client_app", ROOT / "examples" / "quickstart" / "client_app.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)

    def mixed(msg, context):
        return (quickstart.app if context.node_id == 103 else app)(msg, context)

    cfg = run_config(method="fedavg", num_server_rounds=1, local_epochs=1, results_dir=str(tmp_path))
    strategy = build_strategy(load_settings(cfg))
    grid = InProcessGrid(mixed, cfg, 4, node_configs={3: {"num-partitions": 3}})
    grid.contexts[103].node_config["num-partitions"] = 3
    for node in (100, 101, 102):
        grid.contexts[node].node_config["num-partitions"] = 3
    strategy.connect(grid, timeout=5)
    federation = strategy.federation
    assert federation.ids == [0, 1, 2, 3] and federation.num_clients == 4 and federation.stateless == {3}
    federation.fixed = True
    grid.contexts[201] = Context(1, 201, dict(grid.contexts[101].node_config), RecordDict(), dict(cfg))
    grid.offline.add(101)
    federation.query_new_nodes(grid, 5)
    assert federation.node_of[1] == 201 and 201 not in federation.refused


def test_pfedla_gives_no_weight_to_a_client_that_never_answered(tmp_path):
    """Client 3's node never answered: its model stayed the initial one, and after 4 rounds the
    others' weights put 0.16-0.23 of every layer on it. They put none."""
    cfg = {**run_config(method="pfedla", num_server_rounds=2, local_epochs=1, samples_per_client=60), "results-dir": str(tmp_path), "round-timeout": 2.0}
    strategy = build_strategy(load_settings(cfg))
    strategy.start(grid=InProcessGrid(_away(103), cfg, 4))
    alpha = strategy.hn.alpha(torch.arange(3))  # [3 clients, layers, 4]
    assert strategy.federation.ids == [0, 1, 2] and float(alpha[:, :, 3].abs().max()) == 0.0
    assert torch.allclose(alpha.sum(-1), torch.ones(alpha.shape[:2]))
