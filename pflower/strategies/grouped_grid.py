"""A Grid that shows every client of a simulation whose nodes serve several
(``simulated-clients``, :mod:`pflower.node_groups`) as a node of its own.

The strategies, the federation, the reply validator and the records see one node per client,
as with one client per node: the grid gives each client a node id of its own, packs the
messages for one node into one message (of any types: a training for some clients, an
evaluation for others), and splits that message's reply into one reply per client, each
answering its own message. A node has one message in flight at a time: Flower's engine hands
two messages for one node to two actors at once, each with a copy of the node's context, and
keeps the last one written back; messages for a busy node wait here and go together when its
reply is in. A node's reply that is an error (its actor died) is every one of its clients' error.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import WARNING
from uuid import uuid4

from flwr.app import Error, Message, MessageType, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid

from pflower import node_groups

#: Wait between pulls of the members query.
POLL = 0.05


class NodeGroupError(RuntimeError):
    """The simulated nodes cannot serve their clients: a ClientApp that is not pflower's, or none could start."""


class GroupedGrid(Grid):
    """``grid``, whose nodes serve several clients each, as one node per client (module docstring).

    :meth:`pull_messages` is asked for every message still awaited (as pflower's phases ask):
    a message or reply of one no longer asked for (a phase that timed out) is dropped."""

    def __init__(self, grid: Grid, timeout: float):
        self.grid = grid
        self.timeout = timeout
        self.node_of: dict[int, tuple[int, int]] = {}  # a client's node id here -> (the grid's node id, client id)
        self.ids: dict[tuple[int, int], int] = {}  # the reverse
        self.served: dict[int, list[int]] = {}  # the grid's node id -> the clients it serves
        self.waiting: dict[int, list[Message]] = {}  # the grid's node id -> client messages not sent yet
        self.in_flight: dict[str, tuple[int, list[Message]]] = {}  # a packed message's id -> (its node, its client messages' metadata)

    # Flower's Grid interface beside messages: the grid's own.
    def set_run(self, run_id: int) -> None:  # pragma: no cover - Flower sets the run on the grid it made
        self.grid.set_run(run_id)

    @property
    def run(self):  # pragma: no cover
        return self.grid.run

    def create_message(self, *args, **kwargs):  # pragma: no cover - deprecated in Flower
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> list[int]:
        """One id per client of the nodes there now; a node not yet known is asked which clients it serves."""
        nodes = list(self.grid.get_node_ids())
        if new := [n for n in nodes if n not in self.served]:
            self._ask_members(new, len(nodes))
        return [self.ids[(n, c)] for n in nodes for c in self.served.get(n, [])]

    def _ask_members(self, nodes: list[int], present: int) -> None:
        """Ask ``nodes`` which clients they serve. A node that answers with an error is asked again
        at the next call (as the federation asks a node whose ClientApp could not start); when
        all ``present`` nodes did and none serves yet, or a node's ClientApp is not pflower's,
        :class:`NodeGroupError`."""
        asked: dict[str, int] = {}
        for node in nodes:
            for mid in self.grid.push_messages([Message(node_groups.members_query(), dst_node_id=node, message_type=MessageType.QUERY)]):
                asked[mid] = node
        failed: dict[int, str] = {}
        deadline = time.monotonic() + self.timeout
        while asked and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(asked)):
                node = asked.pop(reply.metadata.reply_to_message_id)
                if reply.has_error() and node_groups.NO_QUERY_HANDLER not in reply.error.reason:
                    failed[node] = reply.error.reason
                    log(WARNING, "Node %s could not say which clients it serves (asked again): %s", node, reply.error.reason)
                elif reply.has_error() or not node_groups.is_group(reply.content):
                    why = reply.error.reason if reply.has_error() else "its reply has no list of clients"
                    raise NodeGroupError(f"node {node} did not say which clients it serves (simulated-clients needs pflower's ClientApp on every node): {why}")
                else:
                    self._register(node, [int(c) for c in reply.content.config_records[node_groups.GROUP].get("clients", [])])
            if asked:
                time.sleep(POLL)
        if failed and not self.served and len(failed) == present:
            reasons = "; ".join(f"node {n}: {why}" for n, why in sorted(failed.items())[:3])
            raise NodeGroupError(f"no simulated node could start (all {present} answered with an error): {reasons}")
        if asked:
            log(WARNING, "Nodes %s did not say which clients they serve within %.0f s; asked again later", sorted(asked.values())[:5], self.timeout)

    def _register(self, node: int, clients: list[int]) -> None:
        self.served[node] = clients
        for cid in clients:
            self.ids[(node, cid)] = virtual = len(self.node_of) + 1
            self.node_of[virtual] = (node, cid)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Take the messages (each its id); they go at the next :meth:`pull_messages`, packed per node."""
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex  # as Flower's in-memory grid names a message it stores
            ids.append(msg.metadata.message_id)
            self.waiting.setdefault(self.node_of[msg.metadata.dst_node_id][0], []).append(msg)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """The replies to ``message_ids`` that came (a packed reply split into one per client, an
        error reply each client's error); then each node with nothing in flight gets the messages
        waiting for it, packed into one."""
        wanted = set(message_ids)
        replies = []
        if self.in_flight:
            for packed in self.grid.pull_messages(list(self.in_flight)):
                if (sent := self.in_flight.pop(packed.metadata.reply_to_message_id, None)) is not None:
                    replies += [r for r in self._split(packed, sent[1]) if r.metadata.reply_to_message_id in wanted]
        self._send(wanted)
        return replies

    def _split(self, packed: Message, sent: list[Message]) -> list[Message]:
        parts = {} if packed.has_error() else node_groups.split_reply(packed)
        out = []
        for msg in sent:
            cid = self.node_of[msg.metadata.dst_node_id][1]
            part = packed.error if packed.has_error() else parts.get(cid)
            if part is None:
                part = Error(code=ErrorCode.UNKNOWN, reason=f"the node's reply holds none for client {cid}")
            reply = Message(part, reply_to=msg)
            reply.metadata.__dict__["_message_id"] = uuid4().hex
            out.append(reply)
        return out

    def _send(self, wanted: set[str]) -> None:
        """Each node with nothing in flight: the messages waiting for it that are still ``wanted``, as one."""
        busy = {node for node, _ in self.in_flight.values()}
        for node in [n for n in self.waiting if n not in busy]:
            msgs = [m for m in self.waiting.pop(node) if m.metadata.message_id in wanted]
            if not msgs:
                continue
            content = node_groups.pack((self.node_of[m.metadata.dst_node_id][1], m.metadata.message_type, m.content) for m in msgs)
            for pid in self.grid.push_messages([Message(content, dst_node_id=node, message_type=msgs[0].metadata.message_type)]):
                self.in_flight[pid] = (node, [node_groups.with_content(m, RecordDict()) for m in msgs])  # a reply needs its metadata only

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
