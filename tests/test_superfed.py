"""SuPerFed: mixing math (no Flower), the client update, what leaves the client; label noise and
calibration metrics (used by every method)."""

import json

import pytest
import torch
from conftest import run_config

from pflower.build import build_model, build_strategy
from pflower.client_app.base import ClientMethod
from pflower.client_app.superfed import VALIDATION_FRACTION, SuperFedClient, choose_lambda, holdout
from pflower.config import load_settings
from pflower.datasets.federated import client_data
from pflower.datasets.partition import noisy_labels
from pflower.methods.superfed import POOLED_KEY
from pflower.models.mixing import LAMBDA_GRID, cosine_squared
from pflower.training import calibration_errors, evaluate


def _settings(**kw):
    return load_settings(run_config(method="superfed", **kw))


def test_lambda_zero_without_penalties_is_exactly_fedavgs_client_update():
    s = _settings(superfed__mu=0.0, superfed__nu=0.0, superfed__start=1.0, local_epochs=2)
    train, _ = client_data(s, 0, 3)
    mixed = build_model(s, s.image_shape, s.num_classes, s.seed)
    client = SuperFedClient(s)
    mixed.load_state_dict(client.initial_state(mixed, 0))
    local_before = {k: v.clone() for k, v in mixed.local.state_dict().items()}
    plain = build_model(load_settings(run_config(method="fedavg")), s.image_shape, s.num_classes, s.seed)
    plain.load_state_dict(mixed.fed.state_dict())
    received = {f"fed.{k}": v.clone() for k, v in plain.state_dict().items()}
    client.fit(mixed, train, received, seed=5, server_round=1)
    ClientMethod(s).fit(plain, holdout(train, VALIDATION_FRACTION, s.seed)[0], {}, seed=5, server_round=1)
    for k, v in plain.state_dict().items():
        assert torch.equal(mixed.fed.state_dict()[k], v), k
    assert all(torch.equal(mixed.local.state_dict()[k], v) for k, v in local_before.items())  # frozen before the start


def test_cosine_squared_gradient_matches_the_closed_form():
    torch.manual_seed(0)
    a = [torch.randn(3, 4, requires_grad=True), torch.randn(5, requires_grad=True)]
    b = [torch.randn(3, 4), torch.randn(5)]
    cosine_squared(a, b).backward()
    va, vb = torch.cat([t.detach().reshape(-1) for t in a]), torch.cat([t.reshape(-1) for t in b])
    c = va @ vb / (va.norm() * vb.norm())
    expected = 2 * c * (vb / (va.norm() * vb.norm()) - c * va / va.norm() ** 2)
    got = torch.cat([t.grad.reshape(-1) for t in a])
    assert torch.allclose(got, expected, atol=1e-6)


def test_layer_mixing_uses_one_lambda_per_layer_within_a_step():
    s = _settings(superfed__mixing="layer")
    model = build_model(s, s.image_shape, s.num_classes, s.seed)
    SuperFedClient(s).initial_state(model, 1)
    model.draw_lambda(torch.Generator().manual_seed(0))
    lam = model.lam.clone()
    assert model.num_layers == 4 and len(set(lam.tolist())) == 4
    mixed = model.mixed_parameters()
    fed, loc = dict(model.fed.named_parameters()), dict(model.local.named_parameters())
    for l, keys in enumerate(model.groups):
        for k in keys:
            assert torch.allclose(mixed[k], (1 - lam[l]) * fed[k] + lam[l] * loc[k])
    model_mode = build_model(_settings(superfed__mixing="model"), s.image_shape, s.num_classes, s.seed)
    model_mode.draw_lambda(torch.Generator().manual_seed(0))
    assert len(set(model_mode.lam.tolist())) == 1


def test_gradients_reach_both_weight_sets_in_one_backward_pass():
    s = _settings()
    model = build_model(s, s.image_shape, s.num_classes, s.seed)
    model.set_lambda(0.3)
    x, y = torch.randn(4, *s.image_shape), torch.tensor([0, 1, 2, 3])
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_local_model_never_leaves_the_client_and_the_pooled_curve_goes_out_with_the_next_evaluation(grid_factory, tmp_path):
    cfg = run_config(method="superfed", superfed__mixing="layer", superfed__start=0.0, num_server_rounds=2, local_epochs=1, results_dir=str(tmp_path))
    strategy = build_strategy(load_settings(cfg))
    grid = grid_factory(cfg, 3)
    sent, evaluations, uploads = [], [], []  # as pushed and pulled (the strategy frees the arrays, splits the replies)
    push, pull = grid.push_messages, grid.pull_messages
    grid.push_messages = lambda msgs: push([sent.append(m) or m for m in msgs])

    def pulled(ids):
        for r in (got := pull(ids)):
            uploads.append(dict(r.content.array_records))
            records = r.content.metric_records
            evaluations.extend(dict(records[k]) for k in ("evaluation", "metrics") if k in records and "lambda-val-loss" in records[k])
        return got

    grid.pull_messages = pulled
    strategy.start(grid=grid)
    keys = {k for arrays in uploads for rec in arrays.values() for k in rec}
    assert keys and all(k.startswith("fed.") for k in keys)
    assert set(strategy.upload_spec) == {k for k in keys}
    doc = json.loads((tmp_path / "metrics.json").read_text())
    last = doc["rounds"][-1]
    assert len(last["lambda-curve"]) == len(LAMBDA_GRID) and sorted(last["lambda-chosen"]) == ["0", "1", "2"]
    assert set(last["lambda-chosen"].values()) <= set(LAMBDA_GRID)
    assert 0 <= last["ece"] <= 1 and last["top5-accuracy"] >= last["weighted-accuracy"]
    assert (tmp_path / "lambda.png").stat().st_size > 0
    assert len(last["lambda-pooled-val-loss"]) == len(LAMBDA_GRID) and last["oracle-accuracy"] >= last["accuracy"]
    # the server pools round 1's held-out curves (weighted by held-out size) and sends them with round 2's evaluation;
    # round 1's evaluation rode on round 2's training messages, round 2's went alone
    first = [m.content["evaluate"] for m in sent if "evaluate" in m.content.config_records]
    second = [m.content["config"] for m in sent if m.metadata.message_type == "evaluate"]
    assert len(first) == len(second) == 3 and all(c["server-round"] == 1 and POOLED_KEY not in c for c in first)
    round1 = evaluations[:3]
    n = torch.tensor([float(m["val-examples"]) for m in round1], dtype=torch.float64)
    curves = torch.tensor([list(m["lambda-val-loss"]) for m in round1], dtype=torch.float64)
    pooled = (n @ curves / n.sum()).tolist()
    assert all(c["server-round"] == 2 and list(c[POOLED_KEY]) == pytest.approx(pooled) for c in second)


def test_lambda_is_chosen_on_own_plus_pooled_held_out_loss():
    own = [0.30, 0.10, 0.12, 0.50]
    assert choose_lambda(own) == 1
    assert choose_lambda(own, [0.30, 0.20, 0.05, 0.00]) == 2  # 0.60 0.30 0.17 0.50
    assert choose_lambda([0.2, 0.2, 0.3]) == 0  # ties: the lower lambda
    with pytest.raises(ValueError, match=POOLED_KEY):
        choose_lambda(own, [0.1, 0.2])


def test_trained_client_reports_its_held_out_curve_and_follows_the_pooled_one():
    s = _settings()
    train, test = client_data(s, 0, 3)
    model = build_model(s, s.image_shape, s.num_classes, s.seed)
    client = SuperFedClient(s)
    model.load_state_dict(client.initial_state(model, 0))
    own = client.evaluate(model, train, test, trained=True, config={})
    _, validation = holdout(train, VALIDATION_FRACTION, s.seed)
    expected = []
    for lam in LAMBDA_GRID:
        model.set_lambda(lam)
        expected.append(evaluate(model, validation).loss)
    assert own["lambda-val-loss"] == pytest.approx(expected) and own["val-examples"] == len(validation)
    assert own["lambda"] == LAMBDA_GRID[choose_lambda(expected)]
    pull = [0.0 if lam == 1.0 else 1e6 for lam in LAMBDA_GRID]  # the federation's curve outweighs the client's
    pulled = client.evaluate(model, train, test, trained=True, config={POOLED_KEY: pull})
    assert pulled["lambda"] == 1.0 and pulled["accuracy"] == pulled["lambda-accuracy"][-1]


def test_novel_client_is_served_the_global_model():
    s = _settings()
    train, test = client_data(s, 0, 3)
    model = build_model(s, s.image_shape, s.num_classes, s.seed)
    metrics = SuperFedClient(s).evaluate(model, train, test, trained=False, config={})
    model.set_lambda(0.0)
    assert metrics["lambda"] == 0.0 and metrics["accuracy"] == evaluate(model, test).accuracy


@pytest.mark.parametrize("kind", ["pair", "symmetric"])
def test_label_noise_flips_exactly_the_ratio_of_training_labels(kind):
    y = torch.arange(1000) % 10
    noisy = noisy_labels(y, kind, 0.3, 10, seed=1)
    flipped = noisy != y
    assert int(flipped.sum()) == 300
    if kind == "pair":
        assert torch.equal(noisy[flipped], (y[flipped] + 1) % 10)
    s = load_settings(run_config(label_noise=kind, label_noise_ratio=0.4))
    clean = load_settings(run_config())
    (tr, te), (tr0, te0) = client_data(s, 0, 3), client_data(clean, 0, 3)
    assert torch.equal(te.y, te0.y) and int((tr.y != tr0.y).sum()) == round(0.4 * len(tr0))


def test_calibration_errors_and_top5_on_a_hand_example():
    ece, mce = calibration_errors(torch.tensor([0.95, 0.95, 0.55, 0.55]), torch.tensor([1, 0, 1, 1]))
    assert ece == pytest.approx(0.45) and mce == pytest.approx(0.45)
    ece, mce = calibration_errors(torch.tensor([0.9, 0.9, 0.3]), torch.tensor([1, 1, 0]))
    assert ece == pytest.approx((2 * 0.1 + 0.3) / 3) and mce == pytest.approx(0.3)


def test_pooled_curve_survives_a_checkpoint():
    settings = load_settings(run_config(method="superfed"))
    first, second = build_strategy(settings), build_strategy(settings)
    first.pooled_val_loss = [0.1 * i for i in range(len(LAMBDA_GRID))]
    second.load_state_dict(first.state_dict())
    assert second.pooled_val_loss == first.pooled_val_loss
