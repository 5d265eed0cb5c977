"""The launcher's start-up helpers: the staged app Flower bundles and the shared Ray head."""

import io
import os
import signal
import subprocess
import sys
import time
import zipfile

import pytest

from conftest import ROOT, faulty_app


def _fab_files(app):
    from flwr.cli.build import build_fab_from_disk

    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(app))) as fab:
        return {name: fab.read(name) for name in fab.namelist()}


def test_staged_app_bundles_the_same_fab(tmp_path):
    from pflower.launcher import stage_app

    for app, module in ((ROOT, "pflower/strategies/loop.py"), (faulty_app(tmp_path / "faulty", "nan"), "faulty_client.py")):
        staged = stage_app(app, tmp_path / f"staged-{app.name}")
        assert staged != app
        original, copy = _fab_files(app), _fab_files(staged)
        assert module in original and copy == original


@pytest.mark.e2e
def test_ray_head_is_found_by_ray_init_and_leaves_no_process(tmp_path):
    from pflower.launcher import flower_env
    from pflower.ray_head import address_file, ray_head

    env = {k: v for k, v in flower_env(tmp_path).items() if k != "RAY_ADDRESS"}
    with ray_head(env, tmp_path / "head.log") as ray_env:
        target = address_file(ray_env["RAY_TMPDIR"])
        deadline = time.monotonic() + 180
        while not target.exists():
            assert time.monotonic() < deadline, (tmp_path / "head.log").read_text()
            time.sleep(0.2)
        head = target.read_text()
        driver = "import ray; ray.init(include_dashboard=False); print(ray.get_runtime_context().gcs_address)"
        out = subprocess.run([sys.executable, "-c", driver], env={**env, **ray_env}, capture_output=True, text=True, timeout=180)
        assert out.stdout.strip() == head, out.stderr
    assert not os.path.exists(ray_env["RAY_TMPDIR"])
    left = subprocess.run(["pgrep", "-f", ray_env["RAY_TMPDIR"]], capture_output=True, text=True).stdout.split()
    assert left == []


@pytest.mark.e2e
def test_user_ray_address_wins(tmp_path):
    from pflower.ray_head import ray_head

    with ray_head({"RAY_ADDRESS": "127.0.0.1:1"}, tmp_path / "head.log") as ray_env:
        assert ray_env == {}
    assert not (tmp_path / "head.log").exists()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.e2e
def test_sigterm_stops_every_process_pflower_sim_started(tmp_path):
    home = tmp_path / "home"
    cmd = [os.path.join(os.path.dirname(sys.executable), "pflower-sim"), "--num-clients", "2", "--flwr-home", str(home),
           "--app", str(ROOT), "-c", f"method='fedavg' num-server-rounds=500 results-dir='{tmp_path / 'out'}'"]  # fmt: skip
    from pflower.launcher import process_tree

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not any("flwr-simulation" in _cmdline(pid) for pid in process_tree(proc.pid)):  # the run is under way
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    started = process_tree(proc.pid)[1:]
    assert len(started) >= 4  # flwr run, the SuperLink, its simulation process and the Ray head, at least
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 143
    time.sleep(2)
    left = {pid: _cmdline(pid)[:120] for pid in started if _alive(pid)}
    assert left == {}
