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
def test_an_actor_without_a_gpu_sees_none_through_the_launchers_ray_head(tmp_path):
    """Flower starts each ClientApp actor with the run's GPU share; with 0 Ray must hide every GPU
    (CUDA_VISIBLE_DEVICES=''), as under plain ``flwr run``, not leave the variable unset."""
    from pflower.launcher import flower_env
    from pflower.ray_head import address_file, ray_head

    env = {k: v for k, v in flower_env(tmp_path).items() if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")}
    with ray_head(env, tmp_path / "head.log") as ray_env:
        deadline = time.monotonic() + 180
        while not address_file(ray_env["RAY_TMPDIR"]).exists():
            assert time.monotonic() < deadline, (tmp_path / "head.log").read_text()
            time.sleep(0.2)
        driver = (
            "import os, ray\n"
            "ray.init(include_dashboard=False)\n"
            "@ray.remote(num_cpus=1, num_gpus=0.0)\n"
            "class Actor:\n"
            "    def visible(self): return os.environ.get('CUDA_VISIBLE_DEVICES')\n"
            "print(repr(ray.get(Actor.remote().visible.remote())))\n"
        )
        out = subprocess.run([sys.executable, "-c", driver], env={**env, **ray_env}, capture_output=True, text=True, timeout=180)
    assert out.stdout.strip().splitlines()[-1:] == ["''"], out.stdout + out.stderr


@pytest.mark.parametrize("share", ["0", "0.5", "0.25", "0.125", "0.0625", "0.75", "1", "2"])
def test_gpu_shares_flower_and_ray_count_exactly_are_accepted(share):
    from pflower.launcher import gpu_share

    assert gpu_share(share) == float(share)


@pytest.mark.parametrize("share", ["0.1", "0.2", "0.3", "0.03125", "1.5", "-1", "a quarter"])
def test_other_gpu_shares_stop_pflower_sim_at_argument_parsing(capsys, share):
    from pflower.launcher import main

    with pytest.raises(SystemExit) as stopped:
        main(["--gpus-per-client", share, "--app", "/nonexistent"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --gpus-per-client: '{share}' is not a GPU share Flower and Ray count exactly" in err
    assert "0.5, 0.25, 0.125" in err


@pytest.mark.parametrize("cores", ["0", "-1", "1.0", "two"])
def test_a_core_count_below_one_stops_pflower_sim_at_argument_parsing(capsys, cores):
    from pflower.launcher import main

    with pytest.raises(SystemExit) as stopped:
        main(["--cpus-per-client", cores, "--app", "/nonexistent"])
    assert stopped.value.code == 2
    assert f"argument --cpus-per-client: '{cores}' is not a number of CPU cores: a whole number of at least 1" in capsys.readouterr().err


def test_resources_this_machine_lacks_stop_pflower_sim_before_anything_starts(monkeypatch, capsys, tmp_path):
    """More cores than the machine has, or a GPU share where torch sees too few GPUs: no ClientApp
    could start, which Flower would say only after the run started ('ActorPool is empty'). The
    results-dir is a temporary one: the checkout's `results/` may hold the main job's run."""
    import torch

    from pflower import launcher

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    started = []
    monkeypatch.setattr(launcher, "simulate", lambda *a, **k: started.append(a))
    app = str(launcher.Path(__file__).resolve().parents[1])
    out = ["-c", f"results-dir='{tmp_path / 'results'}'"]
    assert launcher.main(["--cpus-per-client", "5", "--app", app, *out]) == 2
    assert "pflower-sim: --cpus-per-client 5: this machine has 4 cores, so no ClientApp could start" in capsys.readouterr().err
    assert launcher.main(["--gpus-per-client", "2", "--app", app, *out]) == 2
    assert "pflower-sim: --gpus-per-client 2: this machine has 1 GPU(s) that torch sees" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert launcher.main(["--gpus-per-client", "0.25", "--app", app, *out]) == 2
    assert started == []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert launcher.resources_problem(4, 2.0) is None and launcher.resources_problem(4, 0.25) is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a cluster's other nodes may have them
    assert launcher.resources_problem(64, 8.0) is None


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
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGKILL, -9)], ids=["sigterm", "sigkill"])
def test_every_process_pflower_sim_started_ends_with_it(tmp_path, sig, status):
    """SIGTERM: pflower-sim stops what it started. SIGKILL (or the OOM killer) leaves it no time:
    the Ray head and the SuperLink's watcher see their stdin close and stop theirs, and the head
    removes its folder."""
    home = tmp_path / "home"
    cmd = [os.path.join(os.path.dirname(sys.executable), "pflower-sim"), "--num-clients", "2", "--flwr-home", str(home),
           "--app", str(ROOT), "-c", f"method='fedavg' num-server-rounds=500 results-dir='{tmp_path / 'out'}'"]  # fmt: skip
    from pflower.processes import process_tree

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not any("flwr-simulation" in _cmdline(pid) for pid in process_tree(proc.pid)):  # the run is under way
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    started = process_tree(proc.pid)[1:]
    assert len(started) >= 4  # flwr run, the SuperLink, its simulation process and the Ray head, at least
    head = next(pid for pid in started if "pflower.ray_head" in _cmdline(pid))
    ray_tmpdir = next(v[len(b"RAY_TMPDIR=") :].decode() for v in open(f"/proc/{head}/environ", "rb").read().split(b"\0") if v.startswith(b"RAY_TMPDIR="))
    proc.send_signal(sig)
    assert proc.wait(120) == status
    deadline = time.monotonic() + 60  # a watcher gives its server 10 s to stop before SIGKILL
    while ((left := {pid: _cmdline(pid)[:120] for pid in started if _alive(pid)}) or os.path.exists(ray_tmpdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == {} and not os.path.exists(ray_tmpdir)


def _watcher_tree(watcher: int, size: int) -> list[int]:
    """The watcher's process tree once it has ``size`` processes."""
    from pflower.processes import process_tree

    deadline = time.monotonic() + 30
    while len(tree := process_tree(watcher)) < size:
        assert time.monotonic() < deadline, tree
        time.sleep(0.05)
    return tree


def _gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + 30
    while (left := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_a_watched_server_ends_when_the_program_that_started_it_is_killed():
    """SIGKILL leaves a program no time to stop its servers: the watcher's stdin closes, and it
    stops the server and what the server started."""
    stubborn = "sh -c 'trap \"\" TERM; sleep 1000; true' & sleep 1000; true"  # a descendant that ignores SIGTERM
    script = f"import sys\nfrom pflower.processes import start_watched\nprint(start_watched(['sh', '-c', {stubborn!r}]).pid, flush=True)\nsys.stdin.read()\n"
    launcher = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    started = _watcher_tree(int(launcher.stdout.readline()), 5)  # the watcher, sh, its sleep, the stubborn sh and its sleep
    launcher.kill()
    launcher.wait()
    assert _gone(started) == []


def test_a_watched_command_exits_with_its_status_and_ends_with_its_watcher():
    from pflower.processes import start_watched

    assert start_watched(["sh", "-c", "exit 3"]).wait(30) == 3
    watcher = start_watched(["sh", "-c", "sleep 1000; true"])
    started = _watcher_tree(watcher.pid, 3)
    watcher.terminate()
    assert watcher.wait(30) == 143 and _gone(started) == []


def test_a_watcher_stopped_while_its_command_starts_leaves_nothing():
    from pflower.processes import process_tree, start_watched

    marker = f"sleep 1000.{os.getpid()}"  # the command's own process, found by its command line
    for _ in range(20):
        watcher = start_watched(["sh", "-c", f"{marker}; true"])
        while len(process_tree(watcher.pid)) < 2:  # the command has just been forked
            assert watcher.poll() is None
        watcher.terminate()
        watcher.wait(30)
    deadline = time.monotonic() + 30
    while (left := [pid for pid in os.listdir("/proc") if pid.isdigit() and marker in _cmdline(int(pid)) and _alive(int(pid))]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


def _running(marker: str, wait: float = 30) -> list[int]:
    """Live processes whose command line has ``marker``, once none is left or after ``wait`` s."""
    deadline = time.monotonic() + wait
    while (left := [int(p) for p in os.listdir("/proc") if p.isdigit() and marker in _cmdline(int(p)) and _alive(int(p))]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_a_command_that_dies_leaves_nothing_its_watcher_could_find():
    """A server that dies by itself (a crash, the OOM killer) orphans what it started, in its group
    and in sessions of their own: the watcher, their subreaper, ends them and exits as it did."""
    from pflower.processes import start_watched

    marker = f"sleep 1000.{os.getpid()}"
    watcher = start_watched(["sh", "-c", f"{marker}1 & setsid {marker}2 & sleep 0.5; exit 3"])
    assert watcher.wait(60) == 3 and _running(marker) == []


def test_a_second_sigterm_does_not_cut_the_watchers_stop_short():
    """systemd and SLURM SIGTERM every process of a job, then the launcher's stop() does: the
    watcher stops its command, down to SIGKILL for one that ignores SIGTERM, whatever comes."""
    from pflower.processes import start_watched

    marker = f"sleep 1000.{os.getpid()}3"
    watcher = start_watched(["sh", "-c", f"trap '' TERM; exec {marker}"])
    deadline = time.monotonic() + 30
    while not any(marker in _cmdline(pid) for pid in _watcher_tree(watcher.pid, 2)):  # it ignores SIGTERM now
        assert time.monotonic() < deadline
        time.sleep(0.05)
    watcher.terminate()
    time.sleep(0.5)  # the watcher is stopping its command now
    watcher.terminate()
    watcher.wait(60)
    assert _running(marker) == []


def test_stop_ends_what_a_process_starts_while_it_stops():
    """A server that starts a process in a session of its own on SIGTERM (a last export, a
    shutdown hook) and exits: that process is outside the group and was not there when stop()
    began; stop() still ends it."""
    from pflower.processes import stop

    marker = f"sleep 1000.{os.getpid()}4"
    proc = subprocess.Popen(["sh", "-c", f"trap 'setsid {marker} & sleep 1; exit 0' TERM; sleep 1000 & wait"], start_new_session=True)
    _watcher_tree(proc.pid, 2)
    stop(proc)
    assert proc.returncode == 0 and _running(marker) == []


def test_stop_kills_a_descendant_that_ignores_sigterm_and_outlives_its_parent(monkeypatch):
    from pflower import processes
    from pflower.processes import process_tree, stop

    monkeypatch.setattr(processes, "GRACE", 1.0)
    marker = f"sleep 1000.{os.getpid()}5"
    proc = subprocess.Popen(["sh", "-c", f"setsid sh -c \"trap '' TERM; {marker}; true\" & sleep 1000; true"], start_new_session=True)
    deadline = time.monotonic() + 30
    while not any(_cmdline(pid).startswith(marker) for pid in process_tree(proc.pid)):  # the sleep that ignores SIGTERM
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    stop(proc)
    assert _running(marker) == [] and time.monotonic() - started < 5


def test_stop_ends_a_process_that_keeps_starting_others_that_ignore_sigterm(monkeypatch):
    """SIGTERM-proof processes that keep forking new ones into sessions of their own: after the
    grace time each is stopped (SIGSTOP) before any is killed, so none forks after the last look."""
    from pflower import processes
    from pflower.processes import stop

    monkeypatch.setattr(processes, "GRACE", 1.0)
    marker = f"sleep 1000.{os.getpid()}6"
    forker = f"import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    if os.fork() == 0:\n        os.setsid()\n        os.execvp('sleep', {marker.split()!r})\n    time.sleep(0.02)\n"
    proc = subprocess.Popen([sys.executable, "-c", forker], start_new_session=True)
    deadline = time.monotonic() + 30
    while len(_running(marker, wait=0)) < 5:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    stop(proc)
    assert _running(marker) == []


def test_a_process_is_followed_by_pid_and_start_time():
    """A pid told to stop names that process only: once it is gone and the pid is reused, the
    listing leaves the new process and its children alone."""
    from pflower.processes import _live, _tree_of, process_tree

    proc = subprocess.Popen(["sh", "-c", "sleep 1000 & wait"], start_new_session=True)
    try:
        _watcher_tree(proc.pid, 2)
        started = _live()[proc.pid][1]
        assert set(_tree_of(set(), {proc.pid: started})) == set(process_tree(proc.pid))
        assert _tree_of(set(), {proc.pid: started - 1}) == {}  # the same pid, another process
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_flower_and_ray_notes_that_do_not_apply_give_way_to_one_accurate_line():
    """The lines Flower 1.39 and Ray print at every simulation's start (a federation-size warning
    and a hint naming Flower's command, where pflower-sim's is --num-clients; Ray's FutureWarning
    and its source line) are not shown; the federation's size is, in pflower's words."""
    log = [
        "\x1b[92mINFO \x1b[0m:      Starting Flower Simulation\n",
        "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n",
        "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (10 simulated SuperNodes)\n",
        "\x1b[92mINFO \x1b[0m:      To change federation size, use the following command:\n",
        "\x1b[92mINFO \x1b[0m:      \tflwr federation simulation-config @none/default <superlink> --num-supernodes <N>\n",
        "/x/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of Ray, Ray will no longer override accelerator visible devices env var if num_gpus=0\n",
        "  warnings.warn(\n",
        "\x1b[92mINFO \x1b[0m:      Clients: 10 (ids 0..9)\n",
        "  warnings.warn(\n",
        "2026-12-06 14:00:01,123\tWARNING services.py:433 -- Found multiple active Ray instances: {'10.0.0.2:6379', '127.0.0.1:41234'}. "
        "Connecting to latest cluster at 127.0.0.1:41234. You can override this by setting the `--address` flag or `RAY_ADDRESS` environment variable.\n",
        "\x1b[36m(ClientAppActor pid=1017)\x1b[0m \x1b[93mWARNING \x1b[0m:   Manually terminating ClientAppActor\n",
    ]
    from pflower.launcher import Quiet

    quiet = Quiet(10)
    shown = [out for line in log if (out := quiet(line)) is not None]
    assert shown == [
        log[0], "pflower-sim: 10 simulated clients (--num-clients)\n", log[7], log[8],
        "pflower-sim: other Ray instances run on this machine; this run uses its own Ray head at 127.0.0.1:41234\n",
    ]  # fmt: skip
    assert Quiet(10, 4)(log[2]) == "pflower-sim: 10 simulated clients (--num-clients) on 4 simulated nodes (--clients-per-node)\n"


def test_an_exported_flwr_home_is_used_and_its_connections_kept(tmp_path, monkeypatch):
    """pflower-sim used <app>/.flwr whatever FLWR_HOME said; it now uses an exported FLWR_HOME
    (--flwr-home first) and adds its connection to that config.toml, keeping the user's own."""
    import contextlib
    import tomllib

    from pflower import launcher as L

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "lab"\n\n[superlink.lab]\naddress = "10.0.0.1:9093"\ninsecure = true\n')
    used = []
    monkeypatch.setattr(L, "simulation_superlink", lambda h: (used.append(h), contextlib.nullcontext(0))[1])
    monkeypatch.setattr(L, "submit", lambda app, h, *a, **k: (1, "finished:completed", ""))
    monkeypatch.setenv("FLWR_HOME", str(home))
    L.simulate(tmp_path)
    L.simulate(tmp_path, flwr_home=tmp_path / "given")
    monkeypatch.delenv("FLWR_HOME")
    L.simulate(tmp_path)
    assert used == [home, tmp_path / "given", tmp_path / ".flwr"]
    L.write_connection(home / "config.toml", 'address = "127.0.0.1:5555"\ninsecure = true\n')
    L.write_connection(home / "config.toml", 'address = "127.0.0.1:6666"\ninsecure = true\n')  # the next run's port replaces it
    assert tomllib.loads((home / "config.toml").read_text())["superlink"] == {
        "default": "lab", "lab": {"address": "10.0.0.1:9093", "insecure": True}, "pflower-sim": {"address": "127.0.0.1:6666", "insecure": True}
    }  # fmt: skip


def test_a_run_status_that_cannot_be_read_says_so(tmp_path, capsys):
    """The status comes from the SuperLink's Control API in this process (no `flwr list`
    process): a SuperLink that is not there is named, and nothing of Flower's CLI is printed."""
    from pflower.launcher import run_status, write_connection
    from pflower.processes import free_port

    write_connection(tmp_path / "config.toml", f'address = "127.0.0.1:{free_port()}"\ninsecure = true\n')
    with pytest.raises(SystemExit, match=r"^could not read the status of run 42 from the SuperLink \("):
        run_status(tmp_path, 42, attempts=1)
    assert "Using SuperLink" not in capsys.readouterr().out
