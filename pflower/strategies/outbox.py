"""One message per client of a phase, built as it is sent: the messages a phase holds in flight
are never all made at once."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict


@dataclass
class Outbox:
    """One message of type ``kind`` per client of ``ids``, each built when it is iterated (its
    arrays looked up in ``arrays`` then): a phase that sends an outbox holds the messages in
    flight, not one per client. ``pins``: each client's ``state-round`` entry, fixed when the
    outbox was made (:meth:`Federation.pin`)."""

    ids: list[int]
    kind: str
    arrays: Mapping[int, ArrayRecord]
    config: dict
    node_of: Mapping[int, int]
    pins: dict[int, dict[str, int]]
    extras: Mapping[int, Mapping] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[Message]:
        return (self.message(cid) for cid in self.ids)

    def message(self, cid: int) -> Message:
        content = RecordDict({"arrays": self.arrays[cid], "config": ConfigRecord({**self.config, **self.pins[cid]}), **self.extras.get(cid, {})})
        return Message(content, dst_node_id=self.node_of[cid], message_type=self.kind)
