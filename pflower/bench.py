"""The benchmark harness: grids of (method x partition x seed) through the real Flower simulation.

``pflower-bench SUITE`` reads the suite from ``bench/suites.toml`` and runs every run that has
no record yet. Each finished run leaves a compact record, ``bench/records/SUITE/GRID/LABEL/seedK.json``
(its config, per-round accuracy and bytes, final metrics, the mechanism figures of its last
round; no checkpoint or model), committed with the tables it produced; a run's full results-dir
(``bench/results``, not kept) holds its checkpoint and logs. An interrupted suite resumes at the
first run without a record. The report is built from the records alone: per grid a Markdown and
a CSV table (mean +- std over seeds of the final mean and weighted accuracy, total bytes, wall
time) and the accuracy-per-round and accuracy-vs-bytes figures, written into the docs page that
holds the suite's block (between ``<!-- bench:SUITE:start -->`` and ``...:end -->``; once every
grid has records) with the figures in ``figures/SUITE/`` beside that page. ``--report-only`` on a fresh clone rebuilds them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.config import flatten_dict

from pflower.config import ConfigError, load_settings
from pflower.fetch import DATA_ENV, DATASETS, data_root
from pflower.launcher import simulation_superlink, submit
from pflower.methods import declarations
from pflower.plots import plot_comparison, plot_mean_accuracy
from pflower.results import write_json
from pflower.run_folder import clear_run

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "records"
DOCS = ROOT / "docs"
#: Per-round entries too large to keep for every round: a record keeps them for the last round
#: that has them (the figures of the final state need no more).
LAST_ROUND_ONLY = ("alpha",)


@dataclass(frozen=True)
class Run:
    grid: str
    label: str
    seed: int
    clients: int
    config: dict[str, Any]

    def directory(self, results: Path, suite: str) -> Path:
        return results / suite / self.grid / self.label / f"seed{self.seed}"

    def record(self, records: Path, suite: str) -> Path:
        return records / suite / self.grid / self.label / f"seed{self.seed}.json"

    @property
    def rounds(self) -> int:
        return int(self.config.get("num-server-rounds", 20))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return "'" + v.replace("'", "") + "'"
    return repr(v)


def run_config_string(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={_toml_value(v)}" for k, v in config.items())


def load_suite(path: Path, name: str, data: Path | None = None) -> tuple[dict, list[Run]]:
    """The suite ``name`` of ``path`` and its runs, in order; a relative ``data-dir`` is a folder
    under the data root :func:`data_root` (``data``)."""
    suites = tomllib.loads(path.read_text())
    if name not in suites:
        raise SystemExit(f"suite '{name}' not in {path}; it has: {', '.join(suites)}")
    suite = suites[name]
    common = dict(suite.get("common", {}))
    if "data-dir" in common and not Path(common["data-dir"]).is_absolute():
        common["data-dir"] = str(data_root(data) / common["data-dir"])
    runs = []
    for grid in suite["grid"]:
        if grid.get("examples"):  # every declared method with its declaration's example keys
            grid["methods"] = [{"label": m.name, "method": m.name, **m.example} for m in declarations().values()]
        for entry in grid["methods"]:
            entry = {"method": entry} if isinstance(entry, str) else dict(entry)
            label = entry.pop("label", entry["method"])
            for seed in suite.get("seeds", [0]):
                config = flatten_dict({**common, **grid.get("config", {}), **entry, "seed": seed})
                runs.append(Run(grid["name"], label, seed, int(grid.get("clients", 10)), config))
    return suite, runs


def machine() -> dict[str, Any]:
    """What ran a record's run: CPU model and count, GPU if any, Python, torch and flwr versions."""
    import flwr
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "cpu": cpu,
        "cpus": len(os.sched_getaffinity(0)),
        "gpus": gpus,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "flwr": flwr.__version__,
    }


def make_record(metrics: dict[str, Any], wall_seconds: float, clients: int, machine_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run's compact record from its metrics.json: everything but the per-round entries of
    :data:`LAST_ROUND_ONLY` before the last round that has them, plus the bench's wall time and
    the machine that ran it."""
    rounds = [dict(r) for r in metrics["rounds"]]
    for key in LAST_ROUND_ONLY:
        having = [r for r in rounds if key in r]
        for r in having[:-1]:
            del r[key]
    return {**metrics, "rounds": rounds, "bench": {"wall-seconds": wall_seconds, "clients": clients, **({"machine": machine_info} if machine_info else {})}}


#: Run-config keys that name places on one machine: a record made elsewhere still matches its run.
PLACES = ("data-dir", "results-dir")


def matches(run: Run, doc: dict[str, Any]) -> bool:
    """Whether a record or metrics.json is of ``run``: all its rounds, its final metrics, and every
    key of the run's config (but places) as the suite says it now."""
    config = doc.get("config", {})
    return len(doc.get("rounds", [])) >= run.rounds and "final" in doc and all(config.get(k) == v for k, v in run.config.items() if k not in PLACES)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # absent, or cut short by a crash
        return None


def load_record(run: Run, records: Path, suite: str) -> dict[str, Any] | None:
    """The run's record if there is one of the run as the suite declares it now, else None."""
    doc = _read(run.record(records, suite))
    return doc if doc is not None and matches(run, doc) else None


def finished(run: Run, results: Path, records: Path, suite: str) -> bool:
    """A run is finished when it has a record; a results-dir that finished (metrics.json of the
    run with every round, and the bench's bench.json) but has no record yet gets one now."""
    if load_record(run, records, suite) is not None:
        return True
    d = run.directory(results, suite)
    metrics, bench = _read(d / "metrics.json"), _read(d / "bench.json")
    if metrics is None or bench is None or not matches(run, metrics):
        return False
    write_json(run.record(records, suite), make_record(metrics, bench["wall-seconds"], bench["clients"], bench.get("machine")))
    return True


def execute(runs: list[Run], results: Path, suite: str, records: Path = RECORDS) -> None:
    """Run what has no record on one private simulation SuperLink; record each run as it ends."""
    todo = [r for r in runs if not finished(r, results, records, suite)]
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
            clear_run(d)  # the bench's own folder of this run, cut short before: it starts again
            config = run_config_string({**run.config, "results-dir": str(d)})
            print(f"[{k}/{len(todo)}] {run.grid} / {run.label} / seed {run.seed}", flush=True)
            t0 = time.perf_counter()
            _, status, log = submit(ROOT, home, config, num_clients=run.clients, echo=False)
            wall = time.perf_counter() - t0
            (d / "run.log").write_text(log)
            if status != "finished:completed":
                raise SystemExit(f"run {run.grid}/{run.label}/seed{run.seed} ended '{status}'; log in {d / 'run.log'}")
            write_json(d / "bench.json", {"wall-seconds": wall, "clients": run.clients, "machine": machine()})
            if not finished(run, results, records, suite):
                raise SystemExit(f"run {run.grid}/{run.label}/seed{run.seed} ended without all its rounds in {d / 'metrics.json'}")
            print(f"    done in {wall:.0f} s; record {run.record(records, suite)}", flush=True)


def _mean_std(values: list[float]) -> str:
    a = np.array(values, dtype=np.float64)
    return f"{a.mean():.4f}" if len(a) == 1 else f"{a.mean():.4f} ± {a.std(ddof=1):.4f}"


def grid_rows(runs: list[Run], records: Path, suite: str) -> list[dict[str, Any]]:
    """One row per method label of a grid: its recorded runs' final figures over seeds."""
    rows = []
    for label in dict.fromkeys(r.label for r in runs):
        docs = [(d, d["bench"]) for r in runs if r.label == label and (d := load_record(r, records, suite)) is not None]
        if not docs:
            continue
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


def markdown(grid: dict, rows: list[dict[str, Any]], figures: list[str] = ()) -> str:
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
    if figures:
        lines += ["", " ".join(f"![{Path(f).stem}]({f})" for f in figures)]
    return "\n".join(lines) + "\n"


def suite_page(suite_name: str, docs: Path = DOCS) -> Path | None:
    """The docs page that holds the suite's block, if one does."""
    marker = f"<!-- bench:{suite_name}:start -->"
    pages = [p for p in sorted(docs.rglob("*.md")) if marker in p.read_text()]
    if len(pages) > 1:
        raise SystemExit(f"'{marker}' is in more than one page: {', '.join(map(str, pages))}")
    return pages[0] if pages else None


def report(suite_name: str, suite: dict, runs: list[Run], records: Path, out_dir: Path, page: Path | None) -> str:
    """From the records alone: tables (Markdown, CSV in ``out_dir``) and figures per grid, and the
    suite's block of ``page`` with the figures beside it (``figures/SUITE/`` next to the page)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figure_dir = page.parent / "figures" / suite_name if page is not None else out_dir
    figure_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(out_dir / "table.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["grid", "method", "seeds", "accuracy-mean", "accuracy-std", "weighted-mean", "global-mean", "mib", "wall-s"])
        for grid in suite["grid"]:
            rows = grid_rows([r for r in runs if r.grid == grid["name"]], records, suite_name)
            if not rows:
                continue
            for r in rows:
                acc = np.array(r["accuracy"])
                writer.writerow([grid["name"], r["method"], r["seeds"], f"{acc.mean():.4f}", f"{acc.std(ddof=1) if len(acc) > 1 else 0:.4f}",
                                 f"{np.mean(r['weighted-accuracy']):.4f}", f"{np.mean(r['global-accuracy']):.4f}" if "global-accuracy" in r else "",
                                 f"{r['mb']:.2f}", f"{r['wall-s']:.1f}"])  # fmt: skip
            figures = [figure_dir / f"{grid['name']}-accuracy.png", figure_dir / f"{grid['name']}-bytes.png"]
            plot_mean_accuracy({r["method"]: r["docs"] for r in rows}, figures[0], grid.get("title", grid["name"]))
            plot_comparison({r["method"]: r["docs"][0] for r in rows}, figures[1])
            links = [f.relative_to(page.parent).as_posix() for f in figures] if page is not None else []
            parts.append(markdown(grid, rows, links))
    text = "\n".join(parts)
    (out_dir / "table.md").write_text(text)
    if page is not None:
        start, end = f"<!-- bench:{suite_name}:start -->", f"<!-- bench:{suite_name}:end -->"
        content = page.read_text()
        if start not in content or end not in content:
            raise SystemExit(f"{page} has no '{start}' ... '{end}' block")
        head, rest = content.split(start, 1)
        page.write_text(head + start + "\n" + text + rest[rest.index(end) :])
    return text


def example_markdown(name: str, records: Path = RECORDS, suites: Path = ROOT / "bench" / "suites.toml") -> str:
    """A method's docs paragraph: its declared example as the ``examples`` suite recorded it (the
    command that reruns it, and the mean accuracy per evaluated round). A method with no record
    is an error: every method's page shows a measured run."""
    suite, runs = load_suite(suites, "examples")
    run = next((r for r in runs if r.label == name), None)
    doc = load_record(run, records, "examples") if run is not None else None
    if doc is None:
        raise ValueError(f"method '{name}' has no record of its example as declared now: run `pflower-bench examples`")
    keys = {"method": name, **{k: v for k, v in run.config.items() if k not in ("seed", "method")}}
    rows = [r for r in doc["rounds"] if r.get("accuracy") is not None]
    if not rows:
        raise ValueError(f"method '{name}': its example's record has no evaluated round")
    shown = [r for r in rows if r["round"] in {rows[0]["round"], 2, 5, rows[-1]["round"]}]
    record = run.record(records, "examples").relative_to(records.parent.parent)
    lines = [
        f"Its example, measured (`pflower-bench examples`; record `{record}`), on the default data ({suite['grid'][0]['title'].split(': ', 1)[1]}):",
        "",
        "```bash",
        f'scripts/run.sh -c "{run_config_string(keys)}"',
        "```",
        "",
        "| round | " + " | ".join(str(r["round"]) for r in shown) + " |",
        "|" + " --- |" * (len(shown) + 1),
        "| mean test accuracy | " + " | ".join(f"{r['accuracy']:.3f}" for r in shown) + " |",
    ]
    if all("train-loss" in r and r["train-loss"] is not None for r in shown):
        lines.append("| mean training loss | " + " | ".join(f"{r['train-loss']:.3f}" for r in shown) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pflower-bench", description="Run a benchmark suite (resumable), record its runs and build its tables and figures.")
    p.add_argument("suite", help="a suite of the suite file, e.g. 'small' or 'full'")
    p.add_argument("--file", type=Path, default=ROOT / "bench" / "suites.toml", help="suite file (default: bench/suites.toml)")
    p.add_argument(
        "--results",
        type=Path,
        default=ROOT / "bench" / "results",
        help="where run results go, checkpoints and logs included (default: bench/results, not kept)",
    )
    p.add_argument("--records", type=Path, default=RECORDS, help="where the runs' records go, the report's only input (default: bench/records, committed)")
    p.add_argument("--page", type=Path, help="the Markdown page whose suite block gets the tables (default: the page under docs/ that holds it)")
    p.add_argument("--report-only", action="store_true", help="build tables and figures from the records so far (the seeds column says how many); run nothing")
    p.add_argument("--data-root", type=Path, help=f"the folder of the suites' data folders (default: ${DATA_ENV}, else ~/pflower-data)")
    args = p.parse_args(argv)
    suite, runs = load_suite(args.file, args.suite, args.data_root)
    needed = sorted({r.config["data-dir"] for r in runs if "data-dir" in r.config and not Path(r.config["data-dir"]).exists()})
    if needed and not args.report_only:
        root = data_root(args.data_root)
        names = sorted({d.name for d in DATASETS.values() for t in d.targets if str(root / t) in needed})
        fetch = f"`pflower-data {' '.join(names)} --root {root}` fetches it, or " if names else ""
        raise SystemExit(
            f"suite '{args.suite}' reads {', '.join(needed)}, which is not there: {fetch}put the data there, or name the folder that holds it with --data-root DIR (or ${DATA_ENV})"
        )
    results, records = args.results.resolve(), args.records.resolve()
    if args.report_only:
        for run in runs:  # finished results-dirs of this machine get their records; nothing runs
            finished(run, results, records, args.suite)
    else:
        execute(runs, results, args.suite, records)
    if not any(load_record(r, records, args.suite) for r in runs):  # never blank a page's tables
        raise SystemExit(f"suite '{args.suite}' has no records in {records}: nothing to report (`pflower-bench {args.suite}` runs it)")
    page = args.page or suite_page(args.suite)
    missing = [g["name"] for g in suite["grid"] if not any(load_record(r, records, args.suite) for r in runs if r.grid == g["name"])]
    if page is not None and missing:  # the page keeps its tables until every grid has records
        print(f"grids without records: {', '.join(missing)}; {page} is left as it is", flush=True)
        page = None
    print(report(args.suite, suite, runs, records, results / args.suite, page))
    if page is not None:
        print(f"tables written into {page}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
