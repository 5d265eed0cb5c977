"""Who the clients are and how messages reach them: identity, sampling, and one phase of messages.

- Identity: a ``query`` round maps Flower node ids (random per run) to the stable client ids
  the clients report (their ``partition-id``), with their number of clients, training samples
  and classes. A node whose ClientApp has no ``query`` handler (a quickstart-style ClientApp
  that only trains and evaluates) gets the next free client id in node-id order, and its
  sample count is what its first training reply says.
- Sampling: a share of the known clients, drawn from (seed, round, purpose) alone.
- Phases: push messages, pull replies until all came or the timeout passed; the bytes each way,
  and the clients that did not answer (or whose node Flower reports gone). An evaluation held
  back with :meth:`Federation.hold` goes with the next phase (:mod:`pflower.single_message`),
  addressed to its clients' nodes as they are then.
- Saved states: the round in which each client last trained (:attr:`Federation.trained`), sent
  in every message as ``state-round`` (:mod:`pflower.state_round`); a client that answers that
  its saved state of that round is not there stops the run (:class:`MissingStateError`).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, Message, MessageType, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid

from pflower import reply_metrics, single_message
from pflower.datasets.node import CLASS_NAMES, IDENTITY, class_union
from pflower.datasets.shift import DOMAIN
from pflower.node_groups import NO_QUERY_HANDLER
from pflower.records import payload_bytes
from pflower.state_round import STATE_ROUND, MissingStateError, missing_state
from pflower.strategies.grouped_grid import GroupedGrid
from pflower.strategies.held import HeldEvaluation
from pflower.strategies.outbox import Outbox
from pflower.strategies.validation import Rejected, check_reply

#: Error codes with which Flower answers for a node that is gone: the client is missing, not faulty.
UNAVAILABLE = frozenset({ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE})


#: Poll schedule of :func:`send_and_receive`: wait 5% of the time the phase has taken so far,
#: at least 5 ms and at most 0.5 s.
POLL_FIRST, POLL_SHARE, POLL_MAX = 0.005, 0.05, 0.5

#: Messages in flight at once on Flower's in-memory grid (simulation). Every 0.1 s Flower's
#: simulation engine asks its LinkState for each node's next message, and each ask scans every
#: message the LinkState holds, delivered or not, until the ServerApp pulls its reply
#: (flwr/server/superlink/fleet/vce/vce_api.py:174-180, in_memory_linkstate.py:252-263): a
#: sweep costs nodes x messages held, under the lock the ServerApp's pushes and pulls wait for.
#: Holding at most this many keeps the sweep linear in the clients; 64 per 0.1 s sweep is more
#: messages than one machine's actors handle.
SIMULATION_WINDOW = 64
#: The longest wait between pulls of a windowed phase: each reply frees a slot for the next message.
WINDOW_POLL_MAX = 0.05

#: Streams of :meth:`Federation.sample`: which clients train, which evaluate.
TRAIN_SAMPLE, EVALUATE_SAMPLE = 0, 1


def window_for(grid: Grid) -> int | None:
    """How many messages of a phase may be in flight at once on ``grid``: :data:`SIMULATION_WINDOW`
    on Flower's in-memory grid (the simulation engine) and on a :class:`GroupedGrid` over it,
    None (all at once) on any other."""
    # Not imported here: Flower's in-memory grid brings its LinkState (1.3 s per process). A grid
    # of that class exists only where its module was loaded.
    if isinstance(grid, GroupedGrid):  # the same bound on the clients' messages a phase holds (a model each, for some methods)
        return SIMULATION_WINDOW
    module = sys.modules.get("flwr.superlink.grid.inmemory_grid")
    return SIMULATION_WINDOW if module is not None and isinstance(grid, module.InMemoryGrid) else None


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float, window: int | None = None) -> list[Message]:
    """Push ``messages``, then pull their replies until all came or ``timeout`` seconds passed;
    with ``window``, at most that many are pushed and not yet answered at any time (the rest
    are pushed as replies come; those still unsent at the timeout are not sent).

    ``messages`` is consumed as it is pushed: an :class:`Outbox` builds each message then, so
    a windowed phase holds the messages in flight, not all of them.

    Flower's own ``Grid.send_and_receive`` sleeps a fixed 3 s between pulls on the SuperLink's
    HTTP grid (deployment) and 0.1 s on the in-memory one (simulation), which every phase of
    every round pays. Here a reply is noticed within about 5% of the phase's length (at most
    :data:`WINDOW_POLL_MAX` with a window), and a long phase still costs the SuperLink only a
    couple of requests per second.
    """
    unsent = iter(messages)
    pending: set[str] = set()
    more = True  # whether ``unsent`` may hold messages still

    def push() -> None:
        nonlocal more
        room = window - len(pending) if window else None
        if more and (room is None or room > 0):
            batch = list(islice(unsent, room))
            more = room is not None and len(batch) == room
            if batch:
                pending.update(grid.push_messages(batch))

    push()
    longest = POLL_MAX if not more else WINDOW_POLL_MAX
    start = time.monotonic()
    replies: list[Message] = []
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            break
        push()
        if not pending:
            break
        time.sleep(min(max(POLL_FIRST, POLL_SHARE * elapsed), longest, timeout - elapsed))
    return replies


class NoClientsError(RuntimeError):
    """No client answered the identity query in time."""


@dataclass
class Phase:
    """The outcome of one phase: replies (not from gone nodes), bytes each way, silent clients."""

    replies: list[Message]
    down: int
    up: int
    missing: list[int]


class Federation:
    """The clients of a run: identity, sampling, phases (see the module docstring)."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.node_of: dict[int, int] = {}  # client id -> node id
        self.client_of: dict[int, int] = {}  # node id -> client id
        self.num_examples: dict[int, int] = {}  # training samples each client said it has
        self.test_examples: dict[int, int] = {}  # test samples each client said it has, if it said
        self.classes: dict[int, list[int]] = {}  # the classes of its data, if it said
        self.label_counts: dict[int, list[int]] = {}  # its samples per class, if it said
        self.domains: dict[int, str] = {}  # what sets its inputs apart (feature shift, natural ids), if anything
        self.stateless: set[int] = set()  # clients without a query handler (quickstart-style)
        self.stated: dict[int, int] = {}  # the federation size each identified client states
        self.num_clients = 0
        self.fixed = False  # the server has allocated per-client state: no client id beyond num_clients
        self.data: dict[int, tuple[tuple[int, ...], tuple[str, ...]]] = {}  # a node's own data: (shape, class names)
        self.shape: tuple[int, ...] | None = None  # the agreed input shape (agree_on_data)
        self.union: list[str] | None = None  # the agreed class names (agree_on_data)
        self.refused: dict[int, str] = {}  # node id -> why it is not part of the run
        self.displaced: set[int] = set()  # nodes whose client answered again from another node: never asked again
        self.riders: set[int] = set()  # clients that evaluate a riding evaluation first (they said so)
        self.held: HeldEvaluation | None = None  # an evaluation for the next phase
        self.sent_held: HeldEvaluation | None = None  # the one the last phase took, with its replies
        #: Client id -> the round of its last training reply (it saved its state then); None: a
        #: checkpoint older than ``state-round`` did not say, and the messages name no round.
        self.trained: dict[int, int] | None = {}

    @property
    def ids(self) -> list[int]:
        return sorted(self.node_of)

    def discover(self, grid: Grid, timeout: float) -> None:
        """Ask every new node who it is until all clients are known or time runs out.

        Nodes that answer with an error (a ClientApp that cannot start, e.g. unreadable data)
        are asked again; if every node has answered and none could start, the run stops at once
        with their reasons instead of waiting out the timeout.
        """
        deadline = time.monotonic() + timeout
        failed: dict[int, str] = {}
        while True:
            nodes = self.query_new_nodes(grid, timeout, failed)
            if self.num_clients and len(self.node_of) + len(self.refused) >= self.num_clients:
                break
            if nodes and not self.node_of and set(nodes) <= set(failed):
                reasons = "; ".join(f"node {n}: {why}" for n, why in sorted(failed.items())[:3])
                raise NoClientsError(f"no client could start ({len(failed)} of {len(nodes)} nodes answered with an error): {reasons}")
            if time.monotonic() > deadline:
                if not self.node_of:
                    raise NoClientsError(f"no client answered the identity query within {timeout:.0f} s")
                log(WARNING, "Only %d of %d clients answered; going on with them", len(self.node_of), self.num_clients)
                break
            time.sleep(0.5)
        if not self.stateless:
            self._refuse_unbacked(len(nodes))
        ids = self.ids
        shown = f"{ids[0]}..{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 3 else str(ids)
        log(INFO, "Clients: %d (ids %s)%s", len(ids), shown, f", {len(self.stateless)} without a query handler" if self.stateless else "")

    def query_new_nodes(self, grid: Grid, timeout: float, failed: dict[int, str] | None = None) -> list[int]:
        """Ask nodes not yet known (new, or a restarted SuperNode under a new node id) who they are.

        Returns the current node ids; ``failed`` collects the nodes that answered with an error.
        """
        failed = {} if failed is None else failed
        nodes = list(grid.get_node_ids())
        new = [n for n in nodes if n not in self.client_of and n not in self.refused and n not in self.displaced]
        if new:
            msgs = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in new]
            claimed: set[int] = set()  # client ids answered in this query: two nodes alive at once
            for reply in sorted(send_and_receive(grid, msgs, timeout, window_for(grid)), key=lambda r: r.metadata.src_node_id):
                node = reply.metadata.src_node_id
                why = self._register_stateless(node, set(nodes)) if self._no_handler(reply) else self._register(reply, claimed)
                if why is None:
                    failed.pop(node, None)
                else:
                    failed[node] = why
        return nodes

    @staticmethod
    def _no_handler(reply: Message) -> bool:
        return reply.has_error() and NO_QUERY_HANDLER in reply.error.reason

    def _register(self, reply: Message, claimed: set[int]) -> str | None:
        """Record a node's identity; returns why it could not be registered, or None.

        A client id another node claimed in the same query (``claimed``) is refused: two nodes
        with one partition-id. One that answers from a new node in a later query is a restarted
        SuperNode: it takes the id, and the old node is not asked again (it would take it back).
        A node that reads its share of the server's partition must state the federation's size
        (another size is another split: the shares would overlap); one with its own data
        (``dataset='node'``) may state a larger one only while the federation is not fixed, and
        brings images of the agreed shape and classes the federation has."""
        node = reply.metadata.src_node_id
        try:
            r = check_reply(reply, None, None, reply_metrics.IDENTITY)
            n_clients = int(r.metrics["num-clients"])
            if r.client_id >= n_clients or (self.fixed and r.client_id >= self.num_clients):
                most = self.num_clients if self.fixed else n_clients
                raise Rejected("client-id", f"client-id {r.client_id} is not below the federation's {most} clients")
        except (Rejected, KeyError, TypeError, ValueError) as err:
            log(WARNING, "Node %s did not identify itself: %s", node, err)
            return str(err)
        identity = reply.content.config_records.get(IDENTITY)
        if r.client_id in claimed:
            return self._refuse(node, r.client_id, f"node {self.node_of[r.client_id]} answered as client {r.client_id} too (two nodes with one partition-id)")
        if self.fixed and (n_clients > self.num_clients or (identity is None and self.stated and n_clients != self._agreed_size())):
            return self._refuse(node, r.client_id, f"it says the federation has {n_clients} clients, where it has {self.num_clients}")
        if identity is not None:
            shape, names = tuple(int(d) for d in identity.get("shape", [])), tuple(str(n) for n in identity.get(CLASS_NAMES, []))
            if self.shape is not None and shape != self.shape:
                return self._refuse(node, r.client_id, f"its images are {shape}, the federation's {self.shape}")
            if self.union is not None and (unknown := sorted(set(names) - set(self.union))):
                return self._refuse(node, r.client_id, f"its classes {unknown[:5]} are not the federation's (agreed when the run started)")
            self.data[r.client_id] = (shape, names)
        if r.client_id in self.node_of and (old := self.node_of[r.client_id]) != node:
            log(INFO, "Client %d is back as node %s (node %s is not asked again)", r.client_id, node, old)
            self.client_of.pop(old, None)
            self.displaced.add(old)
        claimed.add(r.client_id)
        self.node_of[r.client_id] = node
        self.client_of[node] = r.client_id
        self.num_examples[r.client_id] = r.num_examples
        if "test-examples" in r.metrics:
            self.test_examples[r.client_id] = r.metrics["test-examples"]
        if "classes" in r.metrics:
            self.classes[r.client_id] = r.metrics["classes"]
        if "label-counts" in r.metrics:
            self.label_counts[r.client_id] = r.metrics["label-counts"]
        if (domain := reply.content.config_records.get(DOMAIN)) is not None:
            self.domains[r.client_id] = str(domain.get("name", ""))
        if r.metrics.get(single_message.CAPABLE) == 1:
            self.riders.add(r.client_id)
        self.stated[r.client_id] = n_clients
        if not self.fixed:
            self.num_clients = self._agreed_size() if not self.stateless else max(self.num_clients, n_clients)
        return None

    def _agreed_size(self) -> int:
        """The federation's size most identified clients state (the smaller on a tie)."""
        counts = Counter(self.stated[c] for c in self.node_of if c in self.stated)
        return max(counts, key=lambda n: (counts[n], -n)) if counts else 0

    def _refuse_unbacked(self, nodes: int) -> None:
        """Refuse the clients that state a federation size other than most clients do: a share of
        the server's partition of another size (the shares would overlap), or, with the nodes'
        own data, a size larger than the ``nodes`` the federation has (one reply never sizes the
        server's per-client state, nor makes it wait for clients that do not exist; a node with
        its own data that joins with a size one larger, and is there, is kept). The size is then
        the largest kept."""
        agreed = self._agreed_size()
        for cid in sorted(self.node_of):
            if cid not in self.stated or self.stated[cid] == agreed:
                continue
            if cid not in self.data:  # its share of the server's partition: another size is another split
                why = f"it reads its share of {self.stated[cid]} partitions, the others of {agreed}: their data would overlap"
            elif self.stated[cid] > nodes:
                why = f"it says the federation has {self.stated[cid]} clients, where the others say {agreed} and {nodes} nodes are here"
            else:
                continue
            self._refuse(self.node_of[cid], cid, why)
            self._forget(cid)
        if self.stated:
            self.num_clients = max(self.stated.values())

    def _forget(self, cid: int) -> None:
        """Drop everything known of client ``cid`` (a client refused after it identified itself)."""
        self.client_of.pop(self.node_of.pop(cid), None)
        for known in (self.stated, self.data, self.num_examples, self.test_examples, self.classes, self.label_counts, self.domains):
            known.pop(cid, None)
        self.riders.discard(cid)

    def consistent_label_counts(self) -> dict[int, list[int]]:
        """The clients' label counts of the length most of them have (one per class); a client
        whose list has another length is left out of the partition figure, named in the log."""
        if not self.label_counts:
            return {}
        length = Counter(len(v) for v in self.label_counts.values()).most_common(1)[0][0]
        if odd := sorted(c for c, v in self.label_counts.items() if len(v) != length):
            log(WARNING, "Clients %s reported label counts of another length than the others' %d; left out of the partition figure", odd[:10], length)
        return {c: v for c, v in self.label_counts.items() if len(v) == length}

    def _refuse(self, node: int, client: int, why: str) -> str:
        """Leave ``node`` out of the run for good (it is not asked again) and say why."""
        reason = f"node {node} (client {client}) is refused: {why}"
        self.refused[node] = reason
        log(WARNING, "%s", reason)
        return reason

    def agree_on_data(self) -> tuple[tuple[int, ...], list[str]]:
        """With nodes that bring their own data: the input shape most of them have (the lowest
        client id's on a tie) and the union of their class names. A node with another shape is
        refused, named in the log; it is not asked again, and a later one is checked on arrival."""
        if not self.data:
            raise NoClientsError("dataset='node': no node said what its data is (its node config needs 'data-dir')")
        counts = Counter(shape for shape, _ in self.data.values())
        self.shape = max(counts, key=lambda s: (counts[s], -min(c for c, (sh, _) in self.data.items() if sh == s)))
        for cid, (shape, _) in sorted(self.data.items()):
            if shape != self.shape:
                node = self.node_of.pop(cid)
                self.client_of.pop(node)
                self.data.pop(cid)
                self._refuse(node, cid, f"its images are {shape}, the federation's {self.shape}")
        self.num_clients = min(self.num_clients, max(self.node_of) + 1)  # refused highest ids leave no empty rows
        union = self.union = class_union(names for _, names in self.data.values())
        self.classes = {cid: [union.index(n) for n in names] for cid, (_, names) in self.data.items()}  # in the union's numbering
        for cid, counts in list(self.label_counts.items()):
            if cid in self.data and len(counts) == len(names := self.data[cid][1]):
                numbered = [0] * len(union)
                for name, count in zip(names, counts):
                    numbered[union.index(name)] = count
                self.label_counts[cid] = numbered
            else:
                self.label_counts.pop(cid)
        return self.shape, union

    def _register_stateless(self, node: int, nodes: set[int]) -> str | None:
        """A node without a query handler: the id of a stateless client whose node is gone (a
        restarted node), else the smallest free id; refused once the ids are fixed and all taken."""
        gone = [c for c in sorted(self.stateless) if self.node_of.get(c) not in nodes]
        if gone:
            cid = gone[0]
            self.client_of.pop(self.node_of[cid], None)
        elif self.fixed and len(self.node_of) >= self.num_clients:
            log(WARNING, "Node %s has no query handler and all %d client ids are taken; it is left out", node, self.num_clients)
            return f"no client id left for a node without a query handler (all {self.num_clients} taken)"
        else:
            cid = next(i for i in range(len(self.node_of) + 1) if i not in self.node_of)
        self.node_of[cid] = node
        self.client_of[node] = cid
        self.stateless.add(cid)
        if not self.fixed:
            self.num_clients = max(self.num_clients, len(nodes))
        return None

    def sample(self, fraction: float, server_round: int, purpose: int = TRAIN_SAMPLE) -> list[int]:
        """``fraction`` of the known clients (at least one); depends only on (seed, round, purpose)."""
        ids = np.array(self.ids)
        k = max(1, int(round(fraction * len(ids))))
        if k >= len(ids):
            return ids.tolist()
        entropy = [self.seed, server_round] + ([purpose] if purpose else [])
        return sorted(np.random.default_rng(entropy).choice(ids, size=k, replace=False).tolist())

    def pin(self, client: int) -> dict[str, int]:
        """The ``state-round`` entry of ``client``'s messages (none if the rounds are unknown)."""
        return {} if self.trained is None else {STATE_ROUND: self.trained.get(client, 0)}

    def answered(self, replies: Iterable[Message]) -> list[int]:
        """The clients of ``replies`` that are not error replies."""
        return [cid for r in replies if not r.has_error() and (cid := self.client_of.get(r.metadata.src_node_id)) is not None]

    def trained_in(self, server_round: int, clients: Iterable[int]) -> None:
        """Note ``server_round`` for ``clients``, whose training reply came back (not an error):
        their ClientApp saved its state of that round before it answered."""
        if self.trained is not None:
            self.trained.update(dict.fromkeys(clients, server_round))

    def outbox(self, ids: Iterable[int], kind: str, arrays: Mapping[int, ArrayRecord], config: Mapping, extras: Mapping[int, Mapping] | None = None) -> Outbox:
        """One message of type ``kind`` per client, built when sent (:class:`Outbox`): its arrays,
        the config with its ``state-round`` (:meth:`pin`), and its ``extras`` records."""
        ids = list(ids)
        return Outbox(ids, kind, arrays, dict(config), self.node_of, {cid: self.pin(cid) for cid in ids}, extras or {})

    def messages(
        self, ids: Iterable[int], kind: str, arrays: Mapping[int, ArrayRecord], config: Mapping, extras: Mapping[int, Mapping] | None = None
    ) -> list[Message]:
        """The messages of :meth:`outbox`, built now."""
        return list(self.outbox(ids, kind, arrays, config, extras))

    def hold(self, evaluation: HeldEvaluation) -> None:
        """Hold ``evaluation`` back for the next phase: each of its messages rides on its client's
        message there if the client evaluates riding evaluations, else it goes alone in that
        phase. :meth:`take_sent_held` has it back, with its replies, after that phase."""
        if self.held is not None:
            raise RuntimeError(f"the evaluation of round {self.held.round} has not been sent yet")
        self.held = evaluation

    def take_sent_held(self) -> HeldEvaluation | None:
        """The held evaluation the last phase took, with its replies (once), or None."""
        sent, self.sent_held = self.sent_held, None
        return sent

    def _with_held(self, messages: list[Message], held: HeldEvaluation) -> tuple[Iterator[Message], set[int], set[int]]:
        """The phase's messages with the held evaluation on them or beside them, addressed to
        each client's node now: in the held clients' order, each evaluation built as it is sent
        (a strategy's lazy records build a chunk of clients at a time, once), then the phase's
        other messages; the evaluated nodes and those whose message carries one."""
        hosts = {m.metadata.dst_node_id: m for m in messages if m.metadata.message_type != MessageType.EVALUATE}
        placed = [(cid, node) for cid in held.clients if (node := self.node_of.get(cid)) is not None]
        evaluated = {node for _, node in placed}
        carried = {node for cid, node in placed if node in hosts and cid in self.riders}

        def stream() -> Iterator[Message]:
            for cid, node in placed:
                ev = Message(held.content(cid), dst_node_id=node, message_type=MessageType.EVALUATE)
                if node in carried:
                    single_message.attach(hosts[node], ev)
                    yield hosts[node]
                else:
                    yield ev
            sent = {id(hosts[node]) for node in carried}
            yield from (m for m in messages if id(m) not in sent)

        return stream(), evaluated, carried

    def phase(self, grid: Grid, messages: Outbox | list[Message], timeout: float) -> Phase:
        """Send, wait up to ``timeout``; replies of nodes that are gone are not passed on. A held
        evaluation (:meth:`hold`) goes along; its replies go to :meth:`take_sent_held`. An
        :class:`Outbox`'s messages are built as they are sent."""
        held, self.held = self.held, None
        started = time.monotonic()
        if isinstance(messages, Outbox):
            to = {(self.node_of[cid], messages.kind): self.client_of.get(self.node_of[cid]) for cid in messages.ids}
        else:
            to = {(m.metadata.dst_node_id, m.metadata.message_type): self.client_of.get(m.metadata.dst_node_id) for m in messages}
        evaluated: set[int] = set()
        carried: set[int] = set()
        stream: Iterator[Message] = iter(messages)
        if held is not None:
            stream, evaluated, carried = self._with_held(list(messages), held)
        down = 0

        def counted() -> Iterator[Message]:
            nonlocal down
            for m in stream:
                down += payload_bytes(m.content)
                yield m

        outgoing = counted()
        replies = send_and_receive(grid, outgoing, timeout, window_for(grid))
        for _ in outgoing:  # not sent before the timeout: counted all the same, as every message of the phase
            pass
        replies = [r for r in replies if not (r.has_error() and r.error.code in UNAVAILABLE)]
        up = sum(payload_bytes(r.content) for r in replies if not r.has_error())
        self._stop_if_a_state_is_missing(replies)
        answered = {(r.metadata.src_node_id, r.metadata.message_type) for r in replies}
        missing = sorted({c for key, c in to.items() if key not in answered and c is not None})
        if held is not None:
            own, failed = [], set()
            for r in replies:
                node = r.metadata.src_node_id
                if r.metadata.message_type == MessageType.EVALUATE and node in evaluated:
                    held.replies.append(r)
                    continue
                if node in carried and r.has_error():
                    failed.add(node)
                elif node in carried:
                    r, ev = single_message.split(r)
                    if ev is not None:
                        held.replies.append(ev)
                own.append(r)
            replies = own
            if failed:
                sent, got = self._evaluate_alone(grid, held, failed, max(1.0, timeout - (time.monotonic() - started)))
                down, up = down + sent, up + got
            self._stop_if_a_state_is_missing(held.replies)
            answered_ev = {r.metadata.src_node_id for r in held.replies}
            held.missing = sorted({c for c in held.clients if self.node_of.get(c) not in answered_ev})
            self.sent_held = held
        return Phase(replies, down, up, missing)

    def _evaluate_alone(self, grid: Grid, held: HeldEvaluation, nodes: set[int], timeout: float) -> tuple[int, int]:
        """Send ``held``'s evaluation alone to ``nodes``, whose message it rode on came back as an
        error (a training that failed, a state file that could not be written): the evaluation
        did not fail, the message did, so it is owed still, as a two-phase round would have had
        it; within what is left of the phase's ``timeout``. Its replies go into ``held``; returns
        the bytes sent and received."""
        again = [Message(held.content(cid), dst_node_id=node, message_type=MessageType.EVALUATE)
                 for cid in held.clients if (node := self.node_of.get(cid)) in nodes]  # fmt: skip
        replies = [r for r in send_and_receive(grid, again, timeout, window_for(grid)) if not (r.has_error() and r.error.code in UNAVAILABLE)]
        held.replies.extend(replies)
        return sum(payload_bytes(m.content) for m in again), sum(payload_bytes(r.content) for r in replies if not r.has_error())

    @staticmethod
    def _stop_if_a_state_is_missing(replies: Iterable[Message]) -> None:
        """A client whose saved state is not there never trains or evaluates from another one:
        the run stops with its line (:class:`MissingStateError`)."""
        for r in replies:
            if r.has_error() and (line := missing_state(r.error.reason)) is not None:
                raise MissingStateError(line)

    def state_dict(self) -> dict:
        trained = {} if self.trained is None else {"trained-in": dict(self.trained)}
        return {"num-clients": self.num_clients, "num-examples": dict(self.num_examples), **trained}

    def load_state_dict(self, state: dict) -> None:
        self.num_examples.update(state["num-examples"])
        if "trained-in" in state:
            self.trained = {int(c): int(r) for c, r in state["trained-in"].items()}
        else:
            log(WARNING, "The checkpoint predates state-round: clients restore the newest state they saved before the round, unchecked")
            self.trained = None
