"""Warm nodes: each message's ClientApp process is forked from a per-node server that has torch,
numpy and Flower imported already, instead of a fresh ``flwr-clientapp`` that pays Python's start
and those imports (about 2.4 s per message on 2 cores).

Flower 1.39's SuperExec runs ``flwr-clientapp --runtime-api-address ADDR --token T ...`` (found on
``PATH``) once per message. :func:`run` wraps a SuperNode (or a ``flower-superexec``): it writes
a ``flwr-clientapp`` shim first on the wrapped command's ``PATH`` and starts the fork server
(:func:`serve`, restarted if it dies), both in a folder of mode 0700 of the node's own. The shim
(:func:`shim`) hands its argv, environment, working directory and stdin/stdout/stderr (the file
descriptors themselves) to the server over a Unix socket, relays signals, waits, and exits as
the child did. The server forks one child per message from its clean parent; the child takes
the shim's fds, environment, argv and cwd, re-seeds numpy, and calls Flower's own
``flwr-clientapp`` entry point, which loads the app from the FAB as it always does.

What a child inherits from the server, and nothing else: the modules the server imported
(never pflower: the app loads from the FAB in the child), their import-time settings (read from
the node's environment when the server started), the interpreter's flags and hash seed, and the
server's namespaces, cgroup, limits and user, which is why :func:`run` starts it next to the
node. The parent never runs app code, never initializes CUDA, and runs no tensor op (torch's
thread pools start in each child, as in a fresh process). If the server is not there or refuses,
the shim says so on stderr and execs the real ``flwr-clientapp`` (cold: slower, nothing lost).

Both ends fail closed, to cold. The shim sends nothing unless every folder from the socket up
to ``/`` is root's or the node's user's and writable by nobody else (a sticky folder of root's,
as ``/tmp``, only right above a folder of the node's user's: :func:`trusted_socket`), the
server runs as the node's user or root (``SO_PEERCRED``), and it answers within
``PFLOWER_WARM_TIMEOUT`` seconds (10; a stopped server, or one still importing, does not).
The server refuses another uid, and forks for nobody whose mount, pid, network or user
namespace or root folder differs from its own or cannot be compared (the peer's pid not
visible from its pid namespace, its ``/proc`` links hidden): :func:`namespace_mismatch`. It
reads each request without blocking, at most MAX_REQUEST bytes within REQUEST_DEADLINE seconds
of its accept, MAX_PENDING at once (one more drops the oldest), checks it (:func:`parse_request`)
and answers what it cannot serve with an error; nothing a connection sends ends the server. A
child compares its parent with the server's pid recorded before the fork once it has set
``PR_SET_PDEATHSIG``, so none outlives a server that died at the fork.

This module imports only the standard library at its top, and the server and the shim run it as
a script by its path, so neither imports pflower.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

#: What Flower's SuperExec runs for a ClientApp (``TASK_TYPE_TO_COMMAND[TaskType.CLIENT_APP]`` in
#: flwr 1.39.0; tests/test_warm.py pins it).
COMMAND = "flwr-clientapp"
#: The environment variable that tells the shim where its node's fork server listens.
ENV_SOCKET = "PFLOWER_WARM_SOCKET"
#: How long (seconds) a shim waits for its fork server to connect, take its request and answer
#: (a server still importing counts as not answering); then it goes cold. Default: SHIM_TIMEOUT.
ENV_TIMEOUT = "PFLOWER_WARM_TIMEOUT"
SHIM_TIMEOUT = 10.0
#: Modules the server imports before it forks: Flower's ``flwr-clientapp`` entry point is loaded
#: on top of these. No pflower module may be among them (refused).
PRELOAD = ("numpy", "torch", "flwr.app", "flwr.clientapp")
#: In the first bytes of every shim file: how a shim tells itself from the real command.
MARKER = b"pflower-warm-shim"
SOCKET_NAME = "server.sock"
#: A file of this name beside the socket switches the node cold at run time (the shim goes
#: straight to the real command) until it is removed: :func:`switch`.
COLD_FLAG = "cold"
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes
HEADER = struct.Struct("!I")
#: A request's most bytes (its argv and environment: Linux allows them 2 MiB by default).
MAX_REQUEST = 4 << 20
#: Seconds a connection has, from its accept, to deliver its whole request to the server.
REQUEST_DEADLINE = 5.0
#: Connections whose requests are still arriving; one more drops the oldest.
MAX_PENDING = 16
#: A relayed signal's line, at most (a longer one is no shim's: its connection is dropped).
MAX_LINE = 256
#: The namespaces a shim must share with its fork server: paths (cwd, PATH, files), pids
#: (``--parent-pid``), addresses (``--runtime-api-address``) and uids mean the same to both.
NAMESPACES = {"mnt": "mount", "pid": "pid", "net": "network", "user": "user"}
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15
RELAYED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class WarmError(Exception):
    """A fork server or shim set-up that cannot work; the message names the path and what is wrong."""


def _log(text: str) -> None:
    print(f"pflower-warm[{os.getpid()}]: {text}", file=sys.stderr, flush=True)


def private_dir(path: Path) -> Path:
    """``path`` as a folder of mode 0700 owned by this process's user: created so, or checked
    (WarmError if another user owns it or others may enter it)."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.geteuid():
        raise WarmError(f"{path} is owned by uid {st.st_uid}, not by this process's uid {os.geteuid()}")
    if st.st_mode & 0o077:
        raise WarmError(f"{path} has mode {st.st_mode & 0o777:o}: the fork server's folder must be private to its user (0700)")
    return path


def socket_path(folder: Path) -> Path:
    """Where a node's fork server listens in ``folder`` (WarmError if the path is too long for a Unix socket)."""
    path = Path(folder).resolve() / SOCKET_NAME
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise WarmError(f"{path} is {len(os.fsencode(path))} bytes long; a Unix socket path may have at most {MAX_SOCKET_PATH}")
    return path


def is_shim(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return MARKER in f.read(256)
    except OSError:
        return False


def real_command(path: str | None = None) -> str | None:
    """The first ``flwr-clientapp`` on ``path`` (default: ``PATH``) that is not a shim; folders
    this user may not search are skipped, as a shell skips them."""
    for folder in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        candidate = Path(folder or ".") / COMMAND
        try:
            if candidate.is_file() and os.access(candidate, os.X_OK) and not is_shim(candidate):
                return str(candidate)
        except OSError:  # PermissionError from stat(): an unsearchable folder
            continue
    return None


def trusted_socket(path: str) -> str:
    """``path`` resolved, if nobody but root and this user can replace the socket there: every
    folder from the socket's up to ``/`` owned by root or this user and writable by nobody else.
    The exception is a sticky folder of root's that others may write (``/tmp``), and only where
    the folder below it is this user's own: the sticky bit keeps others from renaming or removing
    that one. WarmError (or OSError) otherwise."""
    uid = os.geteuid()
    real = os.path.realpath(path, strict=True)  # no symbolic link left: each folder below is checked as it is
    folder, below = os.path.dirname(real), None
    while True:
        st = os.stat(folder)
        if st.st_uid not in (0, uid):
            raise WarmError(f"{folder} belongs to uid {st.st_uid}, who could replace the fork server's socket")
        if st.st_mode & 0o022 and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX and below is not None and below.st_uid == uid):
            raise WarmError(f"{folder} has mode {st.st_mode & 0o7777:o}: others could replace the fork server's socket")
        if folder == os.path.dirname(folder):
            return real
        folder, below = os.path.dirname(folder), st


def write_shim(folder: Path, python: str = sys.executable) -> Path:
    """Write the ``flwr-clientapp`` shim into ``folder`` (put it first on ``PATH``); its path.

    It runs this file's :func:`shim` under ``python -I -S``: no site-packages, so it starts in
    about 20 ms and imports the standard library only.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shim_file = folder / COMMAND
    here = str(Path(__file__).resolve().parent)
    shim_file.write_text(
        f"#!{python} -IS\n"
        f"# {MARKER.decode()}: hands this flwr-clientapp call to the node's fork server (pflower/deploy/warm.py).\n"
        f"import sys\nsys.path.insert(0, {here!r})\nfrom warm import shim\nsys.exit(shim())\n"
    )
    shim_file.chmod(0o755)
    return shim_file


# ------------------------------------------------------------------------------ wire format
# Server -> shim: {"ready": true} once it has accepted the connection (or {"error": "..."}); only
# then does the shim send anything, so a server that is stopped never holds its fds or token.
# Shim -> server: a 4-byte length and a JSON object (at most MAX_REQUEST bytes), with the shim's
# fds 0, 1, 2 attached to the first bytes (SCM_RIGHTS); later, {"signal": N} lines to relay a
# signal. Server -> shim: JSON lines, {"pid": N} once the child is forked (or {"error": "..."}),
# then {"status": WAITSTATUS}.
def send_request(sock: socket.socket, request: dict, fds: list[int]) -> None:
    body = json.dumps(request).encode()
    if len(body) > MAX_REQUEST:
        raise ValueError(f"a request of {len(body)} bytes (at most {MAX_REQUEST})")
    if fds:
        socket.send_fds(sock, [HEADER.pack(len(body))], fds)
        sock.sendall(body)
    else:
        sock.sendall(HEADER.pack(len(body)) + body)


def parse_request(body: bytes) -> dict:
    """The request in ``body``, checked: ``{"op": "status"}``, or ``argv`` (strings, at least
    one), ``env`` (names to values) and ``cwd``, all strings without NUL (ValueError otherwise)."""
    request = json.loads(body)
    if request == {"op": "status"}:
        return request
    if not isinstance(request, dict) or set(request) != {"argv", "env", "cwd"}:
        raise ValueError("not an object of argv, env and cwd")
    argv, env, cwd = request["argv"], request["env"], request["cwd"]
    if not isinstance(argv, list) or not argv or not isinstance(env, dict) or not isinstance(cwd, str):
        raise ValueError("argv is no list, env no object or cwd no string")
    strings = [*argv, *env.values(), cwd]
    if not all(isinstance(s, str) and "\0" not in s for s in strings) or not all(k and "=" not in k and "\0" not in k for k in env):
        raise ValueError("an argument, variable or folder that is no string, or holds NUL")
    return request


def _send_line(sock: socket.socket, obj: dict) -> bool:
    try:
        sock.sendall(json.dumps(obj).encode() + b"\n")
        return True
    except OSError:
        return False


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))


def namespace_mismatch(pid: int) -> str | None:
    """Why the process ``pid`` may not have a child forked for it, or None: it must run in this
    process's mount, pid, network and user namespaces and under its root folder. What cannot be
    read refuses too (fail closed): a pid this namespace cannot see (0), a link /proc hides."""
    if pid <= 0:
        return "the shim's pid is not visible in the fork server's pid namespace"
    try:
        for ns, name in NAMESPACES.items():
            if os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"):
                return f"the shim runs in another {name} namespace than the fork server"
        theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/proc/self/root")
    except OSError as err:
        return f"the shim's namespaces cannot be compared with the fork server's ({err.strerror}: {err.filename})"
    if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
        return "the shim runs under another root folder (chroot) than the fork server"
    return None


def _prctl(option: int, arg) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


# ---------------------------------------------------------------------------------- server
class _Arriving:
    """A connection whose request is still arriving: its peer's pid, bytes, fds and deadline."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid, self.data, self.fds = conn, pid, bytearray(), []
        self.deadline = time.monotonic() + REQUEST_DEADLINE


class ForkServer:
    """Listens on ``path`` (its folder private, see :func:`private_dir`) and forks one child per
    shim request; single-threaded, so a fork copies no other thread's half-done work. Nothing a
    connection sends ends the server: each request is read without blocking, bounded in size
    and time, and checked before anything is forked for it."""

    def __init__(self, path: Path, preload: tuple[str, ...] = PRELOAD, entry: str = ""):
        if bad := [m for m in preload if m == "pflower" or m.startswith("pflower.")]:
            raise WarmError(f"preload {bad}: pflower's own modules must load from the FAB in each message, never in the fork server")
        self.path, self.preload = Path(path), tuple(preload)
        self.children: dict[int, socket.socket | None] = {}  # child pid -> its shim's connection
        self.buffers: dict[int, bytes] = {}
        self.arriving: dict[socket.socket, _Arriving] = {}  # oldest first
        self.stopping = False
        self.forked = 0
        self.entry_ref = entry  # "module:function"; empty: Flower's flwr-clientapp console script
        self.entry = None
        self.real = None

    def bind(self) -> None:
        """Listen (before the imports: a shim that connects meanwhile waits instead of going cold)."""
        private_dir(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.listener.listen(64)

    def load(self) -> None:
        """Import the preloaded modules and Flower's ``flwr-clientapp`` entry point, nothing else."""
        import gc
        import importlib
        from importlib.metadata import entry_points

        gc.disable()  # no collection while importing: it would leave holes in pages the children share
        for name in self.preload:
            importlib.import_module(name)
        if not self.entry_ref:
            (ep,) = entry_points(group="console_scripts", name=COMMAND)
            self.entry_ref = ep.value
        module, _, function = self.entry_ref.partition(":")
        self.entry = importlib.import_module(module)
        for attr in function.split("."):
            self.entry = getattr(self.entry, attr)
        self.real = real_command() or str(Path(sys.executable).with_name(COMMAND))
        if (bin_dir := str(Path(self.real).parent)) not in sys.path:
            sys.path.insert(0, bin_dir)  # as for the console script (this file's folder was taken off)
        if loaded := sorted(m for m in sys.modules if m == "pflower" or m.startswith("pflower.")):
            raise WarmError(f"the fork server imported {loaded[:3]}: the app would not load from the FAB")
        gc.freeze()  # the imported objects out of the collector's reach: a child's collections do not copy their pages

    def status(self) -> dict:
        torch = sys.modules.get("torch")
        return {"pid": os.getpid(), "threads": len(os.listdir("/proc/self/task")), "entry": getattr(self, "entry_ref", None),
                "preload": list(self.preload), "children": sorted(self.children), "forked": self.forked,
                "pflower-loaded": any(m == "pflower" or m.startswith("pflower.") for m in sys.modules),
                "cuda-initialized": bool(torch and torch.cuda.is_initialized())}  # fmt: skip

    def serve_forever(self) -> None:
        self.pid = os.getpid()  # what each child checks its parent against, after the fork
        self.original = {s: signal.getsignal(s) for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._stop)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        _log(f"fork server ready at {self.path} ({', '.join(self.preload)} and {self.entry_ref} imported)")
        try:
            while not self.stopping:
                deadline = min((a.deadline for a in self.arriving.values()), default=None)
                for key, _ in self.sel.select(None if deadline is None else max(0.0, deadline - time.monotonic())):
                    try:
                        self._event(key)
                    except Exception as err:  # a bug's safety net: the connection goes, the server stays
                        _log(f"dropped a connection: {err!r}")
                        self._forget(key.data)
                now = time.monotonic()
                for late in [a for a in self.arriving.values() if a.deadline <= now]:
                    self._refuse(late, f"dropped: no whole request within {REQUEST_DEADLINE:g} s")
                self._reap()
        finally:
            for pid in list(self.children):
                self._kill(pid)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def _event(self, key: selectors.SelectorKey) -> None:
        if key.data == "accept":
            self._accept()
        elif key.data == "wake":
            with contextlib.suppress(BlockingIOError):
                os.read(self.wake_r, 512)
        elif isinstance(key.data, _Arriving):
            self._receive(key.data)
        else:
            self._from_shim(key.data, key.fileobj)

    def _forget(self, data) -> None:
        if isinstance(data, _Arriving):
            self._refuse(data, None)
        elif isinstance(data, int):
            self._drop(data)

    def _stop(self, *_) -> None:
        self.stopping = True

    def _kill(self, pid: int) -> None:
        for kill, target in ((os.killpg, pid), (os.kill, pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(target, signal.SIGKILL)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError as err:  # out of fds, or the peer gave up already
            return _log(f"accept: {err}")
        conn.setblocking(False)
        pid, uid, _ = peer_credentials(conn)
        if uid != os.geteuid():
            _send_line(conn, {"error": f"refused: the shim runs as uid {uid}, the fork server as uid {os.geteuid()}"})
            return conn.close()
        if len(self.arriving) >= MAX_PENDING:
            self._refuse(next(iter(self.arriving.values())), f"dropped: {MAX_PENDING} requests were arriving at once")
        arriving = _Arriving(conn, pid)
        self.arriving[conn] = arriving
        self.sel.register(conn, selectors.EVENT_READ, arriving)
        if not _send_line(conn, {"ready": True}):
            self._refuse(arriving, None)

    def _refuse(self, arriving: _Arriving, error: str | None) -> None:
        """Close an arriving request's connection and its fds, with ``error`` for the shim (it goes cold)."""
        self.arriving.pop(arriving.conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(arriving.conn)
        for fd in arriving.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        arriving.fds = []
        if error:
            _send_line(arriving.conn, {"error": error})
            _log(error)
        arriving.conn.close()

    def _receive(self, arriving: _Arriving) -> None:
        """Read what has arrived of a request (fds with it); once it is whole, answer it."""
        want = HEADER.size + MAX_REQUEST + 1 - len(arriving.data)
        try:
            data, ancdata, flags, _ = arriving.conn.recvmsg(min(want, 1 << 16), socket.CMSG_SPACE(3 * 4), socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return
        except OSError:
            data, ancdata, flags = b"", [], 0
        for level, kind, fds in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arriving.fds += struct.unpack(f"{len(fds) // 4}i", fds[: len(fds) - len(fds) % 4])
        if not data:
            return self._refuse(arriving, None)  # the shim gave up
        arriving.data += data
        if len(arriving.fds) > 3 or flags & socket.MSG_CTRUNC:
            return self._refuse(arriving, "bad request: more than 3 fds")
        if len(arriving.data) < HEADER.size:
            return
        (size,) = HEADER.unpack_from(arriving.data)
        if size > MAX_REQUEST or len(arriving.data) > HEADER.size + size:
            return self._refuse(arriving, f"bad request: {size} bytes announced (at most {MAX_REQUEST}), {len(arriving.data) - HEADER.size} sent")
        if len(arriving.data) == HEADER.size + size:
            self._answer(arriving)

    def _answer(self, arriving: _Arriving) -> None:
        """A whole request: a status query is answered; a message is checked, then forked."""
        try:
            request = parse_request(bytes(arriving.data[HEADER.size :]))
        except Exception as err:  # ValueError, RecursionError (deep nesting), MemoryError
            return self._refuse(arriving, f"bad request: {type(err).__name__}: {str(err)[:200]}")
        if request.get("op") == "status":
            _send_line(arriving.conn, self.status())
            return self._refuse(arriving, None)
        if why := namespace_mismatch(arriving.pid):
            return self._refuse(arriving, f"refused: {why}")
        if len(arriving.fds) != 3:
            return self._refuse(arriving, f"bad request: {len(arriving.fds)} fds, not 3")
        try:
            if arriving.conn.recv(1, socket.MSG_PEEK) == b"":
                return self._refuse(arriving, None)  # the shim gave up waiting (it went cold): no child for it
        except BlockingIOError:
            pass
        self.arriving.pop(arriving.conn)
        self.sel.unregister(arriving.conn)
        conn, fds = arriving.conn, arriving.fds
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            child = os.fork()
        except OSError as err:
            self.arriving[conn] = arriving
            return self._refuse(arriving, f"dropped: {err}")
        if child == 0:
            try:
                self._child(conn, request, fds)
            except BaseException:
                import traceback

                traceback.print_exc()  # on the shim's stderr once the fds are in place
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
        self.children[child] = conn
        self.forked += 1
        if _send_line(conn, {"pid": child}):
            self.sel.register(conn, selectors.EVENT_READ, child)
        else:
            self._drop(child)

    def _drop(self, child: int) -> None:
        """The shim is gone: kill its child (and the child's process group)."""
        conn = self.children.get(child)
        if conn is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(conn)
            conn.close()
            self.children[child] = None
        self.buffers.pop(child, None)
        self._kill(child)

    def _from_shim(self, child: int, conn: socket.socket) -> None:
        """Relay the signals a shim sends for its child ({"signal": N} lines, RELAYED_SIGNALS only)."""
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            return self._drop(child)
        *lines, rest = (self.buffers.get(child, b"") + data).split(b"\n")
        if max(len(line) for line in (*lines, rest)) > MAX_LINE:
            _log(f"dropped the connection of child {child}: a line of over {MAX_LINE} bytes")
            return self._drop(child)
        self.buffers[child] = rest
        for line in lines:
            try:
                sig = json.loads(line).get("signal")
            except Exception:  # no JSON object: ignored, as any other line
                continue
            if type(sig) is int and sig in RELAYED_SIGNALS:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, sig)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            self.buffers.pop(pid, None)
            if conn is not None:
                _send_line(conn, {"status": status})
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(conn)
                conn.close()

    def _child(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        """In the forked child: become the message's ``flwr-clientapp`` and exit as it does."""
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # never outlive the server
        if os.getppid() != self.pid:  # the server died before the line above: no signal will come
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for sig, handler in self.original.items():
            signal.signal(sig, handler)
        _prctl(PR_SET_NAME, COMMAND.encode()[:15])
        os.setpgid(0, 0)  # the server kills this group when the shim goes away
        self.sel.close()
        for s in [self.listener, conn, *(c for c in self.children.values() if c is not None), *self.arriving]:
            s.close()
        for fd in (self.wake_r, self.wake_w, *(fd for a in self.arriving.values() for fd in a.fds)):
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"] or "/")
        os.environ.clear()
        os.environ.update(request["env"])
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
            with contextlib.suppress(Exception):
                stream.reconfigure(line_buffering=os.isatty(fd) or stream is sys.stderr, write_through=unbuffered)
        sys.argv = [self.real, *request["argv"][1:]]
        if "numpy" in sys.modules:  # numpy's global generator is not re-seeded on fork (random's is)
            sys.modules["numpy"].random.seed()
        import gc

        gc.enable()  # as in a fresh process (the server's imports stay frozen: never collected, never copied by it)
        os._exit(run_entry(self.entry))


def run_entry(entry) -> int:
    """Call a console script's function as its own process would: its exit status, after
    non-daemon threads, atexit handlers and a flush of stdout and stderr (as Python's exit)."""
    import atexit
    import threading
    import traceback

    code = 0
    try:
        entry()
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # what Py_FinalizeEx does first: wait for non-daemon threads
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if code < 0:  # Python's exit on an unhandled KeyboardInterrupt: die of SIGINT
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code & 0xFF


def serve(path: Path, preload: tuple[str, ...] = PRELOAD, entry: str = "") -> int:
    """Run a node's fork server on ``path`` until SIGTERM, SIGINT or SIGHUP; each child calls
    ``entry`` ("module:function", default: Flower's ``flwr-clientapp`` console script)."""
    server = ForkServer(path, preload, entry)
    server.bind()
    try:
        server.load()
    except BaseException:
        server.listener.close()
        server.path.unlink(missing_ok=True)
        raise
    server.serve_forever()
    return 0


def server_status(path: Path, timeout: float = 5) -> dict:
    """What the fork server at ``path`` reports of itself (pid, threads, whether pflower or CUDA is loaded)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        replies = sock.makefile("rb")
        if not json.loads(replies.readline()).get("ready"):
            raise ConnectionError(f"the fork server at {path} refused the connection")
        send_request(sock, {"op": "status"}, [])
        return json.loads(replies.readline())


def switch(folder: Path, warm: bool) -> None:
    """Switch the node whose fork server lives in ``folder`` warm or cold for its next messages,
    without a restart (cold: the shim execs the real command, and says so on stderr)."""
    flag = Path(folder) / COLD_FLAG
    if warm:
        flag.unlink(missing_ok=True)
    else:
        flag.touch()


# ------------------------------------------------------------------------------------ shim
def _fallback(why: str) -> int:
    """Exec the real ``flwr-clientapp`` with this shim's argv (the cold path)."""
    real = real_command()
    if real is None:
        print(f"pflower-warm shim: {why}; and no real {COMMAND} on PATH", file=sys.stderr, flush=True)
        return 127
    print(f"pflower-warm shim: {why}; starting {real} (cold)", file=sys.stderr, flush=True)
    os.execv(real, [real, *sys.argv[1:]])
    return 127  # not reached


def _std_fds() -> list[int]:
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:  # a closed standard stream: the child gets /dev/null there
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _timeout() -> float:
    try:
        timeout = float(os.environ.get(ENV_TIMEOUT) or SHIM_TIMEOUT)
    except ValueError:
        return SHIM_TIMEOUT
    return timeout if 0 < timeout <= 3600 else SHIM_TIMEOUT


def shim() -> int:
    """``flwr-clientapp`` on a warm node: have the fork server run this call; exit as its child did.

    Cold instead (the real command, with the reason on stderr) unless the socket's folders are
    safe (:func:`trusted_socket`), the server runs as this user or root, and it answers within
    ``PFLOWER_WARM_TIMEOUT`` seconds."""
    path = os.environ.get(ENV_SOCKET)
    if not path:
        return _fallback(f"{ENV_SOCKET} is not set")
    if os.path.exists(os.path.join(os.path.dirname(path), COLD_FLAG)):
        return _fallback(f"this node is switched cold ({os.path.join(os.path.dirname(path), COLD_FLAG)} exists)")
    try:
        real = trusted_socket(path)
    except (OSError, WarmError) as err:
        return _fallback(f"no trusted fork server at {path} ({err})")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    timeout = _timeout()
    try:
        sock.settimeout(timeout)
        sock.connect(real)
        if (uid := peer_credentials(sock)[1]) not in (0, os.geteuid()):
            raise WarmError(f"it runs as uid {uid}, neither this user ({os.geteuid()}) nor root")
        replies = sock.makefile("rb")
        first = json.loads(replies.readline(1 << 16) or b"{}")
        if isinstance(first, dict) and first.get("ready") is True:
            send_request(sock, {"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd()}, _std_fds())
            first = json.loads(replies.readline(1 << 16) or b"{}")
        sock.settimeout(None)  # the message itself takes as long as it takes
    except TimeoutError:
        sock.close()
        return _fallback(f"the fork server at {path} did not answer within {timeout:g} s")
    except (OSError, ValueError, WarmError) as err:
        sock.close()
        return _fallback(f"no fork server at {path} ({err})")
    if not isinstance(first, dict) or type(first.get("pid")) is not int:
        sock.close()
        error = first.get("error") if isinstance(first, dict) else None
        return _fallback(f"the fork server at {path} did not start the ClientApp ({error or 'it closed the connection'})")

    def relay(signum, _frame):
        with contextlib.suppress(OSError):
            sock.sendall(json.dumps({"signal": signum}).encode() + b"\n")

    for sig in RELAYED_SIGNALS:
        signal.signal(sig, relay)
    try:
        last = json.loads(replies.readline(1 << 16) or b"{}")
    except (OSError, ValueError):
        last = {}
    if not isinstance(last, dict) or type(last.get("status")) is not int:
        print(f"pflower-warm shim: the fork server at {path} went away during the message; its ClientApp (pid {first['pid']}) was stopped with it",
              file=sys.stderr, flush=True)  # fmt: skip
        return 1
    code = os.waitstatus_to_exitcode(last["status"])
    if code < 0:  # the child died of a signal: so does the shim, as the real command would have
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


# ------------------------------------------------------------------------- the node wrapper
def _start_server(sock: Path, preload: tuple[str, ...], entry: str, env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, str(Path(__file__).resolve()), "serve", "--socket", str(sock), "--preload", ",".join(preload)]
    return subprocess.Popen(cmd + (["--entry", entry] if entry else []), env=env)


def _stop_process(proc: subprocess.Popen, timeout: float = 5) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(folder: Path, cmd: list[str], preload: tuple[str, ...] = PRELOAD, entry: str = "") -> int:
    """Run ``cmd`` (a SuperNode, or a ``flower-superexec``) with a fork server beside it: the shim
    first on its ``PATH`` (``folder/bin``), the server on ``folder/server.sock``, started again if
    it dies (at most 5 times a minute; after that the node goes on cold). Signals are passed to
    ``cmd``; when it exits, the server is stopped and ``run`` exits as ``cmd`` did."""
    folder = private_dir(Path(folder).resolve())
    sock = socket_path(folder)
    env = {**os.environ, "PATH": f"{write_shim(folder / 'bin').parent}{os.pathsep}{os.environ.get('PATH', '')}", ENV_SOCKET: str(sock)}
    server = _start_server(sock, preload, entry, env)
    try:
        node = subprocess.Popen(cmd, env=env)
    except OSError:
        _stop_process(server)
        raise
    stopping = []

    def forward(signum, _frame):
        stopping.append(signum)  # a stop signal reaches the whole group: the server's exit is no crash then
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.pid, signum)  # not send_signal: it may reap the node behind waitpid's back

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    restarts: list[float] = []
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == node.pid:
            node.returncode = os.waitstatus_to_exitcode(status)
            break
        if pid == server.pid:
            server.returncode = os.waitstatus_to_exitcode(status)
            restarts = [t for t in restarts if t > time.monotonic() - 60]
            if stopping:
                continue
            if len(restarts) < 5:
                _log(f"the fork server exited ({server.returncode}); starting it again")
                restarts.append(time.monotonic())
                server = _start_server(sock, preload, entry, env)
            else:
                _log("the fork server exited 5 times within a minute; this node's ClientApps start cold from now on")
    _stop_process(server)
    if node.returncode < 0:
        signal.signal(-node.returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -node.returncode)
    return node.returncode


# ------------------------------------------------------------------------------------- CLI
def _preload(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if bad := [n for n in names if n == "pflower" or n.startswith("pflower.")]:
        raise argparse.ArgumentTypeError(
            f"{bad[0]!r} is pflower's own code, which loads from the FAB in each message; allowed: third-party modules (e.g. pydantic)"
        )
    return names


class _Plain(argparse.RawDescriptionHelpFormatter):
    """The description without its reST literals, wrapped between words (this module imports the
    standard library only, so not :mod:`pflower.help_text`, which does the same for the others)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(" ".join(text.replace("``", "").split()), width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)


def parser() -> argparse.ArgumentParser:
    """``pflower-warm``'s arguments."""
    p = argparse.ArgumentParser(prog="pflower-warm", description=__doc__.split("\n\n")[0], formatter_class=_Plain)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run CMD (a SuperNode or flower-superexec) with a fork server for its ClientApps")
    r.add_argument("--dir", type=Path, required=True, help="the node's private folder (mode 0700): shim and socket")
    r.add_argument("--preload", type=_preload, default=PRELOAD, help=f"modules the server imports, comma-separated (default: {','.join(PRELOAD)})")
    r.add_argument("--entry", default="", help="module:function each child calls (default: Flower's flwr-clientapp entry point)")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    s = sub.add_parser("serve", help="run a fork server (pflower-warm run starts one)")
    s.add_argument("--socket", type=Path, required=True)
    s.add_argument("--preload", type=_preload, default=PRELOAD)
    s.add_argument("--entry", default="", help="module:function each child calls (default: Flower's flwr-clientapp entry point)")
    st = sub.add_parser("status", help="what a fork server reports of itself, as JSON")
    st.add_argument("--socket", type=Path, required=True)
    sub.add_parser("shim", help="act as flwr-clientapp (what the written shim runs)", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    """``pflower-warm``: ``run`` a node with a fork server, ``serve`` one, ``status`` of one, or ``shim``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["shim"]:
        sys.argv = [sys.argv[0], *argv[1:]]
        return shim()
    p = parser()
    args = p.parse_args(argv)
    try:
        if args.command == "run":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            if not cmd:
                p.error("run: give the command to wrap after --, e.g. pflower-warm run --dir D -- flower-supernode ...")
            return run(args.dir, cmd, args.preload, args.entry)
        if args.command == "serve":
            if "pflower" in sys.modules:  # the console script imported pflower: serve from a clean interpreter
                os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv])
            return serve(args.socket, args.preload, args.entry)
        print(json.dumps(server_status(args.socket)))
        return 0
    except WarmError as err:
        p.error(str(err))
    return 2


if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # this folder holds pflower's deploy modules: no import must find them by accident
    sys.exit(main())
