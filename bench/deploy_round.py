"""Deployment round: pflower's FedAvg against a quickstart-style Flower app with Flower's FedAvg,
each with cold SuperNodes (a fresh ``flwr-clientapp`` process per message) and warm ones (each
message's ClientApp forked from the node's fork server, :mod:`pflower.deploy.warm`).

One loopback deployment (a SuperLink and 3 SuperNodes, TLS and SuperNode authentication) runs
the variants in turn, alternating (A B C D, then D C B A, ...), on the same work each round
(every node trains the MNIST CNN for 1 epoch, batch 32, lr 0.1, on its iid third of the MNIST
files, 70% of it, and evaluates on the other 30%). Its SuperNodes are started warm and a cold
variant switches them cold for its run (:meth:`Deployment.switch_warm`: the shim then execs the
real command, about 30 ms more per message than Flower's own launch). ``bench/stock_app/`` is
the yardstick: Flower's ``FedAvg`` and a ClientApp written as Flower's quickstart writes one. A
round is the server's view: pflower's metrics.json ``wall-seconds``, the stock ServerApp's time
between its ``evaluate_fn`` calls; the steady state is the median of rounds 2 and later.

Where a round's seconds go: each variant's client work per message, timed apart on node 0's
data, in a fresh interpreter (cold: start Python, import the app, read the data, train one epoch
or evaluate) or in a child forked from an interpreter with the fork server's modules imported
(warm: the fork and the child's exit, importing what is left of the app, ...); the rest
(Flower: launching the process, gRPC and HTTP, the SuperLink, the polls; and three nodes
sharing the machine's cores) is the round less that work. Memory: each node's processes are
sampled every half second during the runs (``/proc/PID/smaps_rollup``): the peak RSS and PSS of
a ClientApp process (cold: ``flwr-clientapp``; warm: the forked child) and of the fork server.

    .venv/bin/python bench/deploy_round.py [--data-dir ../shared/data/mnist] [--rounds 6] [--repeats 2]
        [--variant NAME=APP,MODE[,RUN-CONFIG]] ...   # e.g. "pflower-sm=pflower,warm,single-message=true"
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STOCK = ROOT / "bench" / "stock_app"
NODES = 3
DEFAULT_VARIANTS = ("stock-cold=stock,cold", "pflower-cold=pflower,cold", "pflower-warm=pflower,warm", "stock-warm=stock,warm")
PHASES = ("python", "import", "data", "train", "evaluate")


@dataclass
class Variant:
    name: str
    app: str  # pflower | stock
    mode: str  # cold | warm
    extra: str = ""  # more run config (pflower only)
    rounds: list[float] = field(default_factory=list)
    runs: list[float] = field(default_factory=list)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)
    messages: list[dict[str, float]] = field(default_factory=list)


def parse_variant(text: str) -> Variant:
    """``NAME=APP,MODE[,RUN-CONFIG]``, e.g. ``pflower-warm=pflower,warm`` (ArgumentTypeError names what is wrong)."""
    name, eq, rest = text.partition("=")
    parts = rest.split(",", 2)
    if not eq or not name or len(parts) < 2:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: write NAME=APP,MODE[,RUN-CONFIG], e.g. pflower-warm=pflower,warm")
    app, mode, extra = parts[0], parts[1], parts[2] if len(parts) > 2 else ""
    if app not in ("pflower", "stock"):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: APP is {app!r}; allowed: pflower, stock")
    if mode not in ("cold", "warm"):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: MODE is {mode!r}; allowed: cold, warm")
    if extra and app != "pflower":
        raise argparse.ArgumentTypeError(f"--variant {text!r}: extra run config is for APP pflower only")
    return Variant(name, app, mode, extra)


def _pflower_config(data_dir: Path, rounds: int, results: Path) -> str:
    return (f"method='fedavg' dataset='mnist' data-dir='{data_dir}' partition='iid' local-epochs=1 batch-size=32 lr=0.1 "
            f"test-fraction=0.3 num-server-rounds={rounds} round-timeout=300 results-dir='{results}'")  # fmt: skip


def _stock_config(data_dir: Path, rounds: int, results: Path) -> str:
    return f"data-dir='{data_dir}' local-epochs=1 batch-size=32 lr=0.1 num-server-rounds={rounds} results-dir='{results}'"


def _round_seconds(app: str, results: Path) -> list[float]:
    if app == "pflower":
        return [r["wall-seconds"] for r in json.loads((results / "metrics.json").read_text())["rounds"]]
    return json.loads((results / "rounds.json").read_text())["round-seconds"]


# --------------------------------------------------------------------- one message's work
def client_work(app: str, data_dir: Path) -> dict[str, float]:
    """One node's work per message, in this interpreter: seconds to import the app (what is not
    imported yet), read its data, train one epoch, evaluate."""
    t0 = time.perf_counter()
    if app == "pflower":
        import pflower.client_app  # noqa: F401  what flwr-clientapp loads
        from pflower.build import build_model
        from pflower.config import load_settings
        from pflower.datasets.federated import client_data
        from pflower.training import evaluate, train

        t1 = time.perf_counter()
        settings = load_settings({"method": "fedavg", "dataset": "mnist", "data-dir": str(data_dir), "partition": "iid",
                                  "test-fraction": 0.3, "local-epochs": 1})  # fmt: skip
        tr, te = client_data(settings, 0, NODES)
        t2 = time.perf_counter()
        model = build_model(settings, settings.image_shape, settings.num_classes, 0)
        train(model, tr, epochs=1, batch_size=32, lr=0.1, seed=0)
        t3 = time.perf_counter()
        evaluate(model, te)
    else:
        sys.path.insert(0, str(STOCK))
        import torch
        from client_app import Net, load_data
        from flwr.app import Context, RecordDict

        t1 = time.perf_counter()
        ctx = Context(0, 0, {"partition-id": 0, "num-partitions": NODES}, RecordDict(),
                      {"data-dir": str(data_dir), "seed": 0, "test-fraction": 0.3})  # fmt: skip
        (x, y), (xt, yt) = load_data(ctx)
        t2 = time.perf_counter()
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for b in torch.randperm(len(y)).split(32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
        t3 = time.perf_counter()
        with torch.no_grad():
            model.eval()(xt).argmax(1)
    t4 = time.perf_counter()
    return {"import": t1 - t0, "data": t2 - t1, "train": t3 - t2, "evaluate": t4 - t3}


def _forked_work(app: str, data_dir: Path, preload: list[str]) -> dict[str, float]:
    """What a warm node's message costs: import ``preload`` here (the fork server; not counted),
    then fork a child that does the work; "python" is the fork and the child's exit."""
    import gc
    import importlib

    gc.disable()  # as the fork server does (pflower/deploy/warm.py): import, freeze, fork, enable in the child
    for name in preload:
        importlib.import_module(name)
    gc.freeze()
    reader, writer = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        gc.enable()
        os.write(writer, json.dumps({**client_work(app, data_dir), "memory": own_memory()}).encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as f:
        work = json.loads(f.read())
    os.waitpid(pid, 0)
    memory = work.pop("memory")
    work["python"] = time.perf_counter() - t0 - sum(work.values())
    work["memory"] = {**memory, "server-rss": smaps_rollup(os.getpid())["Rss"] // 1024, "server-pss": smaps_rollup(os.getpid())["Pss"] // 1024}
    return work


def own_memory() -> dict[str, int]:
    """This process's memory once its message's work is done (MiB): RSS, PSS, and its peak RSS
    (VmHWM; a forked child's counts the pages it shares with its parent)."""
    mem = smaps_rollup(os.getpid())
    hwm = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return {"rss": mem["Rss"] // 1024, "pss": mem["Pss"] // 1024, "private": (mem["Private_Clean"] + mem["Private_Dirty"]) // 1024, "peak-rss": hwm // 1024}


def measure_work(app: str, mode: str, data_dir: Path, preload: list[str]) -> dict[str, float]:
    """One message's work, each phase's seconds, in a fresh interpreter (cold) or a forked child (warm)."""
    cmd = [sys.executable, __file__, "--work", app, "--data-dir", str(data_dir)]
    if mode == "warm":
        cmd += ["--preload", ",".join(preload)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    work = json.loads(out.stdout)
    if mode == "cold":
        work["python"] = time.perf_counter() - t0 - sum(v for k, v in work.items() if k != "memory")  # interpreter start and exit
    return work


# ----------------------------------------------------------------------------------- memory
class MemorySampler(threading.Thread):
    """Peak RSS and PSS (kB, from /proc/PID/smaps_rollup) of each kind of a deployment's node
    processes while it runs: "clientapp" (a cold message's flwr-clientapp), "child" (a warm
    message's forked child), "server" (a fork server), sampled every ``interval`` seconds."""

    def __init__(self, dep, interval: float = 0.5):
        super().__init__(daemon=True)
        self.dep, self.interval = dep, interval
        self.peak: dict[str, dict[str, int]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        from pflower.processes import process_tree

        for i in range(NODES):
            proc = self.dep.procs.get(f"node{i}")
            if proc is None:
                continue
            for pid in process_tree(proc.pid):
                cmd = _cmdline(pid)
                if len(cmd) > 2 and cmd[1].endswith("warm.py") and cmd[2] == "serve":  # a forked child has its server's cmdline
                    kind = "child" if _comm(pid) == "flwr-clientapp" else "server"
                elif len(cmd) > 1 and cmd[1].endswith("/flwr-clientapp") and "-IS" not in cmd:
                    kind = "clientapp"
                else:
                    continue
                mem = smaps_rollup(pid)
                if mem:
                    peak = self.peak.setdefault(kind, {"rss": 0, "pss": 0})
                    peak["rss"], peak["pss"] = max(peak["rss"], mem["Rss"]), max(peak["pss"], mem["Pss"])


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def smaps_rollup(pid: int) -> dict[str, int]:
    """A process's memory totals in kB (Rss, Pss, Pss_Anon, ...); empty if it is gone."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    except OSError:
        return {}
    return {k.rstrip(":"): int(v) for k, v, *_ in (line.split() for line in lines)}


# ------------------------------------------------------------------------------ log stamps
class LogStamper(threading.Thread):
    """Stamps each new line of the SuperNodes' logs with the time it appeared (read every 10 ms;
    Flower logs to stderr line by line), so a message's steps can be timed on the node:
    "Received successfully" (the SuperNode pulled it), "Start `flwr-clientapp` process" (the
    ClientApp runs Flower's entry point: after the SuperExec's poll and the process's start) and
    "Sending: ..." (the SuperNode pushes the reply, on its next loop after the ClientApp ends)."""

    def __init__(self, dep, interval: float = 0.01):
        super().__init__(daemon=True)
        self.paths = {i: dep.dir / "logs" / f"node{i}.log" for i in range(NODES)}
        self.offsets = {i: p.stat().st_size if p.exists() else 0 for i, p in self.paths.items()}
        self.partial = dict.fromkeys(self.paths, b"")
        self.lines: dict[int, list[tuple[float, str]]] = {i: [] for i in self.paths}
        self.interval, self.done = interval, threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.interval):
            self.read()
        self.read()

    def read(self) -> None:
        now = time.monotonic()
        for i, path in self.paths.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[i])
                    data = f.read()
            except OSError:
                continue
            self.offsets[i] += len(data)
            *complete, self.partial[i] = (self.partial[i] + data).split(b"\n")
            self.lines[i] += [(now, line.decode(errors="replace")) for line in complete]

    def messages(self) -> list[dict[str, float]]:
        """Each train or evaluate message on each node: seconds from its pull to its ClientApp's
        start ("launch") and from there to the push of its reply ("run")."""
        out = []
        for lines in self.lines.values():
            kind, received, started = None, None, None
            for t, line in lines:
                if "Receiving: " in line:
                    kind = line.split("Receiving: ")[1].split()[0]
                elif "Received successfully" in line and kind in ("train", "evaluate"):
                    received, started = t, None
                elif "Start `flwr-clientapp` process" in line and received is not None:
                    started = t
                elif "Sending: " in line and started is not None:
                    out.append({"kind": kind, "launch": started - received, "run": t - started})
                    kind, received, started = None, None, None
        return out


# ------------------------------------------------------------------------------------- main
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "mnist")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2, help="runs of each variant, alternating")
    p.add_argument("--variant", type=parse_variant, action="append", default=None,
                   help=f"NAME=APP,MODE[,RUN-CONFIG] (repeatable; default: {' '.join(DEFAULT_VARIANTS)})")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="write the measurements as JSON here")
    p.add_argument("--work", choices=("pflower", "stock"), help=argparse.SUPPRESS)
    p.add_argument("--preload", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    data_dir = args.data_dir.resolve()
    if args.work:
        work = _forked_work(args.work, data_dir, args.preload.split(",")) if args.preload is not None else client_work(args.work, data_dir)
        if args.preload is None:
            work["memory"] = own_memory()
        print(json.dumps(work))
        return 0
    if not data_dir.is_dir():
        p.error(f"--data-dir {data_dir} is not a folder (MNIST's IDX files)")
    variants = args.variant or [parse_variant(v) for v in DEFAULT_VARIANTS]
    if len({v.name for v in variants}) != len(variants):
        p.error("--variant: two variants have the same NAME")
    sys.path.insert(0, str(ROOT))
    from pflower.deploy import Deployment
    from pflower.deploy.deployment import WARM_PRELOAD

    preload = [*WARM_PRELOAD, "flwr.supernode.cli"]  # and the flwr-clientapp entry point's module
    with tempfile.TemporaryDirectory(prefix="deploy-round-") as tmp, Deployment(Path(tmp) / "deploy", nodes=NODES, warm=True) as dep:
        for rep in range(args.repeats):
            for v in variants if rep % 2 == 0 else variants[::-1]:
                dep.switch_warm(v.mode == "warm")
                results = Path(tmp) / f"{v.name}-{rep}"
                path = ROOT if v.app == "pflower" else STOCK
                config = (_pflower_config if v.app == "pflower" else _stock_config)(data_dir, args.rounds, results)
                sampler, stamper = MemorySampler(dep), LogStamper(dep)
                sampler.start()
                stamper.start()
                t0 = time.perf_counter()
                _, status, log = dep.submit(path, f"{config} {v.extra}".strip())
                v.runs.append(time.perf_counter() - t0)
                for thread in (sampler, stamper):
                    thread.done.set()
                    thread.join()
                v.messages += stamper.messages()
                for kind, peak in sampler.peak.items():
                    mine = v.memory.setdefault(kind, {"rss": 0, "pss": 0})
                    mine["rss"], mine["pss"] = max(mine["rss"], peak["rss"]), max(mine["pss"], peak["pss"])
                if status != "finished:completed":
                    raise SystemExit(f"{v.name} run {rep} ended {status}:\n{log[-3000:]}")
                seconds = _round_seconds(v.app, results)
                v.rounds += seconds[1:]
                print(f"{v.name} run {rep + 1}: {v.runs[-1]:.1f} s, rounds " + " ".join(f"{s:.2f}" for s in seconds), flush=True)
        cold_logs = sum(dep.log(f"node{i}").count("switched cold") for i in range(NODES))
    work = {v.name: measure_work(v.app, v.mode, data_dir, preload) for v in variants}
    steady = {v.name: statistics.median(v.rounds) for v in variants}
    width = max(16, *(len(v.name) + 2 for v in variants))
    head = "".join(f"{v.name:>{width}}" for v in variants)
    print(f"\n{NODES} SuperNodes on loopback (TLS, authentication), MNIST CNN, 1 epoch, {args.rounds} rounds x {args.repeats} runs each")
    print(f"{'':40}{head}")
    print(f"{'round, median of rounds 2+ (s)':40}" + "".join(f"{steady[v.name]:>{width}.2f}" for v in variants))
    print(f"{'whole run, median (s)':40}" + "".join(f"{statistics.median(v.runs):>{width}.1f}" for v in variants))
    print("per message on the node, median (s; from the nodes' logs):")
    for step, what in (("launch", "pulled -> ClientApp started"), ("run", "started -> reply pushed")):
        print(f"  {what:38}" + "".join(f"{statistics.median([m[step] for m in v.messages]):>{width}.2f}" for v in variants))
    print("one node's work per message, measured apart (s; cold: fresh process, warm: forked child):")
    for phase in PHASES:
        print(f"  {phase:38}" + "".join(f"{work[v.name][phase]:>{width}.2f}" for v in variants))
    for v in variants:
        w = work[v.name]
        w["rest"] = steady[v.name] - (2 * (w["python"] + w["import"] + w["data"]) + w["train"] + w["evaluate"])
    print(f"  {'rest of the round (Flower, sharing)':38}" + "".join(f"{work[v.name]['rest']:>{width}.2f}" for v in variants))
    print("peak memory per process, RSS / PSS (MiB):")
    for kind in ("clientapp", "child", "server"):
        cells = [f"{v.memory[kind]['rss'] / 1024:.0f} / {v.memory[kind]['pss'] / 1024:.0f}" if kind in v.memory else "-" for v in variants]
        print(f"  {kind:38}" + "".join(f"{c:>{width}}" for c in cells))
    print("one message's process once its work is done, measured apart (MiB; warm: the child, the server beside it):")
    for key in ("rss", "pss", "private", "peak-rss", "server-rss", "server-pss"):
        print(f"  {key:38}" + "".join(f"{work[v.name]['memory'].get(key, float('nan')):>{width}.0f}" for v in variants))
    print(f"cold messages through the shim: {cold_logs}")
    if args.out:
        args.out.write_text(json.dumps({"rounds": args.rounds, "repeats": args.repeats, "variants": [
            {"name": v.name, "app": v.app, "mode": v.mode, "extra": v.extra, "rounds": v.rounds, "runs": v.runs, "memory": v.memory, "messages": v.messages,
             "round-median": steady[v.name], "work": work[v.name]} for v in variants]}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
