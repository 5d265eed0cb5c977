"""Generated reply metrics through every method's strategy: training replies, and evaluation
replies alone and riding on a training reply. What a key's declaration admits is accepted, what
it does not is rejected and counted, the aggregate is that of the accepted replies alone, and the
metrics.json row is standard JSON; nothing raises.

The values are drawn from the declarations themselves (:mod:`pflower.reply_metrics` and each
method's ``train_metrics`` / ``evaluation_metrics``): inside a key's type and range, or outside
it (NaN and infinities anywhere in a list, a float where an integer belongs, a list where a
number does, a count past what the client declared, a list of the wrong length, a key without
the key it requires, huge and negative counts).
"""

from __future__ import annotations

import copy
import json
import math
from functools import cache

import pytest
from conftest import InProcessGrid, assert_same_state, run_config
from flwr.app import ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import Result
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pflower import reply_metrics as rm
from pflower import single_message
from pflower.build import build_strategy
from pflower.config import load_settings
from pflower.methods import declarations
from pflower.strategies.federico import FedericoRelay
from pflower.strategies.validation import spec_of

N = 4
FACTOR = 2.0  # max-examples-factor's default


@cache
def _setup(name: str):
    """A connected strategy and each client's genuine round-1 training and evaluation replies."""
    from pflower.client_app.app import app

    cfg = {**run_config(method=name, local_epochs=1, samples_per_client=60, results_dir="/tmp/pflower-reply-metrics"), **declarations()[name].example}
    strategy = build_strategy(load_settings(cfg))
    grid = InProcessGrid(app, cfg, N)
    strategy.connect(grid, timeout=5)
    train = []
    if not isinstance(strategy, FedericoRelay):  # its training is the relay's steps (tests/test_federico.py)
        msgs = strategy.configure_train(1, strategy.global_arrays(), ConfigRecord({"server-round": 1}), grid)
        train = [(m, r.content) for m, r in zip(msgs, grid.send_and_receive(msgs))]
    msgs = strategy.configure_evaluate(1, strategy.global_arrays(), ConfigRecord({"server-round": 1, "state-after-round": 1}), grid)
    evaluation = [(m, r.content) for m, r in zip(msgs, grid.send_and_receive(msgs))]
    return strategy, train, evaluation


# ------------------------------------------------------------ values from declarations
FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


def _inside(spec, current, draw, num_clients: int, bound: float):
    """A value ``spec`` admits (for a list: the length ``current`` has)."""
    if isinstance(spec, rm.Count):
        return draw(st.integers(1, int(bound)))
    if isinstance(spec, rm.Numbers):
        if spec.distinct or spec.item.client:
            return draw(st.permutations(current))
        return [_inside(spec.item, None, draw, num_clients, bound) for _ in current]
    hi = min(spec.hi, num_clients - 1) if spec.client else spec.hi
    if spec.integer:
        return draw(st.integers(int(spec.lo), int(min(hi, 2**62))))
    return draw(st.floats(spec.lo, hi, allow_nan=False))


def _outside(spec, current, draw, num_clients: int, bound: float):
    """A value ``spec`` does not admit."""
    if isinstance(spec, rm.Count):
        return draw(st.sampled_from([0, -5, int(bound) + 1, 2**62, 12.5, [3]]))
    if isinstance(spec, rm.Numbers):
        kinds = ["scalar", "length"] + (["item"] if current else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "scalar":
            return 0.5
        if kind == "length":
            return list(current) + list(current[:1] or [0])
        bad = list(current)
        i = draw(st.integers(0, len(bad) - 1))
        bad[i] = draw(NON_FINITE) if not spec.item.integer else num_clients + 7 if spec.item.client else 0.5
        return bad
    hi = min(spec.hi, num_clients - 1) if spec.client else spec.hi
    options = [draw(NON_FINITE), [0.5]]
    if spec.integer:
        options.append(0.5)
    if hi < rm.MAX_MAGNITUDE:
        options.append(hi + 1 if spec.integer else hi + 0.25)
    if spec.lo > -rm.MAX_MAGNITUDE:
        options.append(spec.lo - 1)
    return draw(st.sampled_from(options))


def _complete(schema: dict, metrics: dict) -> bool:
    """Whether every key has the keys it requires beside it, and num-examples and every key its
    kind of reply needs (an evaluation's accuracy and loss) are there."""
    for key in metrics:
        spec = spec_of(key, metrics[key], schema)
        if any(r not in metrics for r in spec.requires) or (isinstance(getattr(spec, "length", None), str) and spec.length not in metrics):
            return False
    needed = [k for k, spec in schema.items() if isinstance(spec, rm.Number) and spec.needed]
    return "num-examples" in metrics and all(k in metrics for k in needed)


@st.composite
def _mutations(draw, schema: dict, metrics: dict, num_clients: int, bound):
    """(new metrics, whether the declarations admit them) for one reply."""
    out, bad = dict(metrics), set()
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(sorted(set(metrics) | {"undeclared"})))
        spec = spec_of(key, metrics.get(key, 0.0), schema)
        action = draw(st.sampled_from(["inside", "outside", "delete"]))
        if key == "undeclared":
            out[key] = draw(st.one_of(FINITE.filter(lambda v: abs(v) <= rm.MAX_MAGNITUDE), st.lists(st.integers(-9, 9), max_size=4)))
            if action == "outside":
                out[key] = draw(st.one_of(NON_FINITE, st.just(1e300), st.lists(NON_FINITE, min_size=1, max_size=3)))
            (bad.add if action == "outside" else bad.discard)(key)
        elif key == "client-id":
            if action != "inside":  # another client's id, or none of the federation's: refused either way
                out[key] = metrics[key] + draw(st.sampled_from([1, -1, 1000]))
                bad.add(key)
        elif action == "delete":
            out.pop(key, None)
            bad.discard(key)
        elif action == "inside":
            if isinstance(spec, rm.Numbers) and isinstance(spec.length, str):
                continue  # its length follows another key's: left as it is
            most = (bound(spec.of) or rm.MAX_COUNT) if isinstance(spec, rm.Count) else 0
            out[key] = _inside(spec, metrics[key], draw, num_clients, most)  # the genuine list's length
            bad.discard(key)
        else:
            current = out.get(key, metrics[key])
            most = (bound(spec.of) or rm.MAX_COUNT) if isinstance(spec, rm.Count) else 0
            out[key] = _outside(spec, current if isinstance(current, list) else [], draw, num_clients, most)
            bad.add(key)
    return out, not bad and _complete(schema, out)


@st.composite
def _plan(draw, replies: list, schema: dict, strategy):
    """Per client: an error reply, or its metrics mutated; with whether each is admitted."""
    plan = []
    for msg, content in replies:
        cid = strategy.federation.client_of[msg.metadata.dst_node_id]
        if draw(st.integers(0, 9)) == 0:
            plan.append((None, False))
            continue
        metrics = dict(next(iter(content.metric_records.values())))
        plan.append(draw(_mutations(schema, metrics, strategy.federation.num_clients, strategy.gate.bound(cid))))
    return plan


def _standard_json(doc) -> None:
    """``doc`` as standard JSON: NaN and infinities refused."""
    json.loads(json.dumps(doc, allow_nan=False))


TRAINING = [m for m, d in declarations().items() if d.strategy != declarations()["federico"].strategy]


@pytest.mark.parametrize("name", TRAINING)
@hsettings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_generated_training_metrics(name, data):
    base, train, _ = _setup(name)
    plan = data.draw(_plan(train, base.gate.schemas[MessageType.TRAIN], base))
    mixed, valid = [], []
    for (msg, content), (metrics, admitted) in zip(train, plan):
        if metrics is None:
            mixed.append(Message(Error(code=0, reason="boom"), reply_to=msg))
            continue
        reply = RecordDict({"arrays": copy.deepcopy(content["arrays"]), "metrics": MetricRecord(metrics)})
        mixed.append(Message(reply, reply_to=msg))
        if admitted:
            valid.append(Message(copy.deepcopy(reply), reply_to=msg))
    corrupted, clean = copy.deepcopy(base), copy.deepcopy(base)
    corrupted.gate.new_round()
    _, got = corrupted.aggregate_train(1, mixed)
    clean.gate.new_round()
    _, want = clean.aggregate_train(1, valid)
    assert sum(corrupted.gate.rejected.values()) == len(mixed) - len(valid), corrupted.gate.problems
    assert dict(clean.gate.rejected) == {} and dict(got) == dict(want)
    assert_same_state(corrupted.state_dict(), clean.state_dict())
    _standard_json(dict(got))


def _evaluate(strategy, replies: list[Message]) -> dict:
    """Round 1's evaluation from ``replies``: its metrics.json fields."""
    result = Result()
    strategy.gate.new_round()
    strategy.evaluated(1, replies, result)
    return strategy._evaluation(1, result)


@pytest.mark.parametrize("riding", [False, True], ids=["alone", "riding"])
@pytest.mark.parametrize("name", sorted(declarations()))
@hsettings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_generated_evaluation_metrics(name, riding, data):
    """Alone, an evaluation reply; riding, the evaluation in a training reply (``evaluation``, or
    ``evaluation-error`` where the plan says error) split off it: the training half is the
    genuine reply whatever its evaluation held."""
    base, train, evaluation = _setup(name)
    plan = data.draw(_plan(evaluation, base.gate.schemas[MessageType.EVALUATE], base))
    host = {m.metadata.dst_node_id: (m, c) for m, c in train}
    mixed, valid = [], []
    for (msg, _content), (metrics, admitted) in zip(evaluation, plan):
        if riding and msg.metadata.dst_node_id in host:
            tmsg, tcontent = host[msg.metadata.dst_node_id]
            reply = copy.deepcopy(tcontent)
            if metrics is None:
                reply[single_message.EVALUATION_ERROR] = ConfigRecord({"reason": "evaluation raised"})
            else:
                reply[single_message.EVALUATION] = MetricRecord(metrics)
            training, ev = single_message.split(Message(reply, reply_to=tmsg))
            assert ev is not None and list(training.content.keys()) == list(tcontent.keys())
            assert dict(training.content["metrics"]) == dict(tcontent["metrics"])
        elif metrics is None:
            ev = Message(Error(code=0, reason="boom"), reply_to=msg)
        else:
            ev = Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
        mixed.append(ev)
        if metrics is not None and admitted:
            valid.append(ev)
    corrupted, clean = copy.deepcopy(base), copy.deepcopy(base)
    got, want = _evaluate(corrupted, mixed), _evaluate(clean, valid)
    assert sum(corrupted.gate.rejected.values()) == len(mixed) - len(valid), corrupted.gate.problems
    if any(m is None for m, _ in plan):
        assert corrupted.gate.rejected["client-error"] == sum(m is None for m, _ in plan)
    assert got == want
    _standard_json(got)


@pytest.mark.parametrize("key", ["accuracy", "loss"])
def test_an_evaluation_reply_without_a_key_every_method_reports_is_refused_naming_it(key):
    """One of 4 evaluation replies lacks ``key``: it is refused as ``missing``, naming the key, and
    the round's accuracy and loss are those of the other 3 (the aggregate keeps only the keys
    all accepted replies share: one such reply erased the round's accuracy)."""
    base, _train, evaluation = _setup("fedavg")
    replies = []
    for i, (msg, content) in enumerate(evaluation):
        metrics = dict(content["metrics"])
        if i == 1:
            del metrics[key]
        replies.append(Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg))
    strategy, clean = copy.deepcopy(base), copy.deepcopy(base)
    got = _evaluate(strategy, replies)
    assert dict(strategy.gate.rejected) == {"missing": 1} and f"metric '{key}' is missing" in strategy.gate.problems[0]
    assert got == _evaluate(clean, replies[:1] + replies[2:])
    assert got["accuracy"] is not None and got["loss"] is not None
