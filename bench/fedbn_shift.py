"""FedBN's mechanism, after the fact: the final FedBN models of the ``fedbn-shift`` suite
(``pflower-bench fedbn-shift``) evaluated on each client's test split with its own
normalization layers (what FedBN runs) and with the mean of all clients' (what FedAvg would
hold), per client and its domain, on feature shift and on label shift.

    .venv/bin/python bench/fedbn_shift.py [--results bench/results] [--suite fedbn-shift] [--method fedbn]

It reads each run's results-dir (``bench/results/<suite>/<grid>/<method>/seed<k>``, not kept:
the suite's records hold no models): ``metrics.json``, the server's final global model in
``checkpoint.pt`` and each client's last saved state under ``client-state/``. A client's final
model is its saved personal state with the server's final global part, as its last evaluation
saw it; only its normalization layers (affine pairs and running statistics) are swapped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from pflower.build import build_model
from pflower.client_app.store import decode, newest_saved
from pflower.config import load_settings
from pflower.datasets import client_data
from pflower.models.layers import norm_keys
from pflower.records import from_record
from pflower.training import evaluate

ROOT = Path(__file__).resolve().parents[1]


def final_states(run: Path, n: int) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """The server's final global state and each client's last saved personal state."""
    shared = torch.load(run / "checkpoint.pt", weights_only=False)["strategy"]["global"]
    shared = shared if isinstance(shared, dict) else from_record(shared)
    personal = []
    for c in range(n):
        saved = newest_saved(run / "client-state", c)
        if saved is None:
            raise SystemExit(f"{run}: client {c} saved no state (client-state/<lineage>/client-{c}/round-*)")
        personal.append(from_record(decode(saved.read_bytes())["personal"]))
    return shared, personal


def own_and_averaged(settings, n: int, run: Path) -> tuple[list[float], list[float], float]:
    """Each client's test accuracy with its own normalization layers and with all clients' mean,
    and how far the clients' running means spread (std over clients / norm of their mean,
    averaged over the normalization layers)."""
    model = build_model(settings, settings.image_shape, settings.num_classes, settings.seed)
    shared, personal = final_states(run, n)
    local = norm_keys(model)
    if not local:
        raise SystemExit(f"{run}: model '{settings.model}' has no normalization layers; FedBN's runs use model='cnn-bn'")
    averaged = {k: torch.stack([p[k].double() for p in personal]).mean(0).to(personal[0][k].dtype) for k in local}
    stats = [torch.stack([p[k] for p in personal]) for k in local if k.endswith("running_mean")]
    spread = float(np.mean([float(s.std(0).norm() / s.mean(0).norm().clamp_min(1e-12)) for s in stats]))
    own, mean = [], []
    for c in range(n):
        test = client_data(settings, c, n)[1]
        for norm, out in ((personal[c], own), (averaged, mean)):
            model.load_state_dict({**personal[c], **{k: v for k, v in shared.items() if k not in local}, **{k: norm[k] for k in local}})
            out.append(evaluate(model, test).accuracy)
    return own, mean, spread


def report(results: Path, suite: str, method: str) -> int:
    """Print one table per grid of ``suite`` whose ``method`` runs are in ``results``; how many runs it read."""
    read = 0
    for grid in sorted(p for p in (results / suite).glob("*") if (p / method).is_dir()):
        rows, spreads = {}, []
        for run in sorted((grid / method).glob("seed*")):
            if not (run / "checkpoint.pt").is_file():
                continue
            doc = json.loads((run / "metrics.json").read_text())
            settings = load_settings({k: v for k, v in doc["config"].items() if k != "results-dir"})
            n = doc["num-clients"]
            own, mean, spread = own_and_averaged(settings, n, run)
            spreads.append(spread)
            domains = doc.get("client-domains", {})
            for c in range(n):
                rows.setdefault(c, {"domain": domains.get(str(c), ""), "own": [], "mean": []})
                rows[c]["own"].append(own[c])
                rows[c]["mean"].append(mean[c])
            read += 1
        if not rows:
            continue
        seeds = len(spreads)
        print(f"\n## {suite} / {grid.name} / {method}: {seeds} seed(s), each client's test accuracy (mean over seeds)\n")
        print("| client | domain | own normalization | all clients' mean | difference |")
        print("|---|---|---|---|---|")
        for c, r in rows.items():
            own_c, mean_c = np.mean(r["own"]), np.mean(r["mean"])
            print(f"| {c} | {r['domain'] or '-'} | {own_c:.4f} | {mean_c:.4f} | {own_c - mean_c:+.4f} |")
        own_all = np.mean([v for r in rows.values() for v in r["own"]])
        mean_all = np.mean([v for r in rows.values() for v in r["mean"]])
        print(f"| all | | {own_all:.4f} | {mean_all:.4f} | {own_all - mean_all:+.4f} |")
        print(f"\nclients' running means differ by {np.mean(spreads):.1%} of their norm (std over clients, mean over layers and seeds)")
    return read


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results", help="the suite's results-dirs (default: bench/results)")
    p.add_argument("--suite", default="fedbn-shift", help="the suite (default: fedbn-shift)")
    p.add_argument("--method", default="fedbn", help="the method's label in the suite (default: fedbn)")
    args = p.parse_args(argv)
    if not report(args.results.resolve(), args.suite, args.method):
        print(f"no finished '{args.method}' run of suite '{args.suite}' under {args.results} (checkpoint.pt and client-state/)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
