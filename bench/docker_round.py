"""The docker compose demo's round against pflower-deploy's on loopback, for the same work.

Both deployments are a SuperLink and 3 SuperNodes with TLS and SuperNode authentication, each
node with its own MNIST folder (`pflower-deploy node-data`, the README's demo data), and run the
same pFedLA config (`dataset='node'`, 1 local epoch) in turn, compose first. Reported: a round's
seconds (metrics.json ``wall-seconds``; the median of rounds 2 and later), and for compose the
seconds from `docker compose up --build --wait` (the executor image already built, its layers
cached) to the end of round 1. Needs a Docker engine with Compose v2, Flower's images and the
executor image's wheels (see README, "Docker compose").

    .venv/bin/python bench/docker_round.py [--data-dir ../shared/data/mnist] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TLS = ["docker", "compose", "-f", "docker/compose.yml", "-f", "docker/compose.tls.yml"]


def _config(rounds: int, results: str) -> str:
    return f"method='pfedla' dataset='node' local-epochs=1 num-server-rounds={rounds} round-timeout=300 results-dir='{results}'"


def _sh(cmd: list[str], env: dict) -> str:
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout


def compose_run(rounds: int, env: dict, tmp: Path) -> tuple[list[float], float]:
    """The compose demo with TLS: round seconds, and seconds from `up --build --wait` to round 1's end."""
    flwr_home = tmp / "flwr-home"
    flwr_home.mkdir()
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "docker-tls"\n[superlink.docker-tls]\naddress = "127.0.0.1:8000"\n'
        f'root-certificates = "{ROOT / "docker" / "certs" / "ca.crt"}"\n'
    )
    env = {**env, "FLWR_HOME": str(flwr_home)}
    _sh([*TLS, "down", "-v"], env)
    _sh(["bash", "docker/generate-certs.sh"], env)
    _sh([*TLS, "up", "--wait", "superlink"], env)
    for i in range(3):
        _sh(["flwr", "supernode", "register", f"docker/certs/keys/node{i}.pub", "docker-tls"], env)
    try:
        t0 = time.perf_counter()
        _sh([*TLS, "up", "--build", "--wait"], env)
        up = time.perf_counter() - t0
        flwr = subprocess.Popen(["flwr", "run", ".", "docker-tls", "--stream", "-c", _config(rounds, "results/bench")], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        to_round1 = None
        for line in flwr.stdout:
            if to_round1 is None and "[round 1/" in line:
                to_round1 = time.perf_counter() - t0
        flwr.wait()
        out = tmp / "compose-results"
        _sh([*TLS, "cp", "serverapp:/app/results/bench", str(out)], env)
        seconds = [r["wall-seconds"] for r in json.loads((out / "metrics.json").read_text())["rounds"]]
        print(f"compose: up --build --wait {up:.1f} s, round 1 ended {to_round1:.1f} s after it; rounds " + " ".join(f"{s:.1f}" for s in seconds), flush=True)
        return seconds, to_round1
    finally:
        _sh([*TLS, "down", "-v"], env)


def deploy_run(rounds: int, env: dict, tmp: Path) -> list[float]:
    """pflower-deploy on loopback (processes, TLS and authentication) on the same node folders."""
    from pflower.deploy import Deployment

    nodes = [ROOT / "docker" / "node-data" / f"node{i}" for i in range(3)]
    with Deployment(tmp / "deploy", nodes=3, node_data=nodes) as dep:
        _, status, log = dep.submit(ROOT, _config(rounds, str(tmp / "deploy-results")))
    if status != "finished:completed":
        raise SystemExit(f"pflower-deploy run ended {status}:\n{log[-3000:]}")
    seconds = [r["wall-seconds"] for r in json.loads((tmp / "deploy-results" / "metrics.json").read_text())["rounds"]]
    print("pflower-deploy: rounds " + " ".join(f"{s:.1f}" for s in seconds), flush=True)
    return seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "mnist")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if not args.data_dir.is_dir():
        p.error(f"--data-dir {args.data_dir} is not a folder (MNIST's IDX files)")
    sys.path.insert(0, str(ROOT))
    from pflower.datasets.node import parse_groups, write_node_folders

    write_node_folders(args.data_dir, ROOT / "docker" / "node-data", parse_groups("0-3/4-6/7-9"), 200)
    venv = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv}:{os.environ['PATH']}", "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="docker-round-") as tmp:
        compose, to_round1 = compose_run(args.rounds, env, Path(tmp))
        deploy = deploy_run(args.rounds, env, Path(tmp))
    steady = {"compose": statistics.median(compose[1:]), "deploy": statistics.median(deploy[1:])}
    print(f"\n3 SuperNodes, TLS + authentication, pFedLA on each node's own MNIST folder, 1 epoch, {args.rounds} rounds")
    print(f"{'':40}{'docker compose':>16}{'pflower-deploy':>16}")
    print(f"{'round, median of rounds 2+ (s)':40}{steady['compose']:>16.1f}{steady['deploy']:>16.1f}")
    print(f"{'up --build --wait to round 1 end (s)':40}{to_round1:>16.1f}{'':>16}")
    print(f"ratio compose / pflower-deploy round: {steady['compose'] / steady['deploy']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
