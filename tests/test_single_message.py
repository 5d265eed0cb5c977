"""The single-message round: round t's evaluation rides on round t+1's message, with the same metrics."""

import json
from collections import Counter

import numpy as np
import pytest
from conftest import run_config
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from pflower import single_message
from pflower.build import build_strategy
from pflower.checkpoint import load_checkpoint
from pflower.config import load_settings
from pflower.methods import declarations

#: Samples per client in the sweeps below, which compare schedules (equality, not learning): the
#: resume sweep's size, enough for every method's splits.
SAMPLES = 60
#: Every run here is compared by its metrics; none draws figures (two thirds of a short run's time).
pytestmark = pytest.mark.usefixtures("no_figures")
#: What legitimately differs between the two schedules: the bytes (an evaluation's arrays that
#: equal the training arrays travel once) and the time.
SCHEDULE = {"bytes-down", "bytes-up", "cumulative-bytes-down", "cumulative-bytes-up", "relayed-bytes", "wall-seconds"}


def _run(grid_factory, results, cfg, clients=3, grid=None):
    cfg = {**cfg, "results-dir": str(results)}
    settings = load_settings(cfg)
    grid = grid or grid_factory(cfg, clients)
    build_strategy(settings).start(grid=grid, checkpoint=load_checkpoint(settings) if settings.resume_from else None)
    return json.loads((results / "metrics.json").read_text()), grid


def _metrics(doc):
    return [{k: v for k, v in r.items() if k not in SCHEDULE} for r in doc["rounds"]], doc["final"]["per-client-accuracy"]


def _both(grid_factory, tmp_path, cfg, clients=3):
    """The run with and without single-message: (two-phase doc, grid), (single-message doc, grid)."""
    return [_run(grid_factory, tmp_path / str(flag), {**cfg, "single-message": flag}, clients) for flag in (False, True)]


def _per_node(grid, round_of=lambda m: int(m.content["config"]["server-round"])):
    """Messages each node got, by round."""
    return Counter((m.metadata.dst_node_id, round_of(m)) for m in grid.sent if m.metadata.message_type != MessageType.QUERY)


@pytest.mark.parametrize("method", sorted(declarations()))
def test_every_method_has_the_same_metrics_with_one_message_per_round(grid_factory, tmp_path, method):
    """Each method's declared example, 3 rounds: every row's evaluation, training and method
    entries (SuPerFed's lambda curve, FedeRiCo's weights, pFedLA's alpha) are identical."""
    cfg = {**run_config(samples_per_client=SAMPLES), **declarations()[method].example, "method": method, "num-server-rounds": 3, "local-epochs": 1}
    (two, _), (one, grid) = _both(grid_factory, tmp_path, cfg)
    assert _metrics(one) == _metrics(two)
    assert all(r["evaluated"] == 3 and r["accuracy"] is not None for r in one["rounds"])
    first_phase = MessageType.TRAIN if method != "federico" else "train.relay"
    carried = [m for m in grid.sent if single_message.EVALUATE in m.content.config_records]
    assert len(carried) == 3 * 2 and {m.metadata.message_type for m in carried} == {first_phase}  # rounds 1 and 2 rode
    assert sum(m.metadata.message_type == MessageType.EVALUATE for m in grid.sent) == 3  # the last round's, alone


@pytest.mark.parametrize("method", ["fedavg", "pfedla", "superfed"])
def test_sampled_subsets_and_sparse_evaluation_have_the_same_metrics(grid_factory, tmp_path, method):
    """Training and evaluation samples that differ (evaluation-only messages for clients not
    training next round) and evaluation every 2 rounds: the same metrics, and no client gets
    more than one message in any round but the last."""
    cfg = run_config(
        method=method, num_server_rounds=5, local_epochs=1, fraction_train=0.5, fraction_evaluate=0.5, evaluate_every=2, samples_per_client=SAMPLES
    )
    (two, _), (one, grid) = _both(grid_factory, tmp_path, cfg, clients=4)
    assert _metrics(one) == _metrics(two)
    assert [r["evaluated"] for r in one["rounds"]] == [0, 2, 0, 2, 4]
    sent = Counter(m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type != MessageType.QUERY and m.content["config"]["server-round"] < 5)
    trained = Counter(m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == MessageType.TRAIN)
    alone = [m for m in grid.sent if m.metadata.message_type == MessageType.EVALUATE and m.content["config"]["server-round"] < 5]
    assert alone, "the samples were meant to differ"
    assert sum(sent.values()) == sum(trained.values()) - 2 + len(alone)  # round 5's training messages left out above
    by_round = Counter()
    for m in grid.sent:
        if m.metadata.message_type != MessageType.QUERY:
            sent_in = int(m.content["config"]["server-round"]) + (m.metadata.message_type == MessageType.EVALUATE)
            by_round[(m.metadata.dst_node_id, sent_in)] += 1
    assert max(n for (_, r), n in by_round.items() if r <= 5) == 1


def test_one_message_per_client_per_round_and_the_global_model_sent_once(grid_factory, tmp_path):
    (two, grid2), (one, grid1) = _both(grid_factory, tmp_path, run_config(method="fedavg", num_server_rounds=3, local_epochs=1))
    assert sorted(Counter(m.metadata.dst_node_id for m in grid1.sent if m.metadata.message_type != MessageType.QUERY).values()) == [4, 4, 4]
    assert sorted(Counter(m.metadata.dst_node_id for m in grid2.sent if m.metadata.message_type != MessageType.QUERY).values()) == [6, 6, 6]
    down1, down2 = [r["bytes-down"] for r in one["rounds"]], [r["bytes-down"] for r in two["rounds"]]
    assert down1[0] == down1[1] == down2[0] // 2 and down1[2] == down2[2]  # FedAvg's evaluation arrays are its next training arrays
    assert one["final"]["bytes-up"] == two["final"]["bytes-up"]


def test_a_crash_with_an_evaluation_pending_resumes_exactly(grid_factory, tmp_path, monkeypatch):
    """The checkpoint after round 2 holds round 2's evaluation as pending; the resumed run sends
    it with round 3, and the whole metrics.json (bytes too) equals the uninterrupted run's."""
    from pflower.strategies.loop import TrainRounds

    cfg = run_config(method="pfedla", num_server_rounds=4, local_epochs=1, fraction_train=0.67)
    full, _ = _run(grid_factory, tmp_path / "full", cfg)
    real = TrainRounds.run_round

    def crash_in_round_3(self, grid, rnd, *args):
        if rnd == 3:
            raise RuntimeError("the ServerApp died")
        return real(self, grid, rnd, *args)

    monkeypatch.setattr(TrainRounds, "run_round", crash_in_round_3)
    with pytest.raises(RuntimeError, match="died"):
        _run(grid_factory, tmp_path / "first", cfg)
    monkeypatch.setattr(TrainRounds, "run_round", real)
    crashed = json.loads((tmp_path / "first" / "metrics.json").read_text())
    assert [r["evaluated"] for r in crashed["rounds"]] == [3, 0]  # round 2's evaluation was riding
    resumed, _ = _run(grid_factory, tmp_path / "second", {**cfg, "resume-from": str(tmp_path / "first")})
    strip = lambda doc: [{k: v for k, v in r.items() if k != "wall-seconds"} for r in doc["rounds"]]  # noqa: E731
    assert strip(resumed) == strip(full)


def test_a_quickstart_clientapp_gets_its_evaluation_alone(tmp_path):
    """A ClientApp that does not say it evaluates riding evaluations (no identity handler) gets
    plain evaluation messages, in the same phase as its next training message."""
    from conftest import InProcessGrid
    from test_quickstart import _initial, client

    from pflower.strategies import FedAvg

    grid = InProcessGrid(client.app, {}, 2)
    result = FedAvg().start(grid, _initial(), num_rounds=2)
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
    assert not any(single_message.EVALUATE in m.content.config_records for m in grid.sent)
    assert Counter(m.metadata.message_type for m in grid.sent) == {MessageType.QUERY: 2, MessageType.TRAIN: 4, MessageType.EVALUATE: 4}


def _message(arrays: ArrayRecord, kind=MessageType.TRAIN, rnd=2) -> Message:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    return Message(RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": rnd})}), dst_node_id=5, message_type=kind)


def _arrays(value: float) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.full((2, 3), value, dtype=np.float32))})


@pytest.mark.parametrize("same", [True, False])
def test_attach_sends_equal_arrays_once_and_detach_restores_the_evaluation(same):
    host, evaluation = _message(_arrays(1.0)), _message(_arrays(1.0 if same else 2.0), MessageType.EVALUATE, rnd=1)
    single_message.attach(host, evaluation)
    assert (single_message.EVALUATE_ARRAYS in host.content.array_records) is not same
    riding = single_message.detach(host)
    assert dict(riding.config) == {"server-round": 1}
    assert riding.arrays["w"].numpy().tolist() == evaluation.content["arrays"]["w"].numpy().tolist()
    assert set(host.content.keys()) == {"arrays", "config"} and single_message.detach(host) is None


def test_split_gives_the_training_reply_and_the_evaluation_reply():
    msg = _message(_arrays(0.0))
    reply = Message(RecordDict({"metrics": MetricRecord({"num-examples": 3}), single_message.EVALUATION: MetricRecord({"accuracy": 0.5})}), reply_to=msg)
    own, ev = single_message.split(reply)
    assert list(own.content.metric_records) == ["metrics"] and dict(ev.content["metrics"]) == {"accuracy": 0.5}
    assert ev.metadata.reply_to_message_id == own.metadata.reply_to_message_id


def test_same_arrays_compares_keys_dtypes_shapes_and_bytes():
    assert single_message.same_arrays(_arrays(1.0), _arrays(1.0))
    assert not single_message.same_arrays(_arrays(1.0), _arrays(1.5))
    assert not single_message.same_arrays(_arrays(1.0), ArrayRecord({"v": Array(np.full((2, 3), 1.0, dtype=np.float32))}))
    assert not single_message.same_arrays(_arrays(1.0), ArrayRecord({"w": Array(np.full((3, 2), 1.0, dtype=np.float32))}))


def test_a_round_that_sends_nothing_still_gets_the_evaluation_back(grid_factory, tmp_path, monkeypatch):
    """A strategy whose round sends no message (here: Local's round skipped) leaves nothing to
    ride on: the held-back evaluation goes alone and the metrics are still complete."""
    from pflower.strategies.local import Local

    real = Local.run_round

    def quiet_round_2(self, grid, rnd, *args):
        if rnd == 2:
            return {"train-loss": None, "bytes-down": 0, "bytes-up": 0, "sampled": 0, "missing": []}
        return real(self, grid, rnd, *args)

    monkeypatch.setattr(Local, "run_round", quiet_round_2)
    doc, grid = _run(grid_factory, tmp_path, run_config(method="local", num_server_rounds=3, local_epochs=1))
    assert [r["evaluated"] for r in doc["rounds"]] == [3, 3, 3]
    assert [m.content["config"]["server-round"] for m in grid.sent if m.metadata.message_type == MessageType.EVALUATE] == [1, 1, 1, 3, 3, 3]


@pytest.mark.parametrize("method", ["fedavg", "fedper", "federico"])
def test_a_riding_evaluation_that_fails_keeps_the_training_and_counts_in_its_own_round(grid_factory, tmp_path, monkeypatch, method):
    """Client 1's evaluation of round 1 raises on the message of round 2 it rides on: that
    message's training (or FedeRiCo's plan) still counts in round 2, and the evaluation's error
    is counted in round 1's row, where it is missing from the accuracies; the other rounds as
    without the failure."""
    import importlib

    runtime_class = importlib.import_module("pflower.client_app.app").Runtime
    real = runtime_class.evaluation

    def fails_once(self, context, config, arrays):
        if self.client_id == 1 and int(config["server-round"]) == 1:
            raise RuntimeError("out of memory in evaluation")
        return real(self, context, config, arrays)

    cfg = {**run_config(method=method, num_server_rounds=3, local_epochs=1, samples_per_client=SAMPLES), **declarations()[method].example}
    clean, _ = _run(grid_factory, tmp_path / "clean", cfg)
    monkeypatch.setattr(runtime_class, "evaluation", fails_once)
    doc, grid = _run(grid_factory, tmp_path / "failing", cfg)
    rows, want = doc["rounds"], clean["rounds"]
    assert rows[0]["rejected"] == {"client-error": 1} and rows[0]["evaluated"] == 2 and "1" not in rows[0]["per-client-accuracy"]
    assert [r["rejected"] for r in rows[1:]] == [{}, {}]
    assert _metrics(doc)[0][1:] == _metrics(clean)[0][1:]  # round 2's training had client 1's reply: the same run from there
    assert rows[0]["train-loss"] == want[0]["train-loss"] and rows[1]["sampled"] == want[1]["sampled"]


@pytest.mark.parametrize(
    "kind, unpacks", [(MessageType.TRAIN, True), (f"{MessageType.TRAIN}.relay", True), (MessageType.QUERY, False), (MessageType.EVALUATE, False)]
)
def test_only_a_message_that_trains_takes_its_saved_state_into_the_context_for_its_riding_evaluation(monkeypatch, kind, unpacks):
    """A message that trains reads the saved state the context points to once, into the context,
    for its riding evaluation and its training; any other message leaves the context holding
    only the pointer (its handler never saves, so a full state would stay in memory)."""
    import importlib

    from flwr.app import Context

    from pflower.client_app.store import SAVED

    client_app = importlib.import_module("pflower.client_app.app")
    calls = []

    class Client:
        def unpack(self, context):
            calls.append("unpack")

        def evaluation(self, context, config, arrays):
            calls.append("evaluation")
            return MetricRecord({"accuracy": 1.0})

    monkeypatch.setattr(client_app, "runtime", lambda context, msg=None: Client())
    host = _message(_arrays(1.0), kind)
    single_message.attach(host, _message(_arrays(1.0), MessageType.EVALUATE, rnd=1))
    context = Context(1, 5, {}, RecordDict({SAVED: ConfigRecord({"lineage": "L", "round": 1})}), {})
    reply = client_app._evaluate_first(host, context, lambda msg, ctx: Message(RecordDict({"metrics": MetricRecord({})}), reply_to=msg))
    assert calls == (["unpack", "evaluation"] if unpacks else ["evaluation"])
    assert dict(reply.content[single_message.EVALUATION]) == {"accuracy": 1.0}
