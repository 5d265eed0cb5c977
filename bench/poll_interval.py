"""SuperExec poll interval: what ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` costs an idle SuperNode and
what it saves a round.

Each SuperNode's SuperExec asks the SuperNode for a message to run every interval (an HTTP
request each time, answered by the SuperNode): a message waits for the next ask, up to one
interval, twice a round (train, evaluate), and a round waits for its slowest node. For each
interval, in turn (the order reversed on every repeat), a loopback deployment (3 SuperNodes,
TLS and authentication, warm or cold) is started with the interval on its SuperNodes; once it
has settled, the CPU seconds (user + system, from /proc) of each SuperNode's processes over
``--idle`` seconds of no run, and of the SuperLink's for reference; then a pflower FedAvg run on
MNIST (1 epoch, as bench/deploy_round.py) gives the round time, the median of rounds 2 and later,
and each message's launch on its node, from the SuperNode's pull to the ClientApp's start (the
poll's wait is in it; from the nodes' logs, as bench/deploy_round.py's LogStamper reads them).

    .venv/bin/python bench/poll_interval.py --intervals 1,0.2,0.1 --idle 60 --rounds 6 --repeats 2 [--warm]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODES = 3
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and its live descendants (what they used so far)."""
    from pflower.processes import process_tree

    total = 0
    for pid in process_tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / TICK


def idle_cpu(dep, seconds: float) -> dict[str, float]:
    """Cores used, per SuperNode (mean of the nodes) and by the SuperLink, over ``seconds`` of no run."""
    roots = {name: proc.pid for name, proc in dep.procs.items()}
    before = {name: cpu_seconds(pid) for name, pid in roots.items()}
    time.sleep(seconds)
    used = {name: cpu_seconds(pid) - before[name] for name, pid in roots.items()}
    nodes = [used[f"node{i}"] for i in range(NODES)]
    return {"node-cores": statistics.mean(nodes) / seconds, "link-cores": used["link"] / seconds}


def config(data_dir: Path, rounds: int, results: Path) -> str:
    return (f"method='fedavg' dataset='mnist' data-dir='{data_dir}' partition='iid' local-epochs=1 batch-size=32 lr=0.1 "
            f"test-fraction=0.3 num-server-rounds={rounds} round-timeout=300 results-dir='{results}'")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--intervals", default="1,0.2,0.1", help="seconds, comma-separated (Flower allows 0.01 to 60; its default is 1)")
    p.add_argument("--idle", type=float, default=60, help="seconds of idle CPU measured per deployment")
    p.add_argument("--settle", type=float, default=20, help="seconds after start-up before the idle measurement")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--warm", action="store_true", help="warm SuperNodes (pflower.deploy.warm)")
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "mnist")
    p.add_argument("--out", type=Path, default=None, help="write the measurements as JSON here")
    args = p.parse_args()
    try:
        intervals = [float(x) for x in args.intervals.split(",")]
    except ValueError:
        p.error(f"--intervals {args.intervals!r}: give seconds, comma-separated, e.g. 1,0.2,0.1")
    if bad := [x for x in intervals if not 0.01 <= x <= 60]:
        p.error(f"--intervals: {bad} outside Flower's 0.01 to 60 s")
    if args.rounds > 0 and not args.data_dir.is_dir():
        p.error(f"--data-dir {args.data_dir} is not a folder (MNIST's IDX files)")
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from deploy_round import LogStamper

    from pflower.deploy import Deployment

    records: dict[float, dict[str, list[float]]] = {x: {"node-cores": [], "link-cores": [], "rounds": [], "launch": []} for x in intervals}
    for rep in range(args.repeats):
        for interval in intervals if rep % 2 == 0 else intervals[::-1]:
            with tempfile.TemporaryDirectory(prefix="poll-interval-") as tmp:
                with Deployment(Path(tmp) / "deploy", nodes=NODES, warm=args.warm, poll_interval=interval) as dep:
                    time.sleep(args.settle)
                    idle = idle_cpu(dep, args.idle)
                    for key, value in idle.items():
                        records[interval][key].append(value)
                    line = f"interval {interval:g} s (repeat {rep + 1}): idle SuperNode {idle['node-cores']:.4f} cores, SuperLink {idle['link-cores']:.4f}"
                    if args.rounds > 0:
                        results = Path(tmp) / "results"
                        stamper = LogStamper(dep)
                        stamper.start()
                        _, status, log = dep.submit(ROOT, config(args.data_dir.resolve(), args.rounds, results))
                        stamper.done.set()
                        stamper.join()
                        launches = [m["launch"] for m in stamper.messages()]
                        records[interval]["launch"] += launches
                        if status != "finished:completed":
                            raise SystemExit(f"run ended {status}:\n{log[-3000:]}")
                        seconds = [r["wall-seconds"] for r in json.loads((results / "metrics.json").read_text())["rounds"]]
                        records[interval]["rounds"] += seconds[1:]
                        line += ", rounds " + " ".join(f"{s:.2f}" for s in seconds) + f", launch median {statistics.median(launches):.2f} s"
                    print(line, flush=True)
    mode = "warm" if args.warm else "cold"
    print(f"\n{NODES} SuperNodes on loopback (TLS, authentication, {mode}), {args.idle:.0f} s idle, {args.repeats} deployments per interval")
    print(f"{'interval (s)':>14}{'idle SuperNode (cores)':>26}{'CPU s per idle hour':>22}{'round, median 2+ (s)':>24}{'launch, median (s)':>22}")
    summary = {}
    for interval, rec in records.items():
        cores = statistics.median(rec["node-cores"])
        rnd = statistics.median(rec["rounds"]) if rec["rounds"] else float("nan")
        launch = statistics.median(rec["launch"]) if rec["launch"] else float("nan")
        summary[interval] = {"node-cores": cores, "link-cores": statistics.median(rec["link-cores"]), "round": rnd, "launch": launch, "raw": rec}
        print(f"{interval:>14g}{cores:>26.4f}{cores * 3600:>22.0f}{rnd:>24.2f}{launch:>22.3f}")
    if args.out:
        args.out.write_text(json.dumps({"mode": mode, "idle-seconds": args.idle, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
