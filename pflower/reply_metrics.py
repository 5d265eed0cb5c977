"""What a reply's metrics may hold: each key's type and range, declared once.

The keys every pflower ClientApp sends are declared here (:data:`TRAIN`, :data:`EVALUATE`,
:data:`IDENTITY`; :data:`RAY_NODE` in a simulation's training and evaluation replies); a
method's own keys beside its declaration (``Method.train_metrics``,
``Method.evaluation_metrics``). The reply validator
(:func:`pflower.strategies.validation.check_metrics`) checks every key of every reply against
them at the boundary: nothing behind it checks again. A key nobody declared (a ClientApp of
one's own that reports more) must be a number or a list of numbers within :data:`MAX_MAGNITUDE`.
In an evaluation reply of ``test-mode='both'``, ``global-<key>`` has ``<key>``'s declaration
(its counts only the absolute bound: the union's size is no client's to declare).

This module imports only the standard library: declarations use it without torch or Flower.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The largest magnitude of any reported number (a loss, an undeclared metric): sums of this
#: times any count stay far from float64's overflow, so no aggregate becomes Infinity.
MAX_MAGNITUDE = 1e15
#: The most items a reported list may have.
MAX_LIST = 100_000
#: The largest sample count any reply may state, whatever it declared before.
MAX_COUNT = 2**40
#: The most clients a federation may say it has (the server keeps state per client).
MAX_CLIENTS = 100_000


@dataclass(frozen=True)
class Number:
    """A finite number in ``[lo, hi]`` (an integer if ``integer``; below the federation's number
    of clients if ``client``); ``requires``: keys that must come with it; ``needed``: every reply
    of its schema must have it (a round's aggregate keeps only the keys all its replies share)."""

    lo: float = -MAX_MAGNITUDE
    hi: float = MAX_MAGNITUDE
    integer: bool = False
    client: bool = False
    requires: tuple[str, ...] = ()
    needed: bool = False


@dataclass(frozen=True)
class Numbers:
    """A list of :class:`Number` ``item``: of a fixed ``length``, of the length of the list under
    another key (a str), or of any length up to :data:`MAX_LIST` (None); ``distinct`` items."""

    item: Number
    length: int | str | None = None
    distinct: bool = False
    requires: tuple[str, ...] = ()


@dataclass(frozen=True)
class Count:
    """A sample count: a positive integer, at most ``max-examples-factor`` times what the client
    declared of its ``of`` split (``train`` or ``test``) at its identity reply, or first reported."""

    of: str
    requires: tuple[str, ...] = ()


Spec = Number | Numbers | Count

UNIT = Number(0.0, 1.0)
LOSS = Number(0.0, MAX_MAGNITUDE)
CLIENT_ID = Number(0, MAX_COUNT, integer=True, client=True)
#: The Ray node that ran the message, in a simulation: the 28 bytes of its node id (Ray's 56 hex
#: digits; a MetricRecord holds numbers only). Outside Ray (a deployment, in process) a reply
#: has no such key.
RAY_NODE = "ray-node"
RAY_NODE_BYTES = 28

TRAIN: dict[str, Spec] = {
    "num-examples": Count("train"),
    "client-id": CLIENT_ID,
    "train-loss": LOSS,
    RAY_NODE: Numbers(Number(0, 255, integer=True), length=RAY_NODE_BYTES),
}
EVALUATE: dict[str, Spec] = {
    "num-examples": Count("test"),
    "client-id": CLIENT_ID,
    RAY_NODE: TRAIN[RAY_NODE],
    "accuracy": Number(0.0, 1.0, needed=True),
    "loss": Number(0.0, MAX_MAGNITUDE, needed=True),
    "top5-accuracy": UNIT,
    "ece": UNIT,
    "mce": UNIT,
}
#: The identity reply (the ``query`` handler): who the client is and what its data is.
IDENTITY: dict[str, Spec] = {
    "client-id": CLIENT_ID,
    "num-clients": Number(1, MAX_CLIENTS, integer=True),
    "num-examples": Number(1, MAX_COUNT, integer=True),
    "test-examples": Number(0, MAX_COUNT, integer=True),
    "classes": Numbers(Number(0, MAX_COUNT, integer=True), distinct=True),
    "label-counts": Numbers(Number(0, MAX_COUNT, integer=True)),
    "evaluates-riding": Number(0, 1, integer=True),
}
