"""pflower and FL-bench side by side, every method both have, in one matched setting.

FL-bench (github.com/KarhouTam/FL-bench at ``COMMIT``) runs with its own code, in a copy of its
checkout per seed (it keeps its data under its own root): its ``generate_data.py`` makes the
partition (``-d mnist -c 2 -cn 10 -tr 0.25``: 10 clients with 2 random classes each, 25 % of each
client's samples its test split) and its ``main.py`` trains. This script changes three things
from the outside, in FL-bench's process: its ``mnist`` data set is MNIST's 10,000-image test
pool (the IDX files under ``--data-root``/mnist, as pflower's MNIST suites use), its ``custom``
model slot holds pflower's model (``cnn``, ``cnn-bn`` for FedBN: the body is its ``base``, the
head its ``classifier``), and after the run it reads its server's ``test_results``: the pooled
accuracy of the model each client is sent after every round.

pflower runs through the real Flower simulation (one SuperLink for all runs) with the same
class assignment, read from FL-bench's partition (``partition='classes'``), the same test
share, rounds, epochs, batch and learning rate, and each method's keys set to the same values
on both sides where both have them (``PAIRS``; what has no counterpart is said there).

Both sides: 10 clients, all every round, 20 rounds of 1 local epoch, batch 32, plain SGD at lr
0.05, accuracy pooled over every client's test samples, 3 seeds. Records (one JSON per tool,
method and seed, with the machine) go to ``bench/records/flbench``; ``--report`` writes the
table and figure of ``docs/reproductions/flbench.md`` from them. A run with a record is not run again.

    git clone https://github.com/KarhouTam/FL-bench ../FL-bench && git -C ../FL-bench checkout 06e658b
    .venv/bin/pip install hydra-core==1.3.2 pynvml   # what FL-bench needs beyond .venv (or --flbench-python PYTHON)
    .venv/bin/python bench/flbench.py --flbench ../FL-bench --data-root ~/pflower-data
    .venv/bin/python bench/flbench.py --report
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "records" / "flbench"
PAGE = ROOT / "docs" / "reproductions" / "flbench.md"
COMMIT = "06e658bca5af6ce732e25bb7c0f8be321e14a85e"
URL = "https://github.com/KarhouTam/FL-bench"
#: FL-bench's own code, copied per seed (its data folder lives under its root).
CODE = ("src", "data", "config", "main.py", "generate_data.py")
SEEDS = (0, 1, 2)
ROUNDS = 20
COMMON = {"num-server-rounds": ROUNDS, "local-epochs": 1, "batch-size": 32, "lr": 0.05, "optimizer": "sgd", "momentum": 0.0,
          "test-fraction": 0.25, "dataset": "mnist", "partition": "classes", "evaluate-every": 1}  # fmt: skip
FLBENCH_COMMON = [f"common.global_epoch={ROUNDS}", "common.local_epoch=1", "common.batch_size=32", "common.join_ratio=1.0",
                  "optimizer.name=sgd", "optimizer.lr=0.05", "optimizer.momentum=0", "optimizer.weight_decay=0",
                  "common.test.client.interval=1", "common.test.client.finetune_epoch=0", "mode=serial", "common.use_cuda=false",
                  "common.save_log=false", "common.save_metrics=false", "common.save_learning_curve_plot=false",
                  "common.save_model=false"]  # fmt: skip


@dataclass(frozen=True)
class Pair:
    """One method on both sides: pflower's run-config keys, FL-bench's method and overrides."""

    label: str
    pflower: dict
    flbench: tuple[str, ...]
    model: str = "cnn"
    note: str = ""
    #: FL-bench's evaluation to read: ``before`` its test-time fine-tuning (the model as sent) or ``after``.
    reads: str = "before"


PAIRS = (
    Pair("local", {"method": "local"}, ("local",)),
    Pair("fedavg", {"method": "fedavg"}, ("fedavg",)),
    Pair(
        "fedprox",
        {"method": "fedprox", "fedprox.mu": 0.01},
        ("fedprox", "++fedprox.mu=0.01"),
        note="mu 0.01 both (FL-bench's parser default is 1.0, its config file's 0.01)",
    ),
    Pair("fedper", {"method": "fedper"}, ("fedper",), note="the head (FL-bench's classifier) personal both"),
    Pair(
        "fedrep",
        {"method": "fedrep", "fedrep.body-epochs": 1},
        ("fedrep", "++fedrep.train_body_epoch=1", "common.local_epoch=2"),
        note="1 head epoch then 1 body epoch both (FL-bench counts the body epochs inside local_epoch: 2 there)",
    ),
    Pair(
        "fedbn",
        {"method": "fedbn", "model": "cnn-bn"},
        ("fedbn",),
        model="cnn-bn",
        note="pflower's cnn-bn both; FL-bench finds the normalization layers by 'bn' in their names, which the wrapper gives them",
    ),
    Pair(
        "lgfedavg",
        {"method": "lgfedavg"},
        ("lgfedavg", "++lgfedavg.num_global_layers=1"),
        note="FL-bench shares the first layer from the input and keeps the rest personal; pflower (the paper) shares the head and keeps the body",
    ),
    Pair("ditto", {"method": "ditto", "ditto.lam": 1.0, "ditto.personal-epochs": 1}, ("ditto", "++ditto.lamda=1", "++ditto.pers_epoch=1")),
    Pair(
        "apfl",
        {"method": "apfl", "apfl.alpha": 0.5},
        ("apfl", "++apfl.alpha=0.5"),
        note="FL-bench mixes the two models' outputs and steps the global model twice per batch (no zero_grad before the second backward); "
        "pflower (the paper) mixes their parameters, one step",
    ),
    Pair(
        "perfedavg",
        {
            "method": "perfedavg",
            "perfedavg.variant": "fo",
            "perfedavg.alpha": 0.05,
            "perfedavg.beta": 0.001,
            "finetune-epochs": 1,
            "aggregation": "trimmed-mean",
            "trim-fraction": 0.0,
        },
        ("perfedavg", "++perfedavg.version=fo", "++perfedavg.beta=0.001"),
        reads="after",
        note="inner step 0.05 (FL-bench's is the run's lr), outer 0.001; both evaluated after 1 epoch of fine-tuning at lr 0.05 "
        "(FL-bench forces it for Per-FedAvg; pflower then takes its one step of alpha) and both average uniformly (FL-bench's weight 1)",
    ),
    Pair(
        "pfedme",
        {"method": "pfedme", "pfedme.lam": 15.0, "pfedme.k": 5, "pfedme.personal-lr": 0.01, "pfedme.beta": 1.0, "pfedme.lr": 0.05},
        ("pfedme", "++pfedme.lamda=15", "++pfedme.k=5", "++pfedme.pers_lr=0.01", "++pfedme.beta=1.0"),
        note="the local-model step is the run's lr (0.05) both; FL-bench never keeps the personalized model it trains and evaluates the initial one",
    ),
    Pair(
        "fedfomo",
        {"method": "fedfomo", "fedfomo.m": 4, "fedfomo.val-fraction": 0.2, "fedfomo.epsilon": 0.0},
        ("fedfomo", "++fedfomo.M=5", "++fedfomo.valset_ratio=0.2"),
        note="no exploration; 4 models of others (FL-bench's top 5 include the client itself); FL-bench reshuffles its validation share every round",
    ),
    Pair(
        "pfedhn",
        {"method": "pfedhn", "pfedhn.hn-lr": 0.01, "pfedhn.embedding-dim": 2},
        ("pfedhn", "++pfedhn.hn_lr=0.01", "common.buffers=local"),
        note="embedding 2 both (FL-bench's int((1 + N) / 4)); FL-bench steps its hypernetwork after each client, clipped at norm 50, pflower once a round",
    ),
    Pair(
        "scaffold",
        {"method": "scaffold", "scaffold.global-lr": 1.0, "local-steps": 1, "local-epochs": 5},
        ("scaffold", "++scaffold.global_lr=1.0"),
        note="one SGD step a round both (FL-bench's SCAFFOLD takes one batch per local epoch); FL-bench never keeps a client's control variate",
    ),
    Pair("pfedla", {"method": "pfedla"}, ("pfedla",)),
    Pair(
        "pfedla-frozen",
        {"method": "pfedla", "pfedla.hn-lr": 0.0},
        ("pfedla", "++pfedla.hn_lr=0"),
        note="the hypernetworks never step: pflower's weights stay at their start; FL-bench's run is its pfedla's to the bit",
    ),
    Pair("heurpfedla", {"method": "heurpfedla", "heurpfedla.top-k": 1}, ("pfedla", "++pfedla.k=1")),
)


# ------------------------------------------------------------------ inside FL-bench's process
def _idx(path: Path):
    import numpy as np

    raw = gzip.open(path, "rb").read()
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3])]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * raw[3]).reshape(dims).copy()


def inside(work: Path, mnist: Path, model: str, seed: int, out: Path | None, args: list[str]) -> None:
    """In a copy of FL-bench's checkout: its ``mnist`` is the test pool, its ``custom`` model
    pflower's; then its ``generate_data.py`` (``out`` None) or its ``main.py``, whose server's
    test results go to ``out``."""
    import runpy

    import torch

    os.chdir(work)
    sys.path.insert(0, str(work))
    from data.utils import datasets
    from src.utils import models

    from pflower.models.cnn import CNN

    class TestPoolMNIST(datasets.BaseDataset):
        def __init__(self, root, args=None, **transforms):
            data = torch.tensor(_idx(mnist / "t10k-images-idx3-ubyte.gz")).float().unsqueeze(1)
            targets = torch.tensor(_idx(mnist / "t10k-labels-idx1-ubyte.gz")).long()
            super().__init__(data=data, targets=targets, classes=list(range(10)), **transforms)

    class PflowerModel(models.DecoupledModel):
        """pflower's model, its modules named as FL-bench's own models name theirs (FL-bench's
        FedBN finds the normalization layers by 'bn' in their names)."""

        def __init__(self, dataset, pretrained=False):
            super().__init__()
            net = CNN(1, 28, 10, batch_norm=model == "cnn-bn")
            kinds = {torch.nn.Conv2d: "conv", torch.nn.BatchNorm2d: "bn", torch.nn.Linear: "fc"}
            named = [(f"{kinds.get(type(m), type(m).__name__.lower())}{i}", m) for i, m in enumerate(net.body)]
            self.base, self.classifier = torch.nn.Sequential(OrderedDict(named)), net.head

    datasets.DATASETS["mnist"] = TestPoolMNIST
    models.MODELS["custom"] = PflowerModel
    if out is None:
        sys.argv = ["generate_data.py", "-d", "mnist", "-c", "2", "-cn", "10", "--seed", str(seed), "-tr", "0.25", "-pd", "0"]
        runpy.run_path("generate_data.py", run_name="__main__")
        return
    from src.server.fedavg import FedAvgServer

    run_experiment = FedAvgServer.run_experiment

    def run_and_keep(server) -> None:
        run_experiment(server)
        rounds = sorted(server.test_results)
        tests = {stage: [server.test_results[r]["all_clients"][stage]["test"] for r in rounds] for stage in ("before", "after")}
        doc = {"rounds": rounds, **{stage: {"accuracy": [m.accuracy for m in ms], "loss": [m.loss for m in ms]} for stage, ms in tests.items()}}
        out.write_text(json.dumps({**doc, "accuracy": doc["before"]["accuracy"]}))

    FedAvgServer.run_experiment = run_and_keep
    own = {a.lstrip("+").split("=")[0] for a in args[1:]}
    common = [a for a in FLBENCH_COMMON if a.split("=")[0] not in own]
    sys.argv = ["main.py", f"method={args[0]}", "dataset.name=mnist", "model.name=custom", f"common.seed={seed}", *common, *args[1:]]
    runpy.run_path("main.py", run_name="__main__")


# ------------------------------------------------------------------ orchestration
def checkout(path: Path, url: str) -> Path:
    """FL-bench at ``COMMIT``: cloned into ``path`` when it is not there, else checked."""
    if not path.exists():
        subprocess.run(["git", "clone", "--quiet", url, str(path)], check=True)
        subprocess.run(["git", "-C", str(path), "checkout", "--quiet", COMMIT], check=True)
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run(["git", "-C", str(path), "diff", "--quiet", COMMIT, "--", *CODE]).returncode
    if head != COMMIT or changed:
        raise SystemExit(f"--flbench {path}: FL-bench must be at {COMMIT} with its code unchanged (HEAD {head or 'unknown'}"
                         f"{', files differ' if changed else ''}): git -C {path} checkout {COMMIT}")  # fmt: skip
    return path


def machine() -> dict:
    from pflower.bench import machine as pflower_machine

    return pflower_machine()


def record_path(label: str, tool: str, seed: int) -> Path:
    return RECORDS / label / f"{tool}-seed{seed}.json"


def recorded(pair: Pair, tool: str, seed: int) -> bool:
    """Whether ``pair`` has a record of ``tool`` and ``seed`` made as the pair is declared now."""
    path = record_path(pair.label, tool, seed)
    if not path.exists():
        return False
    doc = json.loads(path.read_text())
    if tool == "flbench":
        return doc.get("command") == list(pair.flbench) and doc.get("reads") == pair.reads and doc.get("model") == pair.model
    return comparable(doc.get("config", {})) == comparable({**COMMON, **pair.pflower})


#: What differs from run to run of a pair: not compared with the pair's declaration.
PER_RUN = ("data-dir", "results-dir", "seed", "client-classes")


def comparable(config: dict) -> dict:
    """A pflower run's whole config (the app's defaults, its method's keys included, then
    ``config``) without what differs from run to run: a record counts while its pair, or a
    default it runs with, is as it was."""
    from pflower.bench import resolved_config

    return {k: v for k, v in resolved_config(config).items() if k not in PER_RUN}


def workspace(flbench: Path, results: Path, seed: int, python: str, mnist: Path) -> tuple[Path, list[list[int]]]:
    """A copy of FL-bench's code for ``seed`` with its partition made by its generate_data.py;
    and each client's classes in it."""
    work = results / f"flbench-seed{seed}"
    stats = work / "data" / "mnist" / "all_stats.json"
    if not stats.exists():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for name in CODE:
            copy = shutil.copytree if (flbench / name).is_dir() else shutil.copy2
            copy(flbench / name, work / name)
        subprocess.run([python, __file__, "--inside", str(work), "--mnist", str(mnist), "--seed", str(seed)], check=True)
    clients = json.loads(stats.read_text())
    return work, [sorted(int(c) for c in clients[str(i)]["y"]) for i in range(10)]


def run_flbench(pair: Pair, seed: int, work: Path, python: str, mnist: Path, results: Path) -> dict:
    out = results / f"flbench-{pair.label}-seed{seed}.json"
    cmd = [python, __file__, "--inside", str(work), "--mnist", str(mnist), "--seed", str(seed), "--model", pair.model, "--out", str(out), "--", *pair.flbench]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode or not out.exists():
        (results / f"flbench-{pair.label}-seed{seed}.log").write_text(done.stdout + done.stderr)
        raise SystemExit(f"FL-bench {pair.label} seed {seed} failed; log in {results}/flbench-{pair.label}-seed{seed}.log")
    doc = json.loads(out.read_text())
    return {
        "accuracy": [a / 100 for a in doc[pair.reads]["accuracy"]],
        "reads": pair.reads,
        "model": pair.model,
        "wall-seconds": time.perf_counter() - t0,
        "command": list(pair.flbench),
    }


def run_pflower(pair: Pair, seed: int, classes: list[list[int]], mnist: Path, results: Path, home: Path) -> dict:
    from pflower.bench import code_version, run_config_string
    from pflower.launcher import submit

    out = results / f"pflower-{pair.label}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    config = {**COMMON, **pair.pflower, "data-dir": str(mnist), "seed": seed, "results-dir": str(out),
              "client-classes": ";".join(",".join(map(str, c)) for c in classes)}  # fmt: skip
    t0 = time.perf_counter()
    _, state, log = submit(ROOT, home, run_config_string(config), num_clients=10, echo=False)
    if state != "finished:completed":
        (results / f"pflower-{pair.label}-seed{seed}.log").write_text(log)
        raise SystemExit(f"pflower {pair.label} seed {seed} ended {state}; log in {results}")
    doc = json.loads((out / "metrics.json").read_text())
    from pflower.bench import resolved_config

    kept = {k: v for k, v in resolved_config(config).items() if k not in ("data-dir", "results-dir")}
    last = doc["rounds"][-1]
    return {"accuracy": [r["weighted-accuracy"] for r in doc["rounds"]], "mib-down": last["cumulative-bytes-down"] / 2**20,
            "mib-up": last["cumulative-bytes-up"] / 2**20, "wall-seconds": time.perf_counter() - t0, "config": kept, "code": code_version()}  # fmt: skip


def write_record(pair: Pair, tool: str, seed: int, run: dict, classes: list[list[int]]) -> None:
    path = record_path(pair.label, tool, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"tool": tool, "label": pair.label, "seed": seed, "client-classes": classes, "machine": machine(), **run}
    if tool == "flbench":
        doc["flbench-commit"] = COMMIT
    path.write_text(json.dumps(doc, indent=1) + "\n")


def execute(args: argparse.Namespace) -> None:
    from pflower.launcher import simulation_superlink

    pairs = [p for p in PAIRS if not args.methods or p.label in args.methods]
    unknown = set(args.methods or ()) - {p.label for p in PAIRS}
    if unknown:
        raise SystemExit(f"--methods: unknown {sorted(unknown)}; known: {', '.join(p.label for p in PAIRS)}")
    mnist = args.data_root / "mnist"
    if not (mnist / "t10k-images-idx3-ubyte.gz").exists():
        raise SystemExit(f"no MNIST test set in {mnist} (t10k-*-ubyte.gz): pflower-data mnist --root {args.data_root}")
    todo = [(p, s, tool) for s in args.seeds for p in pairs for tool in args.tools if not recorded(p, tool, s)]
    print(f"{len(pairs) * len(args.seeds) * len(args.tools) - len(todo)} runs recorded already; {len(todo)} to run", flush=True)
    if not todo:
        return
    flbench = checkout(args.flbench, args.flbench_url)  # its partition is both sides' data
    results = args.results.resolve()
    results.mkdir(parents=True, exist_ok=True)
    home = results / "flwr-home"
    home.mkdir(exist_ok=True)
    with simulation_superlink(home) if "pflower" in args.tools else contextlib.nullcontext():
        for i, (pair, seed, tool) in enumerate(todo, 1):
            work, classes = workspace(flbench, results, seed, args.flbench_python, mnist)
            print(f"[{i}/{len(todo)}] {tool} {pair.label} seed {seed}", flush=True)
            if tool == "flbench":
                run = run_flbench(pair, seed, work, args.flbench_python, mnist, results)
            else:
                run = run_pflower(pair, seed, classes, mnist, results, home)
            write_record(pair, tool, seed, run, classes)
            acc = run["accuracy"]
            print(f"    round 1 {acc[0]:.4f}, round 5 {acc[4]:.4f}, round {len(acc)} {acc[-1]:.4f} ({run['wall-seconds']:.0f} s)", flush=True)


# ------------------------------------------------------------------ report
def load() -> dict[str, dict[str, dict[int, list[float]]]]:
    """label -> tool -> seed -> accuracy per round."""
    out: dict = {}
    for path in sorted(RECORDS.glob("*/*.json")):
        doc = json.loads(path.read_text())
        out.setdefault(doc["label"], {}).setdefault(doc["tool"], {})[doc["seed"]] = doc["accuracy"]
    return out


def cell(runs: dict[int, list[float]], r: int) -> str:
    import statistics

    values = [100 * acc[r - 1] for acc in runs.values()]
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def table(data: dict) -> str:
    head = "| method | pflower round 1 | round 5 | round 20 | FL-bench round 1 | round 5 | round 20 | seeds |\n|---|---|---|---|---|---|---|---|\n"
    rows = []
    for pair in PAIRS:
        runs = data.get(pair.label, {})
        p, f = runs.get("pflower", {}), runs.get("flbench", {})
        seeds = f"{len(p)} / {len(f)}"
        rows.append(f"| {pair.label} | {cell(p, 1)} | {cell(p, 5)} | {cell(p, ROUNDS)} | {cell(f, 1)} | {cell(f, 5)} | {cell(f, ROUNDS)} | {seeds} |")
    return head + "\n".join(rows) + "\n"


def figure(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(5, 4, figsize=(12, 12), sharex=True)
    for ax, pair in zip(axes.flat, PAIRS):
        for tool, color in (("pflower", "tab:blue"), ("flbench", "tab:orange")):
            runs = data.get(pair.label, {}).get(tool, {})
            if runs:
                acc = 100 * np.array(list(runs.values()))
                x = np.arange(1, acc.shape[1] + 1)
                ax.plot(x, acc.mean(0), color=color, label="pflower" if tool == "pflower" else "FL-bench")
                ax.fill_between(x, acc.min(0), acc.max(0), color=color, alpha=0.2)
        ax.set_title(pair.label)
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(PAIRS) :]:
        ax.set_visible(False)
    axes.flat[0].legend(loc="lower right")
    for ax in axes[-1]:
        ax.set_xlabel("round")
    fig.suptitle("Pooled test accuracy (%) of the model each client is sent, mean and range of 3 seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=65)
    plt.close(fig)


def report() -> None:
    from pflower.bench import write_block

    data = load()
    figure(data, ROOT / "docs" / "figures" / "flbench.png")
    write_block(PAGE, "mechanism:flbench", table(data))
    print(table(data))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flbench", type=Path, default=ROOT.parent / "FL-bench", help="FL-bench's checkout (cloned here at the commit if missing)")
    p.add_argument("--flbench-url", default=URL, help="where to clone FL-bench from")
    p.add_argument("--flbench-python", default=sys.executable, help="the Python that runs FL-bench (with hydra-core and pynvml)")
    p.add_argument("--data-root", type=Path, default=Path(os.environ.get("PFLOWER_DATA", Path.home() / "pflower-data")))
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "flbench", help="runs' working folders")
    p.add_argument("--methods", nargs="*", help=f"labels (default: all): {', '.join(p.label for p in PAIRS)}")
    p.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS))
    p.add_argument("--tools", nargs="*", choices=("pflower", "flbench"), default=["flbench", "pflower"])
    p.add_argument("--report", action="store_true", help="write the table and figure from the records")
    p.add_argument("--inside", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--mnist", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--model", default="cnn", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inside:
        inside(args.inside, args.mnist, args.model, args.seed, args.out, args.rest)
    elif args.report:
        report()
    else:
        execute(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
