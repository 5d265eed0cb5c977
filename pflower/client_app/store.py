"""A client's personal state on disk, so a restarted SuperNode or a resumed run continues with it.

``context.state`` lives as long as the run in one SuperNode process. After training, the
client also writes it to ``<root>/<lineage>/client-<id>/round-<r>.pt``; a context without
personal state (a new run resumed from a checkpoint, a restarted SuperNode) loads the file of
its lineage from the round in which it last trained, which is exactly the state it had when
the server's checkpoint of that round was written. A state found under a fallback root
(the resumed run's directory) is copied into the primary one. A store with fallbacks leaves
``<root>/<lineage>/resumed-from.json`` naming them, so a run resumed from a resumed run finds
the states of clients that got no message in the run between (chains of resumptions).
The server names the round whose state a client needs (:mod:`pflower.state_round`):
:meth:`StateStore.load_round` loads exactly that one, or raises
:class:`~pflower.state_round.MissingStateError`.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from pflower.records import from_record, to_record
from pflower.state_round import MissingStateError

#: Files kept per client: the state of the last rounds it trained in.
KEEP = 2
#: In a root's lineage folder: the roots the run that wrote it had resumed from.
LINK = "resumed-from.json"
#: The most roots a chain of resumptions is followed through.
MAX_CHAIN = 1000

_KINDS = {"arrays": ArrayRecord, "config": ConfigRecord, "metrics": MetricRecord}


def _plain(state: RecordDict) -> dict:
    out = {}
    for name, rec in state.items():
        if isinstance(rec, ArrayRecord):
            out[name] = ("arrays", from_record(rec))
        else:
            out[name] = ("config" if isinstance(rec, ConfigRecord) else "metrics", dict(rec))
    return out


def _records(plain: dict) -> RecordDict:
    return RecordDict({name: to_record(value) if kind == "arrays" else _KINDS[kind](value) for name, (kind, value) in plain.items()})


class StateError(RuntimeError):
    """A saved client state that cannot be read; the message names the file."""


class StateStore:
    """The saved states of one client (see the module docstring)."""

    def __init__(self, client_id: int, root: Path, *fallbacks: Path):
        self.client_id = client_id
        self.roots = [root, *fallbacks]

    def _dir(self, root: Path, lineage: str) -> Path:
        return root / lineage / f"client-{self.client_id}"

    def _write(self, d: Path, server_round: int, payload: bytes, pinned: int | None = None) -> Path:
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"round-{server_round:06d}.pt"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(payload)
        os.replace(tmp, path)
        for old in sorted(d.glob("round-*.pt"))[:-KEEP]:
            if pinned is None or int(old.stem.split("-")[1]) < pinned:
                old.unlink(missing_ok=True)
        return path

    def save(self, lineage: str, server_round: int, state: RecordDict, pinned: int | None = None) -> Path:
        """Write the state after ``server_round``; keep the newest :data:`KEEP` files and every
        one from ``pinned`` on (the round the server named in this message: while the server has
        not received a newer training reply, a resume names that round)."""
        buf = io.BytesIO()
        torch.save(_plain(state), buf)
        return self._write(self._dir(self.roots[0], lineage), server_round, buf.getvalue(), pinned)

    def _link(self, lineage: str) -> None:
        """Name this run's fallbacks in its root's lineage folder (once; atomic)."""
        d = self.roots[0] / lineage
        if len(self.roots) > 1 and not (d / LINK).is_file():
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f".{LINK}.{os.getpid()}.{self.client_id}"
            tmp.write_text(json.dumps([str(r) for r in self.roots[1:]]))
            os.replace(tmp, d / LINK)

    def chain(self, lineage: str) -> list[Path]:
        """The roots to search, newest run first: this store's, then every root the runs before
        resumed from, as their links say."""
        roots, seen, k = list(self.roots), set(self.roots), 0
        while k < len(roots):
            try:
                linked = json.loads((roots[k] / lineage / LINK).read_text())
            except (OSError, ValueError):
                linked = []
            for r in linked if isinstance(linked, list) else []:
                if isinstance(r, str) and r and Path(r) not in seen and len(roots) < MAX_CHAIN:
                    roots.append(Path(r))
                    seen.add(Path(r))
            k += 1
        return roots

    def _read(self, root: Path, lineage: str, path: Path) -> RecordDict:
        """The state in ``path`` (found under ``root``), copied into the primary root if it is a fallback."""
        payload = path.read_bytes()
        try:
            state = _records(torch.load(io.BytesIO(payload), weights_only=True))
        except Exception as err:  # noqa: BLE001 - truncated or damaged: named, never a traceback
            raise StateError(f"the saved client state {path} cannot be read ({err}); it is damaged: resume from a run whose client states are whole") from None
        if root != self.roots[0]:
            self._write(self._dir(self.roots[0], lineage), int(path.stem.split("-")[1]), payload)
        return state

    def load(self, lineage: str, before_round: int) -> RecordDict | None:
        """The newest saved state from a round before ``before_round``, or None (a server that
        names no round: a checkpoint older than ``state-round``)."""
        self._link(lineage)
        for root in self.chain(lineage):
            d = self._dir(root, lineage)
            saved = sorted(p for p in d.glob("round-*.pt") if int(p.stem.split("-")[1]) < before_round) if d.is_dir() else []
            if saved:
                return self._read(root, lineage, saved[-1])
        return None

    def load_round(self, lineage: str, server_round: int) -> RecordDict:
        """The state saved after ``server_round``, searched through the roots of :meth:`chain`;
        :class:`MissingStateError` naming what was searched if no root has it."""
        self._link(lineage)
        roots = self.chain(lineage)
        for root in roots:
            path = self._dir(root, lineage) / f"round-{server_round:06d}.pt"
            if path.is_file():
                return self._read(root, lineage, path)
        found = sorted({int(p.stem.split("-")[1]) for root in roots for p in self._dir(root, lineage).glob("round-*.pt")})
        searched = ", ".join(str(self._dir(root, lineage)) for root in roots)
        raise MissingStateError(
            f"client {self.client_id} has no saved state of round {server_round} (lineage {lineage}), the round it last trained in; "
            f"searched {searched}; {f'found only rounds {found}' if found else 'found none'}. It does not train from another state: "
            "put state-dir on a shared filesystem, or run the client on the node that ran it, or resume from a run whose client states are whole"
        )
