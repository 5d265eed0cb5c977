"""A client's personal state on disk, so a restarted SuperNode or a resumed run continues with it.

After training, the client writes its ``context.state`` to
``<root>/<lineage>/client-<id>/round-<r>.state``, and the context keeps only where that file
is (:data:`SAVED`: its lineage and round): the next message reads the file back. So a node's
context stays small (a simulation holds every client's in one process) and the file, which a
resumed run needs anyway, is the one copy. A context without personal state (a new run resumed
from a checkpoint, a restarted SuperNode) loads the file of its lineage from the round in which
it last trained, which is exactly the state it had when the server's checkpoint of that round
was written. A state found under a fallback root (the resumed run's directory) is copied into
the primary one. A store with fallbacks leaves ``<root>/<lineage>/resumed-from.json`` naming
them, so a run resumed from a resumed run finds the states of clients that got no message in
the run between (chains of resumptions).
The server names the round whose state a client needs (:mod:`pflower.state_round`):
:meth:`StateStore.load_round` loads exactly that one, or raises
:class:`~pflower.state_round.MissingStateError`.

A file is Flower's protobuf form of the RecordDict after a header with its length and CRC-32:
no pickle, and a truncated or damaged file is named, never read short. Files of earlier
versions (``round-<r>.pt``, ``torch.save``) are read, never written.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from pflower.records import to_record
from pflower.state_round import MissingStateError

#: Files kept per client: the state of the last rounds it trained in.
KEEP = 2
#: In a root's lineage folder: the roots the run that wrote it had resumed from.
LINK = "resumed-from.json"
#: The most roots a chain of resumptions is followed through.
MAX_CHAIN = 1000

#: What a context keeps of a state that is on disk: its lineage and round (:func:`keep_on_disk`).
SAVED = "saved-state"
#: A state file's first bytes; then the payload's length and CRC-32, then the payload.
MAGIC = b"pflower-state/1\n"
_HEAD = struct.Struct("<QI")
SUFFIX = ".state"
#: ``torch.save`` files of earlier versions: read, never written.
LEGACY = ".pt"

_KINDS = {"arrays": ArrayRecord, "config": ConfigRecord, "metrics": MetricRecord}


def encode(state: RecordDict) -> bytes:
    """The bytes of a state file holding ``state``."""
    payload = recorddict_to_proto(state).SerializeToString()
    return MAGIC + _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def decode(data: bytes) -> RecordDict:
    """The state a file's bytes hold (this version's or an earlier ``torch.save``); ValueError if
    they are cut short or damaged."""
    if not data.startswith(MAGIC):
        return _records(torch.load(io.BytesIO(data), weights_only=True))
    if len(data) < len(MAGIC) + _HEAD.size:
        raise ValueError(f"{len(data)} bytes, shorter than the header")
    size, crc = _HEAD.unpack_from(data, len(MAGIC))
    payload = memoryview(data)[len(MAGIC) + _HEAD.size :]
    if len(payload) != size or zlib.crc32(payload) != crc:
        raise ValueError(f"{len(payload)} bytes where the header says {size}, or their CRC-32 differs")
    return recorddict_from_proto(ProtoRecordDict.FromString(payload))


def _records(plain: dict) -> RecordDict:
    return RecordDict({name: to_record(value) if kind == "arrays" else _KINDS[kind](value) for name, (kind, value) in plain.items()})


def keep_on_disk(state: RecordDict, lineage: str, server_round: int) -> None:
    """Leave in a context's ``state`` only which saved file holds it (:data:`SAVED`)."""
    for name in list(state.keys()):
        del state[name]
    state[SAVED] = ConfigRecord({"lineage": lineage, "round": server_round})


def _saved(d: Path) -> dict[int, Path]:
    """A client folder's state files by round (this version's where a round has both)."""
    out: dict[int, Path] = {}
    for p in sorted(d.glob("round-*")) if d.is_dir() else []:
        number = p.stem.partition("-")[2]
        if p.suffix in (SUFFIX, LEGACY) and number.isascii() and number.isdigit() and (p.suffix == SUFFIX or int(number) not in out):
            out[int(number)] = p
    return out


def newest_saved(root: Path, client_id: int) -> Path | None:
    """The file of a client's last saved round under ``root`` (a finished run's ``client-state``,
    any lineage), for scripts that read a run's final personal states (:func:`decode`)."""
    files = [(r, p) for d in root.glob(f"*/client-{client_id}") for r, p in _saved(d).items()]
    return max(files)[1] if files else None


class StateError(RuntimeError):
    """A saved client state that cannot be read; the message names the file."""


def _read_file(path: Path) -> RecordDict:
    """The state in the file ``path``; :class:`StateError` naming it if it cannot be read or is damaged."""
    try:
        return decode(path.read_bytes())
    except Exception as err:  # noqa: BLE001 - truncated or damaged: named, never a traceback
        raise StateError(f"the saved client state {path} cannot be read ({err}); it is damaged: resume from a run whose client states are whole") from None


class StateStore:
    """The saved states of one client (see the module docstring)."""

    def __init__(self, client_id: int, root: Path, *fallbacks: Path):
        self.client_id = client_id
        self.roots = [root, *fallbacks]

    def _dir(self, root: Path, lineage: str) -> Path:
        return root / lineage / f"client-{self.client_id}"

    def _write(self, d: Path, server_round: int, payload: bytes, pinned: int | None = None) -> Path:
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"round-{server_round:06d}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(payload)
        os.replace(tmp, path)
        for rnd in sorted(_saved(d))[:-KEEP]:
            if pinned is None or rnd < pinned:
                for suffix in (SUFFIX, LEGACY):
                    (d / f"round-{rnd:06d}{suffix}").unlink(missing_ok=True)
        return path

    def save(self, lineage: str, server_round: int, state: RecordDict, pinned: int | None = None) -> Path:
        """Write the state after ``server_round``; keep the newest :data:`KEEP` files and every
        one from ``pinned`` on (the round the server named in this message: while the server has
        not received a newer training reply, a resume names that round)."""
        self._link(lineage)
        return self._write(self._dir(self.roots[0], lineage), server_round, encode(state), pinned)

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
        state = _read_file(path)
        if root != self.roots[0]:
            self._write(self._dir(self.roots[0], lineage), int(path.stem.split("-")[1]), encode(state))
        return state

    def load(self, lineage: str, before_round: int) -> RecordDict | None:
        """The newest saved state from a round before ``before_round``, or None (a server that
        names no round: a checkpoint older than ``state-round``)."""
        self._link(lineage)
        for root in self.chain(lineage):
            d = self._dir(root, lineage)
            files = _saved(d)
            if saved := [r for r in files if r < before_round]:
                return self._read(root, lineage, files[max(saved)])
        return None

    def load_saved(self, lineage: str, server_round: int) -> RecordDict:
        """The state this store saved after ``server_round`` (what a context's :data:`SAVED`
        names): its file in the primary root, read directly; :meth:`load_round` if it is not there."""
        path = self._dir(self.roots[0], lineage) / f"round-{server_round:06d}{SUFFIX}"
        return _read_file(path) if path.is_file() else self.load_round(lineage, server_round)

    def load_round(self, lineage: str, server_round: int) -> RecordDict:
        """The state saved after ``server_round``, searched through the roots of :meth:`chain`;
        :class:`MissingStateError` naming what was searched if no root has it."""
        self._link(lineage)
        roots = self.chain(lineage)
        for root in roots:
            if path := _saved(self._dir(root, lineage)).get(server_round):
                return self._read(root, lineage, path)
        found = sorted({r for root in roots for r in _saved(self._dir(root, lineage))})
        searched = ", ".join(str(self._dir(root, lineage)) for root in roots)
        raise MissingStateError(
            f"client {self.client_id} has no saved state of round {server_round} (lineage {lineage}), the round it last trained in; "
            f"searched {searched}; {f'found only rounds {found}' if found else 'found none'}. It does not train from another state: "
            "put state-dir on a shared filesystem, or run the client on the node that ran it, or resume from a run whose client states are whole"
        )
