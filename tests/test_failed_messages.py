"""A failed message costs only itself, for every method: the evaluation riding on it is still
counted, and the client's state is the one the server names.

Client 1's round-2 message fails (its state file cannot be written; FedeRiCo: a relay step
raises) or its round-1 evaluation raises. Two-phase and single-message rounds then record the
same rows, and so do a SuperNode (which keeps the context a failed message left), the
simulation engine (which drops it), and, for a failed message, one simulated node serving all
three clients (``simulated-clients``: one message for them, the other two clients' replies kept).
"""

import errno
import importlib
import json

import pytest
from conftest import InProcessGrid, run_config
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from pflower.build import build_strategy
from pflower.client_app.store import SAVED, StateStore
from pflower.config import load_settings
from pflower.methods import declarations

pytestmark = pytest.mark.usefixtures("no_figures")
#: What the schedules legitimately differ in (see test_single_message): bytes and time.
SCHEDULE = {"bytes-down", "bytes-up", "cumulative-bytes-down", "cumulative-bytes-up", "relayed-bytes", "wall-seconds"}
FAULTY, ROUND = 1, 2


def _rows(tmp_path, cfg: dict, single: bool, simulation: bool, grouped: bool = False) -> list[dict]:
    """The run's rows; ``grouped``: on one simulated node that serves the 3 clients."""
    from pflower.client_app.app import app

    results = tmp_path / f"{single}-{simulation}-{grouped}"
    cfg = {**cfg, "single-message": single, "results-dir": str(results), **({"simulated-clients": 3} if grouped else {})}
    build_strategy(load_settings(cfg)).start(grid=InProcessGrid(app, cfg, 1 if grouped else 3, simulation=simulation))
    doc = json.loads((results / "metrics.json").read_text())
    return [{k: v for k, v in r.items() if k not in SCHEDULE} for r in doc["rounds"]]


def _config(method: str) -> dict:
    return {**run_config(samples_per_client=60), **declarations()[method].example, "method": method, "num-server-rounds": 3, "local-epochs": 1}


def _full_disk(monkeypatch):
    """Client 1's state file of round 2 cannot be written (every other write goes through)."""
    real = StateStore.save

    def save(self, lineage, server_round, state, pinned=None):
        if self.client_id == FAULTY and server_round == ROUND:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, lineage, server_round, state, pinned)

    monkeypatch.setattr(StateStore, "save", save)


@pytest.mark.parametrize("method", sorted(declarations()))
def test_a_failed_save_costs_only_its_message_on_either_schedule_and_engine(tmp_path, monkeypatch, method):
    """Round 1's evaluation of client 1 counts although the message it rode on failed; round 2
    misses client 1's update and round 3 trains it from round 1's state: the rows of a two-phase
    run, a single-message run on a SuperNode and one on the simulation engine are the same."""
    _full_disk(monkeypatch)
    cfg = _config(method)
    two = _rows(tmp_path, cfg, single=False, simulation=False)
    assert two[0]["evaluated"] == 3 and str(FAULTY) in two[0]["per-client-accuracy"]
    assert _rows(tmp_path, cfg, single=True, simulation=False) == two
    assert _rows(tmp_path, cfg, single=True, simulation=True) == two
    assert _rows(tmp_path, cfg, single=True, simulation=True, grouped=True) == two


@pytest.mark.parametrize("method", sorted(declarations()))
def test_a_failed_evaluation_counts_alike_on_either_schedule(tmp_path, monkeypatch, method):
    """Client 1's evaluation of round 1 raises: a client error in round 1's row on both schedules,
    and every row the same."""
    runtime_class = importlib.import_module("pflower.client_app.app").Runtime
    real = runtime_class.evaluation

    def fails(self, context, config, arrays):
        if self.client_id == FAULTY and int(config["server-round"]) == 1:
            raise RuntimeError("out of memory in evaluation")
        return real(self, context, config, arrays)

    monkeypatch.setattr(runtime_class, "evaluation", fails)
    cfg = _config(method)
    two = _rows(tmp_path, cfg, single=False, simulation=False)
    assert two[0]["rejected"] == {"client-error": 1} and two[0]["evaluated"] == 2
    assert _rows(tmp_path, cfg, single=True, simulation=False) == two


@pytest.mark.parametrize("step", ["plan", "serve", "use", "update"])
def test_a_failed_relay_step_costs_only_its_round_on_either_engine(tmp_path, monkeypatch, step):
    """A FedeRiCo client whose relay step of round 2 raises: a SuperNode and the simulation engine
    go on from the same state (the step's changes are not kept), on either schedule."""
    _failing_relay_step(monkeypatch, step, FAULTY)
    cfg = _config("federico")
    two = _rows(tmp_path, cfg, single=False, simulation=True)
    assert two[0]["evaluated"] == 3
    assert _rows(tmp_path, cfg, single=False, simulation=False) == two
    assert _rows(tmp_path, cfg, single=True, simulation=False) == two
    assert _rows(tmp_path, cfg, single=True, simulation=True, grouped=True) == two


def test_a_message_whose_save_fails_leaves_the_context_as_it_found_it(tmp_path, monkeypatch):
    """The client's context after a training message whose state file cannot be written holds
    exactly what it held before (the pointer to round 1's file), not the unsaved model."""
    from pflower.client_app.app import app

    _full_disk(monkeypatch)
    cfg = {**_config("fedavg"), "results-dir": str(tmp_path)}
    grid = InProcessGrid(app, cfg, 3)
    build_strategy(load_settings({**cfg, "num-server-rounds": 1})).start(grid=grid)
    context: Context = grid.contexts[100 + FAULTY]
    before = {name: dict(record) for name, record in context.state.items()}
    assert before == {SAVED: {"lineage": before[SAVED]["lineage"], "round": 1}}
    sent = next(m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN and m.metadata.dst_node_id == 100 + FAULTY)
    config = ConfigRecord({**sent.content["config"], "server-round": ROUND, "state-round": 1})
    msg = Message(RecordDict({"arrays": sent.content["arrays"], "config": config}), dst_node_id=100 + FAULTY, message_type=MessageType.TRAIN)
    with pytest.raises(Exception, match="No space left"):
        app(msg, context)
    assert {name: dict(record) for name, record in context.state.items()} == before


def _failing_relay_step(monkeypatch, step: str, client: int) -> None:
    """FedeRiCo's relay ``step`` of round 2 raises on ``client``."""
    federico = importlib.import_module("pflower.client_app.federico")
    method_class = next(c for c in vars(federico).values() if isinstance(c, type) and getattr(c, "LAST_STEP", "") == "update")
    real = method_class.relay_step

    def fails(self, phase, model, data, incoming, state, client_id, num_clients, server_round):
        if client_id == client and server_round == ROUND and phase == step:
            raise RuntimeError(f"the {phase} step failed")
        return real(self, phase, model, data, incoming, state, client_id, num_clients, server_round)

    monkeypatch.setattr(method_class, "relay_step", fails)


@pytest.mark.parametrize("step", ["plan", "serve", "use"])
def test_a_lost_relayed_reply_costs_only_its_round(grid_factory, tmp_path, monkeypatch, step):
    """Client 2's reply to a relay step of round 2 is lost on the way (the client did the step):
    its partners' updates of its model are not refused (they were 'malformed' before), and in
    round 3 it starts from round 1's state, as the server names, not from the half-done round:
    the rows equal those of the run where that step raised on the client instead (two-phase: a
    lost message loses the evaluation riding on it, a failed one does not)."""
    from flwr.app import Error
    from flwr.common.constant import ErrorCode

    cfg, faulty = {**_config("federico"), "single-message": False}, FAULTY + 1

    def lose(cid, reply):
        sent = grid.sent[-1].content.config_records.get("config")
        if sent is not None and not reply.has_error() and sent.get("phase") == step and cid == faulty and int(sent["server-round"]) == ROUND:
            return Message(Error(code=ErrorCode.REPLY_MESSAGE_UNAVAILABLE, reason="lost"), reply_to=grid.sent[-1])
        return reply

    grid = grid_factory({**cfg, "results-dir": str(tmp_path / "lost")}, 5, tamper=lose)
    build_strategy(load_settings({**cfg, "results-dir": str(tmp_path / "lost")})).start(grid=grid)
    lost = json.loads((tmp_path / "lost" / "metrics.json").read_text())["rounds"]
    _failing_relay_step(monkeypatch, step, faulty)
    grid = grid_factory({**cfg, "results-dir": str(tmp_path / "failed")}, 5)
    build_strategy(load_settings({**cfg, "results-dir": str(tmp_path / "failed")})).start(grid=grid)
    failed = json.loads((tmp_path / "failed" / "metrics.json").read_text())["rounds"]
    assert all(r["rejected"] == {} for r in lost)
    strip = lambda doc: [{k: v for k, v in r.items() if k not in SCHEDULE | {"rejected", "missing"}} for r in doc]  # noqa: E731
    assert strip(lost) == strip(failed)


def test_a_failed_message_that_changed_a_record_in_place_leaves_it_as_it_was():
    """A handler that updates a config record of the state in place (FedeRiCo's tables) and then
    fails: the record is as the message found it, not half changed."""
    client_app = importlib.import_module("pflower.client_app.app")
    context = Context(1, 5, {}, RecordDict({"tables": ConfigRecord({"neighbours": [1, 2]})}), {})
    msg = Message(RecordDict(), dst_node_id=5, message_type=MessageType.TRAIN)

    def handler(message, ctx):
        ctx.state["tables"]["neighbours"] = [3]
        raise RuntimeError("the step failed")

    with pytest.raises(RuntimeError, match="the step failed"):
        client_app._commit_on_success(msg, context, handler)
    assert list(context.state["tables"]["neighbours"]) == [1, 2]
