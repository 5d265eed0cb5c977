"""Double head, gradual sharing, test modes and the communication report (in process)."""

import json

import pytest
import torch
from conftest import client_state, run_config
from flwr.app import MessageType

from pflower.build import build_model, build_strategy, client_method
from pflower.client_app.app import PERSONAL
from pflower.config import ConfigError, load_settings
from pflower.datasets.federated import Split
from pflower.models import DoubleHead, communicable_keys, keys_under, layers
from pflower.models.doublehead import combine, predict
from pflower.plots import compare_main
from pflower.records import from_record, to_record
from pflower.sharing import GradualSharing, sharing_units
from pflower.training import evaluate

N = 3


def _log_probs(*rows):
    return torch.tensor(rows, dtype=torch.float64).log()


def test_prediction_rule_matches_a_hand_computed_example():
    g = _log_probs([0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.2, 0.2, 0.6])
    l = _log_probs([0.1, 0.2, 0.7], [0.2, 0.5, 0.3], [0.3, 0.55, 0.15], [0.7, 0.2, 0.1])
    # Concatenations [g | l]: argmax at 5, 0, 4, 3 -> classes 5%3, 0, 4%3, 3%3.
    expected = torch.tensor([2, 0, 1, 0])
    assert torch.equal(predict(g, l), expected)
    assert torch.equal(combine(g, l).argmax(1), expected)
    assert torch.allclose(combine(g, l).exp(), torch.maximum(g.exp(), l.exp()))


def test_double_head_model_predicts_with_the_rule_and_evaluates_with_it():
    settings = load_settings(run_config(method="doublehead"))
    model = build_model(settings, settings.image_shape, settings.num_classes, 0)
    assert isinstance(model, DoubleHead)
    assert not torch.equal(model.head.weight, model.local_head.weight)  # own initialization
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    with torch.no_grad():
        rule = predict(*model.heads(x))
    assert torch.equal(model(x).argmax(1), rule)
    assert evaluate(model, Split(x, y)).accuracy == pytest.approx(float((rule == y).float().mean()))


@pytest.mark.parametrize("name", ["cnn", "cnn-bn", "mlp"])
def test_every_model_family_gets_a_double_head(name):
    settings = load_settings(run_config(method="doublehead", model=name))
    model = build_model(settings, settings.image_shape, settings.num_classes, 0)
    keys = client_method(settings).client_state(model).uploaded
    assert keys_under(model, "local_head") and not set(keys_under(model, "local_head")) & set(keys)
    assert set(keys) | set(keys_under(model, "local_head")) == set(communicable_keys(model))
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_classifier_heads_duplicate_the_whole_fully_connected_stack():
    """doublehead.heads='classifier' (the paper's split): the base is the convolutions, each
    head every Linear of the model, the local one freshly initialized; 'last' only the last."""
    settings = load_settings(run_config(method="doublehead", model="twocnn", doublehead__heads="classifier"))
    model = build_model(settings, settings.image_shape, settings.num_classes, 0)
    assert [l.name for l in layers(model)] == ["body.0", "body.3", "head.0", "head.2", "local_head.0", "local_head.2"]
    assert [tuple(model.local_head[i].weight.shape) for i in (0, 2)] == [(512, 256), (10, 512)]
    assert not torch.equal(model.head[0].weight, model.local_head[0].weight)
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    last = build_model(load_settings(run_config(method="doublehead", model="twocnn")), settings.image_shape, 10, 0)
    assert [l.name for l in layers(last)][-2:] == ["head", "local_head"]
    with pytest.raises(ConfigError, match="doublehead.heads"):
        load_settings(run_config(method="doublehead", doublehead__heads="all"))


def test_sharing_units_are_layers_shallow_to_deep_with_their_buffers():
    settings = load_settings(run_config(method="fedavg", model="cnn-bn"))
    model = build_model(settings, settings.image_shape, settings.num_classes, 0)
    units = sharing_units(model, communicable_keys(model))
    assert [k for u in units for k in u] == communicable_keys(model)
    assert units[1] == ("body.1.weight", "body.1.bias", "body.1.running_mean", "body.1.running_var")
    s = GradualSharing(units, 2)
    assert [s.phase(r) for r in range(0, 16)] == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 6, 6, 6]
    assert [s.sent_phase(r) for r in (1, 2, 3)] == [0, 1, 1]
    off = GradualSharing(units, 0)
    assert off.phase(1) == off.sent_phase(1) == len(units) and off.keys(1) == communicable_keys(model)


def _wire_bytes(state, keys):
    return sum(len(a.data) for a in to_record({k: state[k] for k in keys}).values())


def _run(grid_factory, tmp_path, rounds, **kw):
    """A whole in-process run: (settings, strategy, grid, metrics.json, replies as (kind, arrays keys, metrics))."""
    cfg = run_config(num_server_rounds=rounds, local_epochs=1, results_dir=str(tmp_path), **kw)
    settings = load_settings(cfg)
    replies = []

    def tamper(cid, reply):  # the server drops reply arrays once decoded: note them on arrival
        keys = list(reply.content["arrays"].keys()) if "arrays" in reply.content.array_records else []
        metrics = dict(reply.content["metrics"]) if "metrics" in reply.content.metric_records else {}
        replies.append((reply.metadata.message_type, keys, metrics))
        return reply

    grid = grid_factory(cfg, N, tamper=tamper)
    strategy = build_strategy(settings)
    strategy.start(grid=grid)
    return settings, strategy, grid, json.loads((tmp_path / "metrics.json").read_text()), replies


def test_gradual_sharing_sends_and_aggregates_exactly_the_released_layers(grid_factory, tmp_path):
    rounds = 6
    settings, strategy, grid, doc, replies = _run(grid_factory, tmp_path, rounds, method="doublehead", gradual_interval=2)
    model = build_model(settings, settings.image_shape, settings.num_classes, settings.seed)
    init = model.state_dict()
    sharing = GradualSharing.of(model, client_method(settings).client_state(model).uploaded, 2)
    assert len(sharing.units) == 4  # conv, conv, dense, global head
    train_sent = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    eval_alone = [m for m in grid.sent if m.metadata.message_type == MessageType.EVALUATE]
    train_replies = [keys for kind, keys, _ in replies if kind == MessageType.TRAIN]
    assert len(train_sent) == len(train_replies) == N * rounds and len(eval_alone) == N  # the last round's evaluation
    for r in range(1, rounds + 1):
        p, before = (r - 1) // 2 + 1, (r - 2) // 2 + 1  # this round's phase, the last round's
        window = slice(N * (r - 1), N * r)
        assert all(list(m.content["arrays"].keys()) == sharing.keys_of(before) for m in train_sent[window])
        assert all(keys == sharing.keys_of(p) for keys in train_replies[window])
        # round r's evaluation: on round r+1's training messages, with their arrays (the same units), or alone after the last
        nxt = train_sent[N * r : N * (r + 1)]
        evaluated = (
            [m.content["arrays"] for m in nxt if m.content["evaluate"]["evaluate-with"] == "arrays"]
            if r < rounds
            else [m.content["arrays"] for m in eval_alone]
        )
        assert len(evaluated) == N and all(list(a.keys()) == sharing.keys_of(p) for a in evaluated)
    assert [row["phase"] for row in doc["rounds"]] == [1, 1, 2, 2, 3, 3]
    # Aggregated: released units moved away from the initialization, the unreleased one did not.
    for k in sharing.keys_of(3):
        assert not torch.equal(strategy.global_state[k], init[k]), k
    for k in sharing.units[3]:
        assert torch.equal(strategy.global_state[k], init[k]), k
    # Unreleased layers and the local head are personal: every client has its own.
    heads = [from_record(client_state(c)[PERSONAL]) for c in grid.contexts.values()]
    for k in ("head.weight", "local_head.weight"):
        assert not torch.equal(heads[0][k], heads[1][k]) and not torch.equal(heads[0][k], init[k])


def test_measured_bytes_equal_the_schedule_times_the_layer_sizes(grid_factory, tmp_path):
    rounds = 5
    settings, _, _, doc, _ = _run(grid_factory, tmp_path, rounds, method="fedavg", gradual_interval=1)
    model = build_model(settings, settings.image_shape, settings.num_classes, settings.seed)
    state = model.state_dict()
    sharing = GradualSharing.of(model, communicable_keys(model), 1)
    size = lambda units: _wire_bytes(state, sharing.keys_of(units))  # noqa: E731
    for row in doc["rounds"]:
        r = row["round"]  # a round's evaluation arrays are the next round's training arrays: they ride free, but the last's
        assert row["bytes-down"] == N * (size(sharing.sent_phase(r)) + (size(sharing.phase(r)) if r == rounds else 0))
        assert row["bytes-up"] == N * size(sharing.phase(r))
    assert doc["rounds"][-1]["cumulative-bytes-down"] == sum(row["bytes-down"] for row in doc["rounds"])
    assert doc["rounds"][-1]["cumulative-bytes-up"] == doc["final"]["bytes-up"]
    full = N * size(len(sharing.units))
    assert doc["final"]["bytes-up"] < rounds * full  # the deep layers were not sent every round


def test_local_head_is_in_no_message(grid_factory, tmp_path):
    _, _, grid, doc, replies = _run(grid_factory, tmp_path, 2, method="doublehead")
    for msg in grid.sent:
        for record in msg.content.array_records.values():
            assert not [k for k in record if k.startswith("local_head.")]
    assert all(not k.startswith("local_head.") for _, keys, _ in replies for k in keys)
    assert sum(bool(keys) for _, keys, _ in replies) == 2 * N
    assert all("local_head.weight" in from_record(client_state(c)[PERSONAL]) for c in grid.contexts.values())
    assert "phase" not in doc["rounds"][0]  # no gradual sharing: everything every round


def test_test_modes(grid_factory, tmp_path):
    _, strategy, _, doc, replies = _run(grid_factory, tmp_path / "both", 1, method="fedavg", test_mode="both")
    evals = [m for kind, _, m in replies if kind == MessageType.EVALUATE]
    global_n = {int(m["global-num-examples"]) for m in evals}  # one set, the union of the clients' splits
    assert global_n == {sum(int(m["num-examples"]) for m in evals)} == {sum(strategy.gate.reported["evaluate"].values())}
    row = doc["rounds"][0]
    assert row["global-accuracy"] == pytest.approx(sum(float(m["global-accuracy"]) for m in evals) / N)
    assert doc["final"]["global-accuracy"] == row["global-accuracy"]
    _, _, _, doc_g, replies_g = _run(grid_factory, tmp_path / "global", 1, method="fedavg", test_mode="global")
    assert doc_g["rounds"][0]["accuracy"] == pytest.approx(row["global-accuracy"])
    assert "global-accuracy" not in doc_g["rounds"][0]


@pytest.mark.parametrize(("method", "ok"), [("fedavg", True), ("doublehead", True), ("fedper", True), ("pfedla", False), ("local", False), ("superfed", False)])
def test_gradual_interval_only_for_layer_averaging_methods(method, ok):
    cfg = run_config(method=method, gradual_interval=10)
    if ok:
        assert load_settings(cfg).gradual_interval == 10
    else:
        with pytest.raises(ConfigError, match="gradual-interval"):
            load_settings(cfg)


def test_compare_cli_draws_several_runs_on_one_figure(grid_factory, tmp_path, capsys):
    for name, kw in (("a", {}), ("b", {"gradual_interval": 1})):
        _run(grid_factory, tmp_path / name, 2, method="fedavg", test_mode="both", **kw)
    out = tmp_path / "bytes.png"
    assert compare_main([str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out), "--metric", "global-accuracy"]) == 0
    assert out.stat().st_size > 5000
    with pytest.raises(SystemExit):
        compare_main([str(tmp_path / "missing"), "-o", str(out)])
    assert "no such file" in capsys.readouterr().err
