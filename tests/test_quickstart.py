"""pflower's strategies built with keyword arguments, against the quickstart-style ClientApp of
examples/quickstart (no pflower code, no query handler), in process. The same app runs on
Flower's simulation engine in test_simulation.py."""

import importlib.util

import pytest
import torch
from conftest import ROOT, InProcessGrid, assert_quickstart_run
from flwr.app import ArrayRecord, ConfigRecord

from pflower.records import from_record
from pflower.strategies import FedAvg, Local, PFedLA, SuperFed
from pflower.strategies.federation import NoClientsError
from pflower.strategies.fedfomo import FedFomo

spec = importlib.util.spec_from_file_location("quickstart_client_app", ROOT / "examples" / "quickstart" / "client_app.py")
client = importlib.util.module_from_spec(spec)
spec.loader.exec_module(client)


def _initial() -> ArrayRecord:
    torch.manual_seed(42)
    return ArrayRecord(client.Net().state_dict())


@pytest.mark.parametrize("strategy", [FedAvg(), FedAvg(aggregation="median"), PFedLA(), PFedLA(top_k=1), SuperFed()],
                         ids=["fedavg", "fedavg-median", "pfedla", "heurpfedla", "superfed"])  # fmt: skip
def test_every_strategy_runs_with_a_stateless_quickstart_client(strategy):
    result = strategy.start(grid=InProcessGrid(client.app, {}, 4), initial_arrays=_initial(), num_rounds=2)
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2] and strategy.federation.stateless == {0, 1, 2, 3}
    assert all(0 <= m["accuracy"] <= 1 for m in result.evaluate_metrics_clientapp.values())
    assert not strategy.gate.rejected


def test_heurpfedla_sends_a_stateless_client_its_own_retained_layers():
    """A quickstart client keeps nothing: its retained layer travels (its own model's), with its
    BatchNorm statistics as it last uploaded them."""
    strategy = PFedLA(top_k=1)
    grid = InProcessGrid(client.app, {}, 3)
    strategy.connect(grid, _initial())
    for rnd in (1, 2):
        msgs = strategy.configure_train(rnd, ArrayRecord(), ConfigRecord({"server-round": rnd}), grid)
        for msg in msgs:
            cid = strategy.federation.client_of[msg.metadata.dst_node_id]
            sent = from_record(msg.content["arrays"])
            assert set(sent) == set(from_record(_initial()))  # everything a stateless client loads
            own = strategy.spec.unflatten(strategy.theta[cid])
            for l, layer in enumerate(strategy.layers):
                if strategy.retained_in_training[cid][l]:
                    assert all(torch.equal(sent[k], own[k]) for k in layer.keys)
            if rnd == 2:
                assert torch.equal(sent["norm.running_mean"], strategy.extras[cid]["norm.running_mean"])
        strategy.aggregate_train(rnd, grid.send_and_receive(msgs))
    assert strategy.extras and not torch.equal(strategy.extras[0]["norm.running_mean"], torch.zeros(16))


@pytest.mark.parametrize("strategy", [Local(), FedFomo()], ids=["local", "fedfomo"])
def test_a_method_that_needs_stateful_clients_refuses_a_quickstart_client_by_name(strategy):
    with pytest.raises(NoClientsError, match=r"needs clients that keep their own model .* 4 node\(s\) have no query handler"):
        strategy.start(grid=InProcessGrid(client.app, {}, 4), initial_arrays=_initial(), num_rounds=1)


def test_a_restarted_stateless_node_takes_its_old_client_id():
    """A node without a query handler that comes back under a new node id gets the id of the
    stateless client whose node is gone, not a new one beyond the server's tables."""
    strategy = PFedLA()
    grid = InProcessGrid(client.app, {}, 3)
    strategy.connect(grid, _initial())
    old = strategy.federation.node_of[1]
    grid.contexts[900] = grid.contexts.pop(old)  # the same client, a new node id
    strategy.federation.query_new_nodes(grid, 5)
    assert strategy.federation.node_of[1] == 900 and sorted(strategy.federation.node_of) == [0, 1, 2]
    strategy.configure_train(1, ArrayRecord(), ConfigRecord({"server-round": 1}), grid)


@pytest.mark.parametrize("strategy", ["pfedla", "fedavg"])
def test_the_readmes_serverapp_runs_both_its_strategies(tmp_path, monkeypatch, strategy):
    """examples/quickstart/server_app.py's main with each of its strategies, in process (pFedLA's
    runs on Flower in test_simulation.py): initial_arrays reach evaluate_fn before round 1 and
    every client in round 1; pFedLA evaluates every 2nd round with half the clients and all in the
    last, FedAvg every round, training 3 of the 4 clients."""
    import json

    from flwr.app import Context, RecordDict

    monkeypatch.syspath_prepend(str(ROOT / "examples" / "quickstart"))
    spec = importlib.util.spec_from_file_location("quickstart_server_app", ROOT / "examples" / "quickstart" / "server_app.py")
    server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(server)
    cfg = {"strategy": strategy, "num-server-rounds": 3, "results-dir": str(tmp_path)}
    server.app._main(InProcessGrid(client.app, {}, 4), Context(1, 0, {}, RecordDict(), cfg))
    assert_quickstart_run(json.loads((tmp_path / "metrics.json").read_text()), client.Net, strategy)
