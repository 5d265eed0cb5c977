"""bench/flbench.py (pflower beside FL-bench) and bench/pfedla_differences.py (pFedLA's choices
one at a time): their pflower sides run as declared, their records are read back as written."""

import importlib.util
import json
import sys

import pytest
from conftest import ROOT, run_config

from pflower.config import load_settings


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"pflower_bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


flbench = _load("flbench")
differences = _load("pfedla_differences")


@pytest.mark.parametrize("pair", flbench.PAIRS, ids=lambda p: p.label)
def test_every_pair_s_pflower_side_is_a_valid_run_config(pair, tmp_path):
    """Each pair's keys, on the shared ones, are a run config pflower takes (a key renamed or a
    bound moved would stop the script mid-suite)."""
    classes = ";".join(f"{2 * (i % 5)},{2 * (i % 5) + 1}" for i in range(10))
    cfg = {**run_config(), **flbench.COMMON, **pair.pflower, "dataset": "digits", "client-classes": classes, "results-dir": str(tmp_path)}
    settings = load_settings(cfg)
    assert settings.method == pair.pflower["method"]
    assert pair.flbench[0] and all(a.startswith(("++", "common.")) for a in pair.flbench[1:])


def test_a_record_counts_only_while_its_pair_is_declared_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setattr(flbench, "RECORDS", tmp_path)
    pair = next(p for p in flbench.PAIRS if p.label == "fedprox")
    assert not flbench.recorded(pair, "pflower", 0)
    from pflower.bench import resolved_config

    flbench.write_record(pair, "pflower", 0, {"accuracy": [0.5] * 20, "config": resolved_config({**flbench.COMMON, **pair.pflower, "seed": 0})}, [[0, 1]] * 10)
    flbench.write_record(pair, "flbench", 0, {"accuracy": [0.5] * 20, "command": list(pair.flbench), "reads": "before", "model": "cnn"}, [[0, 1]] * 10)
    assert flbench.recorded(pair, "pflower", 0) and flbench.recorded(pair, "flbench", 0)
    moved = flbench.Pair(pair.label, {**pair.pflower, "fedprox.mu": 0.1}, (*pair.flbench[:1], "++fedprox.mu=0.1"))
    assert not flbench.recorded(moved, "pflower", 0) and not flbench.recorded(moved, "flbench", 0)
    # A record made with another value of a key the pair leaves at its default does not count:
    stale = json.loads(flbench.record_path("fedprox", "pflower", 0).read_text())
    stale["config"]["momentum"] = 0.5
    flbench.record_path("fedprox", "pflower", 0).write_text(json.dumps(stale))
    assert not flbench.recorded(pair, "pflower", 0)
    doc = json.loads(flbench.record_path("fedprox", "flbench", 0).read_text())
    assert doc["flbench-commit"] == flbench.COMMIT and doc["machine"]["cpus"] >= 1 and doc["client-classes"][0] == [0, 1]


def test_the_table_gives_mean_and_spread_per_tool_and_says_how_many_seeds(tmp_path, monkeypatch):
    monkeypatch.setattr(flbench, "RECORDS", tmp_path)
    pair = flbench.PAIRS[0]
    for seed, last in enumerate((0.98, 0.99, 1.0)):
        flbench.write_record(pair, "pflower", seed, {"accuracy": [0.5] * 19 + [last], "config": {}}, [])
    flbench.write_record(pair, "flbench", 0, {"accuracy": [0.25] * 20}, [])
    row = next(line for line in flbench.table(flbench.load()).splitlines() if line.startswith(f"| {pair.label} |"))
    assert row == f"| {pair.label} | 50.00 ± 0.00 | 50.00 ± 0.00 | 99.00 ± 1.00 | 25.00 | 25.00 | 25.00 | 3 / 1 |"
    other = next(line for line in flbench.table(flbench.load()).splitlines() if line.startswith(f"| {flbench.PAIRS[1].label} |"))
    assert other.endswith("| — | — | — | — | — | — | 0 / 0 |")


@pytest.mark.parametrize("row", differences.ROWS)
def test_every_row_of_the_differences_bench_runs_in_process(row, tmp_path):
    """Each variant and reference method of the differences bench runs (digits, 4 clients, 1
    round of 1 epoch); the sequential one sends one client at a time and still evaluates all."""
    cfg = run_config(method="pfedla", num_server_rounds=1, local_epochs=1, partition="label-groups", label_groups=2)
    (accuracy,) = differences.run(row, cfg, num_clients=4)
    assert 0 <= accuracy <= 1


def test_the_variants_differ_from_pflower_only_where_they_say(tmp_path):
    """pflower's variant is pflower's pFedLA to the bit, the reference rows the methods
    themselves; the step at the starting models and another step size each give other numbers;
    FL-bench's step direction, on two groups that share no class, puts each client's weight on
    the other group's models."""
    from conftest import in_process_rounds

    cfg = run_config(method="pfedla", num_server_rounds=2, local_epochs=1, partition="label-groups", label_groups=2)
    plain = [r["weighted-accuracy"] for r in in_process_rounds({**cfg, "single-message": True}, tmp_path / "plain", num_clients=4)]
    runs = {v: differences.run(v, cfg, num_clients=4) for v in ("pflower", "start-models", "hn-lr-20", "flbench-sign", "local")}
    local = [r["weighted-accuracy"] for r in in_process_rounds({**cfg, "method": "local"}, tmp_path / "local", num_clients=4)]
    assert runs["pflower"] == plain and runs["local"] == local
    assert runs["start-models"] != plain and runs["hn-lr-20"] != plain
    assert runs["flbench-sign"][-1] < 0.1 < plain[-1]
