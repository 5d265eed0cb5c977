"""Simulation speed: pflower's Flower simulation against a plain single-process PyTorch loop.

The same FedAvg work both ways: 10 clients x 1,000 MNIST images (iid; each client's share is
split 70/30 into train and test as pflower does), 1 local epoch of SGD (batch 32, lr 0.1) on
the MNIST CNN, the sample-weighted average, every client evaluating on its test split, 20
rounds. Prints the steady-state seconds per round of both (median of rounds 2-20), their ratio,
and pflower's start-up time (process start to the start of round 1).

    .venv/bin/python bench/sim_speed.py [--data-dir ../shared/data/mnist] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pflower.config import load_settings  # noqa: E402
from pflower.datasets import client_data  # noqa: E402
from pflower.models import build_model  # noqa: E402
from pflower.training import evaluate, train  # noqa: E402

CLIENTS = 10


def run_config(data_dir: Path, rounds: int, results: Path) -> dict:
    return {
        "method": "fedavg", "dataset": "mnist", "data-dir": str(data_dir), "partition": "iid",
        "local-epochs": 1, "num-server-rounds": rounds, "results-dir": str(results),
    }  # fmt: skip


def plain_loop(settings, rounds: int) -> list[float]:
    """The same rounds in one process on one core: seconds per round."""
    torch.set_num_threads(1)
    splits = [client_data(settings, c, CLIENTS) for c in range(CLIENTS)]
    model = build_model(settings, settings.image_shape, settings.num_classes, settings.seed)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    times = []
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        states, weights = [], []
        for c, (tr, _) in enumerate(splits):
            model.load_state_dict(global_state)
            train(model, tr, epochs=1, batch_size=settings.batch_size, lr=settings.lr, seed=rnd * 100 + c)
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            weights.append(len(tr))
        total = sum(weights)
        global_state = {k: sum(w * s[k] for w, s in zip(weights, states)) / total for k in global_state}
        model.load_state_dict(global_state)
        for _, te in splits:
            evaluate(model, te)
        times.append(time.perf_counter() - t0)
    return times


def pflower_run(config: dict, results: Path) -> tuple[list[float], float]:
    """pflower-sim end to end: (seconds per round, start-up seconds)."""
    cfg = " ".join(f"{k}='{v}'" if isinstance(v, str) else f"{k}={v}" for k, v in config.items())
    metrics = results / "metrics.json"
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("pflower-sim")), "--num-clients", str(CLIENTS), "-c", cfg, "--app", str(ROOT)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)  # fmt: skip
    first = None
    while proc.poll() is None:
        if first is None and metrics.exists():
            first = time.perf_counter() - t0
        time.sleep(0.05)
    if proc.returncode != 0:
        raise SystemExit(f"pflower-sim failed ({proc.returncode})")
    rounds = json.loads(metrics.read_text())["rounds"]
    times = [r["wall-seconds"] for r in rounds]
    return times, (first or 0.0) - times[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "mnist")
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = run_config(args.data_dir.resolve(), args.rounds, Path(tmp))
        plain = plain_loop(load_settings(config), args.rounds)
        ours, startup = pflower_run(config, Path(tmp))
    steady = lambda t: statistics.median(t[1:])  # noqa: E731
    print(f"plain single-process loop (1 core): {steady(plain):.3f} s/round")
    print(f"pflower simulation (2 workers):     {steady(ours):.3f} s/round")
    print(f"ratio pflower / plain:              {steady(ours) / steady(plain):.2f}")
    print(f"pflower start-up before round 1:    {startup:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
