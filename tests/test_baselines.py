"""The papers' baselines: each update rule against the same step computed by hand on a toy
model (one batch, so one optimizer step), and what each uploads."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import run_config
from torch import nn

from pflower.build import client_method
from pflower.config import load_settings
from pflower.datasets.federated import Split
from pflower.models.mixing import MixedModel, with_alpha

torch.manual_seed(0)
X, Y = torch.randn(8, 4), torch.randint(0, 3, (8,))
DATA = Split(X, Y)


def _client(method: str, **kw):
    return client_method(load_settings(run_config(method=method, lr=0.1, batch_size=8, local_epochs=1, **kw)))


def _grads(loss, params):
    return torch.autograd.grad(loss, params)


def test_lgfedavg_uploads_the_head_and_keeps_the_body():
    from pflower.build import build_model

    s = load_settings(run_config(method="lgfedavg"))
    model = build_model(s, s.image_shape, s.num_classes, 0)
    keys = client_method(s).client_state(model).uploaded
    assert keys == ["head.weight", "head.bias"]


def test_ditto_personal_step_is_sgd_on_ce_plus_the_proximal_term():
    client = _client("ditto", ditto__lam=0.5)
    model = MixedModel(nn.Linear(4, 3))
    with torch.no_grad():
        model.local.weight.add_(0.3)  # v != w
    w0 = {k: v.detach().clone() for k, v in model.fed.named_parameters()}
    v0 = {k: v.detach().clone() for k, v in model.local.named_parameters()}
    received = {f"fed.{k}": v.clone() for k, v in w0.items()}
    client.fit(model, DATA, received, seed=0, server_round=1)
    # w: one plain SGD step; v: one SGD step on CE(v) + lam/2 ||v - w_received||^2
    w = {k: v.clone().requires_grad_() for k, v in w0.items()}
    gw = _grads(F.cross_entropy(torch.func.functional_call(nn.Linear(4, 3), w, (X,)), Y), list(w.values()))
    v = {k: t.clone().requires_grad_() for k, t in v0.items()}
    loss = F.cross_entropy(torch.func.functional_call(nn.Linear(4, 3), v, (X,)), Y) + 0.25 * sum(((v[k] - w0[k]) ** 2).sum() for k in v)
    gv = _grads(loss, list(v.values()))
    for (k, p), g in zip(model.fed.named_parameters(), gw):
        assert torch.allclose(p, w0[k] - 0.1 * g, atol=1e-6)
    for (k, p), g in zip(model.local.named_parameters(), gv):
        assert torch.allclose(p, v0[k] - 0.1 * g, atol=1e-6)
    assert client.client_state(model).uploaded == ["fed.weight", "fed.bias"]


def test_apfl_alpha_follows_its_gradient_and_w_v_their_losses():
    client = _client("apfl")
    torch.manual_seed(1)
    model = with_alpha(MixedModel(nn.Linear(4, 3)), 0.5)
    with torch.no_grad():  # not a constant shift: that moves every logit alike, and alpha's gradient is 0
        model.local.weight.add_(0.5 * torch.randn(3, 4))
    w0 = {k: t.detach().clone() for k, t in model.fed.named_parameters()}
    v0 = {k: t.detach().clone() for k, t in model.local.named_parameters()}
    client.fit(model, DATA, {}, seed=0, server_round=1)
    net = nn.Linear(4, 3)
    w = {k: t.clone().requires_grad_() for k, t in w0.items()}
    v = {k: t.clone().requires_grad_() for k, t in v0.items()}
    a = torch.tensor(0.5, requires_grad=True)
    gw = _grads(F.cross_entropy(torch.func.functional_call(net, w, (X,)), Y), list(w.values()))
    mix = {k: a * v[k] + (1 - a) * w0[k] for k in w0}
    *gv, ga = _grads(F.cross_entropy(torch.func.functional_call(net, mix, (X,)), Y), [*v.values(), a])
    assert float(model.alpha) == pytest.approx(min(max(0.5 - 0.1 * float(ga), 0.0), 1.0), abs=1e-6) and float(ga) != 0
    for (k, p), g in zip(model.fed.named_parameters(), gw):
        assert torch.allclose(p, w0[k] - 0.1 * g, atol=1e-6)
    for (k, p), g in zip(model.local.named_parameters(), gv):
        assert torch.allclose(p, v0[k] - 0.1 * g, atol=1e-6)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_step_is_the_maml_update(variant):
    parts = 2 if variant == "fo" else 3
    client = client_method(load_settings(run_config(method="perfedavg", batch_size=8 // parts if parts == 2 else 2, local_epochs=1,
                                                    perfedavg__variant=variant, perfedavg__alpha=0.3, perfedavg__beta=0.2)))  # fmt: skip
    n = 8 // parts if parts == 2 else 2
    data = Split(X[: parts * n], Y[: parts * n])
    model = nn.Linear(4, 3)
    w0 = {k: t.detach().clone() for k, t in model.named_parameters()}
    client.fit(model, data, {}, seed=0, server_round=1)

    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))  # the loop's minibatch order
    xs, ys = data.x[order], data.y[order]

    def f(p, lo, hi):
        return F.cross_entropy(torch.func.functional_call(nn.Linear(4, 3), p, (xs[lo:hi],)), ys[lo:hi])

    w = {k: t.clone().requires_grad_() for k, t in w0.items()}
    g1 = _grads(f(w, 0, n), list(w.values()))
    tmp = {k: w0[k] - 0.3 * g for k, g in zip(w, g1)}
    tmp = {k: t.requires_grad_() for k, t in tmp.items()}
    v = _grads(f(tmp, n, 2 * n), list(tmp.values()))
    if variant == "hf":  # (I - alpha H(w; D3)) v, H by an explicit Hessian of the toy model
        flat = torch.cat([t.flatten() for t in w0.values()])
        shapes = [t.shape for t in w0.values()]

        def f3(vec):
            parts_, i = {}, 0
            for k, shp in zip(w0, shapes):
                parts_[k] = vec[i : i + shp.numel()].view(shp)
                i += shp.numel()
            return f(parts_, 2 * n, 3 * n)

        H = torch.autograd.functional.hessian(f3, flat)
        vflat = torch.cat([t.flatten() for t in v])
        d = vflat - 0.3 * H @ vflat
        v = list(torch.split(d, [s.numel() for s in shapes]))
        v = [t.view(s) for t, s in zip(v, shapes)]
    for (k, p), g in zip(model.named_parameters(), v):
        assert torch.allclose(p, w0[k] - 0.2 * g, atol=1e-5), k


def test_perfedavg_evaluates_after_one_adaptation_step():
    from pflower.training import evaluate

    client = client_method(load_settings(run_config(method="perfedavg", batch_size=8, perfedavg__alpha=0.5)))
    model = nn.Linear(4, 3)
    before = copy.deepcopy(model.state_dict())
    got = client.evaluate(model, DATA, DATA, True, {"server-round": 1})
    adapted = nn.Linear(4, 3)
    adapted.load_state_dict(before)
    g = _grads(F.cross_entropy(adapted(X), Y), list(adapted.parameters()))
    with torch.no_grad():
        for p, gi in zip(adapted.parameters(), g):
            p -= 0.5 * gi
    assert got["loss"] == pytest.approx(evaluate(adapted, DATA).loss, rel=1e-5)
    assert all(torch.equal(model.state_dict()[k], before[k]) for k in before)  # the model it was given is untouched


def test_pfedme_inner_solver_and_local_step():
    client = _client("pfedme", pfedme__lam=2.0, pfedme__k=3, pfedme__personal_lr=0.2, pfedme__lr=0.05)
    model = MixedModel(nn.Linear(4, 3))
    w0 = {k: t.detach().clone() for k, t in model.fed.named_parameters()}
    client.fit(model, DATA, {}, seed=0, server_round=1)
    theta = {k: t.clone() for k, t in w0.items()}  # theta starts at w
    for _ in range(3):
        th = {k: t.clone().requires_grad_() for k, t in theta.items()}
        g = _grads(F.cross_entropy(torch.func.functional_call(nn.Linear(4, 3), th, (X,)), Y), list(th.values()))
        theta = {k: theta[k] - 0.2 * (gk + 2.0 * (theta[k] - w0[k])) for k, gk in zip(theta, g)}
    for k, p in model.local.named_parameters():
        assert torch.allclose(p, theta[k], atol=1e-6)
    for k, p in model.fed.named_parameters():
        assert torch.allclose(p, w0[k] - 0.05 * 2.0 * (w0[k] - theta[k]), atol=1e-6)


def test_pfedme_server_mixes_with_beta():
    from flwr.app import ArrayRecord

    from pflower.records import to_record
    from pflower.strategies.pfedme import PFedMe
    from pflower.strategies.validation import Reply

    strategy = PFedMe(beta=2.0)
    strategy.prepare(to_record({"w": torch.zeros(3)}))
    replies = [Reply(0, 1, {}, {"w": torch.ones(3)}), Reply(1, 3, {}, {"w": 3 * torch.ones(3)})]
    strategy.aggregate(1, replies)
    mean = (1 * 1 + 3 * 3) / 4
    assert torch.allclose(strategy.global_state["w"], torch.full((3,), 2.0 * mean))  # (1 - 2) * 0 + 2 * mean
    assert isinstance(strategy.global_arrays(), ArrayRecord)


def test_fedfomo_weights_are_the_normalized_positive_loss_improvements():
    from pflower.client_app.fedfomo import fomo_weights

    raw, w = fomo_weights(1.0, [0.5, 1.5, 0.8], [1.0, 2.0, 0.5])
    assert raw == pytest.approx([0.5, -0.25, 0.4], abs=1e-4)
    assert w.tolist() == pytest.approx([0.5 / 0.9, 0.0, 0.4 / 0.9], abs=1e-4)
    assert fomo_weights(1.0, [2.0], [1.0])[1].tolist() == [0.0]  # nothing helps: no move


def test_fedfomo_client_moves_toward_the_useful_models_only():
    from flwr.app import RecordDict

    from pflower.client_app.fedfomo import FedFomoClient
    from pflower.methods.fedfomo import IDS, WEIGHTS, peer_model
    from pflower.records import to_record

    s = load_settings(run_config(method="fedfomo"))
    client = FedFomoClient(s)
    torch.manual_seed(3)
    model = nn.Linear(4, 3)
    own = copy.deepcopy(model.state_dict())
    good = {k: v.clone() for k, v in own.items()}
    _, val = client._split(DATA)
    for _ in range(30):  # a better model on the held-out part: a few steps of gradient descent on it
        good = {k: v.requires_grad_() for k, v in good.items()}
        g = _grads(F.cross_entropy(torch.func.functional_call(model, good, (val.x,)), val.y), list(good.values()))
        good = {k: (v - 0.5 * gk).detach() for (k, v), gk in zip(good.items(), g)}
    bad = {k: v + 3 * torch.randn_like(v) for k, v in own.items()}
    incoming = RecordDict({peer_model(1): to_record(good), peer_model(2): to_record(bad)})
    got = client.before_fit(model, DATA, incoming, 1)
    assert got[IDS] == [1, 2] and got[WEIGHTS][0] > 0 > got[WEIGHTS][1]
    assert all(torch.allclose(model.state_dict()[k], good[k]) for k in own)  # all weight on the one useful model


def test_fedfomo_server_picks_by_affinity_and_adds_the_reported_weights():
    from pflower.methods.fedfomo import IDS, WEIGHTS
    from pflower.records import to_record
    from pflower.strategies.fedfomo import FedFomo
    from pflower.strategies.validation import Rejected, Reply

    strategy = FedFomo(m=2, epsilon=0.0)
    strategy.federation.num_clients = 4
    strategy.prepare(to_record({"w.weight": torch.zeros(2)}))
    strategy.trained = {0, 1, 2, 3}
    strategy.affinity[0] = torch.tensor([1.0, 0.2, 0.9, 0.5], dtype=torch.float64)
    assert strategy.choose(0, 1) == [2, 3]  # the two highest affinities, itself excluded
    assert list(strategy.train_extras(1, [0])[0]) == ["fomo-model-2", "fomo-model-3"]
    reply = Reply(0, 10, {IDS: [2, 3], WEIGHTS: [0.5, -0.1]}, {"w.weight": torch.ones(2)})
    strategy.check_reply(reply)
    strategy.aggregate(1, [reply])
    assert strategy.affinity[0].tolist() == pytest.approx([1.0, 0.2, 1.4, 0.4])
    assert torch.equal(strategy.theta[0], torch.ones(2))
    with pytest.raises(Rejected, match="must be the peers it was sent") as err:
        strategy.check_reply(Reply(0, 10, {IDS: [1], WEIGHTS: [0.1]}, {}))  # client 1's model was not sent to it
    assert err.value.reason == "malformed"
    strategy.epsilon = 1.0  # exploring: random picks, still never itself
    picks = {tuple(strategy.choose(0, r)) for r in range(20)}
    assert len(picks) > 1 and all(0 not in p and len(p) == 2 for p in picks)


def test_pfedhn_step_moves_the_generated_model_toward_the_trained_one():
    from pflower.strategies.hypernetwork import ModelGenerator, generator_update

    gen = ModelGenerator.create(4, 10, 3, 16, 2, seed=0)
    ids = torch.tensor([1, 3])
    with torch.no_grad():
        start = gen.generate(ids)
    trained = start + 0.1 * torch.randn(2, 10)
    untouched = gen.params["emb"][[0, 2]].clone()
    before = (start - trained).norm(dim=1)
    (used,) = generator_update(gen, [(ids, trained)], lr=0.01, momentum=0.0, weight_decay=0.0)
    assert torch.equal(used, start)
    with torch.no_grad():
        after = (gen.generate(ids) - trained).norm(dim=1)
    assert (after < before).all()
    assert torch.equal(gen.params["emb"][[0, 2]], untouched)  # other clients' embeddings stay


def test_pfedhn_refuses_a_hypernetwork_larger_than_the_machine_naming_the_key(tmp_path, grid_factory, monkeypatch):
    """Linear(hidden-dim -> every parameter) with momentum and gradient: 100 x ResNet-18's 11 M
    parameters is about 12.5 GiB; past the machine's memory the run stops before any round."""
    import pflower.strategies.pfedhn as pfedhn
    from pflower.build import build_strategy
    from pflower.config import load_settings

    cfg = run_config(method="pfedhn", num_server_rounds=1, results_dir=str(tmp_path))
    strategy = build_strategy(load_settings(cfg))
    size = sum(v.numel() for v in strategy.initial_arrays.to_torch_state_dict().values())
    monkeypatch.setattr(pfedhn, "physical_memory", lambda: 12 * 100 * size - 1)
    with pytest.raises(
        ValueError, match=rf"Linear\(pfedhn.hidden-dim=100 -> the model's {size:,} parameters\).*lower pfedhn.hidden-dim or run a smaller model"
    ):
        strategy.start(grid=grid_factory(cfg, 3))
    assert not (tmp_path / "metrics.json").exists()


def test_pfedhn_takes_one_step_a_round_however_the_replies_are_chunked():
    from pflower.strategies.hypernetwork import ModelGenerator, generator_update

    ids = torch.arange(6)
    trained = torch.randn(6, 10)
    whole, split = ModelGenerator.create(6, 10, 3, 16, 2, seed=0), ModelGenerator.create(6, 10, 3, 16, 2, seed=0)
    generator_update(whole, [(ids, trained)], lr=0.05)
    generator_update(split, [(ids[:4], trained[:4]), (ids[4:], trained[4:])], lr=0.05)
    assert all(torch.allclose(whole.params[k], split.params[k], atol=1e-6) for k in whole.params)
    assert all(torch.allclose(whole.velocity[k], split.velocity[k], atol=1e-6) for k in whole.velocity)


def test_a_personal_half_keeps_its_own_batchnorm_statistics():
    """Ditto's and pFedMe's personal model (lambda 1) trains and predicts with its own BatchNorm
    statistics; the federated half's, which are uploaded, stay as they were."""
    from pflower.models.mixing import AtLambda

    model = MixedModel(nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 3)))
    fed_before = model.fed[1].running_mean.clone()
    AtLambda(model, 1.0).train()(X * 3 + 1)
    assert torch.equal(model.fed[1].running_mean, fed_before)
    assert not torch.equal(model.local[1].running_mean, fed_before)
