"""End to end on Flower, the unhappy paths: resume in a new run, a client sending NaN, unreadable data."""

import json

import pytest
from conftest import InProcessGrid, faulty_app, load_app, run_config
from conftest import run_on_flower as _run

from pflower.build import build_strategy
from pflower.config import load_settings

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("simulation-faults")]


def _kill_serverapp_after_checkpoint(superlink, results, round_: int, timeout: float = 300.0) -> None:
    """Wait until the run writing ``results`` has checkpointed round ``round_``, then SIGKILL its
    ServerApp (the simulation process of this SuperLink's run): it dies mid-run, as a crash."""
    import os
    import signal
    import subprocess
    import time

    import torch

    from pflower.checkpoint import CHECKPOINT
    from pflower.launcher import CONNECTION, flower_env
    from pflower.processes import console_script

    deadline = time.monotonic() + timeout
    while True:
        try:
            if torch.load(results / CHECKPOINT, weights_only=True)["round"] >= round_:
                break
        except (FileNotFoundError, EOFError, RuntimeError):  # not there yet, or being replaced
            pass
        assert time.monotonic() < deadline, f"no checkpoint of round {round_} in {results} within {timeout:.0f} s"
        time.sleep(0.2)
    ours = f"FLWR_HOME={superlink}".encode()
    killed = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline, environ = (open(f"/proc/{pid}/{name}", "rb").read() for name in ("cmdline", "environ"))
        except OSError:
            continue
        if b"flwr-simulation" in cmdline and ours in environ.split(b"\0"):
            os.kill(int(pid), signal.SIGKILL)
            killed.append(pid)
    assert killed, "no simulation process of this SuperLink to kill"
    # as an operator would: the run is marked stopped at once instead of when its heartbeats lapse
    env, flwr = flower_env(superlink), console_script("flwr")
    runs = json.loads(subprocess.run([flwr, "ls", CONNECTION, "--format", "json"], env=env, capture_output=True, text=True, check=True).stdout)
    for run in runs["runs"]:
        if run["status"].startswith("running"):
            # on a loaded machine the CLI can start after the run's heartbeats lapsed (30 s): then
            # the SuperLink has marked it finished itself, which is what the stop is for
            out = subprocess.run([flwr, "stop", str(run["run-id"]), CONNECTION], env=env, capture_output=True, text=True, check=False)
            assert out.returncode == 0 or "already finished" in (out.stdout + out.stderr).lower(), out.stdout + out.stderr


@pytest.mark.parametrize("single_message", [True, False], ids=["one-message", "two-phase"])
def test_a_serverapp_stopped_mid_run_resumes_exactly(superlink, tmp_path, grid_factory, single_message):
    """FedPer (its head stays on the clients, the evaluation sends only the body) on Flower: the
    ServerApp is killed in round 3 (round 2 checkpointed, its evaluation held for round 3 with
    one message a round; client 0 holds round 3 open, the others have trained it and saved their
    state), then resumed by a second `flwr run` (new ClientApp contexts, state from disk): every
    row, every client's accuracy and the bytes equal one uninterrupted run's (in process, which
    equals Flower's: test_simulation_equals_in_process_run)."""
    import threading

    flag = "true" if single_message else "false"
    base = f"method='fedper' fraction-train=1.0 local-epochs=1 samples-per-client=60 single-message={flag} num-server-rounds=3"
    first: dict = {}
    app = faulty_app(tmp_path / "app", "hang")
    leg = threading.Thread(target=lambda: first.update(zip(("id", "status", "log"), _run(superlink, f"{base} results-dir='{tmp_path / 'first'}'", app=app))))
    leg.start()
    try:
        _kill_serverapp_after_checkpoint(superlink, tmp_path / "first", 2)
    finally:
        (tmp_path / "first" / "release").touch()
        leg.join()
    assert first["status"] != "finished:completed", first["log"]
    stopped = json.loads((tmp_path / "first" / "metrics.json").read_text())
    assert [r["round"] for r in stopped["rounds"]] == [1, 2]
    _, status, log = _run(superlink, f"{base} results-dir='{tmp_path / 'second'}' resume-from='{tmp_path / 'first'}'")
    assert status == "finished:completed" and "Resuming lineage" in log, log
    resumed = json.loads((tmp_path / "second" / "metrics.json").read_text())
    cfg = run_config(
        method="fedper", fraction_train=1.0, local_epochs=1, samples_per_client=60, single_message=single_message, num_server_rounds=3,
        results_dir=str(tmp_path / "full"),
    )  # fmt: skip
    build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, 3))
    full = json.loads((tmp_path / "full" / "metrics.json").read_text())
    strip = lambda doc: [{k: v for k, v in r.items() if k not in ("wall-seconds", "ray-nodes")} for r in doc["rounds"]]  # noqa: E731 - in process runs on no Ray node
    assert strip(resumed) == strip(full)
    assert resumed["final"] == full["final"] and resumed["lineage"] == stopped["lineage"]


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
        # a dropping client's failed message also carried its previous round's evaluation: that
        # evaluation goes again alone and counts, as a two-phase round has it (test_failed_messages.py)
        assert [r["rejected"] for r in doc["rounds"]] == [{reason: 1}] * 3
        final[fault] = doc["final"]["accuracy"]
    assert abs(final["nan"] - final["drop"]) <= 0.01
    assert final["nan"] > 0.3  # learned despite the NaN client (3 short rounds on digits)


def test_data_only_the_clients_can_judge_stops_the_run_naming_the_problem(superlink, tmp_path):
    """The ServerApp checks the data before round 1 (tests/test_data_check.py), but not a partition
    for a federation it has not met: 3 clients x 1000 shards of digits is found by the clients,
    each answers with one line, and the ServerApp prints it."""
    _, status, log = _run(superlink, f"partition='shards' shards-per-client=1000 results-dir='{tmp_path / 'out'}'")
    assert status == "finished:failed"
    assert "no client could start" in log and "shards-per-client=1000: 3 clients x 1000 shards of at least 2 samples need 6000" in log
    assert "Traceback" not in log
