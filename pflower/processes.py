"""The processes pflower's tools start: free ports, Flower's console scripts, waiting until a
server listens, stopping a process with everything it started, and a watcher that stops a
server when the program that started it dies (``python -m pflower.processes COMMAND...``).

Shared by ``pflower-sim`` (:mod:`pflower.launcher`, :mod:`pflower.ray_head`) and
``pflower-deploy`` (:mod:`pflower.deploy`); neither the ServerApp nor the ClientApp needs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def console_script(name: str) -> str:
    """A console script (``flwr``, ``flower-superlink``, ...) next to this interpreter (the
    venv's), else from PATH; SystemExit if neither has it."""
    local = Path(sys.executable).with_name(name)
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"{name} not found: install pflower's dependencies (see README)")
    return found


def wait_for_port(proc: subprocess.Popen, name: str, host: str, port: int, detail: Callable[[], str], timeout: float = 60) -> None:
    """Return once ``host:port`` accepts connections while ``proc`` (the program ``name``) runs.

    SystemExit if it exits first (the message ends with ``detail()``: where its log is, or the
    log's end) or does not listen within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with code {proc.returncode}{detail()}")
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} did not start within {timeout:.0f} s")
        time.sleep(0.2)


def _live() -> dict[int, tuple[int, int]]:
    """Every live process (zombies left out): its parent and its start time (clock ticks after
    boot), read from /proc. A pid and its start time name one process, even once the pid is reused."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                state, ppid, started = fields[0], int(fields[1]), int(fields[19])
            except (OSError, IndexError, ValueError):
                continue
            if state != "Z":
                found[int(entry.name)] = (ppid, started)
    return found


def _descendants(roots: set[int], live: dict[int, tuple[int, int]]) -> list[int]:
    """The descendants of ``roots`` among ``live`` (:func:`_live`), each once."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in live.items():
        children.setdefault(ppid, []).append(pid)
    tree, seen, todo = [], set(roots), list(roots)
    while todo:
        found = [pid for pid in children.get(todo.pop(), []) if pid not in seen]
        seen.update(found)
        tree.extend(found)
        todo.extend(found)
    return tree


def process_tree(root: int) -> list[int]:
    """``root`` and its live descendants (read from /proc; zombies left out)."""
    return [root, *_descendants({root}, _live())]


def _kill(pid: int, sig: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):  # gone, or the pid is another user's now
        pass


#: How long the processes being ended get after SIGTERM before SIGKILL.
GRACE = 10.0

Processes = dict[int, int]  # pid -> start time: processes told to end, each named for good


def _end(listed: Callable[[Processes], Processes], group: int | None = None, wait: float = GRACE) -> None:
    """SIGTERM ``group`` and each process ``listed(told)`` names, asking it again every 50 ms so
    that processes started meanwhile are told too, until it names none or ``wait`` seconds pass.
    Then SIGSTOP the group and what the listing names until it names nothing new (a stopped
    process starts nothing), and SIGKILL them all. ``told``: the processes signalled so far, by
    pid and start time, whose descendants a listing can follow after their parent is gone (a pid
    reused meanwhile names another process, which the listing leaves alone)."""
    deadline, told = time.monotonic() + wait, {}
    left = listed(told)  # before the first signal: a parent it ends at once orphans the rest
    if group is not None:
        _kill(group, signal.SIGTERM, group=True)
    while left and time.monotonic() < deadline:
        for pid in left.keys() - told.keys():
            _kill(pid, signal.SIGTERM)
            told[pid] = left[pid]
        time.sleep(0.05)
        left = listed(told)
    if group is not None:
        _kill(group, signal.SIGSTOP, group=True)
    stopped: Processes = {}
    for _ in range(100):  # a process that keeps moving to a new pid could otherwise hold this here
        if not (new := {pid: t for pid, t in listed({**told, **stopped}).items() if pid not in stopped}):
            break
        for pid in new:
            _kill(pid, signal.SIGSTOP)
        stopped.update(new)
    if group is not None:
        _kill(group, signal.SIGKILL, group=True)
    for pid in stopped:
        _kill(pid, signal.SIGKILL)


def _tree_of(roots: set[int], told: Processes) -> Processes:
    """The live processes among ``roots`` and ``told`` (still the same process), and their
    descendants, with their start times."""
    live = _live()
    held = {pid for pid in roots if pid in live} | {pid for pid, t in told.items() if live.get(pid, (0, -1))[1] == t}
    return {pid: live[pid][1] for pid in [*held, *_descendants(held, live)] if pid in live}


def stop(proc: subprocess.Popen) -> None:
    """Stop a process started with ``start_new_session``, its process group and its descendants,
    those it starts while it stops too: SIGTERM, and SIGKILL for what is left after
    :data:`GRACE` seconds.

    Descendants outside the group count too: a SuperLink's simulation runs in a session of its
    own and would otherwise linger until it notices the SuperLink is gone; a descendant seen once
    is followed after its parent is gone. One started and orphaned between two looks (every
    50 ms) is out of reach: only a subreaper sees it, as :func:`start_watched`'s watcher is. If
    the process has already exited, what is left of its group is killed.
    """
    if proc.poll() is not None:
        _kill(proc.pid, signal.SIGKILL, group=True)
        return
    _end(lambda told: _tree_of({proc.pid}, told), group=proc.pid, wait=GRACE)  # proc's pid is ours until it is reaped
    with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILLed; only a process stuck in the kernel is left
        proc.wait(5)


def start_watched(cmd: list[str], **popen) -> subprocess.Popen:
    """Start ``cmd`` under a watcher (:func:`main`) in a session of its own. When this process
    ends in any way, SIGKILL and the OOM killer included, the watcher's stdin closes and it stops
    ``cmd`` with everything ``cmd`` started; :func:`stop` on the returned process stops them too."""
    return subprocess.Popen([sys.executable, "-m", "pflower.processes", *cmd], stdin=subprocess.PIPE, start_new_session=True, **popen)


#: Linux's prctl option that makes a process the parent of its orphaned descendants.
PR_SET_CHILD_SUBREAPER = 36


def _unblock_sigterm() -> None:
    """In the command's process before it runs: a SIGTERM that came meanwhile ends it, as it would
    end the command (the watcher's handler, inherited until exec, would only note it)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _end_descendants(wait: float = GRACE) -> None:
    """End every live descendant of this process, those it starts meanwhile too (:func:`_end`);
    as their subreaper it sees every one, orphaned or not."""
    _end(lambda told: {pid: t for pid, t in _tree_of({os.getpid()}, {}).items() if pid != os.getpid()}, wait=wait)


def main() -> None:
    """The watcher: run the command ``sys.argv[1:]`` until it exits (then end what it left and
    exit with its status) or until stdin closes or SIGTERM comes (then stop it and its
    descendants, and exit). SIGTERM waits while the command starts, so that no command is left
    without its watcher, and is ignored while it stops. On Linux the watcher is the subreaper of
    what the command starts, so what the command leaves when it dies is found and ended too."""
    stopping = threading.Event()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def on_sigterm(signum, frame) -> None:
        raise SystemExit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_unblock_sigterm)

    def exit_with_child() -> None:
        code = child.wait()
        if not stopping.is_set():  # a stop under way ends what the command left itself
            _end_descendants()
            os._exit(code if code >= 0 else 128 - code)

    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        threading.Thread(target=exit_with_child, daemon=True).start()
        sys.stdin.buffer.read()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stopping.set()
        _end_descendants()  # the command and its tree, and on Linux what it orphaned


if __name__ == "__main__":
    main()
