"""End to end on Flower, the unhappy paths: resume in a new run, a client sending NaN, unreadable data."""

import json

import pytest
from conftest import InProcessGrid, faulty_app, load_app, run_config
from conftest import run_on_flower as _run

from pflower.build import build_strategy
from pflower.config import load_settings

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("simulation-faults")]


def test_resume_on_flower_continues_exactly(superlink, tmp_path, grid_factory):
    """2 rounds on Flower, then a second `flwr run` with resume-from (new run, new ClientApp
    contexts) to round 3: the same rows as one uninterrupted 3-round run (in process, which
    equals Flower's: see test_simulation_equals_in_process_run)."""
    base = "method='heurpfedla' heurpfedla.top-k=1 fraction-train=0.67 local-epochs=1"
    runs = {}
    for name, rounds, resume in (("first", 2, ""), ("second", 3, tmp_path / "first")):
        _, status, log = _run(superlink, f"{base} num-server-rounds={rounds} results-dir='{tmp_path / name}' resume-from='{resume}'")
        assert status == "finished:completed", log
        runs[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    assert "Resuming lineage" in log
    cfg = run_config(method="heurpfedla", heurpfedla__top_k=1, fraction_train=0.67, local_epochs=1, num_server_rounds=3, results_dir=str(tmp_path / "full"))
    build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, 3))
    runs["full"] = json.loads((tmp_path / "full" / "metrics.json").read_text())
    # the first leg's last round sends its evaluation alone, where the full run's rides on round 3 (bytes differ)
    schedule = {"wall-seconds", "bytes-down", "bytes-up", "cumulative-bytes-down", "cumulative-bytes-up"}
    strip = lambda doc: [{k: v for k, v in r.items() if k not in schedule} for r in doc["rounds"]]  # noqa: E731
    assert strip(runs["second"]) == strip(runs["full"])
    assert runs["second"]["lineage"] == runs["first"]["lineage"] != runs["full"]["lineage"]


@pytest.mark.parametrize("method", ["pfedla"])
def test_a_client_sending_nan_every_round_changes_nothing(superlink, tmp_path, method):
    """One of 5 clients sends NaN updates on Flower: the run ends as the run where that client's
    updates are dropped (in process, which equals Flower's: test_simulation_equals_in_process_run).
    Every strategy's gate is checked against NaN in process (test_robustness.py); here on Flower."""
    nan_app = faulty_app(tmp_path / "app-nan", "nan")
    _, status, log = _run(superlink, f"method='{method}' num-server-rounds=3 local-epochs=2 results-dir='{tmp_path / 'nan'}'", clients=5, app=nan_app)
    assert status == "finished:completed", log
    cfg = run_config(method=method, num_server_rounds=3, local_epochs=2, results_dir=str(tmp_path / "drop"))
    drop_app = load_app(faulty_app(tmp_path / "app-drop", "drop"), f"faulty_drop_{method}")
    build_strategy(load_settings(cfg)).start(grid=InProcessGrid(drop_app, cfg, 5))
    final = {}
    for fault, reason in (("nan", "non-finite"), ("drop", "client-error")):
        doc = json.loads((tmp_path / fault / "metrics.json").read_text())
        # a dropping client's failed message also carried its previous round's evaluation: that error
        # counts under the round the evaluation belongs to; the last round's evaluation goes alone
        assert [r["rejected"] for r in doc["rounds"]] == ([{reason: 1}] * 3 if fault == "nan" else [{reason: 2}, {reason: 2}, {reason: 1}])
        final[fault] = doc["final"]["accuracy"]
    assert abs(final["nan"] - final["drop"]) <= 0.01
    assert final["nan"] > 0.3  # learned despite the NaN client (3 short rounds on digits)


def test_unreadable_data_stops_the_run_naming_the_file(superlink, tmp_path):
    data = tmp_path / "mnist"
    data.mkdir()
    (data / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + (10).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + b"\x00" * 100)
    (data / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01" + (10).to_bytes(4, "big") + b"\x01" * 10)
    _, status, log = _run(superlink, f"dataset='mnist' data-dir='{data}' results-dir='{tmp_path / 'out'}'")
    assert status == "finished:failed"
    assert "no client could start" in log and "t10k-images-idx3-ubyte is truncated or corrupt" in log
