"""A results-dir as one run's folder: what a run writes there, whether a folder already holds
a run, clearing one on purpose (``overwrite=true``), and a new folder for each run that names
none (``results/<start time>-<method>``: runs sort by start, repeated runs never collide).

A new run never writes over another run's metrics.json or checkpoint by accident: the old run
could no longer be read or resumed. This module imports neither torch nor matplotlib, so
``pflower-check`` answers as fast as before.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on Windows: no claim there
    fcntl = None

#: Where runs that name no results-dir get a folder each (relative: the SuperLink's working directory).
RESULTS = "results"
METRICS = "metrics.json"
CHECKPOINT = "checkpoint.pt"
#: Every figure :func:`pflower.plots.draw_run` may draw.
FIGURES = ("accuracy.png", "partition.png", "alpha-heatmap.png", "alpha-evolution.png", "lambda.png", "collaboration-weights.png")
#: What a run writes into its results-dir: the files above, its TensorBoard events and, by
#: default, its clients' saved states. (An MLflow store there keeps every run; it is left alone.)
OUTPUTS = (METRICS, CHECKPOINT, f"{CHECKPOINT}.tmp", f"{METRICS}.tmp", *FIGURES, "tensorboard", "client-state")


def new_run_folder(base: Path, method: str, now: float | None = None) -> Path:
    """A new, empty folder ``base/<YYYYmmdd-HHMMSS>-<method>`` (local time; ``-2``, ``-3``, ...
    after it for runs started in the same second), created here so two ServerApps never take
    the same one."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    base.mkdir(parents=True, exist_ok=True)
    for k in range(1, 10_000):
        folder = base / (f"{stamp}-{method}" + (f"-{k}" if k > 1 else ""))
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"{base} holds 9,999 runs started at {stamp}")


def held_run(folder: Path) -> list[str]:
    """The files that make ``folder`` hold a run (its metrics.json, its checkpoint); empty if none."""
    return [name for name in (METRICS, CHECKPOINT) if (folder / name).exists()]


def clear_run(folder: Path) -> list[str]:
    """Remove what a run wrote into ``folder`` (:data:`OUTPUTS`); the names removed."""
    removed = []
    for name in OUTPUTS:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


class FolderBusyError(RuntimeError):
    """Another process runs into this results-dir now."""


@contextmanager
def claimed(folder: Path, busy: str = "is being written by another run now: choose another results-dir, or wait for that run to end") -> Iterator[None]:
    """Hold ``folder`` for one run while the block runs: an exclusive lock on the folder itself,
    released when the block ends or the process dies (a killed run leaves no stale claim).
    FolderBusyError ('FOLDER ``busy``') if another process holds it: two runs started at once
    into one folder both passed the check for another run's files (neither had written one yet)
    and wrote over each other. A file system without locks claims nothing."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        fd = -1
    try:
        if fd >= 0 and fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise FolderBusyError(f"{folder} {busy}") from None
            except OSError:
                pass
        yield
    finally:
        if fd >= 0:
            os.close(fd)
