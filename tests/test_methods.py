"""Every method's client step and the server round, in process (real ClientApp and strategy code)."""

import json

import numpy as np
import pytest
import torch
from conftest import client_state, run_config
from flwr.app import ConfigRecord

from pflower import training
from pflower.build import build_strategy
from pflower.client_app.app import PERSONAL
from pflower.config import load_settings
from pflower.methods import declarations
from pflower.models import communicable_keys, keys_under, norm_keys
from pflower.records import from_record, to_record
from pflower.strategies.federation import EVALUATE_SAMPLE

N = 3


def _setup(grid_factory, tmp_path, **kw):
    cfg = run_config(num_server_rounds=2, local_epochs=1, results_dir=str(tmp_path), **kw)
    settings = load_settings(cfg)
    strategy = build_strategy(settings)
    grid = grid_factory(cfg, N)
    strategy.connect(grid, timeout=5)
    return settings, strategy, grid


def _train_round(strategy, grid, rnd=1):
    msgs = strategy.configure_train(rnd, strategy.global_arrays(), ConfigRecord({"server-round": rnd}), grid)
    return msgs, grid.send_and_receive(msgs)


def _model(settings):
    from pflower.build import build_model

    return build_model(settings, settings.image_shape, settings.num_classes, 0)


def test_discovery_maps_nodes_to_partition_ids(grid_factory, tmp_path):
    _, strategy, grid = _setup(grid_factory, tmp_path)
    assert strategy.federation.node_of == {i: 100 + i for i in range(N)}
    assert strategy.federation.num_clients == N and all(n > 0 for n in strategy.federation.num_examples.values())


def test_fedavg_uploads_everything_and_trains(grid_factory, tmp_path):
    settings, strategy, grid = _setup(grid_factory, tmp_path, method="fedavg")
    msgs, replies = _train_round(strategy, grid)
    model = _model(settings)
    for msg, reply in zip(msgs, replies):
        assert not reply.has_error()
        sent, got = from_record(msg.content["arrays"]), from_record(reply.content["arrays"])
        assert list(got) == communicable_keys(model)
        assert not torch.equal(sent["head.weight"], got["head.weight"])


def test_local_sends_nothing_either_way(grid_factory, tmp_path):
    _, strategy, grid = _setup(grid_factory, tmp_path, method="local")
    msgs, replies = _train_round(strategy, grid)
    assert all(len(m.content["arrays"]) == 0 for m in msgs)
    assert all(len(r.content["arrays"]) == 0 for r in replies)
    assert all(PERSONAL in client_state(c) for c in grid.contexts.values())


@pytest.mark.parametrize("method", ["fedper", "fedrep"])
def test_head_stays_personal(grid_factory, tmp_path, method):
    settings, strategy, grid = _setup(grid_factory, tmp_path, method=method)
    msgs, replies = _train_round(strategy, grid)
    head = set(keys_under(_model(settings), "head"))
    assert not head & set(msgs[0].content["arrays"].keys())
    assert not head & set(replies[0].content["arrays"].keys())
    heads = [from_record(client_state(c)[PERSONAL])["head.weight"] for c in grid.contexts.values()]
    assert not torch.equal(heads[0], heads[1])  # each client trained its own head


def test_fedrep_trains_head_then_body(monkeypatch, grid_factory, tmp_path):
    settings, strategy, grid = _setup(grid_factory, tmp_path, method="fedrep", fedrep__body_epochs=2)
    calls = []
    real = training.train

    def spy(model, data, **kw):
        names = {id(p): n for n, p in model.named_parameters()}
        calls.append(({names[id(p)] for p in kw["params"]}, kw["epochs"]))
        return real(model, data, **kw)

    monkeypatch.setattr("pflower.client_app.base.train", spy)
    _train_round(strategy, grid)
    head_call, body_call = calls[0], calls[1]
    assert head_call == ({"head.weight", "head.bias"}, settings.local_epochs)
    assert body_call[1] == 2 and not body_call[0] & {"head.weight", "head.bias"}
    assert len(body_call[0]) == 6


@pytest.mark.parametrize("method", ["fedper", "fedrep", "lgfedavg"])
def test_a_classifier_head_moves_the_whole_fully_connected_stack_to_the_head(monkeypatch, grid_factory, tmp_path, method):
    """``<method>.head='classifier'``: FedPer and FedRep send and receive the convolutions only,
    LG-FedAvg every fully connected layer only; FedRep's head epochs train every one of them."""
    settings, strategy, grid = _setup(grid_factory, tmp_path, method=method, **{f"{method}__head": "classifier"})
    head_params = []
    real = training.train

    def spy(model, data, **kw):
        names = {id(p): n for n, p in model.named_parameters()}
        head_params.append({names[id(p)] for p in kw["params"]} if kw.get("params") is not None else None)
        return real(model, data, **kw)

    monkeypatch.setattr("pflower.client_app.base.train", spy)
    msgs, replies = _train_round(strategy, grid)
    fc = {f"head.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")}
    conv = {f"body.{i}.{p}" for i in (0, 3) for p in ("weight", "bias")}
    shared = fc if method == "lgfedavg" else conv
    assert all(set(m.content["arrays"].keys()) == shared for m in msgs)
    assert all(set(r.content["arrays"].keys()) == shared for r in replies)
    assert fc | conv == set(from_record(client_state(next(iter(grid.contexts.values())))[PERSONAL])) | shared
    if method == "fedrep":
        assert head_params[0] == fc and head_params[1] == conv


@pytest.mark.parametrize("method", ["fedavg", "fedrep"])
def test_lr_decays_by_round_through_the_client_app(monkeypatch, grid_factory, tmp_path, method):
    """lr-decay: round r trains at lr * (1 - lr-decay) ** (r - 1), every training call of the method."""
    settings, strategy, grid = _setup(grid_factory, tmp_path, method=method, lr=0.1, lr_decay=0.2)
    lrs = []
    real = training.train

    def spy(model, data, **kw):
        lrs.append(kw["lr"])
        return real(model, data, **kw)

    monkeypatch.setattr("pflower.client_app.base.train", spy)
    _train_round(strategy, grid, rnd=1)
    first = list(lrs)
    lrs.clear()
    _train_round(strategy, grid, rnd=3)
    assert first == pytest.approx([0.1] * len(first)) and len(first) >= N
    assert lrs == pytest.approx([0.1 * 0.8**2] * len(first))


def test_fedprox_stays_closer_to_the_global_model(grid_factory, tmp_path):
    dist = {}
    for mu in (0.0, 5.0):
        _, strategy, grid = _setup(grid_factory, tmp_path, method="fedprox", fedprox__mu=mu)
        msgs, replies = _train_round(strategy, grid)
        sent, got = from_record(msgs[0].content["arrays"]), from_record(replies[0].content["arrays"])
        dist[mu] = sum(float((got[k] - sent[k]).norm() ** 2) for k in sent) ** 0.5
    assert dist[5.0] < 0.7 * dist[0.0]


def test_fedprox_with_mu_zero_is_fedavg(grid_factory, tmp_path):
    out = {}
    for method, own in (("fedavg", {}), ("fedprox", {"fedprox__mu": 0.0})):
        _, strategy, grid = _setup(grid_factory, tmp_path, method=method, **own)
        _, replies = _train_round(strategy, grid)
        out[method] = from_record(replies[1].content["arrays"])
    assert all(torch.allclose(out["fedavg"][k], out["fedprox"][k], atol=1e-6) for k in out["fedavg"])


def test_fedbn_keeps_norm_layers_local(grid_factory, tmp_path):
    settings, strategy, grid = _setup(grid_factory, tmp_path, method="fedbn", model="cnn-bn")
    msgs, replies = _train_round(strategy, grid)
    local = set(norm_keys(_model(settings)))
    assert local and not local & set(replies[0].content["arrays"].keys())
    stats = [from_record(client_state(c)[PERSONAL])["body.1.running_mean"] for c in grid.contexts.values()]
    assert not torch.equal(stats[0], stats[1])


def test_fedavg_aggregate_is_the_sample_weighted_mean(grid_factory, tmp_path):
    _, strategy, grid = _setup(grid_factory, tmp_path, method="fedavg")
    _, replies = _train_round(strategy, grid)
    states = [from_record(r.content["arrays"]) for r in replies]
    n = np.array([r.content["metrics"]["num-examples"] for r in replies], dtype=np.float64)
    strategy.aggregate_train(1, replies)
    for k, v in strategy.global_state.items():
        expected = sum(w * s[k].double() for w, s in zip(n / n.sum(), states))
        assert torch.allclose(v.double(), expected, atol=1e-6)


def test_rejected_reply_never_reaches_the_aggregate(grid_factory, tmp_path):
    def poison(cid, reply):
        if cid == 1 and not reply.has_error() and len(reply.content.array_records):
            arrays = from_record(reply.content["arrays"])
            arrays["head.bias"][0] = float("nan")
            reply.content["arrays"] = to_record(arrays)
        return reply

    cfg = run_config(method="fedavg", local_epochs=1, results_dir=str(tmp_path))
    settings = load_settings(cfg)
    strategy = build_strategy(settings)
    grid = grid_factory(cfg, N, tamper=poison)
    strategy.connect(grid, timeout=5)
    _, replies = _train_round(strategy, grid)
    clean = [r for r in replies if r.metadata.src_node_id != 101]
    states = [from_record(r.content["arrays"]) for r in clean]
    strategy.aggregate_train(1, replies)
    assert dict(strategy.gate.rejected) == {"non-finite": 1}
    n = np.array([r.content["metrics"]["num-examples"] for r in clean], dtype=np.float64)
    expected = sum(w * s["head.weight"].double() for w, s in zip(n / n.sum(), states))
    assert torch.allclose(strategy.global_state["head.weight"].double(), expected, atol=1e-6)


def test_client_rejects_arrays_of_another_model(grid_factory, tmp_path):
    _, strategy, grid = _setup(grid_factory, tmp_path, method="fedavg")
    msgs, _ = _train_round(strategy, grid)
    arrays = from_record(msgs[0].content["arrays"])
    arrays["head.weight"] = torch.zeros(3, 3)
    msgs[0].content["arrays"] = to_record(arrays)
    reply = grid.send_and_receive([msgs[0]])[0]
    assert reply.has_error() and "head.weight" in reply.error.reason and "shape" in reply.error.reason


def test_sampling_depends_only_on_seed_and_round(grid_factory, tmp_path):
    cfg = run_config(fraction_train=0.5, results_dir=str(tmp_path))
    a, b = build_strategy(load_settings(cfg)).federation, build_strategy(load_settings(cfg)).federation
    for f in (a, b):
        f.node_of = {i: 100 + i for i in range(10)}
    assert [a.sample(0.5, r) for r in range(1, 6)] == [b.sample(0.5, r) for r in range(1, 6)]
    assert all(len(a.sample(0.5, r)) == 5 for r in range(1, 6))
    assert len({tuple(a.sample(0.5, r)) for r in range(1, 6)}) > 1
    assert [a.sample(0.5, r, EVALUATE_SAMPLE) for r in range(1, 6)] != [a.sample(0.5, r) for r in range(1, 6)]


@pytest.mark.parametrize("method", sorted(declarations()))
def test_full_run_in_process_writes_metrics(grid_factory, tmp_path, method):
    """3 rounds of every method's declared example, one local epoch each (the default 5 would
    only make the rounds longer): every round's row, a final accuracy per client, the figure and
    bytes that go both ways, and no collapse of accuracy from round 1 to round 3; a row holds
    only keys its strategy declares (docs/results.md's table of them is generated from those)."""
    cfg = {**run_config(method=method, num_server_rounds=3, local_epochs=1, results_dir=str(tmp_path)), **declarations()[method].example}
    grid = grid_factory(cfg, N)
    strategy = build_strategy(load_settings(cfg))
    strategy.start(grid=grid)
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert [r["round"] for r in doc["rounds"]] == [1, 2, 3]
    assert {k for r in doc["rounds"] for k in r} <= set(strategy.row_keys()), "a row key its strategy does not declare (ROW_KEYS: docs/results.md's table)"
    assert doc["rounds"][-1]["accuracy"] > doc["rounds"][0]["accuracy"] - 0.05
    assert set(doc["final"]["per-client-accuracy"]) == {"0", "1", "2"}
    assert (tmp_path / "accuracy.png").stat().st_size > 1000
    if method == "local":
        assert doc["final"]["bytes-down"] == doc["final"]["bytes-up"] == 0
    else:
        assert doc["rounds"][0]["bytes-up"] > 0


#: The trainings that stay epochs under local-steps: a method's own epoch key (its default 1), FedAvg+'s fine-tuning epoch.
OWN_EPOCHS = {"ditto": 1, "fedrep": 1, "fedavg-ft": 1}


@pytest.mark.usefixtures("no_figures")
@pytest.mark.parametrize("method", sorted(declarations()))
def test_every_method_trains_local_steps_instead_of_epochs(monkeypatch, grid_factory, tmp_path, method):
    """``local-steps=2``, in process: every local training of every method (FedeRiCo's relayed
    ones included) is exactly 2 minibatch steps, counted by its loss calls; only the epochs of a
    method's own keys and fine-tuning stay epochs; the run ends with its metrics."""
    calls = []
    real = training.train

    def spy(model, data, **kw):
        loss_fn, count = kw.get("loss_fn", training.cross_entropy), []

        def counting(m, x, y):
            count.append(len(y))
            return loss_fn(m, x, y)

        out = real(model, data, **{**kw, "loss_fn": counting})
        calls.append((kw["epochs"], kw["steps"], len(count)))
        return out

    monkeypatch.setattr("pflower.client_app.base.train", spy)
    cfg = {**run_config(method=method, num_server_rounds=2, local_steps=2, results_dir=str(tmp_path)), **declarations()[method].example}
    build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, N))
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert [r["round"] for r in doc["rounds"]] == [1, 2] and doc["config"]["local-steps"] == 2
    stepped = [c for c in calls if c[1]]
    assert len(stepped) >= 2 * N and set(stepped) == {(5, 2, 2)}
    assert {c[0] for c in calls if not c[1]} <= ({OWN_EPOCHS[method]} if method in OWN_EPOCHS else set())


def test_adam_is_a_choice_of_the_one_training_loop():
    settings = load_settings(run_config())
    from pflower.datasets.federated import Split

    data = Split(torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,)))
    results = {}
    for opt in ("sgd", "adam"):
        model = _model(settings)
        before = training.evaluate(model, data).loss
        training.train(model, data, epochs=3, batch_size=16, lr=0.01, seed=0, optimizer=opt)
        results[opt] = model.state_dict()["head.weight"]
        assert training.evaluate(model, data).loss < before
    assert not torch.equal(results["sgd"], results["adam"])


@pytest.mark.parametrize("method,finetune", [("fedavg", 0), ("fedavg", 2), ("fedavg-ft", 0), ("fedper", 1)])
def test_evaluation_protocol_as_received_or_fine_tuned(grid_factory, tmp_path, method, finetune):
    """A client evaluates its personal state with the server's arrays over it, after the fine-tuning
    epochs (``finetune-epochs``; ``fedavg-ft``: 1) of plain local training on its training split,
    seeded apart from its training; the evaluation leaves its personal state as it was."""
    from pflower.client_app.app import runtime
    from pflower.datasets.federated import client_data

    settings, strategy, grid = _setup(grid_factory, tmp_path, method=method, finetune_epochs=finetune)
    _, replies = _train_round(strategy, grid)
    strategy.aggregate_train(1, replies)
    personal = {n: from_record(client_state(ctx)[PERSONAL]) for n, ctx in grid.contexts.items()}
    msgs = strategy.configure_evaluate(1, strategy.global_arrays(), ConfigRecord({"server-round": 1}), grid)
    got = {r.metadata.src_node_id: r.content["metrics"] for r in grid.send_and_receive(msgs)}
    epochs = 1 if method == "fedavg-ft" else finetune
    assert strategy.evaluation["finetune-epochs"] == epochs
    for msg in msgs:
        node = msg.metadata.dst_node_id
        cid = grid.contexts[node].node_config["partition-id"]
        model = _model(settings)
        model.load_state_dict({**personal[node], **from_record(msg.content["arrays"])})
        train, test = client_data(settings, cid, N)
        if epochs:
            seed = runtime(grid.contexts[node]).seed(1, stream=1)
            assert seed != runtime(grid.contexts[node]).seed(1)  # not the training's minibatch order
            training.train(model, train, epochs=epochs, batch_size=settings.batch_size, lr=settings.lr, seed=seed)
        want = training.evaluate(model, test)
        assert got[node]["accuracy"] == pytest.approx(want.accuracy) and got[node]["loss"] == pytest.approx(want.loss, rel=1e-5)
        after = from_record(client_state(grid.contexts[node])[PERSONAL])
        assert all(torch.equal(after[k], v) for k, v in personal[node].items())


@pytest.mark.parametrize("method", sorted(declarations()))
def test_the_run_header_names_the_method(method, caplog, tmp_path):
    """The run's first line names the method the config names (FedPer ran under 'FedAvg:')."""
    import logging

    strategy = build_strategy(load_settings({**run_config(method=method, results_dir=str(tmp_path)), **declarations()[method].example}))
    strategy.num_rounds = 3
    with caplog.at_level(logging.INFO):
        strategy.summary()
    header = caplog.records[-1].getMessage()
    assert header.split(":")[0].lower().startswith(method) or header.startswith(f"{method} ("), header
