"""Simulation speed: pflower's Flower simulation against a plain single-process PyTorch loop.

The same FedAvg work both ways: 10 clients x 1,000 MNIST images (iid; each client's share is
split 70/30 into train and test as pflower does), 1 local epoch of SGD (batch 32, lr 0.1) on
the MNIST CNN, the sample-weighted average, every client evaluating on its test split, 20
rounds. Prints the steady-state seconds per round of both (median of rounds 2-20), their ratio,
pflower's start-up (command start to round 1, in its phases) and the peak memory of all its
processes (proportional set size, so shared libraries count once).

pflower runs twice by default, alternating: with one message per client per round
(``single-message=true``, the default: each evaluation rides on the next round's training
message) and with training and evaluation as two phases a round (``single-message=false``);
``--repeats`` alternates more pairs, ``--single-message true`` runs one of them.

``--clients 100 --fraction 0.1`` (or 1000) measures the scale runs: the shared MNIST set spread
over more clients, 10% of them training each round, every client evaluating; ``--method pfedla``
(with ``--no-plain``) the same with another method. The peak memory is also split by process
group (:data:`GROUPS`, by command line) at the moment of the peak. ``--cpus-per-client 2`` on two
cores runs one ClientApp actor instead of two. ``--clients-per-node`` is pflower-sim's (default
auto: several clients a simulated node; 1: one a node, as before).

    .venv/bin/python bench/sim_speed.py [--data-dir ../shared/data/mnist] [--rounds 20]
    .venv/bin/python bench/sim_speed.py --clients 1000 --fraction 0.1 --rounds 5 --no-plain
    .venv/bin/python bench/sim_speed.py --method pfedla --clients 1000 --fraction 0.1 --rounds 2 --no-plain --single-message true
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pflower.bench import run_config_string  # noqa: E402
from pflower.build import build_model  # noqa: E402
from pflower.config import load_settings  # noqa: E402
from pflower.datasets.federated import client_data  # noqa: E402
from pflower.processes import process_tree  # noqa: E402
from pflower.training import evaluate, train  # noqa: E402


def run_config(data_dir: Path, rounds: int, fraction: float, results: Path, method: str = "fedavg") -> dict:
    return {
        "method": method, "dataset": "mnist", "data-dir": str(data_dir), "partition": "iid",
        "local-epochs": 1, "num-server-rounds": rounds, "fraction-train": fraction, "results-dir": str(results),
    }  # fmt: skip


def plain_loop(settings, clients: int, rounds: int, threads: int, device: str = "cpu") -> list[float]:
    """The same rounds in one process with ``threads`` torch threads, training on ``device``:
    seconds per round."""
    torch.set_num_threads(threads)
    splits = [client_data(settings, c, clients) for c in range(clients)]
    model = build_model(settings, settings.image_shape, settings.num_classes, settings.seed).to(device)
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


#: Process groups by command line, first match wins: what each of pflower-sim's processes is.
GROUPS = (
    ("Ray GCS", ("gcs_server",)),
    ("Ray raylet", ("raylet/raylet",)),
    ("Ray agents and monitors", ("ray::RuntimeEnvAgent", "ray::DashboardAgent", "ray/dashboard", "log_monitor", "autoscaler")),
    ("Ray workers (ClientApp actors)", ("ray::", "default_worker")),
    ("Ray head process (pflower.ray_head)", ("pflower.ray_head",)),
    ("simulation process (ServerApp)", ("flwr-simulation",)),
    ("SuperLink", ("flower-superlink",)),
    ("SuperExec", ("flower-superexec",)),
    ("flwr CLI", ("flwr run", "/flwr ")),
    ("pflower-sim launcher", ("pflower-sim",)),
)


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _group(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    return next((name for name, marks in GROUPS if any(m in cmd for m in marks)), "other")


def _pss_bytes(pids: list[int], groups: dict[int, str]) -> dict[str, int]:
    """Proportional set size of ``pids`` by process group (shared pages split among their users).
    ``groups`` keeps each process's last group that was not "other": an exiting process's
    command line can no longer be read while its memory still counts, and Ray's agents name
    themselves only once started."""
    out: dict[str, int] = {}
    for pid in pids:
        size = _pss(pid)
        if size:
            group = _group(pid)
            if group == "other":
                group = groups.get(pid, group)
            else:
                groups[pid] = group
            out[group] = out.get(group, 0) + size
    return out


def pflower_run(config: dict, clients: int, results: Path, cpus_per_client: int = 1, per_node: str = "auto") -> dict:
    """pflower-sim end to end: per-round seconds, start-up phases, peak memory of its processes."""
    cfg = run_config_string(config)
    cmd = [str(Path(sys.executable).with_name("pflower-sim")), "--num-clients", str(clients), "-c", cfg, "--app", str(ROOT),
           "--cpus-per-client", str(cpus_per_client), "--clients-per-node", per_node]  # fmt: skip
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    marks: dict[str, float] = {}

    def read() -> None:
        for line in proc.stdout:
            if "Successfully started run" in line:
                marks.setdefault("submitted", time.time())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peak, groups, seen = 0, {}, {}
    while proc.poll() is None:
        now = _pss_bytes(process_tree(proc.pid), seen)
        if sum(now.values()) > peak:
            peak, groups = sum(now.values()), now
        time.sleep(0.5)
    reader.join(5)
    if proc.returncode != 0:
        raise SystemExit(f"pflower-sim failed ({proc.returncode})")
    doc = json.loads((results / "metrics.json").read_text())
    line = doc["timeline"]
    return {
        "rounds": [r["wall-seconds"] for r in doc["rounds"]],
        "submit": marks.get("submitted", t0) - t0,
        "serverapp": line["serverapp-started"] - marks.get("submitted", t0),
        "clients": line["clients-ready"] - line["serverapp-started"],
        "startup": line["clients-ready"] - t0,
        "peak": peak,
        "peak-groups": groups,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "mnist")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--fraction", type=float, default=1.0, help="fraction-train: share of clients training per round")
    p.add_argument("--no-plain", action="store_true", help="skip the plain loop (scale runs)")
    p.add_argument("--method", default="fedavg", help="pflower's method (the plain loop is FedAvg's: use --no-plain with others)")
    p.add_argument("--single-message", choices=["both", "true", "false"], default="both",
                   help="pflower's schedule: one message per client per round, two phases a round, or both alternating")  # fmt: skip
    p.add_argument("--repeats", type=int, default=1, help="pflower runs of each schedule, alternating")
    p.add_argument("--clients-per-node", default="auto", help="pflower-sim's --clients-per-node (default: auto)")
    p.add_argument("--cpus-per-client", type=int, default=1, help="pflower-sim's: CPUs per ClientApp actor (2 on two cores: one actor)")
    args = p.parse_args()
    steady = lambda t: statistics.median(t[1:])  # noqa: E731
    schedules = {"both": (True, False), "true": (True,), "false": (False,)}[args.single_message]
    runs: dict[bool, list[dict]] = {flag: [] for flag in schedules}
    with tempfile.TemporaryDirectory() as tmp:
        config = run_config(args.data_dir.resolve(), args.rounds, args.fraction, Path(tmp), args.method)
        for _ in range(args.repeats):
            for flag in schedules:
                runs[flag].append(pflower_run({**config, "single-message": flag}, args.clients, Path(tmp), args.cpus_per_client, args.clients_per_node))
        plain = {} if args.no_plain else {t: plain_loop(load_settings(config), args.clients, args.rounds, t) for t in (1, 2)}
    ours = runs[schedules[0]][-1]
    print(f"{args.method}, clients {args.clients}, fraction-train {args.fraction:g}, {args.rounds} rounds")
    for threads, times in plain.items():
        print(f"plain single-process loop ({threads} thread{'s' * (threads > 1)}): {steady(times):.3f} s/round")
    for flag, done in runs.items():
        name = "one message a round" if flag else "two phases a round "
        per_run = [steady(r["rounds"]) for r in done]
        totals = [sum(r["rounds"]) for r in done]
        print(f"pflower simulation ({max(1, (os.cpu_count() or 1) // args.cpus_per_client)} ClientApp actors), {name}: {statistics.median(per_run):.3f} s/round "
              f"(runs {', '.join(f'{x:.3f}' for x in per_run)}; all rounds {statistics.median(totals):.1f} s)")  # fmt: skip
        for threads, times in plain.items():
            print(f"  ratio to plain ({threads} thread{'s' * (threads > 1)}): {statistics.median(per_run) / steady(times):.2f}")
    if len(runs) == 2:
        pairs = [steady(a["rounds"]) / steady(b["rounds"]) for a, b in zip(runs[True], runs[False])]
        print(f"one message / two phases, s/round, per pair: {', '.join(f'{x:.3f}' for x in pairs)}")
    print(f"pflower start-up before round 1:   {ours['startup']:.1f} s "
          f"(SuperLink + submission {ours['submit']:.1f} s, simulation process + ServerApp {ours['serverapp']:.1f} s, "
          f"Ray + ClientApps + identity query {ours['clients']:.1f} s)")  # fmt: skip
    print(f"peak memory of pflower's processes: {ours['peak'] / 2**20:.0f} MiB (PSS, all processes together); at that peak:")
    for name, size in sorted(ours["peak-groups"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:<36} {size / 2**20:7.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
