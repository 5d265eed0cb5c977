"""Cheap clients: where Flower's engine costs more than the training.

N clients share the MNIST test set (iid, 70 % of each share trains, 30 % tests; at 100 clients
each trains on 70 images: 3 steps of batch 32), 1 local epoch, every client evaluating, 8
rounds; a round's steady state is the median of rounds 2 and later. Side by side in one
invocation, alternating (A B C D E, then E D C B A, ...):

- ``pflower``: ``pflower-sim`` with FedAvg (one message per client a round; its round is
  metrics.json's ``wall-seconds``);
- ``stock``: ``bench/stock_app`` (Flower's quickstart ClientApp and Flower's FedAvg) on N
  simulated SuperNodes, through the same launcher (its round: the time between its
  ``evaluate_fn`` calls);
- ``floor``: the same stock app with ``client-work='none'``: a ClientApp that only replies, so its
  round is Flower's engine alone (2 N messages);
- ``plain-1``, ``plain-2``: the same rounds in one process with 1 and 2 torch threads
  (:func:`sim_speed.plain_loop`).

Each simulation starts its own SuperLink and Ray head with one one-core actor per core; with
``--gpus-per-client`` (a GPU host) one per GPU share, the ClientApps and the plain loop training
on the GPU. ``--figure`` draws round time against the number of clients. ``--pflower-from DIR``
adds another pflower checkout (e.g. a worktree of main) as variant ``pflower@DIR``, run side by
side with this one: a before-and-after in one invocation; ``--json`` keeps every round's
seconds and each pflower run's metrics (without timings), to check that the numbers agree.

``--sweep`` times what bounds Flower's floor as the clients grow, in this process and without
Ray: one pass of the simulation engine's 0.1 s loop (``flwr/server/superlink/fleet/vce/
vce_api.py:174-180``: ``get_message_ins(node, limit=1)`` for every node), which scans every
message the in-memory LinkState holds for every node (``in_memory_linkstate.py:252-263``).

    .venv/bin/python bench/cheap_clients.py                          # 100 clients, each variant once
    .venv/bin/python bench/cheap_clients.py --clients 10 100 1000 --figure docs/figures/cheap-clients.png
    .venv/bin/python bench/cheap_clients.py --pflower-from ../main --variants pflower stock floor
    .venv/bin/python bench/cheap_clients.py --sweep
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

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from deploy_round import STOCK, _round_seconds, _stock_config  # noqa: E402
from sim_speed import plain_loop, run_config  # noqa: E402

from pflower.bench import run_config_string  # noqa: E402
from pflower.config import load_settings  # noqa: E402
from pflower.launcher import gpu_share  # noqa: E402
from pflower.processes import console_script  # noqa: E402
from pflower.results import outcome  # noqa: E402

VARIANTS = ("pflower", "pflower-one", "stock", "floor", "plain-1", "plain-2")
LABELS = {
    "pflower": "pflower simulation (FedAvg), several clients a node",
    "pflower-one": "pflower simulation (FedAvg), one client a node",
    "stock": "stock Flower (quickstart ClientApp + FedAvg)",
    "floor": "Flower's floor (ClientApp that only replies)",
    "plain-1": "plain loop, 1 torch thread",
    "plain-2": "plain loop, 2 torch threads",
}


def simulated(
    variant: str, data_dir: Path, clients: int, rounds: int, results: Path, gpus: float = 0.0, per_node: str = "auto"
) -> tuple[list[float], list[dict] | None]:
    """One ``pflower-sim`` run of ``variant`` (pflower, pflower@DIR, stock or floor): seconds per
    round, and pflower's metrics rows without timings (None for the stock app)."""
    env = dict(os.environ)
    if variant.startswith("pflower"):
        app = Path(variant.partition("@")[2] or ROOT)
        env["PYTHONPATH"] = os.pathsep.join([str(app), env.get("PYTHONPATH", "")])
        cfg = run_config_string(run_config(data_dir, rounds, 1.0, results))
    else:
        app, cfg = STOCK, _stock_config(data_dir, rounds, results) + f" client-work='{'none' if variant == 'floor' else 'full'}'"
    cmd = [console_script("pflower-sim"), "--num-clients", str(clients), "-c", cfg, "--app", str(app)]
    if variant in ("pflower", "pflower-one"):  # another checkout's pflower-sim may not have the option
        cmd += ["--clients-per-node", "1" if variant == "pflower-one" else per_node]
    if gpus:
        cmd += ["--gpus-per-client", str(gpus)]
    log = results.with_suffix(".log")
    with open(log, "w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=app, env=env, check=False).returncode
    if code != 0:
        raise SystemExit(f"{variant} at {clients} clients failed ({code}); see {log}")
    if not variant.startswith("pflower"):
        return _round_seconds("stock", results), None
    rows = json.loads((results / "metrics.json").read_text())["rounds"]
    return [r["wall-seconds"] for r in rows], [outcome(r) for r in rows]


def measure(
    variant: str, data_dir: Path, clients: int, rounds: int, results: Path, gpus: float = 0.0, per_node: str = "auto"
) -> tuple[list[float], list[dict] | None]:
    if variant.startswith("plain-"):
        settings = load_settings(run_config(data_dir, rounds, 1.0, results))
        return plain_loop(settings, clients, rounds, int(variant.split("-")[1]), "cuda" if gpus else "cpu"), None
    return simulated(variant, data_dir, clients, rounds, results, gpus, per_node)


def sweep_seconds(nodes: int, held: int, repeats: int = 3) -> float:
    """Median seconds of one pass of Flower's simulation loop over ``nodes`` nodes while its
    in-memory LinkState holds ``held`` messages, all delivered (in flight, replies not pulled)."""
    from flwr.app import Message, Metadata, RecordDict
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.federation.noop_federation_manager import NOOP_FEDERATION_ID

    state = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()).state()
    run = type("Run", (), {"run_id": 1, "federation_id": NOOP_FEDERATION_ID})()
    state.run_ids[1] = RunRecord(run=run)
    for i in range(held):
        meta = Metadata(run_id=1, message_id=f"m{i}", src_node_id=1, dst_node_id=2 + i, reply_to_message_id="", group_id="",
                        created_at=time.time(), ttl=3600.0, message_type="train")  # fmt: skip
        meta.delivered_at = "delivered"
        state.message_ins_store[f"m{i}"] = Message(RecordDict(), metadata=meta)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for node in range(2, 2 + nodes):
            state.get_message_ins(node_id=node, limit=1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def steady(rounds: list[float]) -> float:
    return statistics.median(rounds[1:])


def checkout(path: Path) -> str:
    """A pflower checkout by its commit (its folder's name where git cannot tell)."""
    got = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return f"commit {got.stdout.strip()}" if got.returncode == 0 else path.name


def draw(table: dict[int, dict[str, float]], path: Path, stamp: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    counts = sorted(table)
    for v in dict.fromkeys(v for n in counts for v in table[n]):
        xs = [n for n in counts if v in table[n]]
        label = LABELS.get(v) or f"pflower at {checkout(Path(v.partition('@')[2]))}"
        ax.plot(xs, [table[n][v] for n in xs], marker="o", label=label, linestyle="--" if "@" in v else "-")
    ax.set(xscale="log", yscale="log", xlabel="clients (the MNIST test set shared out)", ylabel="steady round (s)",
           title=f"Cheap clients: round time against clients\n{stamp}")  # fmt: skip
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "mnist")
    p.add_argument("--clients", type=int, nargs="+", default=[100])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1, help="runs of each variant, alternating")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--pflower-from", type=Path, action="append", default=[], help="another pflower checkout to run beside this one")
    p.add_argument("--figure", type=Path, help="draw round time against clients into this file (PNG or SVG)")
    p.add_argument("--json", type=Path, help="write every round's seconds here")
    p.add_argument("--gpus-per-client", type=gpu_share, default=0.0, help="GPU share per ClientApp (a GPU host; the plain loop then trains on the GPU)")
    p.add_argument("--clients-per-node", default="auto", help="pflower-sim's --clients-per-node for the pflower variants but pflower-one (default: auto)")
    p.add_argument("--sweep", action="store_true", help="only time one pass of Flower's simulation loop at each --clients")
    args = p.parse_args()
    if args.sweep:
        print(f"one pass of Flower's simulation loop (load average {os.getloadavg()[0]:.1f}):")
        for n in args.clients if args.clients != [100] else [10, 100, 1000]:
            for held in sorted({n, min(n, 64)}):
                print(f"  {n} nodes, {held} messages held: {1000 * sweep_seconds(n, held):.1f} ms")
        return 0
    data_dir = args.data_dir.resolve()
    variants = args.variants + [f"pflower@{d.resolve()}" for d in args.pflower_from]
    runs: dict[int, dict[str, list[list[float]]]] = {n: {v: [] for v in variants} for n in args.clients}
    metrics: dict[str, list] = {}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.clients:
            for rep in range(args.repeats):
                for k, v in enumerate(variants if rep % 2 == 0 else variants[::-1]):
                    t0 = time.time()
                    seconds, rows = measure(v, data_dir, n, args.rounds, Path(tmp) / f"{n}-{rep}-{k}", args.gpus_per_client, args.clients_per_node)
                    runs[n][v].append(seconds)
                    if rows is not None:
                        metrics[f"{v} {n} {rep}"] = rows
                    load.append(os.getloadavg()[0])
                    print(f"  {n} clients, {v}: {steady(runs[n][v][-1]):.3f} s/round ({time.time() - t0:.0f} s run)", flush=True)
    table = {n: {v: statistics.median(steady(r) for r in rs) for v, rs in by.items()} for n, by in runs.items()}
    print(f"\n{args.rounds} rounds, steady round = median of rounds 2-{args.rounds}, median of {args.repeats} run(s); "
          f"load average (1 min) {min(load):.1f}-{max(load):.1f} over the runs, {os.cpu_count()} cores"
          + (f", {torch.cuda.get_device_name(0)}, {args.gpus_per_client} GPU a ClientApp" if args.gpus_per_client else ""))  # fmt: skip
    names = {v: v if "@" not in v else f"pflower@{Path(v.partition('@')[2]).name}" for v in variants}
    print(f"{'clients':>8}" + "".join(f"{names[v]:>16}" for v in variants))
    for n, row in table.items():
        print(f"{n:>8}" + "".join(f"{row[v]:>16.3f}" for v in variants))
    for n, row in table.items():
        if "floor" in row:
            print(f"{n} clients: Flower's floor {1000 * row['floor'] / (2 * n):.1f} ms a message (2 x {n} messages a round)")
        if {"pflower", "plain-1", "plain-2", "stock"} <= row.keys():
            plain = min(row["plain-1"], row["plain-2"])
            print(f"{n} clients: pflower / plain {row['pflower'] / plain:.2f} (<= 1.5?), pflower / stock {row['pflower'] / row['stock']:.2f} (<= 0.5?)")
            if "floor" in row:
                target = row["floor"] + plain / 2
                print(f"{n} clients: floor + plain / 2 = {target:.3f} s; pflower / that {row['pflower'] / target:.2f} (<= 1.1?)")
    if args.json:
        args.json.write_text(json.dumps({"load": load, "runs": {str(n): by for n, by in runs.items()}, "metrics": metrics}, indent=1))
    same = {n: len({json.dumps(m, sort_keys=True) for k, m in metrics.items() if k.split()[1] == str(n)}) for n in args.clients}
    print(
        "pflower's metrics (without timings and Ray nodes) alike across its runs: "
        + ", ".join(f"{n} clients {'yes' if c <= 1 else 'NO'}" for n, c in same.items())
    )
    if args.figure:
        gpu = f"{torch.cuda.get_device_name(0)}, {args.gpus_per_client} GPU a client" if args.gpus_per_client else "no GPU"
        draw(table, args.figure, f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {gpu}, load {min(load):.0f}-{max(load):.0f}")
        print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
