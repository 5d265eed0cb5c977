"""Per-round metrics: progress lines while a run goes, metrics.json and a plot at the end."""

from __future__ import annotations

import json
import os
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from pflower.config import Settings
from pflower.plots import draw_run


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MB"


class Recorder:
    """Collects one dict per round and writes ``metrics.json`` (after every round) and the
    figures of :func:`pflower.plots.draw_run` (at the end) into ``results-dir``."""

    def __init__(self, settings: Settings, rounds: list[dict[str, Any]] | None = None):
        self.settings = settings
        self.dir: Path = settings.results_path
        self.rounds: list[dict[str, Any]] = list(rounds or [])
        self.extra: dict[str, Any] = {}
        self.dir.mkdir(parents=True, exist_ok=True)

    def add_round(self, row: dict[str, Any]) -> None:
        """Record a round (adding the run's cumulative bytes so far), log it, rewrite metrics.json."""
        before = self.rounds[-1] if self.rounds else {}
        for way in ("down", "up"):
            row[f"cumulative-bytes-{way}"] = before.get(f"cumulative-bytes-{way}", 0) + row[f"bytes-{way}"]
        self.rounds.append(row)
        total = self.settings.num_server_rounds
        rejected = sum(row.get("rejected", {}).values())
        if row["accuracy"] is None:
            quality = "no evaluation replies"
        else:
            quality = f"accuracy {row['accuracy']:.4f} (weighted {row['weighted-accuracy']:.4f}) loss {row['loss']:.4f}"
            if "global-accuracy" in row:
                quality += f" | global accuracy {row['global-accuracy']:.4f}"
        log(
            INFO,
            "[round %d/%d] %s | down %s up %s | %.2f s%s",
            row["round"],
            total,
            quality,
            _mb(row["bytes-down"]),
            _mb(row["bytes-up"]),
            row["wall-seconds"],
            f" | rejected {rejected}" if rejected else "",
        )
        self.write()

    def document(self) -> dict[str, Any]:
        last = self.rounds[-1] if self.rounds else {}
        return {
            "config": self.settings.to_run_config(),
            "rounds": self.rounds,
            "final": {
                "accuracy": last.get("accuracy"),
                "weighted-accuracy": last.get("weighted-accuracy"),
                "per-client-accuracy": last.get("per-client-accuracy", {}),
                **({"global-accuracy": last["global-accuracy"]} if "global-accuracy" in last else {}),
                "bytes-down": sum(r["bytes-down"] for r in self.rounds),
                "bytes-up": sum(r["bytes-up"] for r in self.rounds),
            },
            **self.extra,
        }

    def write(self) -> Path:
        """Write metrics.json atomically (a crash never leaves half a file)."""
        path = self.dir / "metrics.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.document(), indent=1))
        os.replace(tmp, path)
        return path

    def finish(self) -> None:
        self.write()
        draw_run(self.document(), self.dir)
        log(INFO, "Results written to %s", self.dir)
