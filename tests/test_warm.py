"""Warm nodes (pflower/deploy/warm.py), without Flower processes: the shim/server protocol with a
probe entry point instead of Flower's (exit status, output on the shim's own fds, argv, env and
cwd, crashes, signals, a killed shim, a dead server, the cold fallback, private sockets, the
wrapper's restarts), one server with the real preload (Flower's entry point runs, nothing of
pflower or CUDA loaded, no extra thread), and the Flower 1.39.0 contract the shim relies on."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT

from pflower.deploy import warm

WARM = Path(warm.__file__)
VENV_BIN = str(Path(sys.executable).parent)

PROBE = r"""
import json, os, sys, time


def main():
    what, *rest = sys.argv[1:]
    if what == "report":
        print("out-line", flush=True)
        print("err-line", file=sys.stderr, flush=True)
        line = sys.stdin.readline().strip()
        with open(rest[0], "w") as f:
            json.dump({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid(), "ppid": os.getppid(),
                       "pgid": os.getpgid(0), "stdin": line, "comm": open("/proc/self/comm").read().strip(),
                       "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("pflower", "json", "numpy"))}, f)
        print("echo:" + line)
        sys.exit(int(rest[1]) if len(rest) > 1 else 0)
    if what == "raise":
        raise RuntimeError("the ClientApp failed")
    if what == "segv":
        import ctypes
        ctypes.string_at(0)
    if what == "sleep":
        open(rest[0], "w").write(str(os.getpid()))
        time.sleep(float(rest[1]))
    if what == "ls":
        print(json.dumps(sorted(os.listdir(rest[0]))))
"""


def _wait(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{pid}/stat").exists() else "Z"
    return state != "Z"


def _status(sock: Path) -> dict | None:
    try:
        return warm.server_status(sock, timeout=2)
    except (OSError, ValueError):
        return None


class Node:
    """A probe fork server (no preload: starts in a fraction of a second) and a shim beside it."""

    def __init__(self, root: Path, preload: str = "", entry: str = "warm_probe:main", wrap: tuple[str, ...] = (), path: str = "", program: Path = WARM,
                 start_timeout: float = 60):  # fmt: skip
        self.root = root
        (root / "probe").mkdir(parents=True, exist_ok=True)
        (root / "probe" / "warm_probe.py").write_text(PROBE)
        self.sock = warm.socket_path(warm.private_dir(root / "node"))
        self.shim = warm.write_shim(root / "bin")
        self.fake = root / "cold"  # a stand-in for the real flwr-clientapp, next on PATH after the shim
        self.fake.mkdir(exist_ok=True)
        (self.fake / "flwr-clientapp").write_text('#!/bin/sh\necho "cold $*"\nexit 3\n')
        (self.fake / "flwr-clientapp").chmod(0o755)
        env = {**os.environ, "PYTHONPATH": str(root / "probe"), "PATH": f"{path}{self.fake}:{os.environ['PATH']}"}
        cmd = [*wrap, sys.executable, str(program), "serve", "--socket", str(self.sock), "--preload", preload] + (["--entry", entry] if entry else [])
        self.log = open(root / "server.log", "wb")
        self.server = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        try:  # a server that does not come up in time is stopped here: no fixture holds it yet
            _wait(lambda: _status(self.sock) is not None or self.server.poll() is not None, start_timeout, "the fork server")
            assert self.server.poll() is None, (root / "server.log").read_text()
        except BaseException:
            self.stop()
            raise

    def env(self, **extra) -> dict[str, str]:
        return {"PATH": f"{self.shim.parent}:{self.fake}:/usr/bin:/bin", warm.ENV_SOCKET: str(self.sock), **extra}

    def run(self, *args, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("env", self.env())
        kw.setdefault("timeout", 60)
        return subprocess.run([str(self.shim), *args], capture_output=True, text=True, **kw)

    def popen(self, *args) -> subprocess.Popen:
        return subprocess.Popen([str(self.shim), *args], env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(self):
        if self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(10)
        self.log.close()


def test_a_fork_server_that_does_not_come_up_in_time_is_not_left_behind(tmp_path, monkeypatch):
    """The helper's server never answers (a stand-in that only sleeps): the helper fails and the
    process is gone (at a load of 23 it was left running, orphaned)."""
    started = []
    real = subprocess.Popen

    def popen(*args, **kw):
        started.append(real(*args, **kw))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(AssertionError, match="timed out waiting for the fork server"):
        Node(tmp_path, wrap=("sh", "-c", "exec sleep 600", "stand-in"), start_timeout=0.5)
    assert len(started) == 1 and started[0].poll() is not None


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.stop()


def test_the_child_gets_the_shims_argv_env_cwd_and_fds_and_its_exit_status_comes_back(node, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "report.json"
    done = node.run("report", str(out), "7", cwd=work, input="hello\n", env=node.env(FOO="bar baz"))
    assert done.returncode == 7, done.stderr
    assert done.stdout.splitlines() == ["out-line", "echo:hello"]  # the shim's own stdout, stdin and stderr
    assert "err-line" in done.stderr and "pflower-warm" not in done.stderr
    report = json.loads(out.read_text())
    assert report["argv"][1:] == ["report", str(out), "7"] and report["argv"][0].endswith("/flwr-clientapp")
    assert report["cwd"] == str(work) and report["stdin"] == "hello"
    assert report["env"]["FOO"] == "bar baz" and report["env"][warm.ENV_SOCKET] == str(node.sock)
    assert report["ppid"] == node.server.pid and report["pgid"] == report["pid"]  # forked by the server, a group of its own
    assert report["comm"] == "flwr-clientapp"
    assert not [m for m in report["modules"] if m.startswith("pflower")]
    assert node.run("report", str(out), input="\n").returncode == 0
    assert _status(node.sock)["forked"] == 2


def test_crashing_children_leave_the_server_serving(node, tmp_path):
    raised = node.run("raise")
    assert raised.returncode == 1 and "RuntimeError: the ClientApp failed" in raised.stderr
    segv = node.run("segv")
    assert segv.returncode == -signal.SIGSEGV  # the shim dies of the child's signal, as the real command would
    assert node.run("report", str(tmp_path / "r.json"), "0", input="\n").returncode == 0
    assert node.server.poll() is None and _status(node.sock)["children"] == []


def test_a_killed_shim_takes_its_child_with_it_and_signals_are_relayed(node, tmp_path):
    pidfile = tmp_path / "child.pid"
    shim = node.popen("sleep", str(pidfile), "60")
    _wait(lambda: pidfile.exists() and pidfile.read_text(), what="the child")
    child = int(pidfile.read_text())
    shim.kill()
    shim.wait(10)
    _wait(lambda: not _alive(child), 10, "the child to die with its shim")

    pidfile.unlink()
    shim = node.popen("sleep", str(pidfile), "60")
    _wait(lambda: pidfile.exists() and pidfile.read_text(), what="the child")
    child = int(pidfile.read_text())
    shim.send_signal(signal.SIGTERM)
    assert shim.wait(10) == -signal.SIGTERM
    assert not _alive(child)
    assert node.server.poll() is None


def test_a_dead_server_takes_its_children_and_later_shims_go_cold(node, tmp_path):
    pidfile = tmp_path / "child.pid"
    shim = node.popen("sleep", str(pidfile), "60")
    _wait(lambda: pidfile.exists() and pidfile.read_text(), what="the child")
    child = int(pidfile.read_text())
    node.server.kill()
    node.server.wait(10)
    out, err = shim.communicate(timeout=10)
    assert shim.returncode == 1 and "went away during the message" in err
    _wait(lambda: not _alive(child), 10, "the child to die with the server")
    cold = node.run("report", "x")
    assert cold.returncode == 3 and cold.stdout.strip() == "cold report x"
    assert "no fork server at" in cold.stderr and "(cold)" in cold.stderr


def test_a_node_switched_cold_runs_the_real_command_until_switched_back(node, tmp_path):
    warm.switch(node.sock.parent, False)
    cold = node.run("report", "x")
    assert cold.returncode == 3 and "switched cold" in cold.stderr
    warm.switch(node.sock.parent, True)
    assert node.run("report", str(tmp_path / "r.json"), input="\n").returncode == 0
    assert _status(node.sock)["forked"] == 1


def test_without_a_server_the_shim_execs_the_real_command(tmp_path):
    shim = warm.write_shim(tmp_path / "bin")
    fake = tmp_path / "real"
    fake.mkdir()
    (fake / "flwr-clientapp").write_text('#!/bin/sh\necho "real $*"\nexit 4\n')
    (fake / "flwr-clientapp").chmod(0o755)
    path = f"{shim.parent}:{fake}:/usr/bin:/bin"
    for env in ({"PATH": path}, {"PATH": path, warm.ENV_SOCKET: str(tmp_path / "none.sock")}):
        done = subprocess.run([str(shim), "--token", "t"], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 4 and done.stdout == "real --token t\n"
        assert f"starting {fake / 'flwr-clientapp'} (cold)" in done.stderr
    assert warm.real_command(path) == str(fake / "flwr-clientapp") and warm.is_shim(shim)


def test_the_servers_folder_is_private_and_the_socket_path_short(tmp_path):
    folder = warm.private_dir(tmp_path / "a" / "node0")
    assert folder.stat().st_mode & 0o777 == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with pytest.raises(warm.WarmError, match="mode 755"):
        warm.private_dir(open_dir)
    with pytest.raises(warm.WarmError, match="at most 100"):
        warm.socket_path(tmp_path / ("x" * 120))
    with pytest.raises(SystemExit):
        warm.main(["run", "--dir", str(open_dir), "--", "true"])
    with pytest.raises(SystemExit):
        warm.main(["serve", "--socket", str(folder / "s.sock"), "--preload", "torch,pflower.client_app"])
    with pytest.raises(warm.WarmError, match="pflower"):
        warm.ForkServer(folder / "s.sock", ("pflower",))


@pytest.mark.skipif(os.geteuid() != 0, reason="connects as another user")
def test_the_server_refuses_other_users_and_other_network_namespaces(tmp_path):
    root = Path(tempfile.mkdtemp(prefix="pflower-warm-test-"))  # outside pytest's root-only tmp tree
    n = Node(root)
    try:
        root.chmod(0o755)
        (root / "node").chmod(0o711)  # only for this test: let another uid reach the socket
        n.sock.chmod(0o777)
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.setuid(65534)
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(str(n.sock))
                    try:  # the server may answer and close before it reads the request
                        warm.send_request(s, {"argv": ["x"], "env": {}, "cwd": "/"}, [0, 1, 2])
                    except OSError:
                        pass
                    os.write(writer, s.makefile("rb").readline())
            except BaseException as err:
                os.write(writer, json.dumps({"error": repr(err)}).encode())
            finally:
                os._exit(0)
        os.close(writer)
        os.waitpid(pid, 0)
        reply = json.loads(os.read(reader, 4096))
        assert "refused: the shim runs as uid 65534" in reply["error"]
        if shutil.which("unshare"):
            other_ns = subprocess.run(["unshare", "--net", str(n.shim), "report", "x"], env=n.env(), capture_output=True, text=True, timeout=30)
            assert other_ns.returncode == 3 and "another network namespace" in other_ns.stderr
        assert _status(n.sock)["forked"] == 0, (root / "server.log").read_text()
    finally:
        n.stop()
        shutil.rmtree(root)


# ------------------------------------------------------------------- failing closed (each refusal goes cold)
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, mounts, capabilities, other uids)")
NO_DAC = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--")  # root that file modes bind like anyone
NO_PTRACE = ("setpriv", "--bounding-set", "-sys_ptrace", "--")  # root that may not read a non-dumpable process's /proc links


def _needs(*tools: str) -> None:
    if missing := [t for t in tools if not shutil.which(t)]:
        pytest.skip(f"{', '.join(missing)} not installed")


def _cold(done: subprocess.CompletedProcess, why: str) -> None:
    assert done.returncode == 3 and done.stdout.startswith("cold "), done.stdout + done.stderr
    assert why in done.stderr and "(cold)" in done.stderr, done.stderr


def _exchange(sock: Path, data: bytes, fds=(0, 1, 2), timeout: float = 10) -> bytes:
    """Send ``data`` (with ``fds``) as a request, stop writing, and read the answer to its end."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        with contextlib.suppress(OSError):  # the server may refuse before it has read everything
            socket.send_fds(s, [data], list(fds)) if fds else s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        answer = b""
        with contextlib.suppress(ConnectionResetError):  # it closed with bytes of ours unread
            while chunk := s.recv(4096):
                answer += chunk
        return answer


def _body(text: bytes) -> bytes:
    return warm.HEADER.pack(len(text)) + text


@ROOT_ONLY
def test_a_shim_in_another_mount_or_pid_namespace_goes_cold(node, tmp_path):
    """A requester with a tmpfs over a private folder must not get a child that lists the folder
    (nor run a FAB from its own endpoint): mount, pid, network and user namespaces must match."""
    _needs("unshare")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("x")
    hidden = subprocess.run(["unshare", "--mount", "sh", "-c", 'mount -t tmpfs none "$1" && exec "$2" ls "$1"', "sh", str(secret), str(node.shim)],
                            env=node.env(), capture_output=True, text=True, timeout=30)  # fmt: skip
    assert "key.txt" not in hidden.stdout
    _cold(hidden, "another mount namespace")
    _cold(subprocess.run(["unshare", "--pid", "--fork", str(node.shim), "ls", "/"], env=node.env(), capture_output=True, text=True, timeout=30),
          "another pid namespace")  # fmt: skip
    assert _status(node.sock)["forked"] == 0


@ROOT_ONLY
def test_a_server_that_cannot_see_the_shims_pid_refuses_it(tmp_path):
    """The server in a pid namespace of its own (as in a container) sees the shim's pid as 0."""
    _needs("unshare")
    n = Node(tmp_path, wrap=("unshare", "--pid", "--fork", "--kill-child"))
    try:
        _cold(n.run("ls", "/"), "not visible in the fork server's pid namespace")
        assert _status(n.sock)["forked"] == 0
    finally:
        n.server.kill()  # unshare ignores SIGTERM; its --kill-child takes the server along
        n.stop()


@ROOT_ONLY
def test_a_shim_whose_namespaces_cannot_be_read_goes_cold(tmp_path):
    """A non-dumpable shim's /proc links are hidden from a server without CAP_SYS_PTRACE: refused."""
    _needs("setpriv")
    n = Node(tmp_path, wrap=NO_PTRACE)
    try:
        run = f"import ctypes, sys; sys.path.insert(0, {str(WARM.parent)!r}); import warm; sys.argv = [{str(n.shim)!r}, 'ls', '/']; "
        dumpable = subprocess.run([*NO_PTRACE, sys.executable, "-c", run + "sys.exit(warm.shim())"], env=n.env(), capture_output=True, text=True, timeout=30)
        assert dumpable.returncode == 0 and "pflower-warm" not in dumpable.stderr, dumpable.stderr  # same capabilities: readable
        hidden = run + "ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); sys.exit(warm.shim())"  # PR_SET_DUMPABLE 0
        _cold(subprocess.run([*NO_PTRACE, sys.executable, "-c", hidden], env=n.env(), capture_output=True, text=True, timeout=30),
              "namespaces cannot be compared")  # fmt: skip
        assert _status(n.sock)["forked"] == 1
    finally:
        n.stop()


def test_malformed_requests_and_signal_lines_never_end_the_server(node, tmp_path):
    """Any bytes: wrong types, deep nesting, huge numbers, bad UTF-8, NUL, oversize or lying
    lengths, too many or too few fds, and a fuzz of random byte strings. Each is answered with an
    error or dropped; the server goes on serving."""
    import random

    bad = [b"[]", b"{}", b"null", b"1e999", b"9" * 5000, b"[" * 200_000, b"\xff\xfe", b'{"op": "status", "x": 1}',
           b'{"argv": "x", "env": {}, "cwd": "/"}', b'{"argv": [], "env": {}, "cwd": "/"}', b'{"argv": [1], "env": {}, "cwd": "/"}',
           b'{"argv": ["x"], "env": {"A": 1e999}, "cwd": "/"}', b'{"argv": ["x"], "env": {"A=B": "c"}, "cwd": "/"}',
           b'{"argv": ["x\\u0000"], "env": {}, "cwd": "/"}', b'{"argv": ["x"], "env": [], "cwd": 5}',
           b'{"argv": ["x"], "env": {}, "cwd": "/", "more": 1}']  # fmt: skip
    for body in bad:
        answer = _exchange(node.sock, _body(body))
        assert b'"error": "bad request' in answer, (body[:40], answer)
    good = json.dumps({"argv": ["x", "ls", "/"], "env": {}, "cwd": "/"}).encode()
    assert b"bad request" in _exchange(node.sock, warm.HEADER.pack(0xFFFFFFFF) + b"{}")
    assert b"bad request" in _exchange(node.sock, _body(good) + b"extra")
    assert b"bad request: 0 fds" in _exchange(node.sock, _body(good), fds=())
    assert b"more than 3 fds" in _exchange(node.sock, _body(good), fds=(0, 1, 2, 0, 1))
    assert b"pid" not in _exchange(node.sock, _body(good)[:10])  # cut short: dropped without a child
    rng = random.Random(7)
    for i in range(300):
        junk = rng.randbytes(rng.randrange(1, 300))
        _exchange(node.sock, _body(junk) if i % 2 else junk, fds=(0, 1, 2) if i % 3 else ())
    assert node.server.poll() is None and _status(node.sock)["forked"] == 0

    # a running child's connection: junk lines are ignored, an endless line drops it (and its child)
    pidfile = tmp_path / "child.pid"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s, open(os.devnull, "r+b") as null:
        s.settimeout(10)
        s.connect(str(node.sock))
        replies = s.makefile("rb")
        assert json.loads(replies.readline()) == {"ready": True}
        warm.send_request(s, {"argv": ["x", "sleep", str(pidfile), "60"], "env": {"PYTHONPATH": str(tmp_path / "probe")}, "cwd": "/"}, [null.fileno()] * 3)
        child = json.loads(replies.readline())["pid"]
        junk = [b'{"signal": 1e999}', b"[]", b'{"signal": "1"}', b'{"signal": true}', b'{"signal": 9}', b'{"signal": 1' + b"0" * 30 + b"}", b"not json", b"[" * 250]  # fmt: skip
        s.sendall(b"\n".join(junk) + b"\n")
        _wait(lambda: pidfile.exists() and pidfile.read_text(), what="the child")
        assert _alive(child) and node.server.poll() is None
        with contextlib.suppress(OSError):
            s.sendall(b"x" * 100_000)
        with contextlib.suppress(ConnectionResetError):  # the server dropped the connection: no buffer grows without bound
            assert s.recv(4096) == b""
    _wait(lambda: not _alive(child), 10, "the child to die with its connection")
    assert node.run("ls", "/").returncode == 0 and _status(node.sock)["forked"] == 2 and node.server.poll() is None


def test_slow_clients_stall_nobody_and_are_dropped_at_their_deadline(node):
    """A client sending a byte now and then, and more idle connections than the server keeps:
    a shim is served meanwhile, at once; the slow client is dropped at its deadline."""
    import threading

    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(warm.MAX_PENDING + 4)]
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stop, closed_at = threading.Event(), []

    def drip():
        started = time.monotonic()
        with contextlib.suppress(OSError):
            slow.sendall(warm.HEADER.pack(1000))
            while not stop.is_set():
                slow.sendall(b" ")
                stop.wait(0.2)
        closed_at.append(time.monotonic() - started)

    try:
        for s in idle:  # the oldest of these are dropped to make room
            s.connect(str(node.sock))
            s.sendall(b"\x00")
        slow.connect(str(node.sock))
        thread = threading.Thread(target=drip, daemon=True)
        thread.start()
        started = time.monotonic()
        done = node.run("ls", "/", timeout=8)
        assert done.returncode == 0 and "pflower-warm" not in done.stderr, done.stderr
        assert time.monotonic() - started < warm.REQUEST_DEADLINE  # not after the slow client's deadline
        slow.settimeout(warm.REQUEST_DEADLINE + 5)
        assert b"no whole request within" in slow.recv(4096) + slow.recv(4096)
        thread.join(10)
        assert closed_at and closed_at[0] < warm.REQUEST_DEADLINE + 3
    finally:
        stop.set()
        for s in [slow, *idle]:
            s.close()
    assert node.server.poll() is None and _status(node.sock)["forked"] == 1


def test_a_stopped_server_sends_shims_cold_after_their_timeout(node):
    os.kill(node.server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        done = node.run("ls", "/", env=node.env(**{warm.ENV_TIMEOUT: "1"}), timeout=20)
        _cold(done, "did not answer within 1 s")
        assert time.monotonic() - started < 8
    finally:
        os.kill(node.server.pid, signal.SIGCONT)
    assert node.run("ls", "/").returncode == 0
    assert _status(node.sock)["forked"] == 1  # the shim that went cold left no child behind


@ROOT_ONLY
def test_unsearchable_path_folders_are_skipped_by_the_server_and_the_cold_fallback(tmp_path):
    """A PATH folder this user may not search (root without DAC capabilities here): skipped."""
    _needs("setpriv")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o000)
    locked.chmod(0o000)
    n = Node(tmp_path, wrap=NO_DAC, path=f"{locked}:")
    try:
        env = n.env(PATH=f"{n.shim.parent}:{locked}:{n.fake}:/usr/bin:/bin")
        done = subprocess.run([*NO_DAC, str(n.shim), "ls", "/"], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and "pflower-warm" not in done.stderr, done.stderr
        warm.switch(n.sock.parent, False)
        _cold(subprocess.run([*NO_DAC, str(n.shim), "ls", "/"], env=env, capture_output=True, text=True, timeout=30), "switched cold")
    finally:
        n.stop()
        locked.chmod(0o700)


FAKE_SERVER = r"""
import json, os, socket, sys
path, uid = sys.argv[1], int(sys.argv[2])
if os.path.isdir(os.path.dirname(path)):
    os.rename(os.path.dirname(path), os.path.dirname(path) + ".old")  # the real server's folder, out of the way
os.mkdir(os.path.dirname(path), 0o700)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o777)
os.setuid(uid)  # the listener's credentials are those at listen()
s.listen(1)
print("ready", flush=True)
conn, _ = s.accept()
conn.sendall(b'{"ready": true}\n')
request = conn.makefile("rb")
print(request.read(int.from_bytes(request.read(4), "big")).decode(errors="replace"), flush=True)
conn.sendall(b'{"pid": 1}\n{"status": 0}\n')
"""


def _fake_server(sock: Path, uid: int, as_user: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-c", FAKE_SERVER, str(sock), str(uid)]
    if as_user:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    fake = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert fake.stdout.readline() == "ready\n", fake.stderr.read()
    return fake


def _token_kept_from(fake: subprocess.Popen, done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    fake.kill()
    received = fake.communicate(timeout=10)[0]
    assert "secret-token" not in received, f"the other user got the request: {received[:300]}"
    return done


@ROOT_ONLY
def test_the_shim_goes_cold_for_a_server_of_another_user(node, tmp_path):
    """Its folders all root's, but the server listening as another uid: refused, before the
    shim sends anything."""
    _needs("setpriv")
    own = tmp_path / "other-server" / "server.sock"
    fake = _fake_server(own, 65534, as_user=False)
    try:
        done = node.run("--token", "secret-token", env=node.env(**{warm.ENV_SOCKET: str(own)}))
        _cold(_token_kept_from(fake, done), "it runs as uid 65534")
    finally:
        if fake.poll() is None:
            fake.kill()
            fake.wait(10)


@ROOT_ONLY
def test_the_shim_goes_cold_under_a_folder_of_another_user(tmp_path):
    """Another user who owns a folder above the socket could replace the node's folder and
    receive each message's argv (its token) and environment: every folder up to / must be
    root's or the node's user's and writable by nobody else."""
    _needs("setpriv")
    root = Path(tempfile.mkdtemp(prefix="pflower-warm-test-"))
    n = Node(root)
    fake = None
    try:
        assert n.run("ls", "/").returncode == 0  # warm while the folders are root's
        os.chown(root, 65534, 65534)
        root.chmod(0o755)
        fake = _fake_server(n.sock, 65534, as_user=True)  # that user moves the node's folder away and puts its own there
        _cold(_token_kept_from(fake, n.run("--token", "secret-token")), f"{n.sock.parent} belongs to uid 65534")
        shutil.rmtree(n.sock.parent)
        Path(f"{n.sock.parent}.old").rename(n.sock.parent)
        _cold(n.run("ls", "/"), f"{root} belongs to uid 65534")  # the node's own folder, under that user's: cold all the same
        assert _status(n.sock)["forked"] == 1
    finally:
        n.stop()
        if fake is not None and fake.poll() is None:
            fake.kill()
            fake.wait(10)
        shutil.rmtree(root)


def test_which_socket_folders_the_shim_trusts(tmp_path):
    """Writable by group or others: refused, except a sticky folder of root's (as /tmp) directly
    above a folder of the node's user. Symbolic links are followed before the check."""

    def sock_in(folder: Path, mode: int = 0o700) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(mode)
        (folder / "server.sock").touch()
        return str(folder / "server.sock")

    assert warm.trusted_socket(sock_in(tmp_path / "a" / "node")) == str(tmp_path / "a" / "node" / "server.sock")
    (tmp_path / "a").chmod(0o775)
    with pytest.raises(warm.WarmError, match="mode 775"):
        warm.trusted_socket(str(tmp_path / "a" / "node" / "server.sock"))
    with pytest.raises(warm.WarmError, match="mode 1777"):
        warm.trusted_socket(sock_in(tmp_path / "b", 0o1777))  # the socket's own folder may never be open
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    if os.geteuid() == 0:
        assert warm.trusted_socket(sock_in(sticky / "node"))
        os.chown(sticky, 65534, 65534)
        with pytest.raises(warm.WarmError, match="belongs to uid 65534"):
            warm.trusted_socket(sock_in(sticky / "node"))
        (tmp_path / "link").symlink_to(sticky / "node")
        with pytest.raises(warm.WarmError, match="belongs to uid 65534"):
            warm.trusted_socket(str(tmp_path / "link" / "server.sock"))
    with pytest.raises(FileNotFoundError):
        warm.trusted_socket(str(tmp_path / "none" / "server.sock"))


FORK_DIES = r"""
import os, sys, time
sys.path.insert(0, %r)
import warm
report, fork = %r, os.fork


def dying_fork():
    server = os.getpid()
    child = fork()
    if child:  # the server dies right after the fork
        open(report, "w").write(str(child))
        os._exit(0)
    deadline = time.monotonic() + 10
    while os.getppid() == server and time.monotonic() < deadline:  # the child goes on once it is orphaned
        time.sleep(0.01)
    return 0


os.fork = dying_fork
sys.exit(warm.main(sys.argv[1:]))
"""


def test_a_child_whose_server_dies_at_the_fork_does_not_outlive_it(tmp_path):
    """The server dies between the fork and the child's PR_SET_PDEATHSIG: the child compares its
    parent with the server's pid recorded before the fork, and exits instead of running."""
    forked, ran = tmp_path / "forked.pid", tmp_path / "ran.pid"
    (tmp_path / "fork_dies.py").write_text(FORK_DIES % (str(WARM.parent), str(forked)))
    n = Node(tmp_path, program=tmp_path / "fork_dies.py")
    child = None
    try:
        with open(tmp_path / "shim.out", "w+") as out:  # not a pipe: an orphan holding it would keep the shim's caller waiting
            code = subprocess.run([str(n.shim), "sleep", str(ran), "60"], env=n.env(), stdout=out, stderr=subprocess.STDOUT, timeout=30).returncode
        assert code == 3 and "did not start the ClientApp" in (tmp_path / "shim.out").read_text()  # the server died before it answered
        _wait(lambda: forked.exists() and forked.read_text(), what="the fork")
        child = int(forked.read_text())
        _wait(lambda: not _alive(child) or ran.exists(), 15, "the orphaned child to exit or run")
        assert not ran.exists(), "the child ran the message after its server had died"
    finally:
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
        n.stop()


def test_the_wrapper_restarts_a_dead_server_and_exits_as_its_command(tmp_path):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "warm_probe.py").write_text(PROBE)
    script = tmp_path / "node.py"
    script.write_text(
        "import os, sys, time, signal\n"
        f"sys.path.insert(0, {str(WARM.parent)!r})\n"
        "import warm\n"
        "def status():\n"
        "    try: return warm.server_status(os.environ[warm.ENV_SOCKET], 2)\n"
        "    except (OSError, ValueError): return None\n"
        "while not (s := status()): time.sleep(0.05)\n"
        "assert os.environ['PATH'].split(':')[0].endswith('/bin') and warm.is_shim(os.environ['PATH'].split(':')[0] + '/flwr-clientapp')\n"
        "os.kill(s['pid'], signal.SIGKILL)\n"
        "while not (t := status()) or t['pid'] == s['pid']: time.sleep(0.05)\n"
        "print('restarted', flush=True)\n"
        "sys.exit(5)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "probe")}
    done = subprocess.run([sys.executable, str(WARM), "run", "--dir", str(tmp_path / "node0"), "--preload", "", "--entry", "warm_probe:main", "--",
                           sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 5, done.stdout + done.stderr
    assert "restarted" in done.stdout and "starting it again" in done.stderr
    assert (tmp_path / "node0").stat().st_mode & 0o777 == 0o700 and not (tmp_path / "node0" / "server.sock").exists()


def test_with_the_real_preload_flowers_entry_point_runs_in_a_clean_child(tmp_path):
    """Torch, numpy and Flower imported; pflower not, CUDA not initialized, no thread beyond those
    a fresh interpreter has after the same imports (numpy's BLAS worker); the child runs Flower's
    own flwr-clientapp (its usage text)."""
    n = Node(tmp_path, preload=",".join(warm.PRELOAD), entry="")
    try:
        status = _status(n.sock)
        assert status["entry"] == "flwr.supernode.cli:flwr_clientapp"
        assert not status["pflower-loaded"] and not status["cuda-initialized"]
        fresh = subprocess.run([sys.executable, "-c", f"import os, importlib; [importlib.import_module(m) for m in {warm.PRELOAD!r}]; "
                                "import flwr.supernode.cli; print(len(os.listdir('/proc/self/task')))"], capture_output=True, text=True, check=True)  # fmt: skip
        assert status["threads"] == int(fresh.stdout)
        done = n.run("--help")
        assert done.returncode == 0 and done.stdout.startswith("usage: flwr-clientapp"), done.stderr
    finally:
        n.stop()


# ------------------------------------------------------------- the Flower contract (flwr==1.39.0)
def test_flowers_clientapp_launch_is_what_the_shim_expects(monkeypatch):
    """What pflower.deploy.warm relies on in flwr 1.39.0; if Flower changes it, this fails (and the
    shim may no longer be called, or may pass the wrong arguments)."""
    import flwr
    import flwr.supercore.superexec.executor.subprocess_executor as executor_module
    from flwr.supercore.constant import TASK_TYPE_TO_COMMAND, TaskType
    from flwr.supercore.superexec.executor import ExecutionSpec, SubprocessExecutor
    from flwr.supernode.cli.flwr_clientapp import _parse_args_run_flwr_clientapp

    assert flwr.__version__ == "1.39.0"
    assert TASK_TYPE_TO_COMMAND[TaskType.CLIENT_APP] == warm.COMMAND
    calls = []
    monkeypatch.setattr(executor_module.subprocess, "Popen", lambda *a, **kw: calls.append((a, kw)))
    for insecure, certs in ((False, "/certs/ca.crt"), (True, None)):
        spec = ExecutionSpec(task_type=TaskType.CLIENT_APP, runtime_api_address="127.0.0.1:9094", token="tok", insecure=insecure,
                             root_certificates_path=certs, runtime_dependency_install=False, parent_pid=4242, suppress_output=False, task_id=1)  # fmt: skip
        SubprocessExecutor().launch(spec)
    security = [["--root-certificates", "/certs/ca.crt"], ["--insecure"]]
    for (args, kwargs), tls in zip(calls, security):
        # a bare command name (found on PATH, where the shim comes first), fds and env inherited
        assert args == (["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9094", "--token", "tok", *tls, "--parent-pid", "4242"],)
        assert kwargs == {}
        parsed = _parse_args_run_flwr_clientapp().parse_args(args[0][1:])  # the child's argv is the shim's
        assert parsed.runtime_api_address == "127.0.0.1:9094" and parsed.parent_pid == 4242
    # the command's entry point, which each child calls in place of starting the script
    from importlib.metadata import entry_points

    (ep,) = entry_points(group="console_scripts", name="flwr-clientapp")
    assert ep.value == "flwr.supernode.cli:flwr_clientapp"
    # the SuperNode starts flower-superexec by name (so on the wrapped PATH), with its own environment
    import inspect

    from flwr.supernode import start_client_internal

    source = inspect.getsource(start_client_internal.start_client_internal)
    assert 'command = ["flower-superexec"]' in source and "subprocess.Popen(command)" in source


def test_the_warm_module_stays_out_of_the_fab_and_imports_only_the_standard_library():
    import ast
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "pflower/deploy/**" in project["tool"]["flwr"]["app"]["fab-exclude"]
    assert project["project"]["scripts"]["pflower-warm"] == "pflower.deploy.warm:main"
    tree = ast.parse(WARM.read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, top


# ------------------------------------------------------------------ pflower-deploy's warm nodes
def test_deployment_wraps_its_warm_nodes_and_sets_the_poll_interval(tmp_path, monkeypatch):
    """Without starting anything: which SuperNodes are wrapped, their private folders (short
    enough for a socket, else under /tmp), their environment, and the arguments refused."""
    from pflower.deploy.deployment import NODE_POLL_INTERVAL, POLL_ENV, WARM_PRELOAD, Deployment

    spawned = {}
    dep = Deployment(tmp_path / "d", nodes=3, tls=False, auth=False, warm={0, 2})
    monkeypatch.setattr(dep, "_spawn", lambda name, cmd, env=None: spawned.update({name: (cmd, env)}))
    for i in range(3):
        dep.start_node(i)
    for name in ("node0", "node2"):
        cmd, env = spawned[name]
        assert cmd[1:4] == [warm.__file__, "run", "--dir"] and Path(cmd[4]) == dep.warm_dir(name)
        assert cmd[cmd.index("--preload") + 1] == ",".join(WARM_PRELOAD) and "pydantic" in WARM_PRELOAD
        assert Path(cmd[cmd.index("--") + 1]).name == "flower-supernode"
        assert dep.warm_dir(name).stat().st_mode & 0o777 == 0o700
    cmd, env = spawned["node1"]
    assert Path(cmd[0]).name == "flower-supernode" and not dep.warm_dir("node1").exists()
    assert all(float(env[POLL_ENV]) == NODE_POLL_INTERVAL == 0.2 for _, env in spawned.values())
    assert dep.warm_names == {"node0", "node2"}
    dep.switch_warm(False)
    assert (dep.warm_dir("node0") / warm.COLD_FLAG).exists() and (dep.warm_dir("node2") / warm.COLD_FLAG).exists()
    dep.switch_warm(True)
    assert not (dep.warm_dir("node0") / warm.COLD_FLAG).exists()

    deep = Deployment(tmp_path / ("x" * 90), nodes=1, tls=False, auth=False, warm=True, poll_interval=None)
    assert len(str(warm.socket_path(deep.warm_dir("node0")))) <= warm.MAX_SOCKET_PATH
    assert deep.node_env(0).get(POLL_ENV) == os.environ.get(POLL_ENV)  # None: Flower's default
    deep.stop()
    with pytest.raises(ValueError, match="warm lists"):
        Deployment(tmp_path / "e", warm=[-1])
    with pytest.raises(ValueError, match="0.01 to 60"):
        Deployment(tmp_path / "f", poll_interval=0.001)
