"""SCAFFOLD: the client's corrected steps and its option-II control variate against steps computed
by hand on a toy model, the server's update of x and c by hand with partial participation, the
bytes each way (twice a model's parameters), and in process: c stays the mean of every client's
c_i, and SCAFFOLD learns on the default data."""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import InProcessGrid, assert_same_state, client_state, run_config
from flwr.app import RecordDict
from torch import nn

from pflower.build import build_model, build_strategy, client_method
from pflower.client_app.app import PERSONAL
from pflower.client_app.app import app as client_app
from pflower.client_app.scaffold import step_sum
from pflower.config import ConfigError, load_settings
from pflower.datasets.federated import Split
from pflower.models.controls import C_CLIENT, C_SERVER, DELTA_C, controls, with_controls
from pflower.records import from_record, payload_bytes, to_record
from pflower.strategies.scaffold import Scaffold
from pflower.strategies.validation import Reply

torch.manual_seed(0)
X, Y = torch.randn(8, 4), torch.randint(0, 3, (8,))
DATA = Split(X, Y)
LR = 0.1


def _toy(seed: int = 1) -> nn.Module:
    """A linear model with control variates c and c_i set to values of their own."""
    torch.manual_seed(seed)
    model = with_controls(nn.Linear(4, 3))
    for prefix in (C_SERVER, C_CLIENT):
        for t in controls(model, prefix).values():
            t.copy_(0.3 * torch.randn_like(t))
    return model


def _grad(w: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The cross-entropy's gradient of the linear model with weights ``w`` on one batch."""
    w = {k: v.clone().requires_grad_() for k, v in w.items()}
    loss = F.cross_entropy(torch.func.functional_call(nn.Linear(4, 3), w, (x,)), y)
    return dict(zip(w, torch.autograd.grad(loss, list(w.values()))))


def _by_hand(model: nn.Module, momentum: float) -> tuple[dict, dict, list[float]]:
    """Two steps (batches of 4 in the loop's order) of y <- y - lr (g(y) + c - c_i), with heavy-ball
    momentum as PyTorch's; returns y, the two batches' gradients and their losses."""
    x = {k: p.detach().clone() for k, p in model.named_parameters()}
    c, c_i = controls(model, C_SERVER), controls(model, C_CLIENT)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(0))  # the loop's minibatch order, seed 0
    y, buf, grads, losses = dict(x), None, [], []
    for b in range(2):
        idx = order[4 * b : 4 * (b + 1)]
        g = _grad(y, X[idx], Y[idx])
        losses.append(float(F.cross_entropy(torch.func.functional_call(nn.Linear(4, 3), y, (X[idx],)), Y[idx])))
        grads.append(g)
        step = {k: g[k] + c[k] - c_i[k] for k in y}
        buf = step if buf is None else {k: momentum * buf[k] + step[k] for k in y}
        y = {k: y[k] - LR * buf[k] for k in y}
    return y, grads, losses


def _client(**kw):
    return client_method(load_settings(run_config(method="scaffold", lr=LR, batch_size=4, local_epochs=1, **kw)))


def test_two_corrected_sgd_steps_and_the_option_ii_control_variate():
    """y <- y - lr (g_i(y) - c_i + c) twice; Δc_i = -c + (x - y) / (K lr) with K = 2, c_i <- c_i + Δc_i,
    which with plain SGD is the mean of the two minibatch gradients; the loss reported is the CE's."""
    model = _toy()
    x = {k: p.detach().clone() for k, p in model.named_parameters()}
    c, c_i0 = {k: v.clone() for k, v in controls(model, C_SERVER).items()}, {k: v.clone() for k, v in controls(model, C_CLIENT).items()}
    y, grads, losses = _by_hand(model, momentum=0.0)
    loss = _client().fit(model, DATA, {}, seed=0, server_round=1)
    assert loss == pytest.approx(sum(losses) / 2, rel=1e-6)
    for k, p in model.named_parameters():
        assert torch.allclose(p, y[k], atol=1e-6), k
        delta = -c[k] + (x[k] - y[k]) / (2 * LR)
        assert torch.allclose(controls(model, DELTA_C)[k], delta, atol=1e-5), k
        assert torch.allclose(controls(model, C_CLIENT)[k], c_i0[k] + delta, atol=1e-5), k
        assert torch.allclose(controls(model, C_CLIENT)[k], (grads[0][k] + grads[1][k]) / 2, atol=1e-5), k  # option II = mean gradient
        assert torch.equal(controls(model, C_SERVER)[k], c[k])  # c is the server's, untouched


def test_with_momentum_the_divisor_is_how_far_the_steps_move_a_constant_gradient():
    """Heavy-ball momentum β: two steps move a constant gradient by lr (1 + (1 + β)), which divides
    x - y instead of 2 lr; the round's lr is decayed as training's."""
    assert step_sum(2, LR, 0.0) == pytest.approx(2 * LR) and step_sum(2, LR, 0.5) == pytest.approx(LR * 2.5)
    assert step_sum(3, LR, 0.9) == pytest.approx(LR * (1 + 1.9 + 2.71))
    model = _toy()
    x = {k: p.detach().clone() for k, p in model.named_parameters()}
    c = {k: v.clone() for k, v in controls(model, C_SERVER).items()}
    y, _, _ = _by_hand(model, momentum=0.5)
    _client(momentum=0.5).fit(model, DATA, {}, seed=0, server_round=1)
    for k, p in model.named_parameters():
        assert torch.allclose(p, y[k], atol=1e-6), k
        assert torch.allclose(controls(model, DELTA_C)[k], -c[k] + (x[k] - y[k]) / (2.5 * LR), atol=1e-5), k


def test_the_client_uploads_the_model_and_delta_c_and_keeps_c_i():
    s = load_settings(run_config(method="scaffold", model="cnn-bn"))
    model = build_model(s, s.image_shape, s.num_classes, 0)
    keys = client_method(s).client_state(model).uploaded
    params = [k for k, _ in model.named_parameters()]
    stats = [k for k in model.state_dict() if "running_" in k]
    assert stats and keys == [*(k for k in model.state_dict() if not k.startswith("scaffold.") and "num_batches" not in k), *(DELTA_C + k for k in params)]
    assert all(torch.count_nonzero(v) == 0 for k, v in model.state_dict().items() if k.startswith("scaffold."))  # c_i = 0 before a client's first round
    assert not any(DELTA_C + k in keys for k in stats)  # no control variate for BatchNorm statistics


def test_adam_is_refused_naming_the_optimizer():
    with pytest.raises(ConfigError, match="optimizer"):
        build_strategy(load_settings(run_config(method="scaffold", optimizer="adam", momentum=0.0)))


def _reply(cid: int, y: dict, dc: dict, n: int = 10) -> Reply:
    return Reply(cid, n, {}, {**y, **{DELTA_C + k: v for k, v in dc.items()}})


def test_server_update_of_x_and_c_by_hand_with_partial_participation():
    """N = 4 clients, 2 reply: x <- x + η_g mean(y_i - x), c <- c + (2/4) mean(Δc_i); sample counts do
    not weigh (the paper's plain means); a running statistic is the clients' mean, with no c."""
    torch.manual_seed(2)
    x0 = {"w": torch.randn(3, 2), "b": torch.randn(3), "bn.running_mean": torch.randn(3)}
    strategy = Scaffold(global_lr=0.5, parameters=["w", "b"])
    strategy.federation.num_clients = 4
    strategy.prepare(to_record(x0))
    assert sorted(strategy.control) == ["b", "w"] and all(torch.count_nonzero(v) == 0 for v in strategy.control.values())
    assert set(strategy.upload_spec) == {"w", "b", "bn.running_mean", DELTA_C + "w", DELTA_C + "b"}
    assert set(strategy.train_arrays(1, [0])[0].keys()) == {"w", "b", "bn.running_mean", C_SERVER + "w", C_SERVER + "b"}
    assert set(strategy.evaluate_arrays(1, [0])[0].keys()) == set(strategy.global_arrays().keys()) == set(x0)

    c = {k: torch.zeros_like(x0[k]) for k in ("w", "b")}
    x = dict(x0)
    for rnd, clients in ((1, (0, 2)), (2, (1, 2))):
        ys = [{k: v + torch.randn_like(v) for k, v in x.items()} for _ in clients]
        dcs = [{k: torch.randn_like(v) for k, v in c.items()} for _ in clients]
        strategy.aggregate(rnd, [_reply(cid, y, dc, n=10 * (cid + 1)) for cid, y, dc in zip(clients, ys, dcs)])
        x = {
            "w": x["w"] + 0.5 * ((ys[0]["w"] - x["w"]) + (ys[1]["w"] - x["w"])) / 2,
            "b": x["b"] + 0.5 * ((ys[0]["b"] - x["b"]) + (ys[1]["b"] - x["b"])) / 2,
            "bn.running_mean": (ys[0]["bn.running_mean"] + ys[1]["bn.running_mean"]) / 2,
        }
        c = {k: c[k] + 2 / 4 * (dcs[0][k] + dcs[1][k]) / 2 for k in c}
        for k in x:
            assert torch.allclose(strategy.global_state[k], x[k], atol=1e-6), (rnd, k)
        for k in c:
            assert torch.allclose(strategy.control[k], c[k], atol=1e-6), (rnd, k)
        sent = from_record(strategy.train_arrays(rnd + 1, [3])[3])
        assert all(torch.equal(sent[C_SERVER + k], strategy.control[k]) for k in c) and torch.equal(sent["w"], strategy.global_state["w"])

    resumed = Scaffold(global_lr=0.5, parameters=["w", "b"])
    resumed.federation.num_clients = 4
    resumed.prepare(to_record(x0))
    resumed.load_state_dict(strategy.state_dict())
    assert_same_state(resumed.state_dict(), strategy.state_dict())


def _run(tmp_path, rounds: int, clients: int, **kw) -> tuple[dict, Scaffold, InProcessGrid]:
    cfg = run_config(method="scaffold", num_server_rounds=rounds, results_dir=str(tmp_path), **kw)
    strategy = build_strategy(load_settings(cfg))
    grid = InProcessGrid(client_app, cfg, clients)
    strategy.start(grid=grid)
    return json.loads((tmp_path / "metrics.json").read_text()), strategy, grid


def test_bytes_each_way_are_the_model_and_one_more_copy_of_its_parameters(tmp_path, no_figures):
    """A training message carries x and c, a reply y and Δc: each FedAvg's bytes plus one array per
    parameter (not per BatchNorm statistic); evaluation carries x alone, as FedAvg's."""
    kw = dict(model="cnn-bn", local_epochs=1, single_message=False)
    ours, strategy, _ = _run(tmp_path / "scaffold", 1, 3, **kw)
    cfg = run_config(method="fedavg", num_server_rounds=1, results_dir=str(tmp_path / "fedavg"), **kw)
    build_strategy(load_settings(cfg)).start(grid=InProcessGrid(client_app, cfg, 3))
    fedavg = json.loads((tmp_path / "fedavg" / "metrics.json").read_text())
    s = load_settings(cfg)
    base = build_model(s, s.image_shape, s.num_classes, 0)
    params = payload_bytes(RecordDict({"a": to_record({k: p for k, p in base.named_parameters()})}))
    model = payload_bytes(RecordDict({"a": to_record({k: v for k, v in base.state_dict().items() if v.is_floating_point()})}))
    assert model > params > 0.99 * sum(4 * p.numel() for p in base.parameters())
    row, theirs = ours["rounds"][0], fedavg["rounds"][0]
    assert row["bytes-up"] == theirs["bytes-up"] + 3 * params == 3 * (model + params)
    assert row["bytes-down"] == theirs["bytes-down"] + 3 * params == 3 * (model + params) + 3 * model  # training, then evaluation
    assert payload_bytes(RecordDict({"a": strategy.train_arrays(2, [0])[0]})) == model + params


def test_c_stays_the_mean_of_every_clients_c_i_with_partial_participation(tmp_path, no_figures):
    """Half the 4 clients train each round; a client keeps its c_i across rounds (starting at 0) and
    the server's c stays (1/N) Σ_i c_i over all N clients, those never sampled at 0."""
    doc, strategy, grid = _run(tmp_path, 3, 4, local_epochs=1, fraction_train=0.5)
    assert [r["sampled"] for r in doc["rounds"]] == [2, 2, 2]
    states = [from_record(client_state(ctx)[PERSONAL]) if PERSONAL in client_state(ctx) else None for ctx in grid.contexts.values()]
    for k, c in strategy.control.items():
        total = sum(s[C_CLIENT + k].double() for s in states if s is not None)
        assert torch.allclose(c.double(), total / 4, atol=1e-6), k
        assert c.abs().max() > 0


def test_scaffold_learns_on_the_default_data(tmp_path, no_figures):
    """Three rounds on digits (3 clients, the default 5 local epochs): the mean test accuracy rises every round."""
    doc, _, _ = _run(tmp_path, 3, 3)
    acc = [r["accuracy"] for r in doc["rounds"]]
    assert acc[0] < acc[1] < acc[2] and acc[2] > acc[0] + 0.2, acc
    assert doc["strategy"] == "Scaffold" and doc["evaluation"]["evaluates"] == "the global model as the server sends it"
