"""Deployment round: pflower's FedAvg against a quickstart-style Flower app with Flower's FedAvg.

One loopback deployment (a SuperLink and 3 SuperNodes, TLS and SuperNode authentication, every
message in a fresh ``flwr-clientapp`` process) runs both apps in turn, A B A B: the same work
each round (every node trains the MNIST CNN for 1 epoch, batch 32, lr 0.1, on its iid third of
the MNIST files, 70% of it, and evaluates on the other 30%). ``bench/stock_app/`` is the
yardstick: Flower's ``FedAvg`` and a ClientApp written as Flower's quickstart writes one. A
round is the server's view: pflower's metrics.json ``wall-seconds``, the stock ServerApp's time
between its ``evaluate_fn`` calls; the steady state is the median of rounds 2 and later.

Where a round's seconds go: each app's client work, timed in a fresh interpreter on node 0's
data (what one ``flwr-clientapp`` process does per message: start Python and import the app,
read the data, train one epoch or evaluate), and the rest (Flower: spawning the process,
gRPC, the SuperLink, the server's polling), which is the round less that work.

    .venv/bin/python bench/deploy_round.py [--data-dir ../shared/data/mnist] [--rounds 6] [--repeats 2]
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

ROOT = Path(__file__).resolve().parents[1]
STOCK = ROOT / "bench" / "stock_app"
NODES = 3


def _pflower_config(data_dir: Path, rounds: int, results: Path) -> str:
    return (f"method='fedavg' dataset='mnist' data-dir='{data_dir}' partition='iid' local-epochs=1 batch-size=32 lr=0.1 "
            f"test-fraction=0.3 num-server-rounds={rounds} round-timeout=300 results-dir='{results}'")  # fmt: skip


def _stock_config(data_dir: Path, rounds: int, results: Path) -> str:
    return f"data-dir='{data_dir}' local-epochs=1 batch-size=32 lr=0.1 num-server-rounds={rounds} results-dir='{results}'"


def _round_seconds(app: str, results: Path) -> list[float]:
    if app == "pflower":
        return [r["wall-seconds"] for r in json.loads((results / "metrics.json").read_text())["rounds"]]
    return json.loads((results / "rounds.json").read_text())["round-seconds"]


def client_work(app: str, data_dir: Path) -> dict[str, float]:
    """One node's work per message, in this (fresh) interpreter: seconds to import the app,
    read its data, train one epoch, evaluate."""
    t0 = time.perf_counter()
    if app == "pflower":
        import pflower.client_app  # noqa: F401  what flwr-clientapp loads
        from pflower.build import build_model
        from pflower.config import load_settings
        from pflower.datasets import client_data
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


def _fresh(app: str, data_dir: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--work", app, "--data-dir", str(data_dir)], capture_output=True, text=True, check=True)
    work = json.loads(out.stdout)
    work["python"] = time.perf_counter() - t0 - sum(work.values())  # interpreter start and exit
    return work


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "mnist")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2, help="runs of each app, alternating")
    p.add_argument("--work", choices=("pflower", "stock"), help=argparse.SUPPRESS)
    args = p.parse_args()
    data_dir = args.data_dir.resolve()
    if args.work:
        print(json.dumps(client_work(args.work, data_dir)))
        return 0
    if not data_dir.is_dir():
        p.error(f"--data-dir {data_dir} is not a folder (MNIST's IDX files)")
    sys.path.insert(0, str(ROOT))
    from pflower.deploy import Deployment

    rounds: dict[str, list[float]] = {"pflower": [], "stock": []}
    runs: dict[str, list[float]] = {"pflower": [], "stock": []}
    with tempfile.TemporaryDirectory(prefix="deploy-round-") as tmp, Deployment(Path(tmp) / "deploy", nodes=NODES) as dep:
        for rep in range(args.repeats):
            for app, path, config in (("pflower", ROOT, _pflower_config), ("stock", STOCK, _stock_config)):
                results = Path(tmp) / f"{app}-{rep}"
                t0 = time.perf_counter()
                _, status, log = dep.submit(path, config(data_dir, args.rounds, results))
                runs[app].append(time.perf_counter() - t0)
                if status != "finished:completed":
                    raise SystemExit(f"{app} run {rep} ended {status}:\n{log[-3000:]}")
                seconds = _round_seconds(app, results)
                rounds[app] += seconds[1:]
                print(f"{app} run {rep + 1}: {runs[app][-1]:.1f} s, rounds " + " ".join(f"{s:.2f}" for s in seconds), flush=True)
    work = {app: _fresh(app, data_dir) for app in rounds}
    steady = {app: statistics.median(r) for app, r in rounds.items()}
    print(f"\n{NODES} SuperNodes on loopback (TLS, authentication), MNIST CNN, 1 epoch, {args.rounds} rounds x {args.repeats} runs each")
    print(f"{'':34}{'pflower FedAvg':>16}{'stock FedAvg':>16}")
    print(f"{'round, median of rounds 2+ (s)':34}{steady['pflower']:>16.2f}{steady['stock']:>16.2f}")
    print(f"{'whole run, median (s)':34}{statistics.median(runs['pflower']):>16.1f}{statistics.median(runs['stock']):>16.1f}")
    print("one node's work per message, fresh process (s):")
    for phase in ("python", "import", "data", "train", "evaluate"):
        print(f"  {phase:32}{work['pflower'][phase]:>16.2f}{work['stock'][phase]:>16.2f}")
    for app in rounds:
        w = work[app]
        per_round = 2 * (w["python"] + w["import"] + w["data"]) + w["train"] + w["evaluate"]
        work[app]["rest"] = steady[app] - per_round
    print(f"  {'rest of the round (Flower)':32}{work['pflower']['rest']:>16.2f}{work['stock']['rest']:>16.2f}")
    print(f"ratio pflower / stock round: {steady['pflower'] / steady['stock']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
