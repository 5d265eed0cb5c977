"""A simulation on a Ray cluster of two nodes: each reply names the Ray node that ran it, the
server records it in metrics.json (``ray-nodes``), and the numbers are those of one machine."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import types

import pytest
from conftest import MNIST_DIR, NO_MNIST, ROOT, in_process_rounds, run_config

from pflower.bench import run_config_string
from pflower.results import RAY_NODES, outcome

#: 2 rounds of FedAvg, 4 clients of 40 MNIST images each: the smallest run that is one.
KEYS = {"method": "fedavg", "dataset": "mnist", "data-dir": str(MNIST_DIR), "samples-per-client": 40, "num-server-rounds": 2, "local-epochs": 1}
NODE = "ab" * 28  # a Ray node id: 56 hex digits


def test_a_reply_names_its_ray_node_and_the_row_records_it(tmp_path, monkeypatch, no_figures):
    """In process, with a stand-in for Ray in the ClientApp's process: every training and
    evaluation reply says its node (a declared key, checked by the reply validator), each row
    lists the clients under it, and the rows are otherwise those of a run without Ray."""
    cfg = run_config(method="fedavg", num_server_rounds=2, local_epochs=1, samples_per_client=40)
    plain = in_process_rounds(cfg, tmp_path / "plain")
    context = types.SimpleNamespace(get_node_id=lambda: NODE)
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: context))
    in_process_rounds(cfg, tmp_path / "ray")
    rows = json.loads((tmp_path / "ray" / "metrics.json").read_text())["rounds"]
    assert [r[RAY_NODES] for r in rows] == [{NODE: [0, 1, 2]}] * 2
    assert [outcome(r) for r in rows] == plain and all(RAY_NODES not in r for r in plain)


NETNS = os.geteuid() == 0 and shutil.which("ip") is not None


def _ray_probe(net, address: str, want: int) -> dict[str, str]:
    """Once ``want`` nodes of the cluster at ``address`` are alive: their ids and addresses, read
    by a driver on the head's host (a driver needs a Ray node on its own host)."""
    probe = (
        "import json, time, ray\n"
        f"ray.init(address={address!r}, include_dashboard=False, logging_level='ERROR')\n"
        "deadline = time.monotonic() + 120\n"
        f"while len(alive := {{n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']}}) < {want} and time.monotonic() < deadline:\n"
        "    time.sleep(0.2)\n"
        "print(json.dumps(alive))\n"
    )
    out = subprocess.run([*net.prefix("head"), sys.executable, "-c", probe], capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.xdist_group("simulation-faults")
@pytest.mark.skipif(not NETNS, reason="a second Ray node on a host of its own needs network namespaces: root and iproute2")
@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason=NO_MNIST)
def test_simulation_on_a_two_node_ray_cluster(tmp_path):
    """A Ray head and a second node, each in a network namespace of its own (two hosts on one
    bridge) with 1 CPU: pflower-sim on the head's host with RAY_ADDRESS runs 4 clients of 1 CPU
    each, so Flower's actor pool has one actor per node. metrics.json names both nodes and every
    client under the node(s) that ran its messages; every other number is that of the run in
    process (which tests/test_simulation.py shows equal to a run on one Ray node)."""
    from pflower.deploy.netns import Network
    from pflower.launcher import FLOWER_ENV
    from pflower.processes import console_script, stop, wait_for_port

    net = Network(f"prc{secrets.token_hex(2)}", ["head", "worker"])
    temp = tempfile.mkdtemp(prefix="pfrc-")  # short: Ray's socket paths must fit in 107 bytes
    env = {**os.environ, **FLOWER_ENV, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    ray, port, procs = console_script("ray"), 6379, []
    logs = {name: open(tmp_path / f"ray-{name}.log", "wb") for name in ("head", "worker")}

    def ray_start(name: str, *args: str) -> subprocess.Popen:
        cmd = [*net.prefix(name), ray, "start", "--block", f"--node-ip-address={net.address(name)}", "--num-cpus=1", "--num-gpus=0",
               "--disable-usage-stats", f"--temp-dir={temp}/{name}", *args]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=logs[name], stderr=subprocess.STDOUT, start_new_session=True))
        return procs[-1]

    net.up()
    try:
        head_address = f"{net.address('head')}:{port}"
        head = ray_start("head", "--head", f"--port={port}", "--include-dashboard=false")
        wait_for_port(head, "ray head", net.address("head"), port, lambda: (tmp_path / "ray-head.log").read_text()[-2000:], timeout=120)
        ray_start("worker", f"--address={head_address}")
        nodes = _ray_probe(net, head_address, 2)
        assert sorted(nodes.values()) == sorted(net.address(n) for n in ("head", "worker")), (tmp_path / "ray-worker.log").read_text()[-2000:]

        results, flwr_home = tmp_path / "cluster", tmp_path / "flwr-home"
        cmd = [*net.prefix("head"), sys.executable, "-m", "pflower.launcher", "--app", str(ROOT), "--flwr-home", str(flwr_home),
               "--num-clients", "4", "--cpus-per-client", "1", "-c", f"{run_config_string(KEYS)} results-dir='{results}'"]  # fmt: skip
        sim = subprocess.Popen(cmd, env={**env, "RAY_ADDRESS": head_address}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # fmt: skip
        procs.append(sim)  # stopped with its SuperLink by the clean-up below should it not end in time
        output = sim.communicate(timeout=420)[0]
        assert sim.returncode == 0, output[-4000:]
        assert not (flwr_home / "ray-head.log").exists()  # RAY_ADDRESS: pflower-sim started no head of its own
    finally:
        for proc in reversed(procs):
            stop(proc)
        for log in logs.values():
            log.close()
        net.down()
        shutil.rmtree(temp, ignore_errors=True)
    left = subprocess.run(["pgrep", "-f", temp], capture_output=True, text=True).stdout.split()
    assert left == []

    doc = json.loads((results / "metrics.json").read_text())
    placed = [r[RAY_NODES] for r in doc["rounds"]]
    assert {node for p in placed for node in p} == set(nodes)  # clients ran on both nodes
    assert sorted(c for clients in placed[0].values() for c in clients) == [0, 1, 2, 3]  # one message each in round 1
    assert {c for clients in placed[1].values() for c in clients} == {0, 1, 2, 3}  # round 2: training, then the last evaluation
    local = in_process_rounds(run_config(**{k.replace("-", "_"): v for k, v in KEYS.items()}), tmp_path / "in-process", 4)
    assert [outcome(r) for r in doc["rounds"]] == local
