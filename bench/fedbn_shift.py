"""FedBN's mechanism: the final FedBN models of the ``fedbn-shift`` suite (``pflower-bench
fedbn-shift``) evaluated on each client's test split with its own normalization layers (what
FedBN runs) and with the mean of all clients' (what FedAvg would hold), per kind of domain (a
client's domain depends on the seed), on feature shift and on label shift.

    .venv/bin/python bench/fedbn_shift.py [--page docs/reproductions/fedbn.md]
    .venv/bin/python bench/fedbn_shift.py --from-results bench/results [--page ...]

The tables come from swap records (``swap-seed<k>.json`` beside each run's record in
``bench/records/<suite>/<grid>/<method>/``), committed like the runs' records. Each names the
run record it was measured against (its SHA-256) and the machine that measured it; a swap record
whose run record has changed since, or is not of a run the suite declares now, is refused;
the tables say when some recorded seeds have no swap record. ``--from-results`` measures them first from the
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
from pathlib import Path

import numpy as np
import torch

from pflower.bench import Run, load_record, load_suite, machine, machine_counts, seeds_cell, write_block
from pflower.build import build_model
from pflower.client_app.store import decode, newest_saved
from pflower.config import load_settings
from pflower.datasets.federated import client_data
from pflower.models.layers import norm_keys
from pflower.records import from_record
from pflower.results import write_json
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


SUITES = ROOT / "bench" / "suites.toml"


def _declared(suites: Path, suite: str, method: str) -> dict[str, list[Run]]:
    """The suite's runs labelled ``method``, grid by grid, as it declares them now."""
    grids: dict[str, list[Run]] = {}
    for run in load_suite(suites, suite)[1]:
        if run.label == method:
            grids.setdefault(run.grid, []).append(run)
    if not grids:
        raise SystemExit(f"suite '{suite}' of {suites} declares no run labelled '{method}'")
    return grids


def _swap(record: Path) -> Path:
    return record.with_name(f"swap-{record.name}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def measure(results: Path, records: Path, suite: str, method: str, suites: Path = SUITES) -> tuple[int, list[str]]:
    """Write the swap record of every declared ``method`` run of ``suite`` whose results-dir under
    ``results`` finished (metrics.json and checkpoint.pt) and whose record under ``records`` is of
    the run as declared; how many it wrote, and why it skipped the finished ones it skipped.
    SystemExit for a results-dir whose models are not its record's."""
    written, skipped = 0, []
    for runs in _declared(suites, suite, method).values():
        for run in runs:
            folder = run.directory(results, suite)
            if not (folder / "metrics.json").is_file() or not (folder / "checkpoint.pt").is_file():
                continue
            if (kept := load_record(run, records, suite)) is None:
                skipped.append(f"{folder}: no record of this run under {records} (`pflower-bench {suite}` writes it)")
                continue
            record = run.record(records, suite)
            started, n = time.monotonic(), kept["num-clients"]
            here = json.loads((folder / "metrics.json").read_text())["config"]  # the run's config with this machine's places
            own, mean, spread = own_and_averaged(load_settings({k: v for k, v in here.items() if k != "results-dir"}), n, folder)
            recorded = kept["final"]["per-client-accuracy"]
            if differ := [c for c in range(n) if abs(own[c] - recorded.get(str(c), -1.0)) > 1e-6]:
                c = differ[0]
                raise SystemExit(f"{folder} does not hold the models of {record}: client {c} scores {own[c]:.4f} with its own normalization "
                                 f"layers, the record says {recorded.get(str(c), 'nothing')} (another run, or a machine that rounds differently: "
                                 f"measure on the machine that made the record)")  # fmt: skip
            swap = {"run-record": _sha256(record), "own": own, "mean": mean, "spread": spread, "machine": machine(),
                    "wall-seconds": round(time.monotonic() - started, 1)}  # fmt: skip
            write_json(_swap(record), swap, indent=1)
            written += 1
    return written, skipped


def _domain_rows(pairs: list[tuple[str, float, float]]) -> list[str]:
    """Table rows from (domain, own, mean) of every client of every seed, one row per kind of
    domain (a client's domain depends on the seed, so rows are domains, not client ids)."""
    groups: dict[str, list[tuple[str, float, float]]] = {}
    for domain, own, mean in pairs:
        groups.setdefault(domain.split()[0] if domain else "", []).append((domain, own, mean))
    rows = []
    for kind, group in sorted(groups.items()):
        names = sorted({d for d, _, _ in group})
        label = "none (inputs as they are)" if not kind else names[0] if len(names) == 1 else f"{kind} ({len(names)} settings)"
        own, mean = np.mean([o for _, o, _ in group]), np.mean([m for _, _, m in group])
        largest = max((o - m for _, o, m in group), key=abs)
        rows.append(f"| {label} | {len(group)} | {own:.4f} | {mean:.4f} | {own - mean:+.4f} | {largest:+.4f} |")
    return rows


def tables(records: Path, suite: str, method: str, suites: Path = SUITES) -> str:
    """One table per grid of ``suite`` whose recorded ``method`` runs have swap records: the
    test accuracy of the clients of each kind of domain with their own normalization layers and
    with all clients' mean. SystemExit for a swap record whose run record changed or is not of
    the suite as declared now."""
    parts = []
    for grid, runs in _declared(suites, suite, method).items():
        folder, pairs, seeds, spreads, machines = records / suite / grid / method, [], [], [], []
        declared = {_swap(run.record(records, suite)): run for run in runs}
        for path in sorted(folder.glob("swap-*.json")):
            run = declared.get(path)
            doc = load_record(run, records, suite) if run is not None else None
            if doc is None:
                raise SystemExit(f"{path} has no record of a run of '{suite}' as declared now beside it: remove it, or run "
                                 f"`pflower-bench {suite}` and measure again with --from-results")  # fmt: skip
            swap = json.loads(path.read_text())
            if swap.get("run-record") != _sha256(run.record(records, suite)) or len(swap["own"]) != doc["num-clients"]:
                raise SystemExit(f"{path} was measured against another version of {run.record(records, suite).name}: "
                                 f"measure it again with `.venv/bin/python bench/fedbn_shift.py --from-results RESULTS`")  # fmt: skip
            domains = doc.get("client-domains", {})
            pairs += [(domains.get(str(c), ""), o, m) for c, (o, m) in enumerate(zip(swap["own"], swap["mean"], strict=True))]
            seeds.append((np.mean(swap["own"]), np.mean(swap["mean"])))
            spreads.append(swap["spread"])
            machines.append(swap["machine"])
        if not seeds:
            continue
        rows = _domain_rows(pairs)
        lines = [f"#### {grid}: {method}'s own normalization layers against all clients' mean, seeds: {seeds_cell(len(seeds), len(runs))}", "",
                 "| domain | clients × seeds | own normalization | all clients' mean | difference | largest for a client |",
                 "| --- | --- | --- | --- | --- | --- |", *rows]  # fmt: skip
        own_all, mean_all = np.mean([o for _, o, _ in pairs]), np.mean([m for _, _, m in pairs])
        if len(rows) > 1:
            lines.append(f"| all | {len(pairs)} | {own_all:.4f} | {mean_all:.4f} | {own_all - mean_all:+.4f} | |")
        lines += ["", f"Test accuracy, mean over clients and seeds; by seed, {' / '.join(f'{o:.4f}' for o, _ in seeds)} with their own "
                  f"normalization layers and {' / '.join(f'{m:.4f}' for _, m in seeds)} with the mean. The clients' BatchNorm running means "
                  f"differ by {np.mean(spreads):.1%} of their norm (std over clients, mean over layers and seeds)."]  # fmt: skip
        lines += ["", machine_counts("Measured on", machines)]
        parts.append("\n".join(lines) + "\n")
    if not parts:
        return f"No record yet: `pflower-bench {suite}`, then `.venv/bin/python bench/fedbn_shift.py --from-results bench/results`.\n"
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, default=ROOT / "bench" / "records", help="the runs' records and swap records (default: bench/records)")
    p.add_argument("--from-results", type=Path, metavar="RESULTS", help="measure the swap records first, from the suite's results-dirs under RESULTS")
    p.add_argument("--page", type=Path, help="write the tables into this page's <!-- mechanism:SUITE:start/end --> block")
    p.add_argument("--file", type=Path, default=SUITES, help="the suites file (default: bench/suites.toml)")
    p.add_argument("--suite", default="fedbn-shift", help="the suite (default: fedbn-shift)")
    p.add_argument("--method", default="fedbn", help="the method's label in the suite (default: fedbn)")
    args = p.parse_args(argv)
    records = args.records.resolve()
    if args.from_results is not None:
        written, skipped = measure(args.from_results.resolve(), records, args.suite, args.method, args.file)
        for why in skipped:
            print(f"skipped {why}")
        print(f"{written} swap record(s) written under {records / args.suite}")
        if not written:
            print(f"no finished '{args.method}' run of suite '{args.suite}' under {args.from_results} with its record under {records}")
            return 1
    text = tables(records, args.suite, args.method, args.file)
    print(text, end="")
    if args.page is not None:
        write_block(args.page, f"mechanism:{args.suite}", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
