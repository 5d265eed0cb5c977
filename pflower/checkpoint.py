"""Server checkpoints: the whole strategy state after every round, and ``resume-from``.

A checkpoint holds the run's lineage (an id shared by a run and every run resumed from it,
which clients use to find their own saved state), the last finished round, the run config,
the strategy's :meth:`state_dict` and the metrics rows so far. Resuming with the same seed
continues the run exactly: sampling and minibatch orders depend only on (seed, client, round).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pflower.config import ConfigError, Settings
from pflower.run_folder import CHECKPOINT

#: Keys a resumed run may change; every other key must equal the checkpoint's.
#: ``state-dir`` is not among them: the clients find their saved states where the run saved them.
RESUMABLE_CHANGES = frozenset({"num-server-rounds", "results-dir", "resume-from", "overwrite", "round-timeout", "data-dir", "single-message",
                               "simulated-clients", "tensorboard", "mlflow", "mlflow-tracking-uri", "mlflow-experiment"})  # fmt: skip


@dataclass(frozen=True)
class Checkpoint:
    lineage: str
    round: int
    config: dict[str, Any]
    strategy: dict[str, Any]
    rounds: list[dict[str, Any]]


def save_checkpoint(directory: Path, ckpt: Checkpoint) -> Path:
    """Write ``checkpoint.pt`` atomically: a crash leaves the previous round's file intact."""
    path = directory / CHECKPOINT
    tmp = path.with_suffix(".pt.tmp")
    torch.save(
        {
            "lineage": ckpt.lineage,
            "round": ckpt.round,
            "config": json.dumps(ckpt.config),
            "rounds": json.dumps(ckpt.rounds),
            "strategy": ckpt.strategy,
        },
        tmp,
    )
    os.replace(tmp, path)
    return path


def load_checkpoint(settings: Settings) -> Checkpoint:
    """The checkpoint in ``resume-from``, checked against ``settings``; ConfigError if unusable."""
    where = settings.resume_from
    path = Path(where).expanduser().resolve() / CHECKPOINT
    if not path.is_file():
        raise ConfigError([("resume-from", where, f"no {CHECKPOINT} in that directory")])
    try:
        raw = torch.load(path, weights_only=True)
        ckpt = Checkpoint(raw["lineage"], int(raw["round"]), json.loads(raw["config"]), raw["strategy"], json.loads(raw["rounds"]))
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ConfigError([("resume-from", where, f"{path} is not a readable pflower checkpoint ({err})")]) from None
    if (bad := _non_finite(ckpt.strategy)) is not None:
        raise ConfigError([("resume-from", where, f"{path} holds NaN or infinite values in the server state's {bad}: a run does not go on from it")])
    now = settings.to_run_config()
    problems = [
        (key, now.get(key), f"differs from the checkpoint in {where} ({old!r}); a resumed run may only change {sorted(RESUMABLE_CHANGES)}")
        for key, old in sorted(ckpt.config.items())
        if key not in RESUMABLE_CHANGES and now.get(key) != old
    ]
    defaults = Settings.model_validate({"method": settings.method}).to_run_config()
    problems += [  # a key newer than the checkpoint: its run had the key's default
        (key, now[key], f"the checkpoint in {where} predates this key, so its run had the default {defaults[key]!r}; a resumed run keeps it")
        for key in sorted(now.keys() - ckpt.config.keys())
        if key not in RESUMABLE_CHANGES and key in defaults and now[key] != defaults[key]
    ]
    if settings.num_server_rounds < ckpt.round:
        problems.append(("num-server-rounds", settings.num_server_rounds, f"must be >= {ckpt.round}, the checkpoint's round"))
    elif settings.num_server_rounds == ckpt.round and _finished(path.parent):
        problems.append(("num-server-rounds", settings.num_server_rounds,
                         f"the run in {where} finished all its {ckpt.round} rounds: nothing is left to run (raise num-server-rounds to go on)"))  # fmt: skip
    if problems:
        raise ConfigError(problems)
    return ckpt


def _non_finite(state, name: str = "") -> str | None:
    """The name of the first floating tensor in ``state`` (nested dicts and lists) with a NaN or
    an infinity, or None."""
    if isinstance(state, torch.Tensor):
        return name or "state" if state.is_floating_point() and not bool(torch.isfinite(state).all()) else None
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list | tuple) else ()
    for key, value in items:
        if (found := _non_finite(value, f"{name}.{key}" if name else str(key))) is not None:
            return found
    return None


def _finished(folder: Path) -> bool:
    """Whether the run in ``folder`` ended (its metrics.json says ``complete``), not only
    checkpointed its last round (a run stopped before its figures resumes to draw them)."""
    try:
        return json.loads((folder / "metrics.json").read_text()).get("complete") is True
    except (OSError, ValueError, AttributeError):
        return False
