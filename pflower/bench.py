"""The benchmark harness: grids of (method x partition x seed) through the real Flower simulation.

``pflower-bench SUITE`` reads the suite from ``bench/suites.toml``, runs every run that has not
finished yet (a run is finished when its results-dir holds a metrics.json with all its rounds,
so an interrupted suite resumes where it stopped), then writes per grid a Markdown and a CSV
table (mean +- std over seeds of the final mean and weighted accuracy, total bytes, wall time),
the accuracy-per-round and accuracy-vs-bytes figures, and with ``--readme`` replaces the
suite's block in the README (between ``<!-- bench:SUITE:start -->`` and ``...:end -->``).
"""

from __future__ import annotations

import argparse
import csv
import json
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.config import flatten_dict

from pflower.config import ConfigError, load_settings
from pflower.launcher import simulation_superlink, submit
from pflower.plots import plot_comparison, plot_mean_accuracy

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Run:
    grid: str
    label: str
    seed: int
    clients: int
    config: dict[str, Any]

    def directory(self, results: Path, suite: str) -> Path:
        return results / suite / self.grid / self.label / f"seed{self.seed}"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return "'" + v.replace("'", "") + "'"
    return repr(v)


def run_config_string(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={_toml_value(v)}" for k, v in config.items())


def load_suite(path: Path, name: str) -> tuple[dict, list[Run]]:
    """The suite ``name`` of ``path`` and its runs, in order."""
    suites = tomllib.loads(path.read_text())
    if name not in suites:
        raise SystemExit(f"suite '{name}' not in {path}; it has: {', '.join(suites)}")
    suite = suites[name]
    common = dict(suite.get("common", {}))
    if "data-dir" in common and not Path(common["data-dir"]).is_absolute():
        common["data-dir"] = str((path.parent / common["data-dir"]).resolve())
    runs = []
    for grid in suite["grid"]:
        for entry in grid["methods"]:
            entry = {"method": entry} if isinstance(entry, str) else dict(entry)
            label = entry.pop("label", entry["method"])
            for seed in suite.get("seeds", [0]):
                config = flatten_dict({**common, **grid.get("config", {}), **entry, "seed": seed})
                runs.append(Run(grid["name"], label, seed, int(grid.get("clients", 10)), config))
    return suite, runs


def finished(directory: Path, rounds: int) -> bool:
    path = directory / "metrics.json"
    if not path.is_file():
        return False
    doc = json.loads(path.read_text())
    return len(doc.get("rounds", [])) >= rounds and (directory / "bench.json").is_file()


def execute(runs: list[Run], results: Path, suite: str) -> None:
    """Run what is not finished on one private simulation SuperLink."""
    todo = [r for r in runs if not finished(r.directory(results, suite), int(r.config.get("num-server-rounds", 20)))]
    for run in todo:  # every run's config is checked before the first one starts
        try:
            load_settings(dict(run.config))
        except ConfigError as err:
            raise SystemExit(f"run {run.grid}/{run.label}/seed{run.seed}: {err}") from None
    print(f"{len(runs) - len(todo)} of {len(runs)} runs already finished; running {len(todo)}", flush=True)
    if not todo:
        return
    home = results / suite / ".flwr-home"  # per suite: two suites may run at once
    with simulation_superlink(home):
        for k, run in enumerate(todo, 1):
            d = run.directory(results, suite)
            d.mkdir(parents=True, exist_ok=True)
            config = run_config_string({**run.config, "results-dir": str(d)})
            print(f"[{k}/{len(todo)}] {run.grid} / {run.label} / seed {run.seed}", flush=True)
            t0 = time.perf_counter()
            _, status, log = submit(ROOT, home, config, num_clients=run.clients, echo=False)
            wall = time.perf_counter() - t0
            (d / "run.log").write_text(log)
            if status != "finished:completed":
                raise SystemExit(f"run {run.grid}/{run.label}/seed{run.seed} ended '{status}'; log in {d / 'run.log'}")
            (d / "bench.json").write_text(json.dumps({"wall-seconds": wall, "clients": run.clients}))
            print(f"    done in {wall:.0f} s", flush=True)


def _mean_std(values: list[float]) -> str:
    a = np.array(values, dtype=np.float64)
    return f"{a.mean():.4f}" if len(a) == 1 else f"{a.mean():.4f} ± {a.std(ddof=1):.4f}"


def grid_rows(runs: list[Run], results: Path, suite: str) -> list[dict[str, Any]]:
    """One row per method label of a grid: its runs' final figures over seeds."""
    rows = []
    for label in dict.fromkeys(r.label for r in runs):
        docs = [(json.loads((r.directory(results, suite) / "metrics.json").read_text()),
                 json.loads((r.directory(results, suite) / "bench.json").read_text())) for r in runs if r.label == label]  # fmt: skip
        final = [d["final"] for d, _ in docs]
        row = {
            "method": label,
            "seeds": len(docs),
            "accuracy": [f["accuracy"] for f in final],
            "weighted-accuracy": [f["weighted-accuracy"] for f in final],
            "mb": np.mean([(f["bytes-down"] + f["bytes-up"]) / 2**20 for f in final]),
            "wall-s": np.mean([b["wall-seconds"] for _, b in docs]),
            "docs": [d for d, _ in docs],
        }
        if all("global-accuracy" in f for f in final):
            row["global-accuracy"] = [f["global-accuracy"] for f in final]
        if all("oracle-accuracy" in f for f in final):
            row["oracle-accuracy"] = [f["oracle-accuracy"] for f in final]
        rows.append(row)
    return rows


def ordering_sentence(rows: list[dict[str, Any]], paper_order: list[str]) -> str:
    """Whether our ordering of the paper's methods (best first) is the paper's."""
    ours = {r["method"]: float(np.mean(r["accuracy"])) for r in rows}
    common = [m for m in paper_order if m in ours]
    if len(common) < 2:
        return ""
    ranked = sorted(common, key=lambda m: -ours[m])
    if ranked == common:
        return f"Our ordering ({' > '.join(ranked)}) agrees with the paper's."
    return f"Our ordering ({' > '.join(ranked)}) differs from the paper's ({' > '.join(common)})."


def markdown(grid: dict, rows: list[dict[str, Any]]) -> str:
    has_global = all("global-accuracy" in r for r in rows)
    has_oracle = any("oracle-accuracy" in r for r in rows)
    head = ["method", "final mean acc.", "weighted acc."] + (["global acc."] if has_global else [])
    head += (["acc. at test-chosen λ"] if has_oracle else []) + ["MiB (down + up)", "wall s", "seeds"]
    lines = [f"#### {grid.get('title', grid['name'])}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["method"], _mean_std(r["accuracy"]), _mean_std(r["weighted-accuracy"])]
        cells += [_mean_std(r["global-accuracy"])] if has_global else []
        cells += [_mean_std(r["oracle-accuracy"]) if "oracle-accuracy" in r else "—"] if has_oracle else []
        cells += [f"{r['mb']:.1f}", f"{r['wall-s']:.0f}", str(r["seeds"])]
        lines.append("| " + " | ".join(cells) + " |")
    paper = grid.get("paper", {})
    if paper.get("text"):
        lines += ["", f"Paper: {paper['text']}"]
    if sentence := ordering_sentence(rows, paper.get("order", [])):
        lines += ["", sentence]
    return "\n".join(lines) + "\n"


def report(suite_name: str, suite: dict, runs: list[Run], results: Path, readme: Path | None) -> str:
    """Tables (Markdown, CSV) and figures per grid; the Markdown of the whole suite."""
    out_dir = results / suite_name
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(out_dir / "table.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["grid", "method", "seeds", "accuracy-mean", "accuracy-std", "weighted-mean", "global-mean", "mib", "wall-s"])
        for grid in suite["grid"]:
            rows = grid_rows([r for r in runs if r.grid == grid["name"]], results, suite_name)
            if not rows:
                continue
            for r in rows:
                acc = np.array(r["accuracy"])
                writer.writerow([grid["name"], r["method"], r["seeds"], f"{acc.mean():.4f}", f"{acc.std(ddof=1) if len(acc) > 1 else 0:.4f}",
                                 f"{np.mean(r['weighted-accuracy']):.4f}", f"{np.mean(r['global-accuracy']):.4f}" if "global-accuracy" in r else "",
                                 f"{r['mb']:.2f}", f"{r['wall-s']:.1f}"])  # fmt: skip
            figure = out_dir / f"{grid['name']}-accuracy.png"
            plot_mean_accuracy({r["method"]: r["docs"] for r in rows}, figure, grid.get("title", grid["name"]))
            plot_comparison({r["method"]: r["docs"][0] for r in rows}, out_dir / f"{grid['name']}-bytes.png")
            parts.append(markdown(grid, rows))
    text = "\n".join(parts)
    (out_dir / "table.md").write_text(text)
    if readme is not None:
        start, end = f"<!-- bench:{suite_name}:start -->", f"<!-- bench:{suite_name}:end -->"
        content = readme.read_text()
        if start not in content or end not in content:
            raise SystemExit(f"{readme} has no '{start}' ... '{end}' block")
        head, rest = content.split(start, 1)
        readme.write_text(head + start + "\n" + text + rest[rest.index(end) :])
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pflower-bench", description="Run a benchmark suite (resumable) and build its tables and figures.")
    p.add_argument("suite", help="a suite of the suite file, e.g. 'small' or 'full'")
    p.add_argument("--file", type=Path, default=ROOT / "bench" / "suites.toml", help="suite file (default: bench/suites.toml)")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results", help="where run results go (default: bench/results)")
    p.add_argument("--readme", type=Path, help="replace the suite's block in this README with the tables")
    p.add_argument("--report-only", action="store_true", help="build tables and figures from the runs finished so far (the seeds column says how many)")
    args = p.parse_args(argv)
    suite, runs = load_suite(args.file, args.suite)
    results = args.results.resolve()
    if args.report_only:
        runs = [r for r in runs if finished(r.directory(results, args.suite), int(r.config.get("num-server-rounds", 20)))]
    else:
        execute(runs, results, args.suite)
    print(report(args.suite, suite, runs, results, args.readme))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
