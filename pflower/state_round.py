"""Which saved personal state a client starts from, named once for the server and the client.

The server knows in which round each client last trained: the round of its last training reply
that came back (not an error reply), after which the client saved its state
(:mod:`pflower.client_app.store`). It keeps that per client, in its checkpoint too, and sends
it in every message's config as ``state-round`` (0: the client never trained). A client whose
context holds no personal state (a resumed run, a restarted SuperNode) loads exactly that
round's saved state; if it is not found the client does not train or evaluate: it answers with
a :class:`MissingStateError`, and the server stops the run with the client's one line.

A round whose reply was rejected by the gate counts: the client saved the state it trained,
and a SuperNode that kept running goes on from it, so a resumed run does too. A reply that
never came back leaves the server naming an older round: the client keeps every file from the
round its message names on, so that round is still there, and starts from it even where its
context points to the newer one (so the run goes on as a resumed one would).

Standard library only: the server's modules use it without the ClientApp's imports.
"""

from __future__ import annotations

#: Message-config key (training, relayed steps, evaluations): the round whose saved state the
#: client starts from, or evaluates; 0 = the client never trained (its initial state).
STATE_ROUND = "state-round"


class MissingStateError(RuntimeError):
    """A client's saved state for the round the server names is not found; the message names the
    client, the lineage, the round and the folders searched, and what to do."""


def missing_state(reason: str) -> str | None:
    """The client's line in an error reply's ``reason`` if it is a :class:`MissingStateError`, else None."""
    mark = f"{MissingStateError.__name__}: "
    return reason[reason.index(mark) + len(mark) :] if mark in reason else None
