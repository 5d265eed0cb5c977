"""A ClientApp for fault tests: pflower's own, except that one client misbehaves in training.

Tests copy this file into a temporary Flower app (see ``conftest.faulty_app``) with ``FAULT``
set. The faulty client is the one whose node config has ``fault`` (deployment), or partition
``FAULTY_PARTITION`` (simulation, where node configs are fixed).

A deployment test can also hold a node at a round (node config ``gate-round`` and ``gate``,
:func:`_wait_at_gate`), to wait for the state it asserts instead of for a lucky schedule.
"""

import time
from pathlib import Path

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from pflower.client_app.app import app as pflower_app
from pflower.records import from_record, to_record

FAULT = "nan"  # nan | drop | wrong-shape | hang (from round 3 on, until results-dir/release exists)
FAULTY_PARTITION = 0
#: Seconds a gated training waits for its gate before it fails (a bound for a broken test, never reached in a passing one).
GATE_TIMEOUT = 600.0

app = ClientApp()


def _fault(context: Context) -> str:
    if "fault" in context.node_config:
        return str(context.node_config["fault"])
    return FAULT if int(context.node_config["partition-id"]) == FAULTY_PARTITION else ""


@app.query()
def query(msg: Message, context: Context) -> Message:
    return pflower_app(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return pflower_app(msg, context)


def _wait_at_gate(msg: Message, context: Context) -> None:
    """Round ``gate-round``'s training (node config) says it has the message (it writes
    ``<gate>.reached``) and then waits until the test writes the file ``gate``: a node the test
    kills there cannot have answered, and a round held there cannot end before what the test
    waits for (a restarted node back online) has happened."""
    if "gate" not in context.node_config or int(msg.content.config_records["config"]["server-round"]) != int(context.node_config["gate-round"]):
        return
    gate = Path(str(context.node_config["gate"]))
    gate.with_name(gate.name + ".reached").touch()
    deadline = time.monotonic() + GATE_TIMEOUT
    while not gate.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gate {gate} was not opened within {GATE_TIMEOUT:g} s")
        time.sleep(0.1)


@app.train()
def train(msg: Message, context: Context) -> Message:
    _wait_at_gate(msg, context)
    fault = _fault(context)
    if fault == "hang" and int(msg.content["config"]["server-round"]) >= 3:
        release, deadline = Path(str(context.run_config["results-dir"])) / "release", time.monotonic() + 300
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        raise RuntimeError("released: this run was meant to be killed by now")
    reply = pflower_app(msg, context)
    if fault == "drop":
        raise RuntimeError("this client drops its update")
    if fault in ("nan", "wrong-shape"):
        arrays = from_record(reply.content["arrays"])
        for k, v in arrays.items():
            arrays[k] = torch.full_like(v, float("nan")) if fault == "nan" else v.reshape(-1)[:-1].clone()
        reply.content["arrays"] = to_record(arrays)
    return reply
