"""Every method, every schedule: a ServerApp that dies in any round and resumes, or a SuperNode
that restarts between any two rounds with an evaluation held back, ends with the metrics.json of
the uninterrupted run, every round and every client.

In process (the fast layer): the real strategies and the real ClientApp on 3 clients of digits,
2 of them training each round, so that the third gets its evaluation alone; two schedules
(evaluation every round, and every 2nd round by 2 of the 3 clients). A crash is a new
federation: fresh client contexts and the ClientApp's per-process caches dropped, as a new
process has them; a restarted SuperNode is a new node id with a fresh context.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import InProcessGrid, representatives, run_config

from pflower.build import build_strategy
from pflower.checkpoint import load_checkpoint
from pflower.client_app.store import SAVED
from pflower.config import load_settings
from pflower.methods import declarations
from pflower.state_round import MissingStateError
from pflower.strategies import loop
from pflower.strategies.federation import Federation

#: The ClientApp's module (the package exports the ClientApp under the same name).
client_app = importlib.import_module("pflower.client_app.app")
pytestmark = pytest.mark.usefixtures("no_figures")
CLIENTS = 3
#: Samples per client: enough for every method's splits (held-out shares included), few enough
#: that the sweep's ~300 rounds take a minute or two.
SAMPLES = 60
SCHEDULES = {
    "evaluate-every-1": {"num-server-rounds": 4, "evaluate-every": 1, "fraction-train": 0.67},
    "evaluate-every-2": {"num-server-rounds": 5, "evaluate-every": 2, "fraction-train": 0.67, "fraction-evaluate": 0.67},
}
#: Simulated nodes of the grouped runs (``simulated-clients``): one serves clients 0 and 2, the other 1.
GROUPED_NODES = 2
#: Simulated nodes in each leg of a crashed run: one client a node, and the clients grouped on
#: nodes with a grouping that changes at every resume (2 nodes, 1, one client a node, 2, ...): the same numbers.
NODES = {"one-client-a-node": [CLIENTS], "regrouped": [GROUPED_NODES, 1, CLIENTS]}
#: The time per round differs between any two runs.
TIME = {"wall-seconds"}


class Crash(Exception):
    """The ServerApp process died."""


_FULL: dict[tuple[str, str], tuple[dict, Path]] = {}
_SENT: dict[tuple[str, str], int] = {}  # the messages the uninterrupted run sent


def _uninterrupted(tmp_path_factory, method: str, schedule: str) -> dict:
    """The run without faults (once per process for each method and schedule)."""
    return _full_run(tmp_path_factory, method, schedule)[0]


def _full_run(tmp_path_factory, method: str, schedule: str) -> tuple[dict, Path]:
    """The run without faults: its metrics.json and its results-dir (never to be changed)."""
    if (method, schedule) not in _FULL:
        results = tmp_path_factory.mktemp("full")
        cfg = _config(method, schedule, results)
        grid = InProcessGrid(client_app.app, cfg, CLIENTS)
        _FULL[method, schedule] = (_run(cfg, grid), results)
        _SENT[method, schedule] = len(grid.sent)
    return _FULL[method, schedule]


def _config(method: str, schedule: str, results, **more) -> dict:
    cfg = {**run_config(local_epochs=1, samples_per_client=SAMPLES), **declarations()[method].example, "method": method, **SCHEDULES[schedule], **more}
    return {**cfg, "results-dir": str(results)}


def _new_process() -> None:
    """Drop what a ClientApp process caches (models, method objects, runtimes): a new process."""
    client_app._shared.cache_clear()
    client_app._runtime.cache_clear()
    client_app._store.cache_clear()


def _grouped(cfg: dict, nodes: int) -> dict:
    """``cfg`` on ``nodes`` simulated nodes (those serve the 3 clients between them)."""
    return {**cfg, "simulated-clients": CLIENTS} if nodes != CLIENTS else cfg


def _run(cfg: dict, grid: InProcessGrid | None = None) -> dict:
    """The run of ``cfg`` (on ``grid``; by default one node per client, or 2 nodes serving the 3
    clients where ``cfg`` has ``simulated-clients``): its metrics.json."""
    settings = load_settings(cfg)
    checkpoint = load_checkpoint(settings) if settings.resume_from else None
    grid = grid or InProcessGrid(client_app.app, cfg, GROUPED_NODES if settings.simulated_clients else CLIENTS)
    build_strategy(settings).start(grid=grid, checkpoint=checkpoint)
    for context in grid.contexts.values():  # between messages a context holds only where its saved state is (each client's)
        assert {key.rpartition("/")[2] for key in context.state.keys()} <= {SAVED}, dict(context.state)
    return json.loads((settings.results_path / "metrics.json").read_text())


def _rows(doc: dict) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIME} for r in doc["rounds"]]


def _crash_in(monkeypatch, rnd: int) -> None:
    """The ServerApp dies in round ``rnd``: in an odd round after its first phase came back (the
    sampled clients trained, or planned, and went on), in an even one just before its checkpoint
    (every client of the round saved its state for it)."""
    if rnd % 2:
        real = Federation.phase

        def phase(self, grid, messages, timeout):
            out = real(self, grid, messages, timeout)
            if any(m.metadata.message_type != "evaluate" and int(m.content["config"]["server-round"]) == rnd for m in messages):
                raise Crash(f"after round {rnd}'s first phase")
            return out

        monkeypatch.setattr(Federation, "phase", phase)
    else:
        real = loop.save_checkpoint

        def save(directory, ckpt):
            if ckpt.round == rnd:
                raise Crash(f"before round {rnd}'s checkpoint")
            return real(directory, ckpt)

        monkeypatch.setattr(loop, "save_checkpoint", save)


#: Each method's tests on one xdist worker, which runs its uninterrupted runs once.
METHODS = [pytest.param(m, marks=pytest.mark.xdist_group(f"sweep-{m}")) for m in sorted(declarations())]


def _crash_runs() -> list:
    """Every method and schedule with one client a node; regrouped, one method per server
    strategy on both schedules (the suite's time: the grouping sits below the strategies, and
    every method's grouped run equals its run of one client a node in
    test_clients_grouped_on_nodes_give_the_numbers_of_one_client_a_node)."""
    return [pytest.param(m, schedule, nodes, marks=pytest.mark.xdist_group(f"sweep-{m}"), id=f"{m}-{schedule}-{nodes}")
            for m in sorted(declarations()) for schedule in sorted(SCHEDULES) for nodes in sorted(NODES)
            if nodes != "regrouped" or m in representatives()]  # fmt: skip


@pytest.mark.parametrize(("method", "schedule", "nodes"), _crash_runs())
def test_a_crash_in_every_round_resumes_to_the_uninterrupted_run(tmp_path, tmp_path_factory, monkeypatch, method, schedule, nodes):
    """One lineage crashed in every round r = 2..R, each leg resumed from the last: the final
    metrics.json equals the uninterrupted run's byte for byte (bytes sent included), time aside;
    and so with the 3 clients grouped on simulated nodes, the grouping changed at every resume (2
    nodes, one message for clients 0 and 2; one node for all; one client a node), against the
    uninterrupted run with one client a node."""
    full = _uninterrupted(tmp_path_factory, method, schedule)
    rounds = SCHEDULES[schedule]["num-server-rounds"]
    resume = ""
    for leg, rnd in enumerate(range(2, rounds + 2)):
        _new_process()
        cfg = _config(method, schedule, tmp_path / f"leg{leg}", **({"resume-from": resume} if resume else {}))
        count = NODES[nodes][leg % len(NODES[nodes])]
        cfg = _grouped(cfg, count)
        grid = InProcessGrid(client_app.app, cfg, count)
        if rnd <= rounds:
            with monkeypatch.context() as m:
                _crash_in(m, rnd)
                with pytest.raises(Crash):
                    _run(cfg, grid)
        else:
            doc = _run(cfg, grid)
        resume = str(tmp_path / f"leg{leg}")
    assert _rows(doc) == _rows(full)
    assert doc["final"] == full["final"]
    assert all(not r["rejected"] for r in doc["rounds"]), [r["rejected"] for r in doc["rounds"]]


def _states(results: Path) -> dict[str, bytes]:
    """Every saved client state of a run, by client and round."""
    return {f"{p.parent.name}/{p.name}": p.read_bytes() for p in sorted(results.rglob("*.state"))}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("method", METHODS)
def test_clients_grouped_on_nodes_give_the_numbers_of_one_client_a_node(tmp_path, tmp_path_factory, method, schedule):
    """The 3 clients on 2 simulated nodes (``simulated-clients``): the rows, the final metrics
    and every saved state file byte for byte as with one client a node, in fewer messages."""
    full, results = _full_run(tmp_path_factory, method, schedule)
    _new_process()
    cfg = _grouped(_config(method, schedule, tmp_path / "grouped"), GROUPED_NODES)
    grid = InProcessGrid(client_app.app, cfg, GROUPED_NODES)
    doc = _run(cfg, grid)
    assert _rows(doc) == _rows(full) and doc["final"] == full["final"]
    assert _states(tmp_path / "grouped") == _states(results)
    assert len(grid.sent) < _SENT[method, schedule]


def _resumed_without(tmp_path, tmp_path_factory, method: str, schedule: str, remove) -> tuple[int, int, Path]:
    """A copy of the uninterrupted run, one more round asked of it: ``remove(states, trained)``
    deletes saved state files of the copy (``states``: the copy's lineage folder, ``trained``:
    the checkpoint's round each client last trained in) and returns the client and the round
    it needs. Every client gets a message in the added round (the last round's evaluation)."""
    _, results = _full_run(tmp_path_factory, method, schedule)
    was = tmp_path / "was"
    shutil.copytree(results, was)
    more = SCHEDULES[schedule]["num-server-rounds"] + 1  # the run finished: only more rounds resume it
    ckpt = load_checkpoint(load_settings({**_config(method, schedule, tmp_path / "resumed"), "resume-from": str(was), "num-server-rounds": more}))
    client, needed = remove(was / "client-state" / ckpt.lineage, ckpt.strategy["trained-in"])
    _new_process()
    return client, needed, tmp_path / "resumed"


def _stops(method: str, schedule: str, resumed: Path, client: int, needed: int, was: Path) -> None:
    """Resuming stops before the added round writes any row, naming the client, round and folder."""
    rounds = SCHEDULES[schedule]["num-server-rounds"]
    cfg = _config(method, schedule, resumed, **{"resume-from": str(was), "num-server-rounds": rounds + 1})
    with pytest.raises(MissingStateError, match=rf"^client {client} has no saved state of round {needed} \(lineage") as err:
        _run(cfg)
    assert str(was / "client-state") in str(err.value) and "state-dir on a shared filesystem" in str(err.value)
    written = resumed / "metrics.json"
    assert not written.is_file() or max(r["round"] for r in json.loads(written.read_text())["rounds"]) <= rounds


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("method", METHODS)
def test_a_resume_without_a_clients_saved_states_stops_naming_it(tmp_path, tmp_path_factory, method, schedule):
    """The client that trained last has no saved state at all where the resumed run looks (a
    run moved to another node, a wiped state-dir): the run stops with its line instead of going
    on with that client reset to its initial state."""

    def remove(states: Path, trained: dict) -> tuple[int, int]:
        client = max(trained, key=lambda c: (trained[c], c))
        shutil.rmtree(states / f"client-{client}")
        return client, trained[client]

    client, needed, resumed = _resumed_without(tmp_path, tmp_path_factory, method, schedule, remove)
    _stops(method, schedule, resumed, client, needed, tmp_path / "was")


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("method", METHODS)
def test_a_resume_with_only_an_older_saved_state_stops_naming_it(tmp_path, tmp_path_factory, method, schedule):
    """A client's newest saved state is gone but an older one is there: the run stops rather
    than let the client go on from the older state."""

    def remove(states: Path, trained: dict) -> tuple[int, int]:
        kept = {c: sorted((states / f"client-{c}").glob("round-*.state")) for c in trained}
        client = next(c for c in sorted(trained) if len(kept[c]) > 1)
        assert kept[client][-1].name == f"round-{trained[client]:06d}.state"
        kept[client][-1].unlink()
        return client, trained[client]

    client, needed, resumed = _resumed_without(tmp_path, tmp_path_factory, method, schedule, remove)
    _stops(method, schedule, resumed, client, needed, tmp_path / "was")


class RestartingGrid(InProcessGrid):
    """A grid whose SuperNodes restart when asked: the old node id is gone for good, the node
    comes back under a new one with a fresh context (its state on disk is kept)."""

    def restart(self, client: int) -> None:
        from flwr.app import Context, RecordDict

        old = next(n for n, c in self.contexts.items() if c.node_config["partition-id"] == client and n not in self.offline)
        self.offline.add(old)
        context = self.contexts[old]
        new = max(self.contexts) + 1
        self.contexts[new] = Context(1, new, dict(context.node_config), RecordDict(), dict(context.run_config))


def _restarting(monkeypatch, grid: RestartingGrid, during: bool) -> None:
    """After every round that holds its evaluation back, the SuperNode of one client (0, 1, 2, 0,
    ...) restarts: between the rounds (``during`` False), or after the next round found its
    clients, as its first phase is about to send (the messages for the old node id are lost)."""
    real_evaluate, real_phase = loop.PflStrategy.evaluate_phase, Federation.phase
    pending: list[int] = []

    def evaluate_phase(self, grid_, rnd, config, result):
        phase = real_evaluate(self, grid_, rnd, config, result)
        if self.evaluates(rnd) and rnd < self.num_rounds:  # held back for the next round
            (pending.append if during else grid.restart)((rnd - 1) % CLIENTS)
        return phase

    def phase(self, grid_, messages, timeout):
        while pending:
            grid.restart(pending.pop())
        return real_phase(self, grid_, messages, timeout)

    monkeypatch.setattr(loop.PflStrategy, "evaluate_phase", evaluate_phase)
    monkeypatch.setattr(Federation, "phase", phase)


@pytest.mark.parametrize("method", METHODS)
def test_a_supernode_restarting_with_an_evaluation_held_back_changes_nothing(tmp_path, tmp_path_factory, monkeypatch, method):
    """Between every two rounds a SuperNode restarts while the evaluation of the round before is
    held back for it: each time the client comes back under its client id, gets that evaluation
    and evaluates the state it names, restored from disk. The run completes with the metrics of
    the run without restarts."""
    full = _uninterrupted(tmp_path_factory, method, "evaluate-every-1")
    cfg = _config(method, "evaluate-every-1", tmp_path / "restarts")
    grid = RestartingGrid(client_app.app, cfg, CLIENTS)
    _restarting(monkeypatch, grid, during=False)
    doc = _run(cfg, grid)
    assert _rows(doc) == _rows(full)
    assert len(grid.offline) == SCHEDULES["evaluate-every-1"]["num-server-rounds"] - 1


@pytest.mark.parametrize("method", [m for m in METHODS if m.values[0] in representatives()])
def test_a_supernode_restarting_as_the_round_sends_loses_only_what_it_was_sent(tmp_path, monkeypatch, method):
    """The SuperNode restarts after the next round found its clients: the message to its old node
    id (that round's training with the held evaluation on it, or the evaluation alone) is lost.
    One method per server strategy (the message paths differ by strategy, not by client).
    The run completes; the evaluation's round says the client is missing and evaluated without
    it, the next round says it missed that round, and the client is back for the last."""
    cfg = _config(method, "evaluate-every-1", tmp_path / "restarts")
    grid = RestartingGrid(client_app.app, cfg, CLIENTS)
    _restarting(monkeypatch, grid, during=True)
    doc = _run(cfg, grid)
    rows = doc["rounds"]
    for rnd in (1, 2, 3):
        client = (rnd - 1) % CLIENTS
        assert client in rows[rnd - 1]["missing"] and rows[rnd - 1]["evaluated"] == CLIENTS - 1, rows[rnd - 1]
        assert str(client) not in rows[rnd - 1]["per-client-accuracy"]
        assert client in rows[rnd]["missing"], rows[rnd]
    assert rows[-1]["evaluated"] == CLIENTS and sorted(doc["final"]["per-client-accuracy"]) == ["0", "1", "2"]
