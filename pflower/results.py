"""Per-round metrics: progress lines while a run goes, metrics.json and a plot at the end."""

from __future__ import annotations

import json
import math
import os
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from pflower.plots import draw_run

#: A row's entry in a Ray simulation: which Ray node ran the messages of which clients that round
#: (node id -> client ids); rows of runs outside Ray (deployment, in process) have none.
RAY_NODES = "ray-nodes"


def outcome(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics.json row without where and how fast it ran (timings, Ray nodes): what two runs
    of one config and seed share, wherever they ran."""
    return {k: v for k, v in row.items() if "seconds" not in k and k != RAY_NODES}


def _finite(value: Any, where: str, bad: list[str]) -> Any:
    """``value`` with every NaN or infinity replaced by None (their places listed in ``bad``)."""
    if isinstance(value, float) and not math.isfinite(value):
        bad.append(where or "(top)")
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{where}.{k}" if where else str(k), bad) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, f"{where}[{i}]", bad) for i, v in enumerate(value)]
    return value


def write_json(path: Path, doc: dict[str, Any], indent: int | None = None) -> Path:
    """Write ``doc`` to ``path`` atomically as standard JSON: a crash never leaves half a file
    that reads as whole, and a NaN or infinity (which no client can send: the reply validator
    refuses them; a server-side computation might make one) is written as null, with a warning
    naming where, never as the ``NaN``/``Infinity`` no JSON parser but Python's reads."""
    separators = None if indent else (",", ":")
    try:
        text = json.dumps(doc, indent=indent, separators=separators, allow_nan=False)
    except ValueError:
        bad: list[str] = []
        text = json.dumps(_finite(doc, "", bad), indent=indent, separators=separators, allow_nan=False)
        log(WARNING, "%s: non-finite numbers written as null at %s", path, ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
    return path


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


class Recorder:
    """Collects one dict per round, logs a progress line for each, and writes ``metrics.json``
    (after every round) and the figures of :func:`pflower.plots.draw_run` (at the end) into
    ``directory``; with no directory it only logs. ``trackers`` (:mod:`pflower.tracking`) get
    every row once it is complete, and the figures at the end."""

    def __init__(self, directory: Path | None, run_config: dict[str, Any], num_rounds: int, rounds: list[dict[str, Any]] | None = None,
                 trackers: list | None = None):  # fmt: skip
        self.dir = directory
        self.run_config = dict(run_config)
        self.num_rounds = num_rounds
        self.rounds: list[dict[str, Any]] = list(rounds or [])
        self.trackers = list(trackers or [])
        self.extra: dict[str, Any] = {}
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

    def add_round(self, row: dict[str, Any], log_it: bool = True) -> None:
        """Record a round (adding the run's cumulative bytes so far), log it (unless its
        evaluation is still to come: :meth:`complete_round` logs it then), rewrite metrics.json."""
        before = self.rounds[-1] if self.rounds else {}
        for way in ("down", "up"):
            row[f"cumulative-bytes-{way}"] = before.get(f"cumulative-bytes-{way}", 0) + row[f"bytes-{way}"]
        self.rounds.append(row)
        if log_it:
            self._log(row)
        self.write()

    def complete_round(self, server_round: int, fields: dict[str, Any]) -> None:
        """Add round ``server_round``'s evaluation (which came back later) to its row; log the row."""
        row = next(r for r in self.rounds if r["round"] == server_round)
        row.update(fields)
        self._log(row)
        self.write()

    def _log(self, row: dict[str, Any]) -> None:
        """The progress line of a complete row; the trackers get the row."""
        for tracker in self.trackers:
            tracker.round(row)
        rejected = sum(row.get("rejected", {}).values())
        if not row.get("evaluated"):
            quality = "not evaluated this round"
        elif row["accuracy"] is None:
            quality = "no accuracy in the evaluation replies"
        else:
            quality = f"accuracy {row['accuracy']:.4f} (weighted {row['weighted-accuracy']:.4f})"
            if row.get("loss") is not None:
                quality += f" loss {row['loss']:.4f}"
            if "global-accuracy" in row:
                quality += f" | global accuracy {row['global-accuracy']:.4f}"
        log(
            INFO,
            "[round %d/%d] %s | down %s up %s | %.2f s%s",
            row["round"],
            self.num_rounds,
            quality,
            _mib(row["bytes-down"]),
            _mib(row["bytes-up"]),
            row["wall-seconds"],
            f" | rejected {rejected}" if rejected else "",
        )

    def document(self) -> dict[str, Any]:
        evaluated = [r for r in self.rounds if r.get("accuracy") is not None]
        last = evaluated[-1] if evaluated else {}
        return {
            "config": self.run_config,
            "rounds": self.rounds,
            "final": {
                "accuracy": last.get("accuracy"),
                "weighted-accuracy": last.get("weighted-accuracy"),
                "per-client-accuracy": last.get("per-client-accuracy", {}),
                **({"global-accuracy": last["global-accuracy"]} if "global-accuracy" in last else {}),
                **({"oracle-accuracy": last["oracle-accuracy"]} if "oracle-accuracy" in last else {}),
                "bytes-down": sum(r["bytes-down"] for r in self.rounds),
                "bytes-up": sum(r["bytes-up"] for r in self.rounds),
            },
            **self.extra,
        }

    def write(self) -> Path | None:
        """Write metrics.json atomically (a crash never leaves half a file)."""
        if self.dir is None:
            return None
        return write_json(self.dir / "metrics.json", self.document(), indent=1)

    def abort(self, err: BaseException) -> None:
        """The run died: the trackers closed as failed (MLflow's run FAILED, TensorBoard's events
        flushed; metrics.json has every round so far already); a tracker that cannot close is only logged."""
        for tracker in self.trackers:
            try:
                tracker.abort(err)
            except Exception as problem:  # noqa: BLE001 - the run's own error is the one to raise
                log(WARNING, "%s could not be closed: %s", type(tracker).__name__, problem)

    def finish(self) -> None:
        """The run ended: the figures are drawn and the trackers closed, then metrics.json says
        so (``complete``: a resume of it has nothing left to run; a run whose figures or trackers
        failed is not complete, and a resume with its rounds draws them)."""
        if self.dir is not None:
            self.write()
            figures = draw_run(self.document(), self.dir)
            for tracker in self.trackers:
                tracker.finish(self.document(), figures)
            self.extra["complete"] = True
            self.write()
            log(INFO, "Results written to %s", self.dir)
