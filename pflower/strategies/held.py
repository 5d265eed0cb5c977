"""An evaluation held back for the next phase (the single-message round): what a round still owes.

Round t's evaluation is owed to clients, by client id and never by node id (a SuperNode that
restarts comes back under a new node id), each with the content its evaluation message carries:
the arrays to evaluate with and the config, which names the round and the personal state to
evaluate (``state-after-round``: the state as round t left it, which a client restores from disk
when its context has none; ``state-round``, each client's own: the round whose saved state that is,
:mod:`pflower.state_round`). The first phase of round t+1 takes it
(:meth:`~pflower.strategies.federation.Federation.phase`), addresses each message to its client's
node at that moment, and puts the replies and the clients that did not answer in it.

A checkpoint stores it (:meth:`HeldEvaluation.state_dict`): its round, clients, config and state rounds; the
arrays are rebuilt by the resumed strategy from the restored server state, the state they were
built from (:meth:`HeldEvaluation.from_state_dict`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from pflower.state_round import STATE_ROUND

if TYPE_CHECKING:
    from pflower.strategies.outbox import Outbox


@dataclass
class HeldEvaluation:
    """Round ``round``'s evaluation: each client's arrays and ``state-round`` (none if the server
    names none), and the config all its messages carry; after the phase that took it, the
    replies (error replies included) and the silent clients."""

    round: int
    config: dict[str, Any]
    arrays: Mapping[int, ArrayRecord]  # a strategy's lazy records build each client's when its message is sent
    states: dict[int, int] = field(default_factory=dict)
    replies: list[Message] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)

    @property
    def clients(self) -> list[int]:
        return sorted(self.arrays)

    def content(self, client: int) -> RecordDict:
        """The content of ``client``'s evaluation message."""
        pin = {STATE_ROUND: self.states[client]} if client in self.states else {}
        return RecordDict({"arrays": self.arrays[client], "config": ConfigRecord({**self.config, **pin})})

    @classmethod
    def of_outbox(cls, server_round: int, outbox: Outbox) -> HeldEvaluation:
        """From the evaluation outbox of round ``server_round``: its clients' arrays (still
        unbuilt where the strategy builds them lazily), its config and their state rounds."""
        states = {cid: int(pin[STATE_ROUND]) for cid, pin in outbox.pins.items() if STATE_ROUND in pin}
        return cls(server_round, dict(outbox.config), outbox.arrays, states)

    @classmethod
    def of(cls, server_round: int, messages: list[Message], client_of: Mapping[int, int]) -> HeldEvaluation:
        """From the evaluation messages :meth:`configure_evaluate` built (each a config and arrays)."""
        config = dict(messages[0].content.config_records["config"]) if messages else {}
        config.pop(STATE_ROUND, None)
        arrays = {client_of[m.metadata.dst_node_id]: m.content.array_records.get("arrays", ArrayRecord()) for m in messages}
        states = {client_of[m.metadata.dst_node_id]: int(c[STATE_ROUND]) for m in messages if STATE_ROUND in (c := m.content.config_records["config"])}
        return cls(server_round, config, arrays, states)

    def state_dict(self) -> dict:
        return {"round": self.round, "clients": self.clients, "config": json.dumps(self.config), "state-rounds": dict(self.states)}

    @classmethod
    def from_state_dict(cls, state: dict, arrays: Callable[[int, list[int]], Mapping[int, ArrayRecord]]) -> HeldEvaluation:
        """The evaluation a checkpoint held; ``arrays(round, clients)`` rebuilds what it sends."""
        clients = [int(c) for c in state["clients"]]
        built = arrays(int(state["round"]), clients)  # exactly those clients' (lazy where the strategy builds them so)
        states = {int(c): int(r) for c, r in state.get("state-rounds", {}).items()}  # none in a checkpoint older than state-round
        return cls(int(state["round"]), json.loads(state["config"]), built, states)
