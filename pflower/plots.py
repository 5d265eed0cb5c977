"""Figures drawn from metrics.json (matplotlib, Agg backend: no display needed).

Runs draw their figures when they finish; ``pflower-plot DIR...`` redraws them from the
metrics.json files of finished runs, and ``pflower-compare DIR... -o FILE`` draws several runs'
accuracy against the bytes they sent on one figure.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from pflower import help_text
from pflower.similarity import group_order


def _pyplot():
    """matplotlib.pyplot on the Agg backend, imported on first use (0.8 s that ClientApps,
    which import this module through the strategies, need not pay)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(rounds: list[dict[str, Any]], path: Path, title: str) -> None:
    """Mean and sample-weighted accuracy per round."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    rounds = [r for r in rounds if r.get("accuracy") is not None]  # the evaluated rounds
    x = [r["round"] for r in rounds]
    ax.plot(x, [r["accuracy"] for r in rounds], marker="o", ms=3, label="mean over clients")
    ax.plot(x, [r["weighted-accuracy"] for r in rounds], ls="--", label="sample-weighted")
    ax.set(xlabel="round", ylabel="test accuracy (personalized)", title=title, ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def alpha_array(alpha: dict[str, list[list[float]]]) -> np.ndarray:
    """metrics.json's ``alpha`` (client -> layer -> weights over clients) as [N, L, N]."""
    return np.array([alpha[str(i)] for i in range(len(alpha))])


def plot_alpha_heatmaps(alpha: np.ndarray, path: Path, title: str, order: list[int] | None = None,
                        ratios: list[float | None] | None = None) -> None:  # fmt: skip
    """One client x client heatmap per layer: row i holds the weights client i gives to each j.

    ``order`` lists the clients in the order to draw them (e.g. by class set, so that groups of
    alike clients form blocks); ``ratios`` (same-classes / disjoint-classes weight, per layer)
    go into the panel titles. The colour scale spans the weights' own range (shared by all
    layers), so structure shows even while the weights are still close to uniform.
    """
    n, num_layers, _ = alpha.shape
    order = list(range(n)) if order is None else order
    plt = _pyplot()
    fig, axes = plt.subplots(1, num_layers, figsize=(3.2 * num_layers + 1, 3.4), squeeze=False)
    for l, ax in enumerate(axes[0]):
        im = ax.imshow(alpha[np.ix_(order, [l], order)][:, 0, :], vmin=alpha.min(), vmax=alpha.max(), cmap="viridis")
        ratio = "" if not ratios or ratios[l] is None else f"\nsame/disjoint {ratios[l]:.2f}"
        ax.set(title=f"layer {l + 1}{ratio}", xlabel="weight on client j", ylabel="client i" if l == 0 else None)
        ax.set_xticks(range(n), [str(c) for c in order]), ax.set_yticks(range(n), [str(c) for c in order])
        ax.tick_params(labelsize=6)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    fig.suptitle(title)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_alpha_evolution(rounds: list[int], alpha: np.ndarray, client: int, path: Path, title: str) -> None:
    """The weights one client gives every other client, per layer, over rounds (alpha [R, L, N])."""
    _, num_layers, n = alpha.shape
    plt = _pyplot()
    fig, axes = plt.subplots(1, num_layers, figsize=(3.2 * num_layers, 3.2), sharey=True, squeeze=False)
    for l, ax in enumerate(axes[0]):
        for j in range(n):
            ax.plot(rounds, alpha[:, l, j], lw=2.5 if j == client else 1, label=f"client {j}")
        ax.set(title=f"layer {l + 1}", xlabel="round", ylabel=f"weight of client {client}" if l == 0 else None)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1, 1))
    fig.suptitle(title, y=1.04)  # above the panels' titles (the saved box grows to hold it)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_lambda_curves(rounds: list[dict[str, Any]], path: Path, title: str) -> None:
    """Mean test accuracy versus lambda (0: federated model, 1: local model), a few rounds."""
    rows = [r for r in rounds if "lambda-curve" in r]
    picks = sorted({rows[0]["round"], rows[len(rows) // 2]["round"], rows[-1]["round"]})
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for r in rows:
        if r["round"] in picks:
            grid = np.linspace(0, 1, len(r["lambda-curve"]))
            ax.plot(grid, r["lambda-curve"], marker="o", ms=3, label=f"round {r['round']}")
    ax.set(xlabel="lambda (0 = federated, 1 = local)", ylabel="mean test accuracy", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def weight_matrix(weights: dict[str, dict[str, float]]) -> np.ndarray:
    """FedeRiCo's ``collaboration-weights`` of one round as a client x client matrix (0 where untracked)."""
    n = 1 + max(int(k) for row in weights.values() for k in [*row, *weights])
    w = np.zeros((n, n))
    for i, row in weights.items():
        for j, v in row.items():
            w[int(i), int(j)] = v
    return w


def plot_collaboration(w: np.ndarray, path: Path, title: str) -> None:
    """Row i: client i's weights over the clients whose models it tracks (the paper's Fig. 3)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 4.3))
    im = ax.imshow(w, cmap="viridis", vmin=0, vmax=max(float(w.max()), 1e-9))
    ax.set(xlabel="collaborator j", ylabel="client i", title=title, xticks=range(len(w)), yticks=range(len(w)))
    fig.colorbar(im, ax=ax, label="w_ij")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: The partition figure's widest (inches) and most client labels: a bar per client, 0.45 in each
#: up to that width (at 1000 clients the uncapped figure was 54,000 pixels wide: 110 MB to draw).
PARTITION_MAX_WIDTH, PARTITION_MAX_LABELS = 24.0, 50


def plot_partition(counts: dict[str, list[int]], path, title: str, domains: dict[str, str] | None = None) -> None:
    """Who holds which labels: per client a bar of its samples, stacked by class (``counts``:
    client -> samples per class); each client's domain, if any, under its bar."""
    plt = _pyplot()
    clients = sorted(counts, key=int)
    c = np.array([counts[k] for k in clients], dtype=np.float64)
    n, k = c.shape
    fig, ax = plt.subplots(figsize=(min(max(5.0, 0.45 * n + 2.5), PARTITION_MAX_WIDTH), 4.2 + (0.9 if domains else 0)))
    cmap = plt.get_cmap("tab10" if k <= 10 else "tab20" if k <= 20 else "viridis")
    bottom = np.zeros(n)
    for j in range(k):
        colour = cmap(j) if k <= 20 else cmap(j / max(1, k - 1))
        ax.bar(range(n), c[:, j], bottom=bottom, color=colour, width=0.8, label=str(j) if k <= 20 else None)
        bottom += c[:, j]
    labels = [f"{cl}\n{domains.get(cl, '')}" if domains else cl for cl in clients]
    step = -(-n // PARTITION_MAX_LABELS)  # every client's label while they fit, else every step-th
    ax.set_xticks(range(0, n, step), labels[::step], rotation=90 if domains else 0, fontsize=7 if domains else 8)
    ax.set(xlabel="client", ylabel="samples (train + test)", title=title)
    if k <= 20:
        ax.legend(title="class", fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_run(doc: dict[str, Any], directory: Path) -> list[Path]:
    """Every figure one run's metrics support: accuracy per round, the partition (labels per
    client, and domains) and the method's mechanism figures (:func:`draw_mechanisms`)."""
    cfg, rounds = doc["config"], doc["rounds"]
    name = cfg.get("method") or doc.get("strategy", "run")
    drawn = [directory / "accuracy.png"]
    plot_accuracy(rounds, drawn[0], title=f"{name} on {cfg['dataset']}" if "dataset" in cfg else name)
    if doc.get("client-label-counts"):
        drawn.append(directory / "partition.png")
        shift = f", feature shift {cfg['feature-shift']}" if cfg.get("feature-shift", "none") != "none" else ""
        plot_partition(
            doc["client-label-counts"], drawn[-1], f"{cfg.get('dataset', '')}: partition '{cfg.get('partition', '')}'{shift}", doc.get("client-domains")
        )
    return drawn + draw_mechanisms(doc, directory)


def draw_mechanisms(doc: dict[str, Any], directory: Path, prefix: str = "") -> list[Path]:
    """The figures of what a method learns, from a run's metrics.json or its record: pFedLA's
    weights (the last round's, and client 0's over the rounds), SuPerFed's accuracy against
    lambda, FedeRiCo's collaboration weights; each file named ``prefix`` + its kind."""
    cfg, rounds = doc["config"], doc["rounds"]
    name = cfg.get("method") or doc.get("strategy", "run")
    drawn = []
    with_alpha = [r for r in rounds if "alpha" in r]
    if with_alpha:
        last = with_alpha[-1]
        drawn.append(directory / f"{prefix}alpha-heatmap.png")
        classes, n = doc.get("client-classes") or {}, len(last["alpha"])
        order = group_order([classes[str(i)] for i in range(n)]) if all(str(i) in classes for i in range(n)) else None
        ratios = last.get("alpha-structure", {}).get("ratio")
        caption = " (clients ordered by class set)" if order else ""
        plot_alpha_heatmaps(alpha_array(last["alpha"]), drawn[-1], f"{name}: aggregation weights, round {last['round']}{caption}", order, ratios)
        of_0 = [r for r in with_alpha if "0" in r["alpha"]]
        if len(of_0) > 1:  # a record made before records kept client 0's weights has the last round's only
            drawn.append(directory / f"{prefix}alpha-evolution.png")
            plot_alpha_evolution([r["round"] for r in of_0], np.stack([r["alpha"]["0"] for r in of_0]), 0, drawn[-1], f"{name}: weights of client 0")
    if any("lambda-curve" in r for r in rounds):
        drawn.append(directory / f"{prefix}lambda.png")
        plot_lambda_curves(rounds, drawn[-1], f"{name} ({cfg.get('superfed.mixing', '')} mixing): accuracy vs lambda")
    with_w = [r for r in rounds if r.get("collaboration-weights")]
    if with_w:
        drawn.append(directory / f"{prefix}collaboration-weights.png")
        plot_collaboration(weight_matrix(with_w[-1]["collaboration-weights"]), drawn[-1], f"{name}: weights, round {with_w[-1]['round']}")
    return drawn


def main(argv: list[str] | None = None) -> int:
    p = help_text.parser("pflower-plot", "Redraw the figures of finished runs.")
    p.add_argument("results_dirs", nargs="+", type=Path, help="results-dir of a run (holds metrics.json)")
    args = p.parse_args(argv)
    for d in args.results_dirs:
        path = d / "metrics.json"
        if not path.is_file():
            p.error(f"{path}: no such file")
        for fig in draw_run(json.loads(path.read_text()), d):
            print(fig)
    return 0


#: Markers and line styles that tell apart the lines a colour cycle (10 colours) repeats.
MARKERS, LINESTYLES = "osD^", ("-", "--", ":", "-.")


def line_style(i: int) -> dict[str, str]:
    """The ``i``-th line's colour, marker and line style: no two of the first 40 alike."""
    return {"color": f"C{i % 10}", "marker": MARKERS[i // 10 % 4], "linestyle": LINESTYLES[i // 10 % 4]}


def mean_series(docs: list[dict[str, Any]], metric: str = "accuracy") -> tuple[list[int], np.ndarray, np.ndarray]:
    """The rounds in which every run of ``docs`` has ``metric`` (an evaluated round), and per
    such round the mean over the runs of the cumulative MiB sent (down + up) and of ``metric``."""
    by_round = [{r["round"]: r for r in d["rounds"] if r.get(metric) is not None} for d in docs]
    rounds = sorted(set.intersection(*(set(b) for b in by_round)))
    mib = np.array([[(b[k]["cumulative-bytes-down"] + b[k]["cumulative-bytes-up"]) / 2**20 for k in rounds] for b in by_round]).reshape(len(docs), -1)
    values = np.array([[b[k][metric] for k in rounds] for b in by_round], dtype=np.float64).reshape(len(docs), -1)
    return rounds, mib.mean(0), values.mean(0)


def _finish(fig, ax, path: Path, title: str, lines: int) -> None:
    ax.set_title(textwrap.fill(title, 80), fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if lines > 6 else 1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_mean_accuracy(runs: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    """Per method, the mean over its seeds of the final-mean accuracy in each evaluated round."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (label, docs) in enumerate(runs.items()):
        rounds, _, acc = mean_series(docs)
        ax.plot(rounds, acc, ms=2.5, label=label, **line_style(i))
    ax.set(xlabel="round", ylabel="test accuracy (mean over clients and seeds)")
    _finish(fig, ax, path, title, len(runs))
    plt.close(fig)


def run_label(doc: dict[str, Any]) -> str:
    """A run's legend entry: its method, and its gradual-sharing interval if any."""
    cfg = doc["config"]
    label = cfg["method"]
    if cfg.get("gradual-interval"):
        label += f" + gradual ({cfg['gradual-interval']})"
    return label


def plot_comparison(runs: dict[str, list[dict[str, Any]]], path: Path, metric: str = "accuracy") -> None:
    """``metric`` per evaluated round against the cumulative bytes (down + up, MiB) sent until
    then, each the mean over a label's runs (its seeds)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (label, docs) in enumerate(runs.items()):
        _, mib, values = mean_series(docs, metric)
        ax.plot(mib, values, ms=2.5, label=label, **line_style(i))
    ax.set(xlabel="cumulative bytes, down + up (MiB)", ylabel=f"test {metric}")
    seeds = " (mean over each method's seeds)" if any(len(d) > 1 for d in runs.values()) else ""
    _finish(fig, ax, path, f"{metric} against communication{seeds}", len(runs))
    plt.close(fig)


def compare_main(argv: list[str] | None = None) -> int:
    p = help_text.parser("pflower-compare", "Draw several runs' accuracy against cumulative bytes on one figure.")
    p.add_argument("results_dirs", nargs="+", type=Path, help="results-dir of a run (holds metrics.json)")
    p.add_argument("-o", "--output", type=Path, required=True, help="the figure to write (.png, .pdf, .svg)")
    p.add_argument("--metric", default="accuracy", help="a per-round metric, e.g. 'accuracy' or 'global-accuracy' (default: accuracy)")
    args = p.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {}
    for d in args.results_dirs:
        path = d / "metrics.json"
        if not path.is_file():
            p.error(f"{path}: no such file")
        doc = json.loads(path.read_text())
        if not any("cumulative-bytes-down" in r for r in doc["rounds"]):
            p.error(f"{path}: no cumulative bytes (written by an older pflower)")
        if not any(r.get(args.metric) is not None for r in doc["rounds"]):
            p.error(f"{path}: no '{args.metric}' in its rounds (for 'global-accuracy' run with test-mode='both')")
        label = run_label(doc)
        runs[label if label not in runs else f"{label} ({d.name})"] = [doc]
    plot_comparison(runs, args.output, args.metric)
    print(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
