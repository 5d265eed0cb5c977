"""FedBN's mechanism: the final FedBN models of the ``fedbn-shift`` suite (``pflower-bench
fedbn-shift``) evaluated on each client's test split with its own normalization layers (what
FedBN runs) and with the mean of all clients' (what FedAvg would hold), per client and its
domain, on feature shift and on label shift.

    .venv/bin/python bench/fedbn_shift.py [--page docs/reproductions/fedbn.md]
    .venv/bin/python bench/fedbn_shift.py --from-results bench/results [--page ...]

The tables come from swap records (``swap-seed<k>.json`` beside each run's record in
``bench/records/<suite>/<grid>/<method>/``), committed like the runs' records. Each names the
run record it was measured against (its SHA-256) and the machine that measured it; a swap record
whose run record has changed since is refused. ``--from-results`` measures them first from the
runs' results-dirs (``<results>/<suite>/<grid>/<method>/seed<k>``, not kept: records hold no
models): ``metrics.json``, the server's final global model in ``checkpoint.pt`` and each client's
last saved state under ``client-state/``. A client's final model is its saved personal state
with the server's final global part, as its last evaluation saw it; only its normalization
layers (affine pairs and running statistics) are swapped. A results-dir whose clients' own
accuracies are not its record's is refused: its models are of another run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from pflower.bench import machine, machine_name, write_block
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


def _record(records: Path, suite: str, grid: str, method: str, seed: int) -> Path:
    return records / suite / grid / method / f"seed{seed}.json"


def _swap(record: Path) -> Path:
    return record.with_name(f"swap-{record.name}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def measure(results: Path, records: Path, suite: str, method: str) -> int:
    """Write the swap record of every finished ``method`` run of ``suite`` under ``results`` that
    has its run record under ``records``; how many it wrote. SystemExit for a results-dir that is
    not its record's run."""
    written = 0
    for run in sorted((results / suite).glob(f"*/{method}/seed*")):
        if not run.name[4:].isdigit():
            continue
        record = _record(records, suite, run.parent.parent.name, method, int(run.name[4:]))
        if not (run / "checkpoint.pt").is_file() or not record.is_file():
            continue
        doc, kept = json.loads((run / "metrics.json").read_text()), json.loads(record.read_text())
        started = time.monotonic()
        n = doc["num-clients"]
        own, mean, spread = own_and_averaged(load_settings({k: v for k, v in doc["config"].items() if k != "results-dir"}), n, run)
        recorded = kept["final"]["per-client-accuracy"]
        differ = [c for c in range(n) if abs(own[c] - recorded.get(str(c), -1.0)) > 1e-6]
        if n != kept["num-clients"] or differ:
            why = (
                f"client {differ[0]}'s final model scores {own[differ[0]]:.4f} with its own normalization layers, the record says {recorded.get(str(differ[0]), 'nothing')}"
                if differ
                else f"{n} clients, the record {kept['num-clients']}"
            )
            raise SystemExit(f"{run} is not the run of {record}: {why}; run `pflower-bench {suite}` again")
        swap = {
            "run-record": _sha256(record),
            "own": own,
            "mean": mean,
            "spread": spread,
            "machine": machine(),
            "wall-seconds": round(time.monotonic() - started, 1),
        }
        part = _swap(record).with_suffix(".tmp")
        part.write_text(json.dumps(swap, indent=1) + "\n")
        part.replace(_swap(record))  # whole or not at all
        written += 1
    return written


def tables(records: Path, suite: str, method: str) -> str:
    """One table per grid of ``suite`` whose ``method`` runs have swap records: each client's
    accuracy with its own normalization layers and with all clients' mean (mean over seeds)."""
    parts = []
    for folder in sorted(p for p in (records / suite).glob(f"*/{method}") if p.is_dir()):
        rows: dict[int, dict] = {}
        spreads, machines = [], Counter()
        for swap_path in sorted(folder.glob("swap-seed*.json")):
            record = folder / swap_path.name.removeprefix("swap-")
            swap = json.loads(swap_path.read_text())
            if not record.is_file() or swap["run-record"] != _sha256(record):
                raise SystemExit(f"{swap_path} was measured against another {record.name}; measure it again: "
                                 f"`.venv/bin/python bench/fedbn_shift.py --from-results RESULTS` after `pflower-bench {suite}`")  # fmt: skip
            domains = json.loads(record.read_text()).get("client-domains", {})
            for c, (own, mean) in enumerate(zip(swap["own"], swap["mean"], strict=True)):
                row = rows.setdefault(c, {"domain": domains.get(str(c), ""), "own": [], "mean": []})
                row["own"].append(own)
                row["mean"].append(mean)
            spreads.append(swap["spread"])
            machines[machine_name(swap["machine"])] += 1
        if not rows:
            continue
        lines = [f"#### {folder.parent.name}: {method}'s own normalization layers against all clients' mean, {len(spreads)} seed{'s' if len(spreads) > 1 else ''}", "",
                 "| client | domain | own normalization | all clients' mean | difference |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for c, r in rows.items():
            own_c, mean_c = np.mean(r["own"]), np.mean(r["mean"])
            lines.append(f"| {c} | {r['domain'] or '-'} | {own_c:.4f} | {mean_c:.4f} | {own_c - mean_c:+.4f} |")
        own_all = np.mean([v for r in rows.values() for v in r["own"]])
        mean_all = np.mean([v for r in rows.values() for v in r["mean"]])
        lines += [f"| all | | {own_all:.4f} | {mean_all:.4f} | {own_all - mean_all:+.4f} |", ""]
        lines.append(
            f"Each client's test accuracy, mean over seeds. The clients' BatchNorm running means differ by {np.mean(spreads):.1%} of their norm (std over clients, mean over layers and seeds)."
        )
        lines += ["", "Measured on: " + "; ".join(f"{m} ({n} run{'s' if n > 1 else ''})" for m, n in sorted(machines.items())) + "."]
        parts.append("\n".join(lines) + "\n")
    if not parts:
        return f"No record yet: `pflower-bench {suite}`, then `.venv/bin/python bench/fedbn_shift.py --from-results bench/results`.\n"
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, default=ROOT / "bench" / "records", help="the runs' records and swap records (default: bench/records)")
    p.add_argument("--from-results", type=Path, metavar="RESULTS", help="measure the swap records first, from the suite's results-dirs under RESULTS")
    p.add_argument("--page", type=Path, help="write the tables into this page's <!-- mechanism:SUITE:start/end --> block")
    p.add_argument("--suite", default="fedbn-shift", help="the suite (default: fedbn-shift)")
    p.add_argument("--method", default="fedbn", help="the method's label in the suite (default: fedbn)")
    args = p.parse_args(argv)
    if args.from_results is not None:
        written = measure(args.from_results.resolve(), args.records.resolve(), args.suite, args.method)
        print(f"{written} swap record(s) written under {args.records / args.suite}")
        if not written:
            print(f"no finished '{args.method}' run of suite '{args.suite}' under {args.from_results} with its record under {args.records}")
            return 1
    text = tables(args.records.resolve(), args.suite, args.method)
    print(text, end="")
    if args.page is not None:
        write_block(args.page, f"mechanism:{args.suite}", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
