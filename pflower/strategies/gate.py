"""The reply gate: every reply, relayed ones included, passes here before any server state or
any other client sees it.

A reply goes through :func:`~pflower.strategies.validation.check_reply` (error replies, client
id, arrays: keys, shapes, dtypes, NaN/Inf; every metric as :mod:`pflower.reply_metrics` and the
method's declaration declare it, counts at most ``max-examples-factor`` times what the client
declared at its identity reply or first reported), then the update norm (uploaded minus what
the client started from) at most ``max-update-norm``. A rejected reply is logged with its
client and reason, counted per reason under the round it belongs to (metrics.json
``rejected``; a riding evaluation's under the round it evaluates: :meth:`ReplyGate.round_of`)
and kept in that round's problems (a round that fails names them). A valid reply that says
which Ray node ran it (``ray-node``, in a simulation) is noted under that node for the round's
row (:attr:`ReplyGate.placement`). FedeRiCo's relayed steps pass as error replies and records
(:meth:`ReplyGate.arrays`; the relay checks the rest of what it forwards); their metrics are
never read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from logging import WARNING

import torch
from flwr.app import ArrayRecord, Message, MessageType
from flwr.common.logger import log

from pflower import reply_metrics
from pflower.strategies.validation import ArraySpec, Rejected, Reply, check_arrays, check_reply

#: What a count's ``of`` refers to: the message type whose first count bounds it.
_SPLITS = {"train": MessageType.TRAIN, "test": MessageType.EVALUATE}


class ReplyGate:
    """Validation, bounds and counts; see the module docstring. ``schemas``: the metrics each
    message type's replies may hold (default: those every pflower ClientApp sends)."""

    def __init__(self, max_update_norm: float = 0.0, max_examples_factor: float = 2.0, schemas: Mapping[str, Mapping] | None = None):
        self.max_update_norm = max_update_norm
        self.max_examples_factor = max_examples_factor
        self.schemas: dict[str, Mapping] = {MessageType.TRAIN: reply_metrics.TRAIN, MessageType.EVALUATE: reply_metrics.EVALUATE, **(schemas or {})}
        self.num_clients = 0  # the federation's, once known: client ids reported stay below it
        self.rejected: Counter[str] = Counter()
        self.problems: list[str] = []  # this round's rejections, "client 3: reason"
        #: The samples each client declared (identity) or reported first, per message type.
        self.reported: dict[str, dict[int, int]] = {MessageType.TRAIN: {}, MessageType.EVALUATE: {}}
        #: This round's valid replies by the Ray node that ran them: node id (hex) -> client ids.
        self.placement: dict[str, set[int]] = {}

    def new_round(self) -> None:
        self.rejected = Counter()
        self.problems = []
        self.placement = {}

    def nodes(self) -> dict[str, list[int]]:
        """This round's :attr:`placement` for metrics.json (``ray-nodes``): node id -> sorted client ids."""
        return {node: sorted(clients) for node, clients in sorted(self.placement.items())}

    @contextmanager
    def round_of(self, rejected: Mapping[str, int]) -> Iterator[Counter[str]]:
        """Count rejections into another round's counts (``rejected``, that round's so far) for
        the block: a riding evaluation's replies belong to the round they evaluate. Yields them."""
        now = (self.rejected, self.problems)
        self.rejected, self.problems = Counter(rejected), []
        try:
            yield self.rejected
        finally:
            self.rejected, self.problems = now

    def reject(self, client: int | None, err: Rejected, what: str = "") -> None:
        """Count and log one rejected reply (or relayed record)."""
        self.rejected[err.reason] += 1
        self.problems.append(f"client {client}: {what + ': ' if what else ''}{err}")
        log(WARNING, "Rejected %sfrom client %s: %s", f"{what} " if what else "a reply ", client, err)

    def bound(self, client: int | None) -> Callable[[str], float | None]:
        """The largest count ``client`` may state of a split: ``max-examples-factor`` times what it declared."""

        def most(of: str) -> float | None:
            before = self.reported[_SPLITS[of]].get(client)
            return None if before is None else self.max_examples_factor * before

        return most

    def _bounds(self, reply: Reply, spec: Mapping[str, ArraySpec] | None, reference) -> None:
        if spec and self.max_update_norm > 0 and reference is not None and (ref := reference(reply.client_id)) is not None:
            norm = sum(float((reply.arrays[k].double() - ref[k].double()).square().sum()) for k in spec) ** 0.5
            if norm > self.max_update_norm:
                raise Rejected("update-norm", f"update norm {norm:.4g} exceeds max-update-norm={self.max_update_norm:g}")

    def accept(
        self,
        replies: Iterable[Message],
        client_of: Mapping[int, int],
        spec: Mapping[str, ArraySpec] | None,
        kind: str = MessageType.TRAIN,
        reference: Callable[[int], Mapping[str, torch.Tensor] | None] | None = None,
        check: Callable[[Reply], None] | None = None,
    ) -> list[Reply]:
        """The valid replies of one phase of ``kind``, by client id; every other one is rejected.

        ``spec``: the arrays a reply must carry (None: none are read); ``reference(client)``:
        what the client started from, for the update-norm bound; ``check(reply)``: a method's own
        rule for its reply's metrics (raises :class:`Rejected`).
        """
        valid: dict[int, Reply] = {}
        for msg in replies:
            expected = client_of.get(msg.metadata.src_node_id)
            try:
                if expected is None:
                    raise Rejected("unknown-node", f"node {msg.metadata.src_node_id} is not a known client")
                reply = check_reply(msg, expected, spec, self.schemas[kind], self.bound(expected), self.num_clients)
                if reply.client_id in valid:
                    raise Rejected("duplicate", "second reply in one phase")
                self._bounds(reply, spec, reference)
                if check is not None:
                    check(reply)
            except Rejected as err:
                self.reject(expected, err)
                continue
            valid[reply.client_id] = reply
            self.reported[kind].setdefault(reply.client_id, reply.num_examples)
            if (node := reply.metrics.get(reply_metrics.RAY_NODE)) is not None:
                self.placement.setdefault(bytes(node).hex(), set()).add(reply.client_id)
            if spec is not None:  # decoded: drop the wire bytes, so a round holds one copy of each update
                for name in list(msg.content.array_records):
                    del msg.content[name]
        return [valid[c] for c in sorted(valid)]

    def arrays(self, client: int, record: ArrayRecord, spec: Mapping[str, ArraySpec], what: str) -> bool:
        """A relayed ArrayRecord: the keys, shapes and dtypes of ``spec``, finite; rejected (False) otherwise."""
        try:
            check_arrays(record, spec)
        except Rejected as err:
            self.reject(client, err, what)
            return False
        return True

    def state_dict(self) -> dict:
        return {"reported": {k: dict(v) for k, v in self.reported.items()}}

    def load_state_dict(self, state: dict) -> None:
        for kind, seen in state["reported"].items():
            self.reported[kind].update(seen)
