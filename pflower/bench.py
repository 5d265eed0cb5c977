"""The benchmark harness: grids of (method x partition x seed) through the real Flower simulation.

``pflower-bench SUITE`` reads the suite from ``bench/suites.toml`` and runs every run that has
no record yet. Each finished run leaves a compact record, ``bench/records/SUITE/GRID/LABEL/seedK.json``
(its config, per-round accuracy and bytes, final metrics, the mechanism figures of its last
round; no checkpoint or model), committed with the tables it produced; a run's full results-dir
(``bench/results``, not kept) holds its checkpoint and logs. An interrupted suite resumes at the
first run without a record, which goes on from its checkpoint when it has one (:func:`cut_short_at`).
The report is built from the records alone: per grid a Markdown and
a CSV table (mean +- std over seeds of the final mean and weighted accuracy, total bytes, wall
time) and the accuracy-per-round and accuracy-vs-bytes figures, written into the docs page that
holds the suite's block (between ``<!-- bench:SUITE:start -->`` and ``...:end -->``; a grid
without records shows the command that runs it) with the figures in ``figures/SUITE/`` beside
that page, and the README's headline tables that use the suite (``bench/headlines.toml``).
``--report-only`` on a fresh clone rebuilds them.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.config import flatten_dict

from pflower import help_text
from pflower.check import app_run_config
from pflower.config import ConfigError, Settings, load_settings
from pflower.fetch import DATA_ENV, DATASETS, data_root
from pflower.launcher import auto_clients_per_node, clients_per_node, core_count, gpu_share, resources_problem, simulation_superlink, submit
from pflower.methods import declarations
from pflower.plots import draw_mechanisms, plot_comparison, plot_mean_accuracy
from pflower.results import write_json
from pflower.run_folder import CHECKPOINT, METRICS, clear_run
from pflower.verdict import FAILS, HOLDS, WITHIN, verdict

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "records"
SUITES = ROOT / "bench" / "suites.toml"
DOCS = ROOT / "docs"
#: Per-round entries too large to keep for every round: a record keeps them whole for the last
#: round that has them (the figures of the final state) and, before it, client 0's entry only
#: (the figure of client 0's weights over the rounds).
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


def _twice(items: list) -> list:
    """The items given more than once, sorted."""
    return sorted({x for x in items if items.count(x) > 1})


def load_suite(path: Path, name: str, data: Path | None = None, count_ids: bool = True) -> tuple[dict, list[Run]]:
    """The suite ``name`` of ``path`` and its runs, in order; a relative ``data-dir`` is a folder
    under the data root :func:`data_root` (``data``). A natural-id grid's clients are counted
    from its data where that is there; ``count_ids=False`` leaves them 0, for reading records
    without opening the datasets (a docs build)."""
    suites = tomllib.loads(path.read_text())
    if name not in suites:
        raise SystemExit(f"suite '{name}' not in {path}; it has: {', '.join(suites)}")
    suite = suites[name]
    common = dict(suite.get("common", {}))
    if "data-dir" in common and not Path(common["data-dir"]).is_absolute():
        common["data-dir"] = str(data_root(data) / common["data-dir"])
    if not suite.get("grid"):
        raise SystemExit(f"suite '{name}' has no [[{name}.grid]]: each grid names its methods")
    seeds = suite.get("seeds", [0])
    if twice := _twice(seeds):
        raise SystemExit(f"suite '{name}': seeds {twice} are given more than once; each seed's run has one record")
    if twice := _twice([grid["name"] for grid in suite["grid"]]):
        raise SystemExit(f"suite '{name}': grid names {twice} are given more than once; each grid's records are under its name")
    runs = []
    for grid in suite["grid"]:
        if grid.get("examples"):  # every declared method with its declaration's example keys
            grid["methods"] = [{"label": m.name, "method": m.name, **m.example} for m in declarations().values()]
        clients = grid.get("clients", 10)
        labels = [m if isinstance(m, str) else m.get("label", m["method"]) for m in grid["methods"]]
        if twice := _twice(labels):
            raise SystemExit(f"suite '{name}', grid '{grid['name']}': labels {twice} are given more than once; each run's records are under its label")
        mechanism = grid.get("mechanism", [])
        if not isinstance(mechanism, list):
            raise SystemExit(f"suite '{name}', grid '{grid['name']}': mechanism must be a list of its labels, e.g. [\"{labels[0]}\"]")
        if unknown := [m for m in mechanism if m not in labels]:
            raise SystemExit(f"suite '{name}', grid '{grid['name']}': mechanism {unknown} is not among its labels ({', '.join(labels)})")
        for entry in grid["methods"]:
            entry = {"method": entry} if isinstance(entry, str) else dict(entry)
            label = entry.pop("label", entry["method"])
            for seed in seeds:
                config = flatten_dict({**common, **grid.get("config", {}), **entry, "seed": seed})
                if clients == NATURAL_IDS and not count_ids:
                    clients = 0
                elif clients == NATURAL_IDS:  # the first run's count serves the grid: the draw changes which ids, not how many
                    clients = natural_id_clients(config)
                runs.append(Run(grid["name"], label, seed, int(clients), config))
    return suite, runs


#: A grid's ``clients`` that makes each client one natural id (writer, speaking role) of its data.
NATURAL_IDS = "natural-id"


def natural_id_clients(config: dict[str, Any]) -> int:
    """The number of natural ids the run config's sampling keeps (one client each); 0 while its
    data is not there (the suite stops before any run, naming the data)."""
    from pflower.datasets.federated import natural_id_count

    if not Path(config.get("data-dir", "")).exists():
        return 0
    try:
        return natural_id_count(load_settings(dict(config)))
    except ValueError as err:  # a ConfigError or PartitionError, named
        raise SystemExit(f"clients = '{NATURAL_IDS}': {err}") from None


def code_version() -> str:
    """pflower's version, and the commit of the checkout it runs from where it runs from one
    ('+modified' when the package or its pyproject.toml, which holds the runs' defaults, differ
    from it): which code made a record."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("pflower")
    except PackageNotFoundError:
        release = "unreleased"

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True, timeout=30).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != ROOT.resolve():  # installed inside another checkout
            return release
        commit = git("rev-parse", "--short=12", "HEAD")
        modified = "+modified" if git("status", "--porcelain", "--untracked-files=no", "--", "pflower", "pyproject.toml") else ""
    except (OSError, subprocess.SubprocessError):
        return release
    return f"{release} {commit}{modified}"


def code_digest() -> str:
    """What code a run runs, by content: a BLAKE2 digest of pflower's Python files and the
    pyproject.toml that holds the runs' defaults. Unlike the commit it does not move with a commit
    that changes no code, and it tells two uncommitted edits apart."""
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    package = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    if (ROOT / "pyproject.toml").is_file():
        digest.update((ROOT / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def machine(cpus_per_client: int = 1, gpus_per_client: float = 0.0) -> dict[str, Any]:
    """What ran a record's run, and with which code: CPU model and count, GPUs if any, the cores
    and GPU share each ClientApp had, Python, torch, flwr and pflower versions."""
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
        "cpus-per-client": cpus_per_client,
        "gpus-per-client": gpus_per_client,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "flwr": flwr.__version__,
        "pflower": code_version(),
    }


def data_fingerprint(config: dict[str, Any]) -> str:
    """What a run's data is, not where: a BLAKE2 digest of the pool a run of ``config`` reads
    (its images' shape and values, its labels), so records made on other data under the same
    folder are told apart."""
    import hashlib

    from pflower.datasets.federated import load_pool

    pool = load_pool(load_settings(dict(config)).source)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr((tuple(pool.x.shape), pool.num_classes)).encode())
    digest.update(pool.y.numpy().tobytes())
    digest.update(pool.x.contiguous().numpy().tobytes())
    return digest.hexdigest()


#: Run-config keys that choose the pool a run reads (before partitioning).
DATA_KEYS = (
    "dataset",
    "data-dir",
    "torchvision-name",
    "emnist-split",
    "hf-image-column",
    "hf-label-column",
    "hf-text-column",
    "image-size",
    "natural-id-column",
)


def data_key(config: dict[str, Any]) -> tuple:
    """The keys that name a run's data, its folder by name only (a record made elsewhere matches)."""
    return tuple((k, Path(v).name if k == "data-dir" else v) for k, v in sorted(config.items()) if k in DATA_KEYS)


def check_same_data(runs: list[Run], records: Path, suite: str, now: dict[tuple, str] | None = None) -> None:
    """Stop when a suite's records were made on different data for the same data keys (each
    other's, or ``now``'s: the digest of what the data root holds now); records from before
    digests were kept say nothing and pass. Every record at a run's place that names the run's
    data counts, whether or not it is of the run now: other data can make it another run (a
    natural-id grid's client count), and rerunning would write over it."""
    seen: dict[tuple, tuple[str, Path]] = {}
    for run in runs:
        key, path = data_key(run.config), run.record(records, suite)
        doc = _read(path) or {}
        bench, config = doc.get("bench"), doc.get("config")
        digest = bench.get("data") if isinstance(bench, dict) else None
        if digest is None or not isinstance(config, dict) or data_key({k: config.get(k) for k, _ in key}) != key:
            continue
        if now is not None and key in now and now[key] != digest:
            raise SystemExit(
                f"{path} was made on other data than {run.config.get('data-dir') or run.config.get('dataset', 'the default data set')} holds now (digest {digest}, now {now[key]}): "
                "point --data-root at the data the records were made on, or move the suite's records away to rerun it"
            )
        if key in seen and seen[key][0] != digest:
            raise SystemExit(f"{path} and {seen[key][1]} were made on different data under the same keys (digests {digest} and {seen[key][0]})")
        seen.setdefault(key, (digest, path))


def make_record(
    metrics: dict[str, Any],
    wall_seconds: float,
    clients: int,
    machine_info: dict[str, Any] | None = None,
    data: str | None = None,
    resumed: int = 0,
) -> dict[str, Any]:
    """A run's compact record from its metrics.json: everything but the per-round entries of
    :data:`LAST_ROUND_ONLY` before the last round that has them, which keep client 0's part, plus
    the bench's wall time, the machine that ran it, the digest of its data (:func:`data_fingerprint`)
    and, for a run cut short, how many times it was resumed (its wall time counts every part)."""
    rounds = [dict(r) for r in metrics["rounds"]]
    for key in LAST_ROUND_ONLY:
        having = [r for r in rounds if key in r]
        for r in having[:-1]:
            if "0" in r[key]:
                r[key] = {"0": r[key]["0"]}
            else:
                del r[key]
    bench = {
        "wall-seconds": wall_seconds,
        "clients": clients,
        **({"machine": machine_info} if machine_info else {}),
        **({"data": data} if data else {}),
        **({"resumed": resumed} if resumed else {}),
    }
    return {**metrics, "rounds": rounds, "bench": bench}


#: Run-config keys that name places on one machine, or how its simulation placed the clients on
#: nodes (the same numbers): a record made elsewhere still matches its run.
PLACES = ("data-dir", "results-dir", "resume-from", "simulated-clients")
#: The bench's file in a run's results-dir while the run goes: its wall time so far and how often
#: it was resumed, so that a run cut short and resumed is timed whole.
PROGRESS = "bench-progress.json"
#: What the bench writes into a run's results-dir beside the run's own outputs.
BENCH_FILES = ("bench.json", "run.log", PROGRESS)


def client_errors(doc: dict[str, Any]) -> int:
    """Error replies in a record or metrics.json: clients that crashed (an exception, a worker
    Ray killed for memory), not a reply the method's gate judged."""
    return sum(int((r.get("rejected") or {}).get("client-error", 0)) for r in doc.get("rounds", []))


@cache
def default_config(method: str) -> dict[str, Any]:
    """Every run-config key of ``method`` at pflower's declared default; none for a method that
    is not declared (no record is of it)."""
    return Settings(method=method).to_run_config() if method in declarations() else {}


@cache
def app_defaults() -> dict[str, Any]:
    """The run-config defaults a run of the suites gets: the app's pyproject.toml
    ``[tool.flwr.app.config]`` (what ``flwr run`` submits beneath a suite's keys)."""
    return app_run_config(ROOT)


def resolved_config(config: dict[str, Any]) -> dict[str, Any]:
    """The whole run config a run of the suite's ``config`` has: the app's defaults (the shared
    keys and its method's own), then the suite's keys."""
    defaults = app_defaults()
    method = config.get("method", defaults.get("method"))
    return {**{k: v for k, v in defaults.items() if "." not in k or k.startswith(f"{method}.")}, **config}


def mismatch(run: Run, doc: dict[str, Any]) -> str | None:
    """Why a record or metrics.json is not of ``run`` as the suite declares it now, or None. It
    is of the run when it holds the whole run (all its rounds, the last evaluated by every
    client as the loop does, its final metrics, no client that crashed: such a run measures the
    machine, not the method) with the run's client count and every key of the run's whole config
    (:func:`resolved_config`; places aside). A key the record lacks came into pflower after it
    was made, at the default that keeps the old behaviour: it matches only that default. A key
    the record has and pflower no longer has is not compared."""
    try:
        rounds, clients = doc.get("rounds", []), doc.get("num-clients")
        last = rounds[-1] if rounds else {}
        if len(rounds) < run.rounds or "final" not in doc:
            return f"{len(rounds)} of its {run.rounds} rounds"
        if last.get("accuracy") is None or last.get("evaluated") != clients:
            return f"its last round evaluated by {last.get('evaluated')} of its {clients} clients"
        if run.clients and clients != run.clients:  # 0: a natural-id grid whose data is not here to count
            return f"{clients} clients, the suite's {run.clients}"
        if errors := client_errors(doc):
            return f"{errors} clients crashed"
        return config_mismatch(run, doc.get("config", {}))
    except (AttributeError, TypeError, KeyError, IndexError) as err:
        return f"not a record ({type(err).__name__}: {err})"


def config_mismatch(run: Run, config: dict[str, Any]) -> str | None:
    """The first key of the run's whole config (:func:`resolved_config`; places aside) that
    ``config``, a record's or a metrics.json's, has otherwise, or None. A key ``config`` lacks
    came into pflower after it was made, at the default that keeps the old behaviour."""
    defaults = default_config(run.config.get("method", "pfedla"))
    for key, value in resolved_config(run.config).items():
        if key not in PLACES and (had := config.get(key, defaults.get(key))) != value:
            return f"{key} = {had!r}, the suite's run has {value!r}"
    return None


def matches(run: Run, doc: dict[str, Any]) -> bool:
    """Whether a record or metrics.json is of ``run`` (:func:`mismatch` finds nothing)."""
    return mismatch(run, doc) is None


def _read(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None if absent, unreadable, cut short by a crash or not an object."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def load_record(run: Run, records: Path, suite: str) -> dict[str, Any] | None:
    """The run's record if there is one of the run as the suite declares it now, else None."""
    doc = _read(run.record(records, suite))
    return doc if doc is not None and matches(run, doc) else None


def finished(run: Run, results: Path, records: Path, suite: str) -> bool:
    """A run is finished when it has a record; a results-dir that finished (metrics.json of the
    run with every round, and the bench.json the bench wrote when that very run, its lineage,
    ended) but has no record yet gets one now."""
    if load_record(run, records, suite) is not None:
        return True
    d = run.directory(results, suite)
    metrics, bench = _read(d / "metrics.json"), _read(d / "bench.json")
    if metrics is None or bench is None or not matches(run, metrics) or bench.get("lineage") != metrics.get("lineage"):
        return False
    record = make_record(metrics, bench["wall-seconds"], bench["clients"], bench.get("machine"), bench.get("data"), bench.get("resumed", 0))
    write_json(run.record(records, suite), record)
    return True


def cut_short_at(run: Run, folder: Path, part: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The last round of the run cut short in ``folder`` and the bench's :data:`PROGRESS` of it,
    when the run can go on from its checkpoint (``resume-from``, which continues it exactly): the
    bench started it on this machine with this code and data (``part``: :func:`machine` without
    the commit, :func:`code_digest` and the data's digest, as :data:`PROGRESS` has them), and it left a checkpoint and a metrics.json of
    the run as the suite declares it, no client crashed; None when it starts again."""
    progress, metrics = _read(folder / PROGRESS), _read(folder / METRICS)
    if progress is None or metrics is None or not (folder / CHECKPOINT).is_file() or (folder / "bench.json").exists():
        return None
    if any(progress.get(key) != value for key, value in part.items()) or not isinstance(progress.get("resumed"), int):
        return None
    if not isinstance(progress.get("wall-seconds"), (int, float)):
        return None
    try:
        if config_mismatch(run, metrics["config"]) or client_errors(metrics) or (run.clients and metrics["num-clients"] != run.clients):
            return None
        last = int(metrics["rounds"][-1]["round"])
    except (AttributeError, TypeError, KeyError, IndexError, ValueError):
        return None
    return (last, progress) if 0 < last <= run.rounds else None


def duration(seconds: float) -> str:
    """A time left as a person reads it: '40 s', '12 min', '3 h 05 min'."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


#: Run-config keys that leave a round's cost as it is (or name places): a record of any suite
#: whose config differs from a run's only in these tells how long the run's rounds take.
#: ``simulated-clients`` does change the pace (fewer messages), but the bench sets it at
#: submission, never in a suite's configs: an estimate from records made either way errs on the
#: slow side, where one that ignored them would have none.
COST_FREE = frozenset(
    {
        "seed",
        "data-seed",
        "num-server-rounds",
        "evaluate-every",
        "results-dir",
        "resume-from",
        "data-dir",
        "state-dir",
        "overwrite",
        "round-timeout",
        "simulated-clients",
        "tensorboard",
        "mlflow",
        "mlflow-experiment",
        "mlflow-tracking-uri",
    }
)


def same_cost(record: dict[str, Any], run: dict[str, Any]) -> bool:
    """Whether a record's config trains the rounds the resolved ``run`` config does: equal on every
    key but :data:`COST_FREE`, a key the record lacks (pflower gained it since) at its method's
    default. An evaluation round counts as any other (``evaluate-every`` is cost-free): so it is
    in the records so far, where a round's training outweighs its evaluation."""
    record = {**default_config(record.get("method", "")), **record}
    return all(record[k] == run[k] for k in (record.keys() & run.keys()) - COST_FREE)


#: What of a record's machine sets its pace: the cross-suite estimates use records made alike.
PACE = ("cpu", "cpus", "gpus", "cpus-per-client", "gpus-per-client")


class Eta:
    """A suite's time left from the records' wall times per round: a run takes what a round of its
    grid and label took (any seed), else of a run of any suite that trains the same rounds
    (:func:`same_cost`: FedPer at 100 rounds from FedPer at 40) with as many clients on a machine
    like this one (``cpus``, ``gpus`` per ClientApp), else of its grid, else of the suite, times
    its rounds; a run under way, its elapsed time per round so far times its rounds left. No
    record of the suite or of a run alike: no estimate."""

    def __init__(self, runs: list[Run], records: Path, suite: str, cpus: int = 1, gpus: float = 0.0) -> None:
        self.per_round: dict[tuple[str, str], list[float]] = {}
        for run in runs:
            if (doc := load_record(run, records, suite)) is not None:
                self.add(run, doc["bench"]["wall-seconds"])
        here = machine(cpus, gpus)
        self.alike: dict[tuple[str, str, int], list[float]] = {}
        self.recorded: list[tuple[dict[str, Any], int, float]] = []  # config, clients and seconds a round of the records made here
        for path in sorted(records.glob("*/*/*/seed*.json")):
            doc = _read(path) or {}
            config, bench = doc.get("config"), doc.get("bench") or {}
            wall, made_on = bench.get("wall-seconds"), bench.get("machine") or {}
            if (
                isinstance(config, dict)
                and isinstance(wall, (int, float))
                and isinstance(config.get("num-server-rounds"), int)
                and config["num-server-rounds"] > 0
                and all(made_on.get(key) == here[key] for key in PACE)
            ):
                self.recorded.append((config, bench.get("clients"), wall / config["num-server-rounds"]))

    def add(self, run: Run, wall: float) -> None:
        self.per_round.setdefault((run.grid, run.label), []).append(wall / run.rounds)

    def of(self, run: Run) -> float | None:
        """The run's expected wall seconds, or None when nothing recorded tells."""
        grid = [w for (g, _), ws in self.per_round.items() if g == run.grid for w in ws]
        every = [w for ws in self.per_round.values() for w in ws]
        key = (run.grid, run.label, run.seed)
        if key not in self.alike:  # asked at every round line: the records are matched once a run
            resolved = resolved_config(run.config)
            self.alike[key] = [w for config, clients, w in self.recorded if clients == run.clients and same_cost(config, resolved)]
        per_round = self.per_round.get((run.grid, run.label)) or self.alike[key] or grid or every
        return float(np.mean(per_round)) * run.rounds if per_round else None

    def left(self, todo: list[Run], current: tuple[int, float] | None = None) -> str:
        """Time left for ``todo``, whose first run has done ``current`` = (rounds, elapsed s)."""
        total = 0.0
        for k, run in enumerate(todo):
            if k == 0 and current is not None and current[0] > 0:
                total += current[1] / current[0] * (run.rounds - current[0])
            elif (e := self.of(run)) is not None:
                total += max(e - (current[1] if k == 0 and current is not None else 0.0), 0.0)
            else:
                return "time left unknown until a run of this suite has a record"
        return f"about {duration(max(total, 0.0))} left"


#: The ServerApp's line for a round that ended (pflower/server_app), e.g. ``[round 3/20] accuracy``.
ROUND_LINE = re.compile(r"\[round (\d+)/(\d+)\]")


def status(runs: list[Run], results: Path, records: Path, suite: str, cpus: int = 1, gpus: float = 0.0) -> str:
    """Runs done and left per grid, and the time left: what ``--status`` prints."""
    todo = [r for r in runs if not finished(r, results, records, suite)]
    lines = [f"suite '{suite}': {len(runs) - len(todo)} of {len(runs)} runs finished, {len(todo)} left; {Eta(runs, records, suite, cpus, gpus).left(todo)}"]
    for grid in dict.fromkeys(r.grid for r in runs):
        n = sum(r.grid == grid for r in runs)
        lines.append(f"  {grid}: {n - sum(r.grid == grid for r in todo)} of {n}")
    return "\n".join(lines)


def execute(runs: list[Run], results: Path, suite: str, records: Path = RECORDS, cpus: int = 1, gpus: float = 0.0, allow_modified: bool = False,
            clients_per_node: int | str = "auto") -> None:  # fmt: skip
    """Run what has no record on one private simulation SuperLink, each ClientApp with ``cpus``
    cores and a ``gpus`` share of a GPU, each simulated node serving ``clients_per_node`` clients
    ('auto': :func:`~pflower.launcher.auto_clients_per_node`; the same numbers); record each run as it ends. It prints runs done and
    left, each round of the run under way and the suite's time left. A checkout with uncommitted
    changes to pflower/ or pyproject.toml makes no records unless ``allow_modified`` (its records
    then say '+modified'): a record names the code that made it."""
    todo = [r for r in runs if not finished(r, results, records, suite)]
    for run in todo:  # every run's config is checked before the first one starts
        try:
            load_settings(dict(run.config))
        except ConfigError as err:
            raise SystemExit(f"run {run.grid}/{run.label}/seed{run.seed}: {err}") from None
    eta = Eta(runs, records, suite, cpus, gpus)
    print(f"{len(runs) - len(todo)} of {len(runs)} runs already finished; running {len(todo)}; {eta.left(todo)}", flush=True)
    if not todo:
        return
    if "+modified" in (version := code_version()) and not allow_modified:
        raise SystemExit(
            f"pflower-bench: this checkout has uncommitted changes to pflower/ or pyproject.toml (code version {version}), and a record "
            "names the commit that made it: commit them first, or pass --allow-modified (the records then say '+modified')"
        )
    digests = {key: data_fingerprint(run.config) for key, run in {data_key(r.config): r for r in todo}.items()}
    check_same_data(runs, records, suite, digests)
    home = results / suite / ".flwr-home"  # per suite: two suites may run at once
    with simulation_superlink(home):
        for k, run in enumerate(todo, 1):
            d = run.directory(results, suite)
            d.mkdir(parents=True, exist_ok=True)
            per_node = auto_clients_per_node(run.clients, cpus, gpus) if clients_per_node == "auto" else int(clients_per_node)
            here = machine(cpus, gpus)
            part = {"machine": {key: v for key, v in here.items() if key != "pflower"}, "code": code_digest(), "data": digests[data_key(run.config)]}
            if (cut := cut_short_at(run, d, part)) is None:
                clear_run(d)  # the bench's own folder of this run, cut short where it cannot go on: it starts again
                for name in BENCH_FILES:  # and what the bench wrote of an earlier run into it
                    (d / name).unlink(missing_ok=True)
                before, resumed, going_on = 0.0, 0, ""
            else:
                before, resumed = float(cut[1]["wall-seconds"]), cut[1]["resumed"] + 1
                going_on = f"; goes on from its checkpoint after round {cut[0]}"
            write_json(d / PROGRESS, {"wall-seconds": before, "resumed": resumed, **part})
            config = run_config_string({**run.config, "results-dir": str(d), **({"resume-from": str(d)} if resumed else {})})
            print(f"[{k}/{len(todo)}] {run.grid} / {run.label} / seed {run.seed}{going_on}; {eta.left(todo[k - 1 :])}", flush=True)
            t0 = time.perf_counter() - before

            went_on: list[int] = []  # the rounds this part logged

            def progress(
                line: str, rest: list[Run] = todo[k - 1 :], t0: float = t0, d: Path = d, resumed: int = resumed, part: dict = part, went_on: list = went_on
            ) -> None:
                if found := ROUND_LINE.search(line):
                    done, elapsed = int(found.group(1)), time.perf_counter() - t0
                    went_on.append(done)
                    write_json(d / PROGRESS, {"wall-seconds": elapsed, "resumed": resumed, **part})
                    print(f"    round {done}/{found.group(2)}, {duration(elapsed)}; suite {eta.left(rest, (done, elapsed))}", flush=True)

            _, state, log = submit(ROOT, home, config, num_clients=run.clients, cpus=cpus, gpus=gpus, echo=False, on_line=progress,
                                   clients_per_node=per_node)  # fmt: skip
            wall = time.perf_counter() - t0
            if state != "finished:completed":
                again = ""
                if resumed and not went_on:  # it may fail so at every start: the next one runs it from its first round
                    clear_run(d)
                    (d / PROGRESS).unlink(missing_ok=True)
                    again = "; it went on from its checkpoint, now removed: the next start runs it from round 1"
                (d / "run.log").write_text(log)
                raise SystemExit(f"run {run.grid}/{run.label}/seed{run.seed} ended '{state}'{again}; log in {d / 'run.log'}")
            (d / "run.log").write_text(log)
            eta.add(run, wall)
            lineage = (_read(d / "metrics.json") or {}).get("lineage")
            write_json(
                d / "bench.json",
                {
                    "wall-seconds": wall,
                    "clients": run.clients,
                    "machine": {**here, "clients-per-node": per_node},  # how the simulation placed them: the pace, not the numbers
                    "data": part["data"],
                    "lineage": lineage,
                    **({"resumed": resumed} if resumed else {}),
                },
            )
            (d / PROGRESS).unlink(missing_ok=True)
            if not finished(run, results, records, suite):
                why = mismatch(run, _read(d / "metrics.json") or {}) or "no metrics.json"
                raise SystemExit(f"run {run.grid}/{run.label}/seed{run.seed} ended, but {d / 'metrics.json'} is not of the suite's run: {why}")
            print(f"    done in {wall:.0f} s; record {run.record(records, suite)}", flush=True)


def mean_std(values: list[float]) -> str:
    """Mean over seeds, with the sample standard deviation where there are two or more."""
    a = np.array(values, dtype=np.float64)
    return f"{a.mean():.4f}" if len(a) == 1 else f"{a.mean():.4f} ± {a.std(ddof=1):.4f}"


def seeds_cell(done: int, declared: int) -> str:
    """The seeds column: how many seeds the row's mean is over, and of how many while some lack a record."""
    return str(done) if done == declared else f"{done} of {declared}"


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
            "declared": sum(r.label == label for r in runs),
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
    """Our ordering of the paper's methods (best first) beside the paper's, each of the paper's
    pairs marked by the one rule of :func:`pflower.verdict.verdict` (a gap within the seeds'
    spread does not count; one seed gives no verdict)."""
    ours = {r["method"]: r["accuracy"] for r in rows}
    common = [m for m in paper_order if m in ours]
    if len(common) < 2:
        return ""
    ranked = sorted(common, key=lambda m: -float(np.mean(ours[m])))
    said = f"Ours by mean: {' > '.join(ranked)}; the paper's: {' > '.join(common)}."
    if any(len(ours[m]) < 2 for m in common):
        return f"{said} One seed: no verdict on the ordering."
    marks = Counter(verdict(ours[a], ours[b]).mark for i, a in enumerate(common) for b in common[i + 1 :])
    pairs = sum(marks.values())
    return (f"{said} Of the paper's {pairs} pairwise ordering{'s' if pairs != 1 else ''}, {marks[HOLDS]} hold here beyond the seeds' spread, "
            f"{marks[WITHIN]} within it only (a gap that does not count) and {marks[FAILS]} do not hold.")  # fmt: skip


def machine_name(m: dict[str, Any] | None) -> str:
    """A record's machine in words: CPU, the cores the run could use, GPUs, torch."""
    if not m:
        return "a machine not recorded"
    return ", ".join([m["cpu"], f"{m['cpus']} cores", *m.get("gpus", []), *([f"torch {m['torch']}"] if "torch" in m else [])])


def machines_sentence(rows: list[dict[str, Any]]) -> str:
    """Which machines made a table's records, with how many runs each: another kind of CPU or GPU
    rounds differently, so a rerun elsewhere moves the numbers a little. A table of more than one
    says that it mixes them."""
    machines = [doc["bench"].get("machine") for r in rows for doc in r["docs"]]
    mixed = len({machine_name(m) for m in machines}) > 1
    return machine_counts("This table mixes machines, runs made on" if mixed else "Runs made on", machines)


#: A commit in a record's code version (``machine.pflower``: "<release> <commit>[+modified]").
COMMIT = re.compile(r"\b[0-9a-f]{12}\b")


def provenance_gaps(doc: dict[str, Any]) -> list[str]:
    """What a record does not say of what made it: 'code version' (no commit), 'data digest',
    'modified tree' (made from uncommitted code); empty for a whole record."""
    bench = doc.get("bench", {})
    version = (bench.get("machine") or {}).get("pflower", "")
    gaps = [] if COMMIT.search(version) else ["code version"]
    gaps += [] if bench.get("data") else ["data digest"]
    return gaps + (["modified tree"] if "+modified" in version else [])


def provenance_sentence(rows: list[dict[str, Any]]) -> str:
    """How many of a table's records lack a code version or a data digest, or were made from a
    modified tree (bench/records-unnamed.txt lists each); empty when none."""
    docs = [doc for r in rows for doc in r["docs"]]
    gaps = Counter(g for doc in docs for g in provenance_gaps(doc))
    if not gaps:
        return ""
    said = {"code version": "name no code version", "data digest": "name no data digest", "modified tree": "were made from a modified tree"}
    parts = [f"{gaps[g]} {said[g]}" for g in said if gaps[g]]
    return f"Of these {len(docs)} records, {', '.join(parts)} (made before records named them; bench/records-unnamed.txt lists each)."


def machine_counts(start: str, machines: list[dict[str, Any] | None]) -> str:
    """``start``, then each machine in words (:func:`machine_name`) with how many runs it made, most first."""
    made = Counter(machine_name(m) for m in machines)
    return f"{start}: " + "; ".join(f"{name} ({n} run{'s' if n > 1 else ''})" for name, n in sorted(made.items(), key=lambda kv: (-kv[1], kv[0]))) + "."


def anchor(suite_name: str, grid_name: str) -> str:
    """The id of a grid's table on its page (the claims' checklists link to it)."""
    return f"{suite_name}-{grid_name}"


def markdown(suite_name: str, grid: dict, rows: list[dict[str, Any]], figures: list[str] = ()) -> str:
    has_global = all("global-accuracy" in r for r in rows)
    has_oracle = any("oracle-accuracy" in r for r in rows)
    head = ["method", "final mean acc.", "weighted acc."] + (["global acc."] if has_global else [])
    head += (["acc. at test-chosen λ"] if has_oracle else []) + ["MiB (down + up)", "wall s", "seeds"]
    lines = [f"#### {grid.get('title', grid['name'])}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines[:0] = [f'<a id="{anchor(suite_name, grid["name"])}"></a>', ""]
    for r in rows:
        cells = [r["method"], mean_std(r["accuracy"]), mean_std(r["weighted-accuracy"])]
        cells += [mean_std(r["global-accuracy"])] if has_global else []
        cells += [mean_std(r["oracle-accuracy"]) if "oracle-accuracy" in r else "—"] if has_oracle else []
        cells += [f"{r['mb']:.1f}", f"{r['wall-s']:.0f}", seeds_cell(r["seeds"], r["declared"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", " ".join(filter(None, [machines_sentence(rows), provenance_sentence(rows)]))]
    paper = grid.get("paper", {})
    if paper.get("text"):
        lines += ["", f"Paper: {paper['text']}"]
    if sentence := ordering_sentence(rows, paper.get("order", [])):
        lines += ["", sentence]
    if figures:
        lines += ["", " ".join(f"![{Path(f).stem}]({f})" for f in figures)]
    return "\n".join(lines) + "\n"


def twin_runs_markdown(records: Path = RECORDS) -> str:
    """Runs recorded in two suites with one config and seed (their places aside) whose results
    differ, side by side with the machine and code that made each: a difference of machine or
    code, never shown as one run."""
    groups: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for path in sorted(records.rglob("*.json")):
        doc = _read(path)
        if doc is None or not isinstance(doc.get("bench"), dict) or not isinstance(doc.get("config"), dict):
            continue
        key = json.dumps({k: v for k, v in doc["config"].items() if k not in PLACES}, sort_keys=True)
        groups.setdefault(key, []).append((path, doc))
    lines = ["| run | accuracy | made on | code |", "| --- | --- | --- | --- |"]
    gaps = []
    for twins in groups.values():
        if len(twins) < 2 or len({d["final"]["accuracy"] for _, d in twins}) < 2:
            continue
        accuracies = [d["final"]["accuracy"] for _, d in twins]
        gaps.append((max(accuracies) - min(accuracies), twins[0][0].relative_to(records).with_suffix("").as_posix()))
        for path, doc in twins:
            m = doc["bench"].get("machine")
            lines.append(
                f"| `{path.relative_to(records).with_suffix('').as_posix()}` | {doc['final']['accuracy']:.4f} | {machine_name(m)} | "
                f"{(m or {}).get('pflower') or 'not named'} |"
            )
    if not gaps:
        return "None: every run recorded twice has the same results."
    gap, where = max(gaps)
    return "\n".join(lines) + f"\n\nThe largest difference between twins: {gap:.4f} (`{where}` and its twin)."


def missing_data(runs: list[Run], root: Path) -> tuple[list[str], list[str]]:
    """The data the runs read that is not there, and the `pflower-data` names that fetch it. A
    data-dir that is one of `pflower-data`'s folders must exist; one that holds such folders (the
    root torchvision reads, which `dataset='cifar100'` names) must hold the run's dataset's."""
    missing, names = set(), set()
    for run in runs:
        if "data-dir" not in run.config:
            continue
        folder = Path(run.config["data-dir"])
        wanted = [(root / t, d.name) for d in DATASETS.values() for t in d.targets
                  if root / t == folder or (d.name == run.config.get("dataset") and (root / t).parent == folder)]  # fmt: skip
        for path, name in wanted:
            if not path.exists():
                missing.add(str(path))
                names.add(name)
        if not wanted and not folder.exists():
            missing.add(str(folder))
    return sorted(missing), sorted(names)


def suite_page(suite_name: str, docs: Path = DOCS) -> Path | None:
    """The docs page that holds the suite's block, if one does."""
    marker = f"<!-- bench:{suite_name}:start -->"
    pages = [p for p in sorted(docs.rglob("*.md")) if marker in p.read_text()]
    if len(pages) > 1:
        raise SystemExit(f"'{marker}' is in more than one page: {', '.join(map(str, pages))}")
    return pages[0] if pages else None


def no_record(suite_name: str, grid: dict) -> str:
    """A grid's place on its page while it has no record: its title and the command that runs it."""
    return (
        f'<a id="{anchor(suite_name, grid["name"])}"></a>\n\n#### {grid.get("title", grid["name"])}\n\nNo record yet: `pflower-bench {suite_name}` runs it.\n'
    )


def report(suite_name: str, suite: dict, runs: list[Run], records: Path, out_dir: Path, page: Path | None) -> str:
    """From the records alone: tables (Markdown, CSV in ``out_dir``) and figures per grid, and the
    suite's block of ``page`` with the figures beside it (``figures/SUITE/`` next to the page); a
    grid without records shows its command instead of a table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figure_dir = page.parent / "figures" / suite_name if page is not None else out_dir
    parts = []
    with open(out_dir / "table.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["grid", "method", "seeds", "accuracy-mean", "accuracy-std", "weighted-mean", "global-mean", "mib", "wall-s"])
        for grid in suite["grid"]:
            rows = grid_rows([r for r in runs if r.grid == grid["name"]], records, suite_name)
            if not rows:
                parts.append(no_record(suite_name, grid))
                continue
            for r in rows:
                acc = np.array(r["accuracy"])
                writer.writerow([grid["name"], r["method"], r["seeds"], f"{acc.mean():.4f}", f"{acc.std(ddof=1) if len(acc) > 1 else 0:.4f}",
                                 f"{np.mean(r['weighted-accuracy']):.4f}", f"{np.mean(r['global-accuracy']):.4f}" if "global-accuracy" in r else "",
                                 f"{r['mb']:.2f}", f"{r['wall-s']:.1f}"])  # fmt: skip
            figure_dir.mkdir(parents=True, exist_ok=True)
            figures = [figure_dir / f"{grid['name']}-accuracy.png", figure_dir / f"{grid['name']}-bytes.png"]
            plot_mean_accuracy({r["method"]: r["docs"] for r in rows}, figures[0], grid.get("title", grid["name"]))
            plot_comparison({r["method"]: r["docs"] for r in rows}, figures[1])
            for r in rows:
                if r["method"] in grid.get("mechanism", []):
                    figures += draw_mechanisms(r["docs"][0], figure_dir, f"{grid['name']}-{r['method']}-")
            links = [f.relative_to(page.parent).as_posix() for f in figures] if page is not None else []
            parts.append(markdown(suite_name, grid, rows, links))
    text = "\n".join(parts)
    (out_dir / "table.md").write_text(text)
    if page is not None:
        write_block(page, f"bench:{suite_name}", text)
    return text


def block_problem(page: Path, name: str) -> str | None:
    """Why ``page`` cannot take the block ``NAME``, or None."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if not page.is_file():
        return f"{page} is not a file"
    content = page.read_text()
    return None if start in content and end in content else f"{page} has no '{start}' ... '{end}' block"


def write_block(page: Path, name: str, text: str) -> None:
    """Replace what ``page`` holds between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``."""
    if why := block_problem(page, name):
        raise SystemExit(why)
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    content = page.read_text()
    head, rest = content.split(start, 1)
    page.write_text(head + start + "\n" + text + rest[rest.index(end) :])


#: The README's tables of the papers' numbers beside ours (``bench/headlines.toml``).
HEADLINES = ROOT / "bench" / "headlines.toml"
README = ROOT / "README.md"


def headline(spec: dict, suites: Path, records: Path) -> str:
    """One headline table from the records of the suites it names. A column with a ``suite`` is
    measured (``value``: accuracy, global-accuracy, oracle-accuracy or mib; the row's label in
    that suite's ``grid``); one without takes the row's next ``paper`` entry. A cell shows a
    label the grid does not run, or whose records lack the value, as a dash, one without records as "no record yet", and fewer
    seeds than declared as "(n of m seeds)"; a table with no measured cell recorded is its
    commands instead."""
    loaded = {}
    for col in spec["columns"]:
        if "suite" in col and col["suite"] not in loaded:
            loaded[col["suite"]] = load_suite(suites, col["suite"], count_ids=False)
    lines = ["| " + " | ".join([spec.get("row-title", "method")] + [c["title"] for c in spec["columns"]]) + " |", "|" + " --- |" * (len(spec["columns"]) + 1)]
    recorded = False
    for row in spec["rows"]:
        cells, papers = [row["title"]], iter(row.get("paper", []))
        for col in spec["columns"]:
            if "suite" not in col:
                cells.append(next(papers, "—"))
                continue
            suite, runs = loaded[col["suite"]]
            mine = [r for r in runs if r.grid == col["grid"] and r.label == row.get("label")]
            found = [d for r in mine if (d := load_record(r, records, col["suite"])) is not None]
            value = col.get("value", "accuracy")
            if not mine:
                cells.append("—")
            elif not found:
                cells.append("no record yet")
            elif value != "mib" and any(value not in d["final"] for d in found):
                cells.append("—")  # a figure this method has no such value of (oracle-accuracy: SuPerFed's alone)
            else:
                recorded = True
                if value == "mib":
                    cell = f"{np.mean([(d['final']['bytes-down'] + d['final']['bytes-up']) / 2**20 for d in found]):.1f}"
                else:
                    cell = mean_std([d["final"][value] for d in found])
                cells.append(cell + (f" ({len(found)} of {len(mine)} seeds)" if len(found) < len(mine) else ""))
        lines.append("| " + " | ".join(cells) + " |")
    if not recorded:
        commands = ", ".join(f"`pflower-bench {name}`" for name in loaded)
        return f"No record yet: {commands} {'runs' if len(loaded) == 1 else 'run'} it.\n"
    return "\n".join(lines) + "\n"


def write_headlines(suite_name: str | None, suites: Path, records: Path, readme: Path = README, headlines: Path = HEADLINES) -> list[str]:
    """Rewrite the README's headline tables that use ``suite_name`` (every one for None); their names."""
    written = []
    for name, spec in tomllib.loads(headlines.read_text()).items():
        if suite_name is None or any(c.get("suite") == suite_name for c in spec["columns"]):
            write_block(readme, f"headline:{name}", headline(spec, suites, records))
            written.append(name)
    return written


def write_generated_pages() -> None:
    """Rewrite the docs' generated sections, each method page's table of recorded runs among
    them, after the project's records changed: ``docs/hooks.py --write``, in a checkout that has it."""
    hooks = DOCS / "hooks.py"
    if not hooks.is_file():
        return
    done = subprocess.run([sys.executable, str(hooks), "--write"], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise SystemExit(f"the docs' generated sections were not rewritten ({why}): run `{sys.executable} docs/hooks.py --write`")
    print(done.stdout, end="", flush=True)


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
    data = suite["grid"][0]["title"].split(": ", 1)[1]
    if "partition" in keys:  # the example shares the pool out its own way, not the title's
        data = re.sub(r" with [^,]*|$", f" with `partition='{keys['partition']}'`", data, count=1)
    lines = [
        f"Its example, measured (`pflower-bench examples`; record `{record}`), on {data}:",
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
    p = help_text.parser("pflower-bench", "Run a benchmark suite (resumable), record its runs and build its tables and figures.")
    p.add_argument("suite", help="a suite of the suite file, e.g. 'small' or 'full'")
    p.add_argument("--file", type=Path, default=SUITES, help="suite file (default: bench/suites.toml; another needs --records DIR)")
    p.add_argument(
        "--results",
        type=Path,
        default=ROOT / "bench" / "results",
        help="where run results go, checkpoints and logs included (default: bench/results, not kept)",
    )
    p.add_argument("--records", type=Path, default=RECORDS, help="where the runs' records go, the report's only input (default: bench/records, committed)")
    p.add_argument(
        "--page",
        type=Path,
        help="the Markdown page whose suite block gets the tables (default: the page under docs/ that holds it, for the project's records; none for --records elsewhere)",
    )
    p.add_argument("--report-only", action="store_true", help="build tables and figures from the records so far (the seeds column says how many); run nothing")
    p.add_argument("--readme", type=Path, help="the page with the headline tables of bench/headlines.toml (default: README.md, for the project's suite file)")
    p.add_argument("--status", action="store_true", help="print runs done and left per grid and the time left estimated from the records; run nothing")
    p.add_argument(
        "--allow-modified",
        action="store_true",
        help="run from a checkout with uncommitted changes to pflower/ or pyproject.toml (refused otherwise; the records say '+modified')",
    )
    p.add_argument("--data-root", type=Path, help=f"the folder of the suites' data folders (default: ${DATA_ENV}, else ~/pflower-data)")
    p.add_argument("--cpus-per-client", type=core_count, default=1, help="CPU cores reserved per ClientApp (default: 1)")
    p.add_argument(
        "--gpus-per-client",
        type=gpu_share,
        default=0.0,
        help="GPU share per ClientApp, e.g. 0.25: four clients train at once on each GPU (default: 0, CPU only)",
    )
    p.add_argument("--clients-per-node", type=clients_per_node, default="auto",
                   help="clients each simulated SuperNode serves (the same numbers; default: auto, as pflower-sim's)")  # fmt: skip
    args = p.parse_args(argv)
    results, records = args.results.resolve(), args.records.resolve()
    kept = records == RECORDS.resolve()  # the project's records: their pages and README follow them
    if kept and args.file.resolve() != SUITES.resolve() and args.suite in tomllib.loads(SUITES.read_text()):
        raise SystemExit(
            f"--file {args.file}: bench/suites.toml has a suite '{args.suite}' too, whose records in bench/records this one's would write over; "
            "give this file's runs a folder of their own with --records DIR"
        )
    suite, runs = load_suite(args.file, args.suite, args.data_root)
    if args.page is not None and (why := block_problem(args.page, f"bench:{args.suite}")):
        raise SystemExit(f"--page: {why} (the suite's tables go between those comments)")
    needed, names = missing_data(runs, data_root(args.data_root))
    if needed and not (args.report_only or args.status):
        root = data_root(args.data_root)
        fetch = f"`pflower-data {' '.join(names)} --root {shlex.quote(str(root))}` fetches it, or " if names else ""
        raise SystemExit(
            f"suite '{args.suite}' reads {', '.join(needed)}, which is not there: {fetch}put the data there, or name the folder that holds it with --data-root DIR (or ${DATA_ENV})"
        )
    if args.status:
        print(status(runs, results, records, args.suite, args.cpus_per_client, args.gpus_per_client))
        return 0
    if args.report_only:
        for run in runs:  # finished results-dirs of this machine get their records; nothing runs
            finished(run, results, records, args.suite)
        check_same_data(runs, records, args.suite)
    else:
        if why := resources_problem(args.cpus_per_client, args.gpus_per_client):
            raise SystemExit(f"pflower-bench: {why}")
        execute(runs, results, args.suite, records, args.cpus_per_client, args.gpus_per_client, args.allow_modified, args.clients_per_node)
    page = args.page or (suite_page(args.suite) if kept else None)
    if page is None and not any(load_record(r, records, args.suite) for r in runs):
        raise SystemExit(f"suite '{args.suite}' has no records in {records}: nothing to report (`pflower-bench {args.suite}` runs it)")
    print(report(args.suite, suite, runs, records, results / args.suite, page))
    if page is not None:
        print(f"tables written into {page}", flush=True)
    if args.readme is not None or (kept and args.file.resolve() == SUITES.resolve()):
        readme = args.readme or README
        if names := write_headlines(args.suite, args.file, records, readme):
            print(f"headline tables {', '.join(names)} written into {readme}", flush=True)
    if kept and args.file.resolve() == SUITES.resolve():
        write_generated_pages()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
