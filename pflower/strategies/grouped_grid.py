"""A Grid that shows every client of a simulation whose nodes serve several
(``simulated-clients``, :mod:`pflower.node_groups`) as a node of its own.

The strategies, the federation, the reply validator and the records see one node per client,
as with one client per node: the grid gives each client a node id of its own, packs the
messages a push holds for one node (and one message type) into one message, and splits that
message's reply into one reply per client, each answering its own message. A node's reply that
is an error (its actor died) is every one of its clients' error.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import WARNING
from uuid import uuid4

from flwr.app import Error, Message, MessageType
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid

from pflower import node_groups

#: Wait between pulls of the members query.
POLL = 0.05


class NotGroupedError(RuntimeError):
    """A node did not say which clients it serves (a ClientApp that is not pflower's)."""


class GroupedGrid(Grid):
    """``grid``, whose nodes serve several clients each, as one node per client (module docstring)."""

    def __init__(self, grid: Grid, timeout: float):
        self.grid = grid
        self.timeout = timeout
        self.node_of: dict[int, tuple[int, int]] = {}  # a client's node id here -> (the grid's node id, client id)
        self.ids: dict[tuple[int, int], int] = {}  # the reverse
        self.served: dict[int, list[int]] = {}  # the grid's node id -> the clients it serves
        self.sent: dict[str, list[Message]] = {}  # a packed message's id -> the clients' messages it carries
        self.packed_of: dict[str, str] = {}  # a client's message id -> its packed message's id
        self.ready: dict[str, Message] = {}  # a client's message id -> its reply, not pulled yet

    # Flower's Grid interface beside messages: the grid's own.
    def set_run(self, run_id: int) -> None:  # pragma: no cover - Flower sets the run on the grid it made
        self.grid.set_run(run_id)

    @property
    def run(self):  # pragma: no cover
        return self.grid.run

    def create_message(self, *args, **kwargs):  # pragma: no cover - deprecated in Flower
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> list[int]:
        """One id per client of the nodes there now; a node seen for the first time is asked which clients it serves."""
        nodes = list(self.grid.get_node_ids())
        if new := [n for n in nodes if n not in self.served]:
            self._ask_members(new)
        return [self.ids[(n, c)] for n in nodes for c in self.served.get(n, [])]

    def _ask_members(self, nodes: list[int]) -> None:
        asked = {m: n for n, m in zip(nodes, self.grid.push_messages(
            [Message(node_groups.members_query(), dst_node_id=n, message_type=MessageType.QUERY) for n in nodes]))}  # fmt: skip
        deadline = time.monotonic() + self.timeout
        while asked and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(asked)):
                node = asked.pop(reply.metadata.reply_to_message_id)
                if reply.has_error() or not node_groups.is_group(reply.content):
                    why = reply.error.reason if reply.has_error() else "no client list in its reply"
                    raise NotGroupedError(f"node {node} did not say which clients it serves (simulated-clients needs pflower's ClientApp): {why}")
                clients = [int(c) for c in reply.content.config_records[node_groups.GROUP].get("clients", [])]
                self.served[node] = clients
                for cid in clients:
                    self.ids[(node, cid)] = virtual = len(self.node_of) + 1
                    self.node_of[virtual] = (node, cid)
            if asked:
                time.sleep(POLL)
        if asked:
            log(WARNING, "Nodes %s did not say which clients they serve within %.0f s; asked again later", sorted(asked.values())[:5], self.timeout)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Pack the messages for each node and type into one; returns the clients' message ids."""
        groups: dict[tuple[int, str], list[tuple[int, Message]]] = {}
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex  # as Flower's in-memory grid names a message it stores
            ids.append(msg.metadata.message_id)
            node, cid = self.node_of[msg.metadata.dst_node_id]
            groups.setdefault((node, msg.metadata.message_type), []).append((cid, msg))
        packed = [Message(node_groups.pack((cid, m.content) for cid, m in group), dst_node_id=node, message_type=kind)
                  for (node, kind), group in groups.items()]  # fmt: skip
        for pid, group in zip(self.grid.push_messages(packed), groups.values()):
            self.sent[pid] = [m for _, m in group]
            self.packed_of.update(dict.fromkeys((m.metadata.message_id for _, m in group), pid))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """The clients' replies of these ids that came: a packed reply split into one per client
        (an error reply is each of its clients' error)."""
        wanted = list(message_ids)
        if waiting := {self.packed_of[i] for i in wanted if i not in self.ready and i in self.packed_of}:
            for packed in self.grid.pull_messages(waiting):
                parts = {} if packed.has_error() else node_groups.split_reply(packed)
                for msg in self.sent.pop(packed.metadata.reply_to_message_id, []):
                    cid = self.node_of[msg.metadata.dst_node_id][1]
                    part = packed.error if packed.has_error() else parts.get(cid)
                    if part is None:
                        part = Error(code=ErrorCode.UNKNOWN, reason=f"the node's reply holds none for client {cid}")
                    reply = Message(part, reply_to=msg)
                    reply.metadata.__dict__["_message_id"] = uuid4().hex
                    self.ready[msg.metadata.message_id] = reply
                    self.packed_of.pop(msg.metadata.message_id, None)
        return [self.ready.pop(i) for i in wanted if i in self.ready]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:  # pragma: no cover - pflower's phases push and pull
        ids = set(self.push_messages(messages))
        replies: list[Message] = []
        deadline = time.monotonic() + (timeout or 0.0)
        while ids and (timeout is None or time.monotonic() < deadline):
            got = self.pull_messages(ids)
            replies += got
            ids -= {r.metadata.reply_to_message_id for r in got}
            time.sleep(POLL)
        return replies
