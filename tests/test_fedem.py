"""FedEM: the E-step's responsibilities, the M-step's π and one weighted step of each component
by hand on two fixed linear components and three samples; the π-mixture's prediction by hand;
the server's per-component average weighted by n_t π_tk, and the π it requires of every
training reply; K = 1 as FedAvg, number for number; the bytes each way (K models); the keys'
bounds; the replies the server refuses (π among the arrays, a missing or non-finite component);
an E-step whose losses are not all finite; without Flower, two groups of clients with opposite
labels that specialize the two components under SGD and Adam (and the authors' weighting that
does not under Adam); and in process: π stays personal, metrics.json records it, and FedEM
learns on the default data."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import InProcessGrid, client_state, run_config
from flwr.app import RecordDict
from torch import nn

from pflower.build import build_model, build_strategy, client_method
from pflower.client_app.app import PERSONAL
from pflower.client_app.app import app as client_app
from pflower.client_app.fedem import responsibilities, sample_losses, weighted_cross_entropy
from pflower.config import ConfigError, load_settings
from pflower.datasets.federated import Split
from pflower.methods.fedem import PI_METRIC
from pflower.models.mixture import PI, Mixture
from pflower.records import from_record, payload_bytes, to_record
from pflower.strategies.validation import Reply
from pflower.training import evaluate

#: Three samples of two features, classes 0, 0, 1.
X = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
Y = torch.tensor([0, 0, 1])
LR = 0.5


def _toy(pi=(0.25, 0.75)) -> Mixture:
    """Component 0 the identity (logits = x), component 1 the swap (logits = (x_2, x_1)), no
    biases; π as given."""
    model = Mixture(nn.Linear(2, 2), 2)
    with torch.no_grad():
        model.components[0].weight.copy_(torch.eye(2))
        model.components[1].weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
        for c in model.components:
            c.bias.zero_()
        model.pi.copy_(torch.tensor(pi))
    return model


def _sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


#: The probability each component gives each sample's class: for logits (a, b), σ(a − b) for
#: class 0. Sample 1: (2, 0) and (0, 2); sample 2: (0, 2) and (2, 0); sample 3: (1, 1) for both.
P = [[_sigmoid(2), _sigmoid(-2), 0.5], [_sigmoid(-2), _sigmoid(2), 0.5]]


def test_e_step_and_m_step_by_hand():
    """ℓ_ki = −log p_ki; q_ki = π_k p_ki / Σ_j π_j p_ji; the new π is the mean of q over the samples."""
    model = _toy()
    losses = sample_losses(model, Split(X, Y))
    assert torch.allclose(losses, -torch.log(torch.tensor(P)), atol=1e-6)
    q = responsibilities(losses, model.pi)
    by_hand = [[0.25 * P[0][i] / (0.25 * P[0][i] + 0.75 * P[1][i]) for i in range(3)]]
    by_hand.append([1 - v for v in by_hand[0]])
    assert torch.allclose(q, torch.tensor(by_hand), atol=1e-6)
    assert q[0, 2] == pytest.approx(0.25)  # both components explain sample 3 alike: its q is π
    assert torch.allclose(q.mean(1), torch.tensor([sum(r) / 3 for r in by_hand]), atol=1e-6)


def test_a_component_of_weight_zero_takes_no_responsibility():
    q = responsibilities(torch.tensor([[1.0, 2.0], [0.5, 3.0]]), torch.tensor([1.0, 0.0]))
    assert torch.equal(q, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))


def test_weighted_loss_divides_by_the_batch_not_the_weights():
    logits, y, w = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]), torch.tensor([0.2, 0.6])
    ce = [math.log(1 + math.exp(-2)), math.log(1 + math.e)]
    assert float(weighted_cross_entropy(logits, y, w)) == pytest.approx((0.2 * ce[0] + 0.6 * ce[1]) / 2, rel=1e-6)
    assert float(weighted_cross_entropy(logits, y, torch.ones(2))) == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-7)  # weights of 1: the plain loss


def _client(**kw):
    return client_method(load_settings(run_config(**{"method": "fedem", "lr": LR, "batch_size": 3, "local_steps": 1, **kw})))


def test_one_round_of_the_client_by_hand():
    """π ← mean q; each component takes one SGD step on mean_i (q_ki / π_k) CE_ki (the three
    samples one batch): ∇_{W_k} = Σ_i (q_ki / π_k) (softmax_ki − e_{y_i}) x_iᵀ / 3; the loss
    reported is Σ_k of the components' weighted losses at the step."""
    model = _toy()
    q = responsibilities(sample_losses(model, Split(X, Y)), model.pi)
    before = [c.weight.detach().clone() for c in model.components]
    loss = _client().fit(model, Split(X, Y), {}, seed=0, server_round=1)
    assert torch.allclose(model.pi, q.mean(1)) and float(model.pi.sum()) == pytest.approx(1.0)
    expected_loss = 0.0
    for k, c in enumerate(model.components):
        logits = X @ before[k].T
        w = q[k] / q[k].mean()
        g = (logits.softmax(1) - F.one_hot(Y, 2)) * w[:, None] / 3
        assert torch.allclose(c.weight, before[k] - LR * g.T @ X, atol=1e-6), k
        assert torch.allclose(c.bias, -LR * g.sum(0), atol=1e-6), k
        expected_loss += float((w * -torch.log(torch.tensor(P[k]))).mean())
    assert loss == pytest.approx(expected_loss, rel=1e-6)


def test_local_steps_count_each_components_steps(monkeypatch):
    """``local-steps`` = 2: each of the K components trains exactly 2 minibatches, its own parameters only."""
    from pflower import training

    calls = []
    real = training.train

    def spy(model, data, **kw):
        calls.append((kw["steps"], {id(p) for p in kw["params"]}))
        return real(model, data, **kw)

    monkeypatch.setattr("pflower.client_app.base.train", spy)
    model = _toy()
    _client(local_steps=2).fit(model, Split(X, Y), {}, seed=0, server_round=1)
    assert [s for s, _ in calls] == [2, 2]
    assert [ids for _, ids in calls] == [{id(p) for p in c.parameters()} for c in model.components]


def test_the_prediction_is_the_pi_weighted_mixture_of_softmax_outputs():
    model = _toy()
    mix = 0.25 * (X @ torch.eye(2)).softmax(1) + 0.75 * (X @ torch.tensor([[0.0, 1.0], [1.0, 0.0]])).softmax(1)
    assert torch.allclose(model(X).exp(), mix, atol=1e-6)
    ev = evaluate(model, Split(X, Y))
    assert ev.accuracy == pytest.approx(float((mix.argmax(1) == Y).float().mean()))
    assert ev.loss == pytest.approx(float(-torch.log(mix[torch.arange(3), Y]).mean()), rel=1e-5)
    alone = _toy(pi=(1.0, 0.0))  # a component of weight 0 adds nothing: the other one's softmax
    assert torch.allclose(alone(X), F.log_softmax(X, 1), atol=1e-6)


def test_components_are_drawn_apart_and_pi_starts_uniform():
    s = load_settings(run_config(method="fedem"))
    model = build_model(s, s.image_shape, s.num_classes, 0)
    assert len(model.components) == 4 and torch.equal(model.pi, torch.full((4,), 0.25))
    firsts = [next(c.parameters()) for c in model.components]
    assert all(not torch.equal(firsts[0], f) for f in firsts[1:])
    base = build_model(load_settings(run_config(method="fedavg")), s.image_shape, s.num_classes, 0)
    assert all(torch.equal(v, model.state_dict()[f"components.0.{k}"]) for k, v in base.state_dict().items())  # component 0: FedAvg's init


def test_the_client_uploads_the_components_and_keeps_pi():
    s = load_settings(run_config(method="fedem", fedem__components=3, model="cnn-bn"))
    model = build_model(s, s.image_shape, s.num_classes, 0)
    keys = client_method(s).client_state(model).uploaded
    assert PI not in keys and keys == [k for k, v in model.state_dict().items() if k != PI and v.is_floating_point()]
    assert {k.split(".")[1] for k in keys} == {"0", "1", "2"} and any("running_mean" in k for k in keys)


def test_the_server_averages_each_component_by_samples_times_pi():
    """Two replies of 10 and 30 samples with π (0.2, 0.8) and (0.6, 0.4): component 0 becomes
    the 2:18 mean (10·0.2 : 30·0.6), component 1 the 8:12 mean; π is neither sent nor averaged.
    A component no reply uses (π_k = 0 everywhere) keeps its value."""
    settings = load_settings(run_config(method="fedem", fedem__components=2))
    strategy = build_strategy(settings)
    strategy.prepare(strategy.initial_arrays)
    assert PI not in strategy.upload_spec and PI not in strategy.global_arrays().keys()
    torch.manual_seed(3)
    ups = [{k: torch.randn_like(v) for k, v in strategy.global_state.items()} for _ in range(2)]
    strategy.aggregate(1, [Reply(0, 10, {PI_METRIC: [0.2, 0.8]}, ups[0]), Reply(1, 30, {PI_METRIC: [0.6, 0.4]}, ups[1])])
    assert {k.split(".")[1] for k in strategy.global_state} == {"0", "1"}
    for k, v in strategy.global_state.items():
        a = 0.1 if k.startswith("components.0.") else 0.4
        assert torch.allclose(v, a * ups[0][k] + (1 - a) * ups[1][k], atol=1e-6), k
    before = dict(strategy.global_state)
    strategy.aggregate(2, [Reply(0, 10, {PI_METRIC: [1.0, 0.0]}, ups[0]), Reply(1, 30, {PI_METRIC: [1.0, 0.0]}, ups[1])])
    for k, v in strategy.global_state.items():
        if k.startswith("components.1."):
            assert torch.equal(v, before[k]), k
        else:
            assert torch.allclose(v, 0.25 * ups[0][k] + 0.75 * ups[1][k], atol=1e-6), k


def test_the_server_requires_pi_of_length_k_in_every_training_reply():
    from pflower.strategies.validation import Rejected, check_metrics

    strategy = build_strategy(load_settings(run_config(method="fedem", fedem__components=3)))
    strategy.prepare(strategy.initial_arrays)
    schema = strategy.gate.schemas["train"]
    check_metrics({"num-examples": 5, "client-id": 0, "train-loss": 1.0, PI_METRIC: [0.2, 0.3, 0.5]}, schema, num_clients=2)
    for metrics, reason in [
        ({"num-examples": 5}, "missing"),
        ({"num-examples": 5, PI_METRIC: [0.5, 0.5]}, "length"),
        ({"num-examples": 5, PI_METRIC: [0.5, 1.5, 0.0]}, "range"),
    ]:
        with pytest.raises(Rejected) as err:
            check_metrics(metrics, schema, num_clients=2)
        assert err.value.reason.endswith(reason), (metrics, err.value.reason)


@pytest.mark.parametrize("value", [0, 33])
def test_components_out_of_bounds_is_refused_in_one_line(value):
    with pytest.raises(ConfigError, match="fedem.components") as err:
        load_settings(run_config(method="fedem", fedem__components=value))
    assert "\n" not in str(err.value).strip()


def _run(tmp_path, method: str, rounds: int, clients: int = 3, **kw) -> tuple[dict, object, InProcessGrid]:
    cfg = run_config(method=method, num_server_rounds=rounds, results_dir=str(tmp_path), **kw)
    strategy = build_strategy(load_settings(cfg))
    grid = InProcessGrid(client_app, cfg, clients)
    strategy.start(grid=grid)
    return json.loads((tmp_path / "metrics.json").read_text()), strategy, grid


def test_one_component_is_fedavg_number_for_number(tmp_path, no_figures):
    """K = 1: the same seed gives FedAvg's global model bit for bit after 2 rounds, and its
    accuracies; the losses agree to rounding (a mixture of one is log-softmax, FedAvg's logits)."""
    kw = dict(local_epochs=1, samples_per_client=60)
    ours, fedem, _ = _run(tmp_path / "fedem", "fedem", 2, fedem__components=1, **kw)
    theirs, fedavg, _ = _run(tmp_path / "fedavg", "fedavg", 2, **kw)
    assert fedem.global_state.keys() == {f"components.0.{k}" for k in fedavg.global_state}
    assert all(torch.equal(v, fedem.global_state[f"components.0.{k}"]) for k, v in fedavg.global_state.items())
    for a, b in zip(ours["rounds"], theirs["rounds"]):
        assert a["accuracy"] == b["accuracy"] and a["per-client-accuracy"] == b["per-client-accuracy"]
        assert a["bytes-up"] > 0 and a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["train-loss"] == pytest.approx(b["train-loss"], rel=1e-6)


def test_bytes_each_way_are_k_models(tmp_path, no_figures):
    """K = 2, 3 clients, one round: each training message and each reply carries the 2 components
    (exactly twice FedAvg's model), each evaluation message the same; π never travels."""
    doc, strategy, grid = _run(tmp_path, "fedem", 1, local_epochs=1, samples_per_client=40, fedem__components=2, single_message=False)
    s = load_settings(run_config(method="fedem", fedem__components=2))
    model = build_model(s, s.image_shape, s.num_classes, 0)
    components = payload_bytes(RecordDict({"a": to_record(model.state_dict(), client_method(s).client_state(model).uploaded)}))
    base = build_model(load_settings(run_config(method="fedavg")), s.image_shape, s.num_classes, 0)
    one = payload_bytes(RecordDict({"a": to_record(base.state_dict())}))
    assert components == 2 * one
    row = doc["rounds"][0]
    assert row["bytes-up"] == 3 * components and row["bytes-down"] == 3 * components + 3 * components  # training, then evaluation
    assert not any(PI in m.content["arrays"].keys() for m in grid.sent if "arrays" in m.content.array_records)


def test_pi_stays_personal_and_fedem_learns_on_the_default_data(tmp_path, no_figures):
    """Three rounds on digits (3 clients of 4 classes each, the default 5 local epochs, K = 2):
    the mean test accuracy rises every round; each client's π is its own, a distribution, no
    longer uniform, kept in its personal state, and recorded in metrics.json."""
    doc, _, grid = _run(tmp_path, "fedem", 3, fedem__components=2)
    acc = [r["accuracy"] for r in doc["rounds"]]
    assert acc[0] < acc[1] < acc[2] and acc[2] > acc[0] + 0.2, acc
    pis = {str(ctx.node_config["partition-id"]): from_record(client_state(ctx)[PERSONAL])[PI] for ctx in grid.contexts.values()}
    assert all(float(p.sum()) == pytest.approx(1.0, abs=1e-6) and not torch.equal(p, torch.full((2,), 0.5)) for p in pis.values())
    first, second = list(pis.values())[:2]
    assert not torch.equal(first, second)
    reported = doc["rounds"][-1][PI_METRIC]  # the π of each client's last round, as metrics.json records it
    assert reported == {c: [round(float(x), 6) for x in p] for c, p in pis.items()}
    assert doc["evaluation"]["evaluates"].startswith("the mixture of the K components")


def test_a_component_that_cannot_score_a_sample_leaves_pi_a_distribution():
    """A component whose output overflows on a sample (its loss NaN or +inf) explains that sample
    with probability 0; a sample no component of positive weight can score keeps π as its q. π
    stays a distribution, so the client's next round, with healthy components, is the ordinary
    one (a NaN π would be saved in its personal state and make every later round NaN)."""
    inf, nan = float("inf"), float("nan")
    q = responsibilities(torch.tensor([[0.5, nan, inf, 1.0], [inf, 2.0, nan, 1.0]]), torch.tensor([0.25, 0.75]))
    assert torch.equal(q[:, 0], torch.tensor([1.0, 0.0])) and torch.equal(q[:, 1], torch.tensor([0.0, 1.0]))
    assert torch.allclose(q[:, 2], torch.tensor([0.25, 0.75]))  # no evidence: the prior
    assert torch.allclose(q[:, 3], torch.tensor([0.25, 0.75]))
    only = responsibilities(torch.tensor([[inf], [1.0]]), torch.tensor([1.0, 0.0]))  # the one finite component has weight 0
    assert torch.equal(only, torch.tensor([[1.0], [0.0]]))

    model = _toy()
    with torch.no_grad():
        model.components[1].weight[0, 0] = inf  # sample 1 (2, 0): logits (inf, 0), a NaN loss; sample 2 (0, 2): inf * 0, NaN
    _client().fit(model, Split(X, Y), {}, seed=0, server_round=1)
    assert torch.isfinite(model.pi).all() and float(model.pi.sum()) == pytest.approx(1.0)
    healthy = _toy()
    healthy.pi.copy_(model.pi)
    _client().fit(healthy, Split(X, Y), {}, seed=0, server_round=2)
    assert torch.isfinite(healthy.pi).all() and all(torch.isfinite(p).all() for p in healthy.parameters())


def test_the_server_refuses_a_reply_with_pi_a_missing_component_or_a_non_finite_one():
    """The upload spec is the K components exactly: a reply carrying π, one missing a component's
    key, or one with a NaN in a single component is rejected whole (the other components too)."""
    from pflower.strategies.validation import Rejected, check_arrays

    strategy = build_strategy(load_settings(run_config(method="fedem", fedem__components=2)))
    strategy.prepare(strategy.initial_arrays)
    good = dict(strategy.global_state)
    key = next(k for k in good if k.startswith("components.1."))
    bad = {
        "keys": [{**good, PI: torch.tensor([0.5, 0.5])}, {k: v for k, v in good.items() if k != key}],
        "non-finite": [{**good, key: torch.full_like(good[key], float("nan"))}],
        "shape": [{**good, key: good[key].flatten()}],
    }
    assert check_arrays(to_record(good), strategy.upload_spec).keys() == good.keys()
    for reason, states in bad.items():
        for state in states:
            with pytest.raises(Rejected) as err:
                check_arrays(to_record(state), strategy.upload_spec)
            assert err.value.reason == reason


def _flipped_labels(groups: list[int], n: int = 64) -> list[tuple[Split, Split]]:
    """Per client (train, test) of 2-d Gaussian points, the label 1[x_1 > 0] in group 0 and its
    opposite in group 1: no single model fits both groups, a mixture of two does."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for group in groups:
        x = torch.randn(2 * n, 2, generator=gen)
        y = (x[:, 0] > 0).long() ^ group
        out.append((Split(x[:n], y[:n]), Split(x[n:], y[n:])))
    return out


def _toy_federation(optimizer: str, lr: float, rounds: int, authors: bool = False) -> tuple[list[torch.Tensor], list[float]]:
    """FedEM without Flower on :func:`_flipped_labels` (3 clients per group, K = 2 linear
    components, 1 local epoch of batches of 16): the client's E-step, M-step and training, the
    server's :meth:`FedEM.aggregate`. ``authors``: their weighting instead (loss weights q, the
    server's weights n_t). Returns each client's π and test accuracy after ``rounds``."""
    from pflower.client_app import fedem as client_fedem
    from pflower.strategies.fedem import FedEM

    groups = [0, 0, 0, 1, 1, 1]
    data = _flipped_labels(groups)
    client = client_method(load_settings(run_config(method="fedem", optimizer=optimizer, lr=lr, batch_size=16, local_epochs=1, fedem__components=2)))
    torch.manual_seed(0)
    model = Mixture(nn.Linear(2, 2), 2)
    keys = [k for k in model.state_dict() if k != PI]
    server = FedEM()
    server.prepare(to_record(model.state_dict(), keys))
    states = [{PI: model.pi.clone()} for _ in groups]
    weigh, threads = client_fedem.sample_weights, torch.get_num_threads()
    if authors:
        client_fedem.sample_weights = lambda q, pi: q
    torch.set_num_threads(1)  # tiny tensors: one thread is the fastest, as the ClientApp's (client-threads)
    try:
        for rnd in range(1, rounds + 1):
            replies = []
            for c, (train, _) in enumerate(data):
                model.load_state_dict(server.global_state | states[c])
                metrics = client.before_fit(model, train, RecordDict(), rnd)
                client.fit(model, train, {}, seed=100 * rnd + c, server_round=rnd)
                states[c] = {PI: model.pi.clone()}
                metrics = {PI_METRIC: [0.5, 0.5]} if authors else metrics  # equal weights: the server's are n_t
                replies.append(Reply(c, len(train), metrics, {k: v.clone() for k, v in model.state_dict().items() if k in keys}))
            server.aggregate(rnd, replies)
    finally:
        client_fedem.sample_weights = weigh
        torch.set_num_threads(threads)
    accuracy = []
    for c, (_, test) in enumerate(data):
        model.load_state_dict(server.global_state | states[c])
        accuracy.append(evaluate(model, test).accuracy)
    return [s[PI] for s in states], accuracy


@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.5), ("adam", 0.05)])
def test_two_groups_specialize_the_two_components(optimizer, lr):
    """On two groups of clients with opposite labels, after 20 rounds each group puts > 0.9 of π
    on its own component, the two groups on different ones, and every client's mixture is right
    on > 90 % of its test points (one model would be right on about half)."""
    pis, accuracy = _toy_federation(optimizer, lr, 20)
    a, b = int(pis[0].argmax()), int(pis[3].argmax())
    assert a != b, pis
    assert all(float(p[a]) > 0.9 for p in pis[:3]) and all(float(p[b]) > 0.9 for p in pis[3:]), pis
    assert min(accuracy) > 0.9, accuracy


def test_with_adam_the_authors_weighting_leaves_the_components_alike():
    """The authors' weighting (loss weights q, the server's n_t) under Adam: π still drifts apart
    but each component trains at Adam's full step on every client, so neither fits a group and
    the mixtures stay near chance; the same run with the n_t π_tk weighting fits both groups
    (:func:`test_two_groups_specialize_the_two_components`)."""
    _, accuracy = _toy_federation("adam", 0.05, 20, authors=True)
    assert sum(accuracy) / len(accuracy) < 0.7, accuracy
