"""The docker compose demo, run for real: the README's own commands on a Docker engine with
Flower's image layout, then a SuperNode container killed mid-run, a SuperLink that cannot start,
and a clean `down -v`. Marker `docker` (not in the default run; `.ci/run` runs it after it).

The engine and Flower's images come from `../shared/tools/docker-offline.sh` where no engine
runs (it needs root and the package registries); the executor image is built from a wheel folder
served on loopback (the README's air-gapped path). Without an engine and without that tool the
tests skip, saying why."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, mnist_like

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.xdist_group("docker")]

TOOL = ROOT.parent / "shared" / "tools" / "docker-offline.sh"
WHEELS = Path(os.environ.get("DOCKER_OFFLINE_DIR", "/tmp/docker-offline")) / "wheels"
PROJECT = "pflower"
BASE = ["docker", "compose", "-f", "docker/compose.yml"]
TLS = [*BASE, "-f", "docker/compose.tls.yml"]
FLWR_IMAGES = [f"flwr/{name}:1.39.0" for name in ("superlink", "supernode", "superexec")]


def readme_blocks() -> dict[str, str]:
    """The README's commands, by the name of the `<!-- docker-test: NAME -->` marker before each block."""
    text = (ROOT / "README.md").read_text()
    return {m[1]: m[2] for m in re.finditer(r"<!-- docker-test: (\S+) -->\n```bash\n(.*?)```", text, re.S)}


def _ok(*cmd: str) -> bool:
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


def _wheel_port() -> int:
    """The README's port (8765) where it is free: the build argument, and so the image's cached
    layers, stay the same from run to run; any free port otherwise."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 8765))
        except OSError:
            s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log(line: str) -> None:
    print(f"[docker demo {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def engine():
    """A Docker engine with Compose v2 and Flower's 1.39 images; the wheel folder served on a
    loopback port (its address in PFLOWER_WHEELS)."""
    have_images = _ok("docker", "compose", "version") and all(_ok("docker", "image", "inspect", i) for i in FLWR_IMAGES)
    if not have_images:
        if not (TOOL.exists() and os.geteuid() == 0):
            pytest.skip("no Docker engine with Compose v2 and Flower's images, and no ../shared/tools/docker-offline.sh run as root to make them")
        subprocess.run(["bash", str(TOOL), "all"], check=True)
    # dockerd sets the FORWARD policy to DROP; pflower-deploy's netns bridges add their own rule.
    if not any(WHEELS.glob("torch-*.whl")):
        if not TOOL.exists():
            pytest.skip(f"no wheel folder at {WHEELS} to build the executor image from")
        subprocess.run(["bash", str(TOOL), "wheels", str(WHEELS), str(ROOT / "pyproject.toml")], check=True)
    port = _wheel_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(WHEELS)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture(scope="module")
def env(engine, tmp_path_factory):
    venv = ROOT / ".venv" / "bin"
    return {**os.environ, "PATH": f"{venv}:{os.environ['PATH']}", "MNIST": str(mnist_like(tmp_path_factory)), "PFLOWER_WHEELS": engine,
            "FLWR_HOME": str(ROOT / "docker" / "flwr-home"), "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}  # fmt: skip


def _run(cmd: str | list[str], env: dict, timeout: float = 2400, check: bool = True) -> subprocess.CompletedProcess:
    """A README block (a string, run by bash -e) or a command; its output goes to the test log too."""
    args = ["bash", "-euo", "pipefail", "-c", cmd] if isinstance(cmd, str) else cmd
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"{cmd!r} exited {out.returncode}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out


def _leftovers() -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={PROJECT}"
    kinds = {"containers": ["ps", "-aq"], "volumes": ["volume", "ls", "-q"], "networks": ["network", "ls", "-q"]}
    return {k: subprocess.run(["docker", *cmd, "--filter", label], capture_output=True, text=True).stdout.split() for k, cmd in kinds.items()}


def _runs(dest: Path) -> list[dict]:
    """The metrics.json of every run under ``dest``: its own, or its run folders' in start order."""
    files = [dest / "metrics.json"] if (dest / "metrics.json").is_file() else sorted(dest.glob("*/metrics.json"))
    return [json.loads(f.read_text()) for f in files]


def _results(env: dict, compose: list[str], source: str, dest: Path) -> dict:
    """The one run's metrics.json under ``source`` in the ServerApp's container."""
    shutil.rmtree(dest, ignore_errors=True)
    _run([*compose, "cp", f"serverapp:{source}", str(dest)], env)
    (doc,) = _runs(dest)
    return doc


def _check_nodes_own_accuracy(doc: dict, rounds: int) -> None:
    assert doc["num-clients"] == 3 and [r["round"] for r in doc["rounds"]] == list(range(1, rounds + 1))
    assert doc["client-classes"] == {"0": [0, 1, 2, 3], "1": [4, 5, 6], "2": [7, 8, 9]}
    for r in doc["rounds"]:
        assert r["missing"] == [] and sorted(r["per-client-accuracy"]) == ["0", "1", "2"], r
        assert all(0.0 <= a <= 1.0 for a in r["per-client-accuracy"].values())


def _node_status(env: dict, node_id: str) -> str:
    out = _run(["flwr", "supernode", "ls", "docker-tls", "--format", "json"], env).stdout
    nodes = json.loads(out[out.index("{") :])["nodes"]
    return next((n["status"] for n in nodes if str(n["node-id"]) == node_id), "unknown")


def test_readme_docker_demo_insecure_tls_restart_and_down(env, tmp_path):
    blocks = readme_blocks()
    assert set(blocks) >= {"setup", "insecure", "tls", "inspect", "down"}, sorted(blocks)
    _run([*TLS, "down", "-v"], env)  # whatever an earlier, interrupted run left
    shutil.rmtree(ROOT / "docker" / "certs", ignore_errors=True)
    shutil.rmtree(ROOT / "results-docker", ignore_errors=True)
    setup = blocks["setup"]
    try:
        _run(setup, env)
        # insecure: up --build (the image built once, for every executor), a 2-round pFedLA run, results out, down -v
        started = time.monotonic()
        run = _run(blocks["insecure"], env)
        _log(f"insecure block (build, up, 2 rounds, copy, down) {time.monotonic() - started:.0f} s")
        _log("rounds: " + "; ".join(re.findall(r"\[round \d+/\d+\][^\n]*", run.stdout)))
        assert "Successfully started run" in run.stdout, run.stdout[-3000:]
        docs = _runs(ROOT / "results-docker")  # two runs in a row, each in a folder of its own
        assert [d["config"]["method"] for d in docs] == ["pfedla", "fedavg"], [d["config"]["results-dir"] for d in docs]
        for doc in docs:
            _check_nodes_own_accuracy(doc, rounds=2)
        assert _leftovers() == {"containers": [], "volumes": [], "networks": []}

        # TLS + SuperNode authentication: keys readable by the containers' user, registration, a run
        started = time.monotonic()
        registered = re.findall(r"SuperNode (\d+) registered", _run(blocks["tls"], env).stdout)
        assert len(registered) == 3, registered
        _log(f"tls block {time.monotonic() - started:.0f} s")
        _check_nodes_own_accuracy(_results(env, TLS, "/app/results", tmp_path / "tls"), rounds=2)
        inspect = _run(blocks["inspect"], env).stdout
        assert inspect.count("(healthy)") == 4 and "online" in inspect, inspect

        # a SuperNode container killed mid-run, started again once the SuperLink marks it offline
        node1 = registered[1]
        config = "method='pfedla' dataset='node' num-server-rounds=6 local-epochs=1 round-timeout=180 results-dir='results/restart'"
        flwr = subprocess.Popen(["flwr", "run", ".", "docker-tls", "--stream", "-c", config], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        stream = []
        try:
            for line in flwr.stdout:
                stream.append(line)
                if "[round 1/" in line:
                    break
            _run([*TLS, "kill", "supernode-1"], env)
            _log("supernode-1 killed after round 1")
            deadline = time.monotonic() + 300
            while _node_status(env, node1) != "offline":
                assert time.monotonic() < deadline, "the SuperLink never marked supernode-1 offline"
                time.sleep(2)
            _run([*TLS, "start", "supernode-1"], env)
            _log("supernode-1 started again")
            stream.extend(flwr.stdout)
            assert flwr.wait(900) == 0, "".join(stream)[-4000:]
        finally:
            if flwr.poll() is None:
                flwr.kill()
        _log("restart run: " + "; ".join(re.findall(r"\[round \d+/\d+\][^\n]*", "".join(stream))))
        rounds = _results(env, TLS, "/app/results/restart", tmp_path / "restart")["rounds"]
        missing = [r["missing"] for r in rounds]
        assert len(rounds) == 6 and missing[0] == [] and missing[1] == [1], missing
        back = [i for i, m in enumerate(missing) if i > 1 and m == []]
        assert back and all(m == [] for m in missing[back[0] :]), missing  # answers again before the run ends
        assert "1" in rounds[-1]["per-client-accuracy"]
    finally:
        down = _run(blocks["down"], env, check=False)
    assert down.returncode == 0, down.stderr[-3000:]
    assert _leftovers() == {"containers": [], "volumes": [], "networks": []}


def test_up_wait_fails_naming_a_superlink_that_cannot_start(env, tmp_path):
    """The SuperLink's database path cannot be written: `up --wait` exits non-zero and names it."""
    broken = tmp_path / "broken.yml"
    broken.write_text(
        'services:\n  superlink:\n    command: ["--insecure", "--isolation", "process", "--host", "0.0.0.0",\n'
        '              "--database", "/nonexistent/superlink.db", "--disable-runtime-dependency-installation"]\n'
    )
    compose = [*BASE, "-f", str(broken)]
    try:
        out = _run([*compose, "up", "--build", "--wait", "--wait-timeout", "180"], env, check=False)
        text = out.stdout + out.stderr
        assert out.returncode != 0, text[-3000:]
        assert re.search(r"pflower-superlink-1 (exited|is unhealthy)", text), text[-3000:]
        logs = _run([*compose, "logs", "superlink"], env).stdout
        assert "unable to open database file" in logs, logs[-3000:]
    finally:
        _run([*compose, "down", "-v"], env, check=False)
    assert _leftovers() == {"containers": [], "volumes": [], "networks": []}
