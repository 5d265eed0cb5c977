"""What the papers' suites' mechanisms did, on CIFAR-10 and on MNIST, read from their runs'
records (``pflower-bench``'s ``bench/records``, committed) and, for what needs the final models, their results-dirs
(``bench/results``, not kept: those parts say so and are skipped where the runs are not here):
the docs' evidence beside the accuracy tables.

    .venv/bin/python bench/mechanisms.py [--records bench/records] [--results bench/results] [--data-root DIR]

- pFedLA: learned against frozen weights, paired by seed (final round and the mean of the last
  5); how the final weights follow the clients' class overlap and label-distribution overlap,
  per layer, and the same-classes / disjoint-classes weight ratio per seed; which layers
  HeurpFedLA retains and the bytes it saves.
- FedeRiCo: the final weight each client puts on its own label group, and the largest weight
  each client would give if the E-step used the summed log-likelihood (w ∝ w_mean ** n).
- Double head: bytes of gradual sharing against sharing every layer, the accuracy of each, the
  accuracy reached at given cumulative bytes, and which head decides the prediction (each
  client's final model: its saved personal state with the server's final global part, as its
  last evaluation saw it).
- FedBN: each client's accuracy with its own normalization layers and with all clients' mean.
- Orderings: per-seed differences and per-round accuracy behind each ordering the README
  explains (pFedLA and FedBN against Local and FedAvg, FedeRiCo and FedFomo against Local,
  SuPerFed against every other method of its grid, FedRep against FedPer, FedProx and SCAFFOLD
  against FedAvg).
- SuPerFed: every method's accuracy per evaluated round (every grid of the SuPerFed suites); the final accuracy
  along the line (federated model at λ = 0, local model at λ = 1, the best λ in between), at each
  client's held-out choice, the chosen λs and cos² between the federated and local weights; the
  same with the connectivity term off (ν = 0).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from fedbn_shift import own_and_averaged  # bench/, beside this script

from pflower.build import build_model
from pflower.client_app.store import decode, newest_saved
from pflower.config import load_settings
from pflower.datasets.federated import client_data, federated_indices, global_test
from pflower.fetch import data_root
from pflower.models.layers import layers
from pflower.models.mixing import LAMBDA_GRID, cosine_squared
from pflower.records import from_record

ROOT = Path(__file__).resolve().parents[1]


RECORDS, RESULTS, DATA_ROOT = ROOT / "bench" / "records", ROOT / "bench" / "results", None


def _runs(directory: Path) -> dict[int, dict]:
    """seed -> record of the recorded runs under ``directory`` (a method's folder of the records)."""
    return {int(f.stem[4:]): json.loads(f.read_text()) for f in sorted(directory.glob("seed*.json"))}


def _settings(doc: dict):
    """A record's settings on this machine: its data folder under this machine's data root
    (``--data-root``, else $PFLOWER_DATA, else ~/pflower-data) where the record's own (the
    folder of the machine that made it) is not here; no results-dir."""
    config = {k: v for k, v in doc["config"].items() if k != "results-dir"}
    if config.get("data-dir") and not Path(config["data-dir"]).is_dir():
        config["data-dir"] = str(data_root(DATA_ROOT) / Path(config["data-dir"]).name)
    return load_settings(config)


def _run_dir(directory: Path, seed: int) -> Path | None:
    """The results-dir (checkpoint, client states) of a recorded run, if it is on this machine."""
    run = RESULTS / directory.relative_to(RECORDS) / f"seed{seed}"
    return run if (run / "checkpoint.pt").is_file() else None


CUMULATIVE_MIB = (25, 50, 100, 200, 400)


def _fmt(a) -> str:
    a = np.asarray(a, dtype=np.float64)
    return f"{a.mean():.4f} ± {a.std(ddof=1):.4f}" if len(a) > 1 else f"{a.mean():.4f}"


def _sd(runs: dict[int, dict]) -> str:
    """Sample standard deviation over seeds of the final accuracy."""
    return f"{np.std([d['final']['accuracy'] for d in runs.values()], ddof=1):.4f}" if len(runs) > 1 else "-"


def _paired(a: dict[int, dict], b: dict[int, dict], key: str = "accuracy") -> str:
    """Per-seed differences of the final ``key`` of ``a`` against ``accuracy`` of ``b``."""
    return " / ".join(f"{a[s]['final'][key] - b[s]['final']['accuracy']:+.3f}" for s in sorted(a.keys() & b.keys()))


def _per_round(runs: dict[int, dict]) -> dict[int, float]:
    """Round -> accuracy, mean over seeds, at every evaluated round."""
    rounds = sorted({r["round"] for d in runs.values() for r in d["rounds"] if r["accuracy"] is not None})
    return {k: float(np.mean([r["accuracy"] for d in runs.values() for r in d["rounds"] if r["round"] == k])) for k in rounds}


def _distribution_correlation(doc: dict, layer: int) -> float:
    """Pearson correlation, over pairs i != j, of client i's final weight on client j in
    ``layer`` with the overlap of their training label distributions, sum_c min(p_i(c), p_j(c))
    (defined where class sets are not: with every class on every client, as in non-IID_2)."""
    settings, n = _settings(doc), doc["num-clients"]
    p = np.array([np.bincount(client_data(settings, c, n)[0].y.numpy(), minlength=10) for c in range(n)], dtype=np.float64)
    p /= p.sum(axis=1, keepdims=True)
    overlap = np.minimum(p[:, None, :], p[None, :, :]).sum(axis=2)
    alpha = np.array([doc["rounds"][-1]["alpha"][str(i)][layer] for i in range(n)])
    others = ~np.eye(n, dtype=bool)
    return float(np.corrcoef(alpha[others], overlap[others])[0, 1])


def pfedla(records: Path) -> None:
    for suite, grid in (
        (records / "cifar10-pfedla", "noniid1"),
        (records / "cifar10-pfedla", "noniid2"),
        (records / "cifar10-pfedla-long", "noniid1-80-rounds"),
        (records / "pfedla", "pfedla-groups2"),
        (records / "pfedla", "pfedla-pathological"),
        (records / "pfedla-ablation", "groups2"),
    ):
        learned = _runs(suite / grid / "pfedla")
        if not learned:
            continue
        print(f"\n## pFedLA, {suite.name} {grid}")
        frozen = _runs(suite / grid / "pfedla-frozen")
        seeds = sorted(set(learned) & set(frozen))
        if seeds:
            diff = [learned[s]["final"]["accuracy"] - frozen[s]["final"]["accuracy"] for s in seeds]
            print(f"learned - frozen accuracy per seed {seeds}: {', '.join(f'{d:+.4f}' for d in diff)} (mean {np.mean(diff):+.4f})")
            last5 = [np.mean(list(_per_round({s: learned[s]}).values())[-5:]) - np.mean(list(_per_round({s: frozen[s]}).values())[-5:]) for s in seeds]
            print(f"  over the last 5 rounds: {', '.join(f'{d:+.4f}' for d in last5)}; seed-to-seed sd: learned {_sd(learned)}, frozen {_sd(frozen)}")
        doc = next(iter(learned.values()))
        settings = _settings(doc)
        names = [layer.name for layer in layers(build_model(settings, settings.image_shape, 10, 0))]
        for label in sorted(p.name for p in (suite / grid).iterdir() if p.is_dir()):
            runs = _runs(suite / grid / label)
            ratios = [d["rounds"][-1].get("alpha-structure", {}).get("ratio") for d in runs.values()]
            if runs and all(r and None not in r for r in ratios):
                print(f"same / disjoint classes weight ratio, {label}, per layer (seeds {' / '.join(map(str, runs))}): "
                      + ", ".join(f"{n} " + " / ".join(f"{r[l]:.1f}" for r in ratios) for l, n in enumerate(names)))  # fmt: skip
        corr = np.array([d["rounds"][-1]["alpha-structure"]["overlap-correlation"] for d in learned.values()], dtype=np.float64)
        if not np.isnan(corr).all():  # undefined where every client has every class
            print("correlation of the final weights with class overlap, per layer (mean over seeds):")
            print("  " + ", ".join(f"{n} {c:.2f}" for n, c in zip(names, corr.mean(axis=0))))
        hist = np.array([[_distribution_correlation(d, layer) for layer in range(len(names))] for d in learned.values()])
        print("correlation of the final weights with label-distribution overlap (histogram intersection), per layer (mean over seeds):")
        print("  " + ", ".join(f"{n} {c:.2f}" for n, c in zip(names, hist.mean(axis=0))))
        self_w = np.array([[[a[l][i] for l in range(len(names))] for i, a in enumerate(d["rounds"][-1]["alpha"].values())] for d in learned.values()])
        print(
            "self-weight per layer (mean over clients and seeds; uniform is 0.1): " + ", ".join(f"{n} {w:.3f}" for n, w in zip(names, self_w.mean(axis=(0, 1))))
        )
        for k in (1, 2, 3):
            heur = _runs(suite / grid / f"heurpfedla-k{k}")
            if not heur:
                continue
            kept: dict[str, int] = {}
            for d in heur.values():
                for i, a in d["rounds"][-1]["alpha"].items():
                    own = np.array([a[l][int(i)] for l in range(len(names))])
                    for l in np.argsort(-own, kind="stable")[:k]:
                        kept[names[l]] = kept.get(names[l], 0) + 1
            total = sum(kept.values())
            down = [d["final"]["bytes-down"] / 2**20 for d in heur.values()]
            print(f"heurpfedla-k{k}: MiB down {_fmt(down)}, up {_fmt([d['final']['bytes-up'] / 2**20 for d in heur.values()])}; "
                  f"layers retained in the final round: " + ", ".join(f"{n} {c / total:.0%}" for n, c in sorted(kept.items(), key=lambda x: -x[1])))  # fmt: skip
        base = [d["final"]["bytes-down"] / 2**20 for d in learned.values()]
        print(f"pfedla (k = 0): MiB down {_fmt(base)}, up {_fmt([d['final']['bytes-up'] / 2**20 for d in learned.values()])}")
        local, fedfomo = _runs(suite / grid / "local"), _runs(suite / grid / "fedfomo")
        fedavg, fedbn = _per_round(_runs(suite / grid / "fedavg")), _per_round(_runs(suite / grid / "fedbn"))
        print(f"local: round 1 {_per_round(local).get(1, float('nan')):.3f}; pfedla - local per seed {_paired(learned, local)}")
        for other in ("fedfomo", "fedavg-ft", "heurpfedla-k1"):
            if runs := _runs(suite / grid / other):
                print(f"{other} - pfedla per seed {_paired(runs, learned)}")
        if fedfomo:
            print(f"fedfomo - local per seed {_paired(fedfomo, local)}")
        if gaps := [fedbn[k] - fedavg[k] for k in fedavg.keys() & fedbn.keys()]:
            print(f"fedbn - fedavg per round {min(gaps):+.3f} to {max(gaps):+.3f}")
        per_round = {label: _per_round(runs) for label, runs in (("pfedla", learned), ("local", local)) if runs}
        marks = [k for k in per_round["pfedla"] if k % 10 == 0]
        for label, acc in per_round.items():
            print(f"  {label:7} mean accuracy at rounds {marks[0]}..{marks[-1]} every 10: " + " ".join(f"{acc[k]:.3f}" for k in marks))
        for seed in sorted(learned.keys() & local.keys()):
            a, b = ({r["round"]: r["accuracy"] for r in d["rounds"]} for d in (learned[seed], local[seed]))
            print(f"  seed {seed}: pfedla - local at rounds every 10: " + " ".join(f"{a[k] - b[k]:+.3f}" for k in marks))


def fedbn(records: Path) -> None:
    """FedBN's mechanism frozen after the fact: each client's final model evaluated with its own
    normalization layers and with the mean of all clients' (what FedAvg would hold)."""
    for grid in ("noniid1", "noniid2"):
        directory = records / "cifar10-pfedla" / grid / "fedbn"
        own, mean, spread = [], [], []
        for seed, doc in _runs(directory).items():
            if (run := _run_dir(directory, seed)) is None:
                print(f"  {directory.relative_to(RECORDS)}/seed{seed}: its final models are not here (results-dir); skipped")
                continue
            o, m, s = own_and_averaged(_settings(doc), doc["num-clients"], run)
            own, mean, spread = own + o, mean + m, spread + [s]
        if own:
            print(f"\n## FedBN, {grid}: with its own normalization layers {np.mean(own):.4f}, with all clients' mean {np.mean(mean):.4f} "
                  f"(mean over clients and seeds); clients' running means differ by {np.mean(spread):.1%} of their norm (std over clients)")  # fmt: skip


def federico(records: Path) -> None:
    for suite, grid in [(s, p.name) for s in (records / "cifar10-federico", records / "federico-mnist") for p in sorted(s.glob("groups*")) if p.is_dir()]:
        runs = _runs(suite / grid / "federico")
        if not runs:
            continue
        own_group, top_mean, top_sum = [], [], []
        for doc in runs.values():
            settings = _settings(doc)
            fi = federated_indices(settings, doc["num-clients"])
            for i, w in doc["rounds"][-1]["collaboration-weights"].items():
                ids = np.array([int(j) for j in w])
                v = np.array(list(w.values()), dtype=np.float64)
                own_group.append(v[fi.groups[ids] == fi.groups[int(i)]].sum())
                top_mean.append(v.max())
                log = len(fi.train[int(i)]) * np.log(v)  # the sum over n samples: w ∝ w_mean ** n
                top_sum.append(np.exp(log - log.max()).max() / np.exp(log - log.max()).sum())
        print(f"\n## FedeRiCo, {suite.name} {grid}: weight on its own label group {_fmt(own_group)} (mean over clients and seeds); "
              f"largest weight: {np.mean(top_mean):.3f} with the mean loss, {np.mean(top_sum):.3f} with the summed log-likelihood")  # fmt: skip
        local = _runs(suite / grid / "local")
        print(f"  per seed: federico - local {_paired(runs, local)}, fedfomo - local {_paired(_runs(suite / grid / 'fedfomo'), local)}")
        for label in sorted(p.name for p in (suite / grid).iterdir() if p.is_dir()):
            print(f"  {label:9} per round: " + " ".join(f"{a:.3f}" for a in _per_round(_runs(suite / grid / label)).values()))


def doublehead(records: Path) -> None:
    for grid in (records / "cifar10-doublehead" / "groups5", records / "doublehead-mnist" / "groups5"):
        if (grid / "doublehead").is_dir():
            doublehead_grid(grid)


def doublehead_grid(grid: Path) -> None:
    rows = {label: _runs(grid / label) for label in ("fedavg", "local", "doublehead", *sorted(p.name for p in grid.glob("doublehead-gradual*")))}
    if not rows["doublehead"]:
        return
    print(f"\n## Double head, {grid.parent.name}, 5 label groups")
    full = np.mean([d["final"]["bytes-down"] + d["final"]["bytes-up"] for d in rows["doublehead"].values()])
    for label, runs in rows.items():
        if not runs:
            continue
        mib = np.mean([d["final"]["bytes-down"] + d["final"]["bytes-up"] for d in runs.values()])
        print(f"{label}: local {_fmt([d['final']['accuracy'] for d in runs.values()])}, global {_fmt([d['final']['global-accuracy'] for d in runs.values()])}, "
              f"{mib / 2**20:.1f} MiB ({mib / full:.0%} of the double head's)")  # fmt: skip
        if label.startswith("doublehead"):
            heads(grid / label, runs)
    print("mean local accuracy of the last round by which a run has sent at most (down + up):")
    for label, runs in rows.items():
        reached = []
        for d in runs.values():
            cum = np.cumsum([r["bytes-down"] + r["bytes-up"] for r in d["rounds"]]) / 2**20
            acc = [r["accuracy"] for r in d["rounds"]]
            if cum[-1] > 0:
                reached.append([acc[np.searchsorted(cum, t, side="right") - 1] if cum[0] <= t else np.nan for t in CUMULATIVE_MIB])
        if reached:
            print(f"  {label}: " + ", ".join(f"{t} MiB {a:.3f}" for t, a in zip(CUMULATIVE_MIB, np.mean(reached, axis=0))))


def heads(directory: Path, runs: dict[int, dict]) -> None:
    """Share of local-test predictions the local head decides; each head's accuracy alone."""
    decided, alone = [], {"global head, local test": [], "global head, global test": [], "local head, local test": []}
    for seed, doc in runs.items():
        if (run := _run_dir(directory, seed)) is None:
            continue
        settings = _settings(doc)
        n = doc["num-clients"]
        model = build_model(settings, settings.image_shape, 10, settings.seed).eval()
        shared = torch.load(run / "checkpoint.pt", weights_only=False)["strategy"]["global"]
        shared = shared if isinstance(shared, dict) else from_record(shared)
        union = global_test(settings, n)
        for c in range(n):
            personal = from_record(decode(newest_saved(run / "client-state", c).read_bytes())["personal"])
            model.load_state_dict(personal)
            model.load_state_dict({k: v for k, v in shared.items() if k in personal}, strict=False)
            test = client_data(settings, c, n)[1]
            with torch.no_grad():
                g, loc = model.heads(test.x)
                decided.append(float((torch.cat([g.softmax(1), loc.softmax(1)], 1).argmax(1) >= g.shape[1]).float().mean()))
                alone["global head, local test"].append(float((g.argmax(1) == test.y).float().mean()))
                alone["local head, local test"].append(float((loc.argmax(1) == test.y).float().mean()))
                alone["global head, global test"].append(float((model.heads(union.x)[0].argmax(1) == union.y).float().mean()))
    if not decided:
        print(f"  {directory.relative_to(RECORDS)}: its final models are not here (results-dir); which head decides is skipped")
        return
    print(
        f"  the local head decides {np.mean(decided):.1%} of the local-test predictions; alone: " + ", ".join(f"{k} {np.mean(v):.3f}" for k, v in alone.items())
    )


def _cosine_squared(directory: Path, runs: dict[int, dict]) -> list[float]:
    """cos²(w_g, w_l) per client: the final global federated weights against each client's local
    weights (all their parameters as one vector, as the training term takes them)."""
    out = []
    for seed, doc in runs.items():
        if (run := _run_dir(directory, seed)) is None:
            continue
        shared = torch.load(run / "checkpoint.pt", weights_only=False)["strategy"]["global"]
        shared = shared if isinstance(shared, dict) else from_record(shared)
        for c in range(doc["num-clients"]):
            if (saved := newest_saved(run / "client-state", c)) is None:
                continue
            personal = from_record(decode(saved.read_bytes())["personal"])
            names = [k[len("local.") :] for k, v in personal.items() if k.startswith("local.") and v.is_floating_point() and "running" not in k]
            out.append(float(cosine_squared([shared[f"fed.{k}"] for k in names], [personal[f"local.{k}"] for k in names])))
    return out


def superfed(records: Path) -> None:
    suites = ("cifar10-superfed", "cifar10-superfed-checks", "cifar10-superfed-long", "superfed-mnist", "superfed-mnist-noise")
    grids = [p for suite in suites if (records / suite).is_dir() for p in sorted((records / suite).iterdir()) if p.is_dir()]
    for grid in grids:
        print(f"\n## SuPerFed, {grid.parent.name} grid {grid.name}: mean accuracy at each evaluated round")
        for method in sorted(p for p in grid.iterdir() if p.is_dir()):
            runs = _runs(method)
            if not runs:
                continue
            print(f"  {method.name:16} " + " ".join(f"{k}: {a:.3f}" for k, a in _per_round(runs).items()))
        for method in sorted(grid.glob("*-classifier")):
            if (base := _runs(grid / method.name.removesuffix("-classifier"))) and (runs := _runs(method)):
                print(f"  {method.name} minus {method.name.removesuffix('-classifier')} per seed: {_paired(runs, base)}")
        for rep, per in (("fedrep", "fedper"), ("fedrep-classifier", "fedper-classifier"), ("fedprox", "fedavg"), ("scaffold", "fedavg")):
            if (a := _runs(grid / rep)) and (b := _runs(grid / per)):
                print(f"  {rep} minus {per} per seed: {_paired(a, b)}")
        for label in ("superfed-mm", "superfed-lm", "superfed-mm-nu0"):
            runs = _runs(grid / label)
            if not runs:
                continue
            curves = np.array([d["rounds"][-1]["lambda-curve"] for d in runs.values()])
            inner = curves[:, 1:-1].max(axis=1)
            chosen = np.concatenate([list(d["rounds"][-1]["lambda-chosen"].values()) for d in runs.values()])
            print(f"  {label}: federated model (λ = 0) {_fmt(curves[:, 0])}, local model (λ = 1) {_fmt(curves[:, -1])}, "
                  f"best λ in (0, 1) {_fmt(inner)}; at each client's held-out λ {_fmt([d['final']['accuracy'] for d in runs.values()])}, "
                  f"at its test-chosen λ {_fmt([d['final']['oracle-accuracy'] for d in runs.values()])}")  # fmt: skip
            print("    mean accuracy along the line (λ = 0, 0.1, ..., 1): " + " ".join(f"{a:.3f}" for a in curves.mean(axis=0)))
            above_worse = (curves[:, 1:-1] >= np.minimum(curves[:, :1], curves[:, -1:])).all(axis=1)
            above_both = (curves[:, 1:-1] > np.maximum(curves[:, :1], curves[:, -1:])).sum(axis=1)
            print(
                f"    runs where every interior λ is at least the worse end: {int(above_worse.sum())} of {len(curves)}; "
                f"interior λs above both ends, per run: {' / '.join(str(int(n)) for n in above_both)} of {curves.shape[1] - 2}"
            )
            if cos := _cosine_squared(grid / label, runs):
                print(f"    cos²(final global w_f, each client's w_l): mean {np.mean(cos):.2e}, largest {np.max(cos):.2e}")
            for other in sorted(p.name for p in grid.iterdir() if p.is_dir() and p.name != label):
                if base := _runs(grid / other):
                    print(f"    minus {other} per seed: at the held-out λ {_paired(runs, base)}, at the test-chosen λ {_paired(runs, base, 'oracle-accuracy')}")
            print(
                "    held-out λ chosen by the clients: " + ", ".join(f"{lam:g} × {int((chosen == lam).sum())}" for lam in LAMBDA_GRID if (chosen == lam).any())
            )


def main() -> None:
    global RECORDS, RESULTS, DATA_ROOT
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=Path, default=RECORDS, help="the runs' records (default: bench/records)")
    p.add_argument("--results", type=Path, default=RESULTS, help="the runs' results-dirs, for what needs their final models (default: bench/results)")
    p.add_argument(
        "--data-root", type=Path, help="the folder of the suites' data folders, for what reads the data (default: $PFLOWER_DATA, else ~/pflower-data)"
    )
    args = p.parse_args()
    RECORDS, RESULTS, DATA_ROOT = args.records.resolve(), args.results.resolve(), args.data_root
    pfedla(RECORDS)
    fedbn(RECORDS)
    federico(RECORDS)
    doublehead(RECORDS)
    superfed(RECORDS)


if __name__ == "__main__":
    main()
