"""A Ray head that the simulations of one SuperLink share.

Flower's simulation calls ``ray.init()`` in every run, which starts a local Ray instance (5 s
here) after the SuperLink, the submission and the ServerApp have started. :func:`ray_head`
starts one Ray instance at the same time as the SuperLink and gives the SuperLink its own
``RAY_TMPDIR``; this module's process writes the head's address to
``$RAY_TMPDIR/ray/ray_current_cluster``, the file where ``ray.init()`` looks for an existing
cluster, so every simulation of that SuperLink connects to the head. A run that starts
before the head is up (or if it fails) starts its own instance, as without it. A ``RAY_ADDRESS``
set by the user wins: then no head is started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pflower.processes import stop

#: The start of the name of a head's private ``RAY_TMPDIR``.
TMP_PREFIX = "pflower-ray-"
#: Seconds a head gets to shut down cleanly before its processes are killed.
SHUTDOWN_WAIT = 15


def address_file(tmpdir: str | Path) -> Path:
    """Where ``ray.init()`` looks for the address of an existing cluster under ``RAY_TMPDIR``."""
    return Path(tmpdir) / "ray" / "ray_current_cluster"


@contextmanager
def ray_head(env: dict[str, str], log_path: Path) -> Iterator[dict[str, str]]:
    """Start a Ray head in the background; yield the environment that makes ``ray.init()`` use it."""
    if env.get("RAY_ADDRESS"):
        yield {}
        return
    # Short and private: Ray's socket paths must fit in 107 bytes, and a shared temp dir would
    # let other programs' ray.init() find this head.
    tmpdir = tempfile.mkdtemp(prefix=TMP_PREFIX)
    head_env = {**env, "RAY_TMPDIR": tmpdir}
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pflower.ray_head"], env=head_env, stdin=subprocess.PIPE, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield {"RAY_TMPDIR": tmpdir}
    finally:
        proc.stdin.close()
        try:
            proc.wait(SHUTDOWN_WAIT)
        except subprocess.TimeoutExpired:
            pass
        stop(proc)  # also Ray's own processes, should any outlive the head's shutdown
        log.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


def main() -> None:
    """Hold a Ray head until stdin closes (the launcher ends or dies), then stop its processes
    and remove its folder.

    The head is Ray's node itself, as ``ray start --head`` makes it, not ``ray.init()``: this
    process then holds no driver of its own, and the head runs without the autoscaler's
    monitor, which a one-machine cluster never uses (at a 1000-client simulation: 62 MiB of
    PSS for the driver, now 50, and 49 MiB for the monitor). Ray's node API is internal
    (``ray._private``): checked on the Ray that Flower 1.39 installs (2.55).
    """
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    node = Node(RayParams(include_dashboard=False, no_monitor=True), head=True, shutdown_at_exit=True, spawn_reaper=False)
    target = address_file(os.environ["RAY_TMPDIR"])
    target.write_text(node.gcs_address)
    print(f"Ray head at {node.gcs_address}", flush=True)
    sys.stdin.read()
    target.unlink(missing_ok=True)
    node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
    folder = Path(os.environ["RAY_TMPDIR"])
    if folder.name.startswith(TMP_PREFIX):  # the launcher's, which it removes too unless it was killed
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
