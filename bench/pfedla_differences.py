"""pFedLA's choices, one at a time: each difference from the other public implementations (and
from pflower's previous pFedLA) measured in two settings.

Every variant is pflower's pFedLA with one thing changed, run in process (the real strategy and
ClientApp through Flower's wire format, ``tests/conftest.py``'s grid: the numbers a Flower
simulation gives), seeds 0-2, in two settings:

- ``matched``: ``bench/flbench.py``'s: MNIST's test pool, 10 clients with FL-bench's class
  assignment of each seed (2 classes each, read from ``bench/records/flbench``), 20 rounds of 1
  epoch, batch 32, lr 0.05; the pooled accuracy of the model each client is sent, per round.
- ``iid``: scikit-learn's digits shared out IID over 10 clients, 10 rounds of 1 epoch, the run
  config's defaults otherwise (lr 0.1, batch 32): where FedAvg is far above Local, so a method
  that personalizes where nothing differs loses.

The rows:

- ``pflower``: pFedLA as it is (the step at the kept models, the loss scaled by the clients'
  norms, step 100).
- ``before``: pflower's previous pFedLA (the step at the round's starting models, the loss
  scaled by the clients' spread, step 0.05).
- ``start-models``: the step's Jacobian at the round's starting models, the models the client's
  personalized model was mixed from (as FL-bench and the other public port do), not at the kept
  trained models.
- ``spread``: the loss scaled by the clients' spread instead of their norms, at step 1.0.
- ``hn-lr-20``, ``hn-lr-300``: other step sizes.
- ``per-tensor``: a weight per parameter tensor (a layer's weight and bias apart), as FL-bench.
- ``stored-plus-update``: the server keeps theta_i + (trained - sent) instead of the trained
  model, as FL-bench writes it.
- ``sequential``: the round's clients one after another, each mixed from the models of the
  clients before it (FL-bench's serial loop); the paper's Algorithm 1 trains them in parallel.
- ``flbench-heads``: FL-bench's hypernetwork heads (weights uniform in [0, 1), zero bias, so
  raw outputs far above 1/N), its unscaled loss and its step 0.005.
- ``flbench-sign``: the step in FL-bench's direction, away from the trained model (its
  gradient is the update, not minus it).
- ``local``, ``fedavg``: the two methods themselves, for reference.

What FL-bench's own pFedLA does (each client trains and is evaluated on its stored model, so the
weights never reach a model) is shown by ``bench/flbench.py``'s ``pfedla-frozen`` pair.

    .venv/bin/python bench/pfedla_differences.py [--variants ...] [--settings ...] [--seeds 0 1 2]
    .venv/bin/python bench/pfedla_differences.py --report      # the table on docs/methods/pfedla.md
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

import torch
from flwr.app import ConfigRecord, MessageType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
RECORDS = ROOT / "bench" / "records" / "pfedla-differences"
FLBENCH_RECORDS = ROOT / "bench" / "records" / "flbench"
PAGE = ROOT / "docs" / "methods" / "pfedla.md"
SEEDS = (0, 1, 2)

from pflower.models.layers import Layer  # noqa: E402
from pflower.strategies.hypernetwork import hypernetwork_update, layer_norms  # noqa: E402
from pflower.strategies.personal import chunks  # noqa: E402
from pflower.strategies.pfedla import PFedLA  # noqa: E402


def spread(theta: torch.Tensor, segments: list[tuple[int, int]]) -> torch.Tensor:
    """sum_j ||theta_j^l - mean_k theta_k^l||^2 per layer l (the previous scale of the loss)."""
    dev = theta.double() - theta.double().mean(0)
    return torch.stack([dev[:, a:b].square().sum() for a, b in segments])


class StartModels(PFedLA):
    """The step's Jacobian at the round's starting models (FL-bench, the other port, pflower before)."""

    def scale(self) -> torch.Tensor:
        return layer_norms(self.theta, self.segments)

    def aggregate(self, server_round, replies):
        if self.hn_lr > 0:
            scale = self.scale()
            for part in chunks(replies):
                ids = [r.client_id for r in part]
                delta = self.spec.stack(r.arrays for r in part) - self.sent(ids)
                hypernetwork_update(self.hn, torch.tensor(ids), self.theta, delta, self.segments, self.hn_lr, norms=scale)
        self.store(replies)
        self.unsynced -= {r.client_id for r in replies}


class Before(StartModels):
    """pflower's previous pFedLA: the step at the starting models, the spread-scaled loss, step 0.05."""

    def __init__(self, **kw):
        super().__init__(**{**kw, "hn_lr": 0.05})

    def scale(self) -> torch.Tensor:
        return spread(self.theta, self.segments)


class Spread(PFedLA):
    """The loss scaled by the clients' spread (step 1.0) instead of their norms."""

    def __init__(self, **kw):
        super().__init__(**{**kw, "hn_lr": 1.0})

    def aggregate(self, server_round, replies):
        updates = [([r.client_id for r in part], self.spec.stack(r.arrays for r in part) - self.sent([r.client_id for r in part])) for part in chunks(replies)]
        self.store(replies)
        scale = spread(self.theta, self.segments)
        for ids, delta in updates:
            hypernetwork_update(self.hn, torch.tensor(ids), self.theta, delta, self.segments, self.hn_lr, norms=scale)
        self.unsynced -= {r.client_id for r in replies}


def with_hn_lr(lr: float) -> type[PFedLA]:
    """pFedLA at step ``lr``."""
    return type(f"HnLr{lr}", (PFedLA,), {"__init__": lambda self, **kw: PFedLA.__init__(self, **{**kw, "hn_lr": lr})})


class PerTensor(PFedLA):
    """One weight per parameter tensor."""

    def prepare(self, initial_arrays):
        self.layers = [Layer(f"{layer.name}:{key}", (key,)) for layer in self.layers for key in layer.keys]
        super().prepare(initial_arrays)


class StoredPlusUpdate(PFedLA):
    """theta_i <- theta_i + (trained_i - sent_i) instead of the trained model."""

    def store(self, replies):
        for part in chunks(replies):
            ids = [r.client_id for r in part]
            self.theta[torch.tensor(ids)] += self.spec.stack(r.arrays for r in part) - self.sent(ids)


class Sequential(PFedLA):
    """The round's clients one after another: each is sent its model after the step and store
    of the ones before it."""

    def run_round(self, grid, rnd, config, train_config, result):
        ids = self.federation.sample(self.fraction_train, rnd)
        down = up = 0
        missing, losses = [], []
        for cid in ids:
            msgs = self.federation.messages([cid], MessageType.TRAIN, self.train_arrays(rnd, [cid]), ConfigRecord({**train_config, **config}))
            phase = self.federation.phase(grid, msgs, self.round_timeout)
            self.federation.trained_in(rnd, self.federation.answered(phase.replies))
            arrays, metrics = self.aggregate_train(rnd, phase.replies)
            result.arrays = arrays or result.arrays
            down, up, missing = down + phase.down, up + phase.up, missing + phase.missing
            if "train-loss" in metrics:
                losses.append(metrics["train-loss"])
        return {"train-loss": statistics.mean(losses) if losses else None, "bytes-down": down, "bytes-up": up, "sampled": len(ids), "missing": missing}


class FlbenchHeads(PFedLA):
    """FL-bench's heads: Linear weights uniform in [0, 1), zero bias; unscaled loss; step 0.005."""

    def __init__(self, **kw):
        super().__init__(**{**kw, "hn_lr": 0.005, "layer_loss": "raw"})

    def prepare(self, initial_arrays):
        super().prepare(initial_arrays)
        g = torch.Generator().manual_seed(self.seed)
        self.hn.params["hw"] = torch.rand(self.hn.params["hw"].shape, generator=g)
        self.hn.params["hb"] = torch.zeros_like(self.hn.params["hb"])


class FlbenchSign(PFedLA):
    """The step away from the trained model."""

    def prepare(self, initial_arrays):
        super().prepare(initial_arrays)
        step = self.hn.step
        self.hn.step = lambda ids, grads, lr: step(ids, grads, -lr)


VARIANTS = {"pflower": PFedLA, "before": Before, "start-models": StartModels, "spread": Spread, "hn-lr-20": with_hn_lr(20.0),
            "hn-lr-300": with_hn_lr(300.0), "per-tensor": PerTensor, "stored-plus-update": StoredPlusUpdate, "sequential": Sequential,
            "flbench-heads": FlbenchHeads, "flbench-sign": FlbenchSign}  # fmt: skip
#: The methods themselves, beside the variants.
REFERENCES = ("local", "fedavg")
ROWS = (*VARIANTS, *REFERENCES)


def classes_of(seed: int) -> list[list[int]]:
    path = FLBENCH_RECORDS / "local" / f"flbench-seed{seed}.json"
    if not path.exists():
        raise SystemExit(f"no {path}: run bench/flbench.py --methods local first (its partition is this setting's)")
    return json.loads(path.read_text())["client-classes"]


def settings_config(setting: str, seed: int, data_root: Path) -> dict:
    """The whole run config of ``setting`` for ``seed`` (pyproject's defaults, then its keys)."""
    from conftest import DEFAULTS

    if setting == "iid":
        return {**DEFAULTS, "method": "pfedla", "partition": "iid", "num-server-rounds": 10, "local-epochs": 1, "seed": seed}
    return {**DEFAULTS, "method": "pfedla", "dataset": "mnist", "data-dir": str(data_root / "mnist"), "partition": "classes", "model": "cnn",
            "client-classes": ";".join(",".join(map(str, c)) for c in classes_of(seed)), "test-fraction": 0.25,
            "num-server-rounds": 20, "local-epochs": 1, "batch-size": 32, "lr": 0.05, "seed": seed}  # fmt: skip


SETTINGS = ("matched", "iid")


def run(row: str, cfg: dict, num_clients: int = 10) -> list[float]:
    """The pooled accuracy per round of ``row`` (a variant, or a reference method) on ``cfg``, a
    whole pfedla run config, in process (two-phase rounds for ``sequential``, whose loop sends one
    client at a time)."""
    from conftest import InProcessGrid

    import pflower.methods as methods
    from pflower.build import build_strategy
    from pflower.client_app.app import app
    from pflower.config import load_settings

    declaration = type(methods.get("pfedla"))
    real = declaration.strategy_class
    with tempfile.TemporaryDirectory() as out:
        cfg = {**{k: v for k, v in cfg.items() if not (row in REFERENCES and k.startswith("pfedla."))}, "results-dir": out,
               "single-message": row != "sequential", **({"method": row} if row in REFERENCES else {})}  # fmt: skip
        if row in VARIANTS:
            declaration.strategy_class = lambda self: VARIANTS[row]
        try:
            build_strategy(load_settings(cfg)).start(grid=InProcessGrid(app, cfg, num_clients))
        finally:
            declaration.strategy_class = real
        doc = json.loads((Path(out) / "metrics.json").read_text())
    return [r["weighted-accuracy"] for r in doc["rounds"]]


def report() -> str:
    from pflower.bench import write_block

    data: dict[tuple[str, str], list[list[float]]] = {}
    for path in sorted(RECORDS.glob("*/*.json")):
        doc = json.loads(path.read_text())
        data.setdefault((doc["setting"], doc["row"]), []).append(doc["accuracy"])

    def cell(setting: str, row: str, r: int) -> str:
        values = [100 * a[r - 1] for a in data.get((setting, row), [])]
        if not values:
            return "—"
        return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"

    lines = ["| row | matched, round 1 | round 5 | round 20 | IID digits, round 10 |", "|---|---|---|---|---|"]
    lines += [f"| `{row}` | {cell('matched', row, 1)} | {cell('matched', row, 5)} | {cell('matched', row, 20)} | {cell('iid', row, 10)} |" for row in ROWS]
    text = "\n".join(lines) + "\n"
    write_block(PAGE, "pfedla-differences", text)
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="*", choices=list(ROWS), default=list(ROWS))
    p.add_argument("--settings", nargs="*", choices=SETTINGS, default=list(SETTINGS))
    p.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS))
    p.add_argument("--data-root", type=Path, default=Path(os.environ.get("PFLOWER_DATA", Path.home() / "pflower-data")))
    p.add_argument("--report", action="store_true")
    args = p.parse_args()
    if args.report:
        print(report())
        return 0
    from pflower.bench import code_version, machine

    for setting in args.settings:
        for row in args.variants:
            for seed in args.seeds:
                path = RECORDS / setting / f"{row}-seed{seed}.json"
                if path.exists():
                    continue
                t0 = time.perf_counter()
                a = run(row, settings_config(setting, seed, args.data_root))
                doc = {"setting": setting, "row": row, "seed": seed, "accuracy": a, "wall-seconds": time.perf_counter() - t0,
                       "machine": machine(), "code": code_version()}  # fmt: skip
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(doc, indent=1) + "\n")
                print(
                    f"{setting} {row} seed {seed}: round 1 {a[0]:.4f}, round 5 {a[4]:.4f}, round {len(a)} {a[-1]:.4f} ({doc['wall-seconds']:.0f} s)", flush=True
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
