"""Real deployment: a SuperLink and 3 SuperNodes, each in its own network namespace (veth +
bridge), with TLS and SuperNode authentication; an unregistered node; a node that crashes and
comes back while another one's ClientApp returns wrong shapes.

Warm and cold at once, without running anything twice: in the shared deployment nodes 0 and 1
are warm (each message's ClientApp forked from the node's fork server, pflower.deploy.warm) and
node 2 and the added node 3 are cold (Flower's fresh process per message), so every run mixes
both paths and FedeRiCo's equality with the in-process run holds for each; in the crash test
every node is warm, and the killed node's fork server dies and comes back with it."""

import json
import os
import shutil
import threading
import time

import pytest
from conftest import MNIST_DIR, ROOT, faulty_app, mnist_like, run_config

from pflower.datasets.node import parse_groups, write_node_folders
from pflower.deploy import Deployment
from pflower.deploy.certificates import node_key
from pflower.deploy.warm import server_status as warm_status

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2")]
#: The deployment tests share one worker and one deployment; the crash test has a deployment and
#: a worker of its own, so its minute of waiting for heartbeats to lapse overlaps the others.
DEPLOYMENT = pytest.mark.xdist_group("deployment")


#: Each node's own data for dataset='node': node i's classes (an image tree written from the MNIST test set).
NODE_CLASSES = parse_groups("0-3/4-6/7-9")


def _deployment(tmp_path_factory, node_data=(), hide=(), warm=True, node_config=None) -> Deployment:
    # Node 2 misbehaves when the run's ClientApp is tests/faulty_client.py; pflower's own ignores the key.
    node_config = {**(node_config or {}), 2: f'{(node_config or {}).get(2, "")} fault="wrong-shape"'.strip()}
    return Deployment(tmp_path_factory.mktemp("deploy"), nodes=3, netns=True, node_config=node_config,
                      node_data=node_data, hide=hide, warm=warm)  # fmt: skip


def wait_until(condition, timeout: float, what: str, interval: float = 0.2) -> None:
    """Poll ``condition`` until it holds; after ``timeout`` seconds fail, saying ``what`` was awaited."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(interval)


def wait_ready(dep: Deployment, timeout: float = 180) -> None:
    """Every SuperNode online as the SuperLink sees it, and every warm node's fork server done
    importing: a message sent now finds its node and runs warm (a shim that waits more than
    PFLOWER_WARM_TIMEOUT for a server still importing goes cold, which assert_warm fails)."""
    dep.wait_statuses(range(dep.nodes), {"online"}, timeout)
    for name in sorted(dep.warm_names):
        wait_until(lambda name=name: "fork server ready" in dep.log(name), timeout, f"{name}'s fork server ready")


def assert_warm(dep: Deployment, name: str, starts: int = 1) -> None:
    """SuperNode process ``name``'s ClientApps were forked by its fork server (started at least
    ``starts`` times): none went cold, and the server has pflower and CUDA unloaded."""
    log = dep.log(name)
    assert log.count("fork server ready") >= starts and "pflower-warm shim:" not in log, log[-3000:]
    status = warm_status(dep.warm_dir(name) / "server.sock")
    assert status["forked"] > 0 and not status["pflower-loaded"] and not status["cuda-initialized"], status


@pytest.fixture(scope="session")  # per xdist worker: not torn down when the worker interleaves other modules
def deployment(tmp_path_factory):
    """3 SuperNodes, each with a folder of its own data (dataset='node'; runs on the shared pool
    ignore it); the SuperLink, and the ServerApp it starts, see neither those folders nor the
    shared data sets."""
    root = tmp_path_factory.mktemp("node-data")
    mnist = mnist_like(tmp_path_factory)
    dirs = write_node_folders(mnist, root, NODE_CLASSES, per_class=80)
    hide = [root, MNIST_DIR.parent if mnist == MNIST_DIR else mnist]  # the shared data sets, or the digits made here
    with _deployment(tmp_path_factory, dirs, hide, warm={0, 1}) as dep:
        dep.node_data_root, dep.mnist = root, mnist
        wait_ready(dep)
        yield dep


@pytest.fixture
def crash_deployment(tmp_path_factory):
    """Every node warm; node 0 held at round 2's training (where the test kills it), node 1 at
    round 3's (which the test lets go once node 0 is back): gates in ``dep.gates``, see
    tests/faulty_client.py."""
    gates = tmp_path_factory.mktemp("gates")
    config = {i: f'gate-round={i + 2} gate="{gates / f"node{i}"}"' for i in (0, 1)}
    with _deployment(tmp_path_factory, node_config=config) as dep:
        dep.gates = gates
        wait_ready(dep)
        yield dep


def _metrics(path):
    return json.loads((path / "metrics.json").read_text())


@DEPLOYMENT
def test_federico_gives_the_same_result_deployed_as_in_process(deployment, tmp_path, grid_factory):
    """The relay's steps between real SuperNodes (a fresh ClientApp process per message) end
    exactly where the same run ends in process."""
    from pflower.build import build_strategy
    from pflower.config import load_settings

    keys = {"method": "federico", "partition": "label-groups", "num_server_rounds": 1, "local_epochs": 1, "round_timeout": 120.0}
    config = "method='federico' partition='label-groups' num-server-rounds=1 local-epochs=1 round-timeout=120.0"
    _, status, log = deployment.submit(ROOT, f"{config} results-dir='{tmp_path / 'deployed'}'")
    assert status == "finished:completed", log
    cfg = run_config(**keys, results_dir=str(tmp_path / "in-process"))
    build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, 3))
    deployed, local = _metrics(tmp_path / "deployed")["rounds"], _metrics(tmp_path / "in-process")["rounds"]
    assert [r["round"] for r in deployed] == [1] and all(r["missing"] == [] for r in deployed)
    for a, b in zip(deployed, local):
        assert a["per-client-accuracy"] == b["per-client-accuracy"]
        assert a["collaboration-weights"] == b["collaboration-weights"]
        assert a["relayed-bytes"] == b["relayed-bytes"]
    for i in (0, 1):  # warm nodes: forked, never cold; node 2 cold: no fork server
        assert_warm(deployment, f"node{i}")
    assert "fork server" not in deployment.log("node2") and not deployment.warm_dir("node2").exists()


@DEPLOYMENT
def test_supernode_with_an_unregistered_key_is_refused(deployment, tmp_path):
    node_key(tmp_path / "rogue")
    proc = deployment.start_node(0, key=tmp_path / "rogue", name="node0-rogue")
    assert proc.wait(90) != 0
    assert "Failed to activate SuperNode" in deployment.log("node0-rogue")


@DEPLOYMENT
def test_nodes_bring_their_own_data_over_tls_and_the_superlink_sees_none(deployment, tmp_path):
    """dataset='node', TLS and SuperNode authentication on: each SuperNode trains on its own folder
    (other classes each), the SuperLink's view has no data at all, a fourth node whose images
    are another size is refused by name; a pFedLA and a FedAvg run finish with every node's
    accuracy, and each node keeps its personal state in its own state-dir. (Last of the group:
    the fourth node stays registered.)"""
    assert deployment.net is not None and deployment.link_address.startswith("10.77.")
    statuses = deployment.node_statuses()
    assert [statuses[i] for i in range(3)] == ["online"] * 3
    assert deployment.view_of_link(deployment.node_data_root) == [] and deployment.view_of_link(deployment.mnist) == []
    (odd,) = write_node_folders(deployment.mnist, tmp_path / "odd", [["1", "2"]], per_class=20, image_size=14)
    deployment.add_node(3, f'partition-id=3 num-partitions=4 data-dir="{odd}"')
    deployment.wait_status(3, {"online"}, 120)
    for method in ("pfedla", "fedavg"):
        results = tmp_path / method
        config = f"method='{method}' dataset='node' num-server-rounds=2 local-epochs=5 round-timeout=120 results-dir='{results}'"
        _, status, log = deployment.submit(ROOT, config)
        assert status == "finished:completed", log
        assert "(client 3) is refused: its images are (1, 14, 14), the federation's (1, 28, 28)" in log
        doc = _metrics(results)
        assert doc["num-clients"] == 3 and [r["round"] for r in doc["rounds"]] == [1, 2]
        for r in doc["rounds"]:
            assert r["missing"] == [] and r["rejected"] == {} and r["bytes-down"] > 0
            assert sorted(r["per-client-accuracy"]) == ["0", "1", "2"]
        assert doc["rounds"][-1]["accuracy"] > 0.5, doc["rounds"][-1]["per-client-accuracy"]
        assert doc["client-classes"] == {"0": [0, 1, 2, 3], "1": [4, 5, 6], "2": [7, 8, 9]}
        for i in range(3):  # each SuperNode saved its personal state in its own state-dir (node config)
            assert list((deployment.dir / "state" / f"node{i}" / doc["lineage"]).glob("client-*/round-*.state"))


@pytest.mark.xdist_group("crash")
def test_crashed_supernode_rejoins_with_its_state_and_wrong_shapes_are_rejected(crash_deployment, tmp_path):
    """Node 0 is killed while it has round 2's training message (of 4), and restarted as a
    supervisor would: with its key the SuperLink lets it back in once its old heartbeats lapse
    (about a minute). Round 3 cannot end before node 0 is back online and warm (node 1's training
    waits for it), so round 4, the first round sent after that, includes it: it answers under
    its client id, from the state in its state-dir. A resumed run has it back as well (that a
    resumed run restores exactly is shown in test_faults and test_checkpoint).
    Meanwhile node 2's ClientApp sends wrong shapes every round; they are rejected."""
    dep = crash_deployment
    app = faulty_app(tmp_path / "app", fault="")
    first, second = tmp_path / "first", tmp_path / "second"
    # A generous timeout: round 3 lasts until node 0 is back, which restart_node bounds (240 s);
    # the dead node's phases end when the SuperLink marks it offline, not at this timeout.
    base = "method='heurpfedla' heurpfedla.top-k=1 local-epochs=2 round-timeout=300"
    outcome = {}
    runner = threading.Thread(
        target=lambda: outcome.update(zip(("id", "status", "log"), dep.submit(app, f"{base} num-server-rounds=4 results-dir='{first}'"))),
        daemon=True,  # a failing test does not wait for the run: the deployment's teardown ends it
    )
    runner.start()
    wait_until(lambda: (dep.gates / "node0.reached").exists() or not runner.is_alive(), 300, "node 0 training in round 2")
    assert runner.is_alive(), outcome.get("log")
    dep.kill_node(0)
    (dep.gates / "node0").touch()  # were round 2's message ever delivered again, it would not wait
    dep.restart_node(0)  # returns once the SuperLink says it is online
    wait_until(lambda: dep.log("node0").count("fork server ready") >= 2, 180, "node 0's fork server ready again")
    (dep.gates / "node1").touch()  # round 3 may end: round 4 goes to node 0 as well
    runner.join(600)
    assert not runner.is_alive() and outcome["status"] == "finished:completed", outcome.get("log")
    assert dep.node_status(0) == "online"
    rounds = _metrics(first)["rounds"]
    # round 1's evaluation rode on round 2's message to node 0, lost with it; round 3's message
    # went to node 0 while it was down (or, were it back already, was answered)
    assert [r["missing"] for r in rounds] in ([[0], [0], [0], []], [[0], [0], [], []]), [(r["missing"], r["wall-seconds"]) for r in rounds]
    assert "0" in rounds[2]["per-client-accuracy"] and "0" in rounds[3]["per-client-accuracy"]  # round 3's evaluation rode on round 4
    assert [r["rejected"] for r in rounds] == [{"shape": 1}] * 4
    acc0 = next(r["per-client-accuracy"]["0"] for r in rounds if "0" in r["per-client-accuracy"])

    _, status, log = dep.submit(app, f"{base} num-server-rounds=5 results-dir='{second}' resume-from='{first}'")
    assert status == "finished:completed", log
    resumed = _metrics(second)["rounds"]
    assert [r["round"] for r in resumed] == [1, 2, 3, 4, 5] and resumed[4]["missing"] == []
    assert resumed[4]["per-client-accuracy"]["0"] >= acc0 - 0.02  # no reset to an untrained model
    saved = dep.dir / "state" / "node0" / _metrics(first)["lineage"] / "client-0"
    assert "round-000005.state" in {p.name for p in saved.iterdir()}  # its state went on in its state-dir
    # warm: node 0's fork server was killed with it and started again with it; node 2's ClientApp
    # raised nothing but sent wrong shapes through forked children; every node stayed warm
    assert_warm(dep, "node0", starts=2)
    for i in (1, 2):
        assert_warm(dep, f"node{i}")
