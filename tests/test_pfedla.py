"""pFedLA / HeurpFedLA: hypernetwork math (no Flower), and the strategy in process."""

import json

import numpy as np
import pytest
import torch
from conftest import client_state, run_config
from flwr.app import ConfigRecord, RecordDict

from pflower.build import build_strategy
from pflower.config import ConfigError, load_settings
from pflower.records import from_record, payload_bytes, to_record
from pflower.similarity import alpha_structure, group_order
from pflower.strategies.hypernetwork import HyperNetworks, hypernetwork_update, layer_norms, mix

SEGMENTS = [(0, 6), (6, 10)]  # two layers of a 10-parameter model


def test_alpha_is_a_distribution_per_layer():
    hn = HyperNetworks.create(5, 2, 8, 8, 100, seed=0)
    a = hn.alpha(torch.tensor([0, 3]))
    assert a.shape == (2, 2, 5)
    assert torch.allclose(a.sum(-1), torch.ones(2, 2)) and (a >= 0).all()


def test_all_zero_weights_fall_back_to_the_client_itself():
    hn = HyperNetworks.create(4, 2, 8, 8, 100, seed=0)
    hn.params["hb"][:] = -100.0  # ReLU kills every head output
    a = hn.alpha(torch.tensor([2]))
    assert torch.equal(a[0, :, 2], torch.ones(2)) and a[0].sum() == 2


def test_mix_is_layerwise_weighted_sum():
    theta = torch.arange(30, dtype=torch.float32).reshape(3, 10)
    alpha = torch.tensor([[[1.0, 0, 0], [0, 0.5, 0.5]]])
    out = mix(alpha, theta, SEGMENTS)
    assert torch.equal(out[0, :6], theta[0, :6])
    assert torch.equal(out[0, 6:], 0.5 * (theta[1, 6:] + theta[2, 6:]))


def test_a_step_moves_the_personalized_model_along_the_update():
    torch.manual_seed(0)
    hn = HyperNetworks.create(3, 2, 8, 8, 100, seed=0)
    theta = torch.randn(3, 10)
    ids = torch.tensor([0, 2])
    bar = mix(hn.alpha(ids), theta, SEGMENTS)
    trained = bar + 0.3 * torch.randn_like(bar)
    before = (bar - trained).norm(dim=1)
    hypernetwork_update(hn, ids, theta, trained - bar, SEGMENTS, lr=0.05)
    after = (mix(hn.alpha(ids), theta, SEGMENTS) - trained).norm(dim=1)
    assert (after < before).all()
    untouched = HyperNetworks.create(3, 2, 8, 8, 100, seed=0)
    assert torch.equal(hn.params["w1"][1], untouched.params["w1"][1])  # client 1 was not updated


def test_two_groups_learn_to_aggregate_within_their_group():
    """Clients 0,1 pull toward target A, clients 2,3 toward B: weights concentrate within groups."""
    n, group = 4, torch.tensor([0, 0, 1, 1])
    targets = torch.stack([torch.full((10,), 3.0), torch.full((10,), -3.0)])
    hn = HyperNetworks.create(n, 2, 16, 16, 100, seed=1)
    theta = torch.zeros(n, 10)
    ids = torch.arange(n)
    same = group[:, None] == group[None, :]

    def within_share():
        a = hn.alpha(ids).detach()  # [N, L, N]
        return (a * same[:, None, :]).sum(-1).mean().item()

    start = within_share()
    for _ in range(60):
        with torch.no_grad():
            bar = mix(hn.alpha(ids), theta, SEGMENTS)
        trained = bar + 0.5 * (targets[group] - bar)  # one local "training" step
        theta = trained  # kept, then the step at the kept models (the strategy's order)
        hypernetwork_update(hn, ids, theta, trained - bar, SEGMENTS, lr=0.02)
    end = within_share()
    assert start == pytest.approx(0.5, abs=0.05)
    assert end > 0.8 and end > start + 0.25


def test_the_step_does_not_depend_on_the_scale_of_a_layer():
    """The loss per layer is divided by the layer's spread over clients: scaling one layer's
    parameters (theta and trained alike) leaves the step, hence alpha, unchanged."""
    torch.manual_seed(0)
    theta = torch.randn(3, 10)
    ids = torch.tensor([0, 1, 2])
    trained = theta + 0.3 * torch.randn(3, 10)
    big = torch.ones(10)
    big[6:] = 1000.0  # layer 2 a thousand times larger
    steps = []
    for factor in (torch.ones(10), big):
        hn = HyperNetworks.create(3, 2, 8, 8, 100, seed=0)
        hypernetwork_update(hn, ids, theta * factor, (trained - theta) * factor, SEGMENTS, lr=0.05)
        steps.append(hn.alpha(ids).detach())
    assert torch.allclose(steps[0], steps[1], atol=1e-5)
    assert not torch.allclose(steps[0], HyperNetworks.create(3, 2, 8, 8, 100, seed=0).alpha(ids), atol=1e-4)


def test_layer_norms_are_the_clients_squared_norms_per_layer_by_chunks_of_rows():
    theta = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    want = torch.stack([(theta[:, :1].double() ** 2).sum(), (theta[:, 1:].double() ** 2).sum()])
    for chunk in (1, 2, 64):
        assert torch.allclose(layer_norms(theta, [(0, 1), (1, 4)], chunk=chunk), want, rtol=1e-12)
    assert layer_norms(theta, [(0, 1), (1, 4)]).dtype == torch.float64


def test_the_step_hardly_moves_the_weights_where_the_clients_agree():
    """Clients whose models differ only by noise (IID data): a step along updates that are noise
    too moves the weights far less than where the models differ (the loss is scaled by the
    clients' norms, not by their spread, which vanishes as they agree)."""
    g = torch.Generator().manual_seed(0)
    base, ids = torch.randn(10, generator=g), torch.arange(4)
    moved = {}
    for name, apart in (("alike", 0.01), ("apart", 1.0)):
        theta = base + apart * torch.randn(4, 10, generator=g)
        hn = HyperNetworks.create(4, 2, 8, 8, 100, seed=0)
        before = hn.alpha(ids).detach()
        hypernetwork_update(hn, ids, theta, 0.05 * torch.randn(4, 10, generator=g), SEGMENTS, lr=100.0)
        moved[name] = (hn.alpha(ids).detach() - before).abs().max().item()
    assert moved["alike"] < moved["apart"] / 10


def test_alpha_structure_on_hand_made_weights():
    classes = [[0, 1], [0, 1], [2, 3], [2, 3]]
    alpha = np.full((4, 1, 4), 0.1)
    for i in range(4):
        alpha[i, 0, i] = 0.5  # self, excluded from both means
        alpha[i, 0, i ^ 1] = 0.3  # the other client of the same class set
    st = alpha_structure(alpha, classes)
    assert st["same"] == [pytest.approx(0.3)] and st["disjoint"] == [pytest.approx(0.1)]
    assert st["ratio"] == [pytest.approx(3.0)] and st["overlap-correlation"][0] == pytest.approx(1.0)
    assert alpha_structure(np.full((4, 1, 4), 0.25), classes)["overlap-correlation"] == [None]
    assert group_order([[2, 3], [0, 1], [2, 3], [0, 1]]) == [1, 3, 0, 2]


def test_the_paper_s_head_start_damps_every_step_on_the_weights_by_about_1_over_n_squared():
    """``head-start='sum-n'`` (raw outputs 1 each, as the paper leaves them) starts at the same
    near-uniform weights as ``sum-1`` (1/N each), but the same loss moves them about N² less."""
    n = 10
    theta, ids = torch.randn(n, 10, generator=torch.Generator().manual_seed(0)), torch.arange(n)
    moved = {}
    for start in ("sum-1", "sum-n"):
        hn = HyperNetworks.create(n, 2, 8, 8, 100, seed=0, head_start=start)
        before = hn.alpha(ids).detach()
        assert torch.allclose(before, torch.full_like(before, 1 / n), rtol=0.02)
        raw = hn.params["hb"][0, 0, 0].item()
        assert raw == pytest.approx(1 / n if start == "sum-1" else 1.0)
        hypernetwork_update(hn, ids, theta, 0.3 * theta[[1, 2, 3, 4, 5, 6, 7, 8, 9, 0]], SEGMENTS, lr=0.05)
        moved[start] = (hn.alpha(ids).detach() - before).abs().max().item()
    assert n**2 / 3 < moved["sum-1"] / moved["sum-n"] < 3 * n**2


@pytest.mark.parametrize(("layer_loss", "scale_of_each_layer"), [("norm", "the clients' squared norms"), ("raw", "1")])
def test_the_layer_loss_switch_divides_each_layer_s_loss_by_the_clients_norms_or_by_nothing(
    grid_factory, tmp_path, monkeypatch, layer_loss, scale_of_each_layer
):
    import pflower.strategies.pfedla as module

    seen = []
    real = module.hypernetwork_update
    monkeypatch.setattr(module, "hypernetwork_update", lambda *a, norms, **kw: seen.append(norms) or real(*a, norms=norms, **kw))
    strategy, grid = _strategy_and_grid(grid_factory, tmp_path, method="pfedla", pfedla__layer_loss=layer_loss, pfedla__head_start="sum-n")
    assert strategy.hn.params["hb"][0, 0, 0].item() == pytest.approx(1.0)
    msgs = strategy.configure_train(1, strategy.global_arrays(), ConfigRecord({"server-round": 1}), grid)
    strategy.aggregate_train(1, grid.send_and_receive(msgs))
    kept = strategy.theta  # the trained models: the step is taken at them
    want = layer_norms(kept, strategy.segments) if layer_loss == "norm" else torch.ones(len(strategy.segments), dtype=torch.float64)
    assert len(seen) == 1 and torch.equal(seen[0], want) and (layer_loss == "raw") == bool((want == 1).all())


def test_an_unknown_head_start_or_layer_loss_is_a_config_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="pfedla.head-start"):
        load_settings(run_config(method="pfedla", pfedla__head_start="sum-2", results_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="pfedla.layer-loss"):
        load_settings(run_config(method="pfedla", pfedla__layer_loss="none", results_dir=str(tmp_path)))


def _strategy_and_grid(grid_factory, tmp_path, **kw):
    cfg = run_config(num_server_rounds=2, local_epochs=1, results_dir=str(tmp_path), **kw)
    strategy = build_strategy(load_settings(cfg))
    grid = grid_factory(cfg, 3)
    strategy.connect(grid, timeout=5)
    return strategy, grid


@pytest.mark.parametrize("k", [1, 2])
def test_heurpfedla_does_not_send_retained_layers(grid_factory, tmp_path, k):
    strategy, grid = _strategy_and_grid(grid_factory, tmp_path, method="heurpfedla", heurpfedla__top_k=k)
    msgs = strategy.configure_train(1, strategy.global_arrays(), ConfigRecord({"server-round": 1}), grid)
    with torch.no_grad():
        alpha = strategy.hn.alpha(torch.arange(strategy.federation.num_clients))
        bar = mix(alpha, strategy.theta, strategy.segments)
    mask = strategy.retained_layers(alpha, torch.arange(strategy.federation.num_clients))
    for msg in msgs:
        cid = strategy.federation.client_of[msg.metadata.dst_node_id]
        retained = {k for l, layer in enumerate(strategy.layers) if mask[cid, l] for k in layer.keys}
        full = to_record(strategy.spec.unflatten(bar[cid]))
        sent = from_record(msg.content["arrays"])
        assert all(torch.equal(sent[key], full_t) for key, full_t in strategy.spec.unflatten(bar[cid]).items() if key in sent)
        layer_keys = [set(l.keys) for l in strategy.layers]
        assert sum(keys <= retained for keys in layer_keys) == k
        assert not retained & set(msg.content["arrays"].keys())
        saved = sum(len(full[key].data) for key in retained)
        assert payload_bytes(msg.content) == payload_bytes(RecordDict({"arrays": full})) - saved
    replies = grid.send_and_receive(msgs)
    assert all(set(r.content["arrays"].keys()) == set(strategy.spec.keys) for r in replies)


def test_a_retained_layer_s_weights_keep_learning_from_an_update_measured_from_the_client_s_own_layer(grid_factory, tmp_path):
    """HeurpFedLA: what a client was sent is its own layer where it retains one (the update is
    measured from there), and the step moves the weights of its retained layer as of any other:
    a layer that stops being retained is mixed with current weights."""
    strategy, grid = _strategy_and_grid(grid_factory, tmp_path, method="heurpfedla", heurpfedla__top_k=1)
    msgs = strategy.configure_train(1, strategy.global_arrays(), ConfigRecord({"server-round": 1}), grid)
    ids = list(range(strategy.federation.num_clients))
    mask = strategy._retained_mask(ids)
    sent = strategy.sent(ids)
    for cid in ids:
        (layer,) = mask[cid].nonzero().flatten().tolist()
        a, b = strategy.segments[layer]
        assert torch.equal(sent[cid, a:b], strategy.theta[cid, a:b])
    before = strategy.hn.params["hw"].clone()
    strategy.aggregate_train(1, grid.send_and_receive(msgs))
    for cid in ids:
        (layer,) = mask[cid].nonzero().flatten().tolist()
        assert not torch.equal(strategy.hn.params["hw"][cid, layer], before[cid, layer])


def test_pfedla_k0_sends_the_whole_personalized_model(grid_factory, tmp_path):
    strategy, grid = _strategy_and_grid(grid_factory, tmp_path, method="pfedla")
    msgs = strategy.configure_train(1, strategy.global_arrays(), ConfigRecord({"server-round": 1}), grid)
    assert all(list(m.content["arrays"].keys()) == list(strategy.spec.keys) for m in msgs)


def test_top_k_larger_than_layers_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="'heurpfedla.top-k' = 9 .* <= 4"):
        build_strategy(load_settings(run_config(method="heurpfedla", heurpfedla__top_k=9, results_dir=str(tmp_path))))


def test_server_keeps_trained_models_and_updates_only_replying_hypernetworks(grid_factory, tmp_path):
    strategy, grid = _strategy_and_grid(grid_factory, tmp_path, method="pfedla", fraction_train=0.67)
    initial = strategy.theta.clone()
    before = {k: v.clone() for k, v in strategy.hn.params.items()}
    msgs = strategy.configure_train(1, strategy.global_arrays(), ConfigRecord({"server-round": 1}), grid)
    replies = grid.send_and_receive(msgs)
    trained = {strategy.federation.client_of[r.metadata.src_node_id]: strategy.spec.flatten(from_record(r.content["arrays"])) for r in replies}
    strategy.aggregate_train(1, replies)
    assert all(not r.content.array_records for r in replies)  # decoded replies drop their wire bytes
    sampled = sorted(trained)
    (idle,) = set(range(3)) - set(sampled)
    for cid, flat in trained.items():
        assert torch.equal(strategy.theta[cid], flat)
    assert torch.equal(strategy.theta[idle], initial[idle])
    assert torch.equal(strategy.hn.params["w1"][idle], before["w1"][idle])
    assert not torch.equal(strategy.hn.params["w1"][sampled[0]], before["w1"][sampled[0]])


@pytest.mark.parametrize("method", ["pfedla", "heurpfedla"])
def test_run_records_alpha(grid_factory, tmp_path, method):
    cfg = run_config(method=method, num_server_rounds=3, results_dir=str(tmp_path))
    build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, 3))
    doc = json.loads((tmp_path / "metrics.json").read_text())
    alpha = doc["rounds"][-1]["alpha"]
    assert sorted(alpha) == ["0", "1", "2"]
    assert len(alpha["0"]) == 4 and all(len(row) == 3 and abs(sum(row) - 1) < 1e-3 for row in alpha["0"])
    assert doc["rounds"][-1]["accuracy"] > 0.5
    assert (tmp_path / "alpha-heatmap.png").stat().st_size > 0 and (tmp_path / "alpha-evolution.png").stat().st_size > 0


def test_pflower_plot_redraws_figures_from_metrics(tmp_path):
    from pflower.plots import main

    n, layers = 3, 2
    alpha = {str(i): [[1 / n] * n for _ in range(layers)] for i in range(n)}
    rows = [{"round": r, "accuracy": 0.5, "weighted-accuracy": 0.5, "alpha": alpha} for r in (1, 2)]
    (tmp_path / "metrics.json").write_text(json.dumps({"config": {"method": "pfedla", "dataset": "digits"}, "rounds": rows}))
    assert main([str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.glob("*.png")} == {"accuracy.png", "alpha-heatmap.png", "alpha-evolution.png"}


def test_heurpfedla_reference_is_what_the_client_started_from(grid_factory, tmp_path):
    """update_reference (the update-norm bound, the hypernetwork step) = the arrays sent, with the
    retained layers from the client's own model: its personal state when the message came."""
    strategy, grid = _strategy_and_grid(grid_factory, tmp_path, method="heurpfedla", heurpfedla__top_k=2)
    for rnd in (1, 2):
        own = {strategy.federation.node_of[c]: from_record(client_state(ctx)["personal"]) if "personal" in client_state(ctx) else None
               for c, ctx in ((strategy.federation.client_of[n], grid.contexts[n]) for n in grid.contexts)}  # fmt: skip
        msgs = strategy.configure_train(rnd, strategy.global_arrays(), ConfigRecord({"server-round": rnd}), grid)
        for msg in msgs:
            cid = strategy.federation.client_of[msg.metadata.dst_node_id]
            sent = from_record(msg.content["arrays"])
            start = own[msg.metadata.dst_node_id] or from_record(strategy.initial_arrays)
            ref = strategy.update_reference(cid)
            assert len(set(strategy.spec.keys) - set(sent)) > 0
            for key in strategy.spec.keys:
                assert torch.allclose(ref[key], sent[key] if key in sent else start[key]), (rnd, cid, key)
        strategy.aggregate_train(rnd, grid.send_and_receive(msgs))


def _evaluate_locally(cfg, cid, num_clients, state):
    """A client's test metrics for a model state, computed outside Flower."""
    from pflower.build import build_model
    from pflower.datasets.federated import client_data
    from pflower.training import evaluate

    s = load_settings(cfg)
    model = build_model(s, s.image_shape, s.num_classes, s.seed)
    model.load_state_dict(state, strict=False)
    return evaluate(model, client_data(s, cid, num_clients)[1])


@pytest.mark.parametrize("method", ["pfedla", "heurpfedla"])
def test_pfedla_evaluates_the_personalized_model_as_the_server_sends_it(grid_factory, tmp_path, method):
    """After a round, the evaluate message carries bar_theta_i from the updated weights and models
    (retained layers left out), and the reported accuracy is that model's, not the trained one's."""
    strategy, grid = _strategy_and_grid(grid_factory, tmp_path, method=method, heurpfedla__top_k=1)
    for rnd in (1, 2):
        msgs = strategy.configure_train(rnd, strategy.global_arrays(), ConfigRecord({"server-round": rnd}), grid)
        strategy.aggregate_train(rnd, grid.send_and_receive(msgs))
    with torch.no_grad():
        alpha = strategy.hn.alpha(torch.arange(3))
        bar = mix(alpha, strategy.theta, strategy.segments)
    msgs = strategy.configure_evaluate(2, strategy.global_arrays(), ConfigRecord({"server-round": 2}), grid)
    replies = {strategy.federation.client_of[r.metadata.src_node_id]: r for r in grid.send_and_receive(msgs)}
    cfg = grid.contexts[100].run_config
    for msg in msgs:
        cid = strategy.federation.client_of[msg.metadata.dst_node_id]
        sent = from_record(msg.content["arrays"])
        expected = strategy.spec.unflatten(bar[cid])
        assert len(sent) == len(expected) - (2 if method == "heurpfedla" else 0)  # a retained layer: weight and bias
        assert all(torch.allclose(sent[k], expected[k]) for k in sent)
        personal = from_record(client_state(grid.contexts[msg.metadata.dst_node_id])["personal"])
        assert not all(torch.equal(personal[k], sent[k]) for k in sent)  # not the trained model
        got = replies[cid].content["metrics"]
        want = _evaluate_locally(cfg, cid, 3, {**personal, **sent})
        assert got["accuracy"] == pytest.approx(want.accuracy) and got["loss"] == pytest.approx(want.loss, rel=1e-5)


def test_alpha_leaves_uniform_on_a_real_model(grid_factory, tmp_path):
    """Digits, 6 clients in 2 label groups, 4 rounds of 1 epoch: the weights on the own group
    pull ahead in every layer; with hn-lr=0 they stay exactly at their initial values."""
    runs = {}
    for hn_lr in (100.0, 0.0):
        cfg = run_config(partition="label-groups", label_groups=2, num_server_rounds=4, local_epochs=1, pfedla__hn_lr=hn_lr,
                         results_dir=str(tmp_path / str(hn_lr)))  # fmt: skip
        build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, 6))
        runs[hn_lr] = json.loads((tmp_path / str(hn_lr) / "metrics.json").read_text())
    learned, frozen = runs[100.0]["rounds"], runs[0.0]["rounds"]
    structure = learned[-1]["alpha-structure"]
    assert all(same > 1.3 * disjoint for same, disjoint in zip(structure["same"], structure["disjoint"]))
    assert np.abs(np.array([learned[-1]["alpha"][str(i)] for i in range(6)]) - 1 / 6).max() > 0.03
    assert all(r["alpha"] == frozen[0]["alpha"] for r in frozen)
    assert np.abs(np.array([frozen[0]["alpha"][str(i)] for i in range(6)]) - 1 / 6).max() < 0.005
    assert runs[100.0]["evaluation"] == {
        "evaluates": "its personalized model as the server sends it (HeurpFedLA: its retained layers its own)",
        "finetune-epochs": 0,
    }


def test_two_groups_that_share_no_class_personalize_in_round_1(grid_factory, tmp_path):
    """Digits, 6 clients in 2 label groups (no class in common), 1 round of 1 epoch: in every
    layer each client's weight on its own group exceeds the uniform start's share (1/2) and its
    weight on each other client of its group exceeds that on any client of the other group; its
    personalized model is more accurate than FedAvg's global model after the same round."""
    docs = {}
    for method in ("pfedla", "fedavg"):
        cfg = run_config(method=method, partition="label-groups", label_groups=2, num_server_rounds=1, local_epochs=1,
                         results_dir=str(tmp_path / method))  # fmt: skip
        build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, 6))
        docs[method] = json.loads((tmp_path / method / "metrics.json").read_text())
    first = docs["pfedla"]["rounds"][0]
    classes = {int(c): set(v) for c, v in docs["pfedla"]["client-classes"].items()}
    for i in range(6):
        group = [j for j in range(6) if classes[j] == classes[i]]
        others = [j for j in range(6) if j not in group]
        assert len(group) == 3 and not classes[i] & classes[others[0]]
        for weights in first["alpha"][str(i)]:
            assert sum(weights[j] for j in group) > 0.5, (i, weights)
            assert min(weights[j] for j in group if j != i) > max(weights[j] for j in others), (i, weights)
    assert first["accuracy"] > docs["fedavg"]["rounds"][0]["accuracy"] + 0.1


def test_heurpfedla_client_whose_reply_was_lost_gets_every_layer_next(grid_factory, tmp_path):
    """Client 0's round-1 reply is lost: it kept retained layers the server never saw, so its
    round-2 message carries every layer (the reference is then exactly what it received), and
    from round 3, with its reply accepted, it retains again."""
    from flwr.app import Error, Message

    cfg = run_config(method="heurpfedla", heurpfedla__top_k=2, num_server_rounds=3, local_epochs=1, results_dir=str(tmp_path))
    strategy = build_strategy(load_settings(cfg))
    lost = {"done": False}

    def tamper(cid, reply):
        if cid == 0 and reply.metadata.message_type == "train" and not lost["done"]:
            lost["done"] = True
            return Message(Error(code=0, reason="lost"), reply_to=grid.sent[-1])
        return reply

    grid = grid_factory(cfg, 3, tamper=tamper)
    strategy.connect(grid, timeout=5)
    sent_keys = {}
    for rnd in (1, 2, 3):
        msgs = strategy.configure_train(rnd, strategy.global_arrays(), ConfigRecord({"server-round": rnd}), grid)
        sent = {strategy.federation.client_of[m.metadata.dst_node_id]: from_record(m.content["arrays"]) for m in msgs}
        sent_keys[rnd] = {c: set(a) for c, a in sent.items()}
        if rnd == 2:
            ref = strategy.update_reference(0)
            assert all(torch.equal(ref[k], sent[0][k]) for k in strategy.spec.keys)
        strategy.aggregate_train(rnd, grid.send_and_receive(msgs))
    full = set(strategy.spec.keys)
    assert sent_keys[1][0] != full and sent_keys[2][0] == full and sent_keys[3][0] != full
    assert sent_keys[2][1] != full and sent_keys[2][2] != full  # the others kept retaining
    assert strategy.state_dict()["unsynced"] == []


def test_heatmap_is_drawn_when_some_clients_never_said_their_classes(tmp_path):
    from pflower.plots import draw_run

    alpha = {str(i): [[0.25] * 4 for _ in range(2)] for i in range(4)}
    doc = {"config": {"method": "pfedla", "dataset": "digits"}, "client-classes": {"0": [1], "1": [1], "3": [2]},
           "rounds": [{"round": 1, "accuracy": 0.5, "weighted-accuracy": 0.5, "alpha": alpha}]}  # fmt: skip
    assert (tmp_path / "alpha-heatmap.png") in draw_run(doc, tmp_path)


@pytest.mark.parametrize("method", ["pfedla", "heurpfedla"])
def test_lazy_evaluation_records_are_the_eager_ones_built_a_chunk_at_a_time(grid_factory, tmp_path, monkeypatch, method):
    """The evaluation's records, built a chunk at a time as they are sent, are those an eager
    build made when the evaluation was configured, also after the next round's training
    messages marked clients unsynced (HeurpFedLA sends those every layer)."""
    monkeypatch.setattr("pflower.strategies.personal.CHUNK", 2)
    strategy, grid = _strategy_and_grid(grid_factory, tmp_path, method=method, heurpfedla__top_k=1)
    msgs = strategy.configure_train(1, strategy.global_arrays(), ConfigRecord({"server-round": 1}), grid)
    strategy.aggregate_train(1, grid.send_and_receive(msgs))
    ids = [0, 1, 2]
    eager = strategy.personalized(ids)[0]
    lazy = strategy.evaluate_arrays(1, ids)
    assert list(lazy) == ids and lazy.builds == 0
    strategy.configure_train(2, strategy.global_arrays(), ConfigRecord({"server-round": 2}), grid)  # marks its clients unsynced
    for cid in ids:
        assert [(k, a.data) for k, a in lazy[cid].items()] == [(k, a.data) for k, a in eager[cid].items()]
    assert lazy.builds == 2  # chunks [0, 1] and [2], each once
    assert lazy[0].keys() == eager[0].keys() and lazy.builds == 3  # only the last chunk is kept


def test_the_weights_line_says_why_a_figure_is_a_dash():
    """The main job's last line of weights printed 'ratio -, -, -, -' unexplained: a '-' now comes
    with its reason (no two clients share a class set; all weight in a layer on the client itself)."""
    from pflower.strategies.pfedla import _dashes

    main_job = {"ratio": [None] * 4, "same": [None] * 4, "disjoint": [0.1, 0.0, 0.0, 0.1], "overlap-correlation": [0.43, None, None, 0.42]}
    assert _dashes(main_job) == " (ratio -: no two clients have the same class set; correlation -: every other client gets the same weight in that layer)"
    assert (
        _dashes({"ratio": [2.0, None], "same": [0.2, 0.3], "disjoint": [0.1, 0.0], "overlap-correlation": [0.4, 0.5]})
        == " (ratio -: no weight on clients sharing no class)"
    )
    assert _dashes({"ratio": [2.0], "same": [0.2], "disjoint": [0.1], "overlap-correlation": [0.4]}) == ""
