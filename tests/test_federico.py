"""FedeRiCo: the overlay, the client's EM pieces, and the relay (in process)."""

import json

import numpy as np
import pytest
import torch
from conftest import client_state, run_config
from flwr.app import Array, ArrayRecord, MessageType, RecordDict
from torch import nn

from pflower.build import build_strategy
from pflower.client_app.federico import Mixture, choose_neighbours, collaboration_weights, e_step_loss, track
from pflower.config import load_settings
from pflower.datasets.federated import Split
from pflower.overlay import View
from pflower.records import from_record, to_record
from pflower.strategies.federico import RELAY, FedericoRelay


# ------------------------------------------------------------------ overlay
def test_view_merge_keeps_the_youngest_entries_never_itself():
    v = View(0, 3, {1: 5, 2: 1})
    v.merge({0: 0, 1: 2, 3: 4, 4: 0})
    assert v.ages == {1: 2, 2: 1, 4: 0}  # 3 (age 4) is the oldest of four: dropped
    v.tick()
    assert v.ages == {1: 3, 2: 2, 4: 1} and v.oldest() == 1
    buf = v.shuffle_buffer(np.random.default_rng(0), partner=1)
    assert buf[0] == 0 and 1 not in buf and len(buf) == 1  # itself plus size//2 - 1 = 0 others
    v.remove(1)
    assert v.peers == [2, 4]


def _gossip(views: dict[int, View], rounds: int, rng: np.random.Generator, alive=None) -> None:
    """The overlay alone, as the FedeRiCo steps run it: plan (tick, buffer), serve (reply, merge), use (merge)."""
    for _ in range(rounds):
        alive_now = set(views) if alive is None else alive
        plans = {}
        for i in sorted(alive_now):
            views[i].tick()
            p = views[i].oldest()
            plans[i] = (p, views[i].shuffle_buffer(rng, p))
        replies = {}
        for i, (p, buf) in sorted(plans.items()):
            if p in alive_now:
                replies[i] = views[p].reply_buffer(rng, i)
                views[p].merge(buf)
        for i, (p, _) in sorted(plans.items()):
            if p is None:
                continue
            if i in replies:
                views[i].merge(replies[i])
            else:
                views[i].remove(p)


def _connected(views: dict[int, View], members: set[int]) -> bool:
    seen, todo = set(), [min(members)]
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        todo += [j for j in views[i].peers if j in members]
        todo += [j for j in members if i in views[j].peers]
    return seen == members


def test_gossip_fills_partial_views_drops_the_dead_and_admits_newcomers():
    n, size = 30, 5
    rng = np.random.default_rng(0)
    views = {i: View(i, size, {(i + 1) % n: 0}) for i in range(n)}  # each knows one contact
    _gossip(views, 15, rng)
    assert all(len(v.peers) == size for v in views.values())  # partial: 5 of 29
    assert _connected(views, set(range(n)))
    degree = np.bincount([j for v in views.values() for j in v.peers], minlength=n)
    assert degree.min() >= 1  # everyone is known by someone
    alive = set(range(n)) - {7}
    _gossip(views, 25, rng, alive)
    assert not [i for i in alive if 7 in views[i].peers]  # the dead client left every view
    views[n] = View(n, size, {3: 0})  # a newcomer that knows one peer
    _gossip(views, 10, rng, alive | {n})
    assert len(views[n].peers) == size and any(n in views[i].peers for i in alive)


# ------------------------------------------------------------------ EM pieces
def test_weights_are_softmax_of_minus_the_tracked_ema_losses():
    losses = track({}, {0: 1.0, 2: 3.0}, beta=0.5)
    assert losses == {0: 1.0, 2: 3.0}
    losses = track(losses, {2: 1.0, 5: 0.5}, beta=0.5)
    assert losses == {0: 1.0, 2: 2.0, 5: 0.5}
    w = collaboration_weights(losses)
    expected = torch.softmax(-torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64), 0)
    assert list(w) == [0, 2, 5] and np.allclose(list(w.values()), expected.numpy())


def test_the_e_step_loss_is_the_mean_per_sample_so_weights_do_not_scale_with_data_size():
    """Duplicating a client's data leaves its E-step losses, hence its weights, unchanged (the
    sum would double the gap between two models and square their weight ratio)."""
    torch.manual_seed(0)
    data = Split(torch.randn(40, 1, 8, 8), torch.randint(0, 10, (40,)))
    twice = Split(torch.cat([data.x, data.x]), torch.cat([data.y, data.y]))
    models = [nn.Sequential(nn.Flatten(), nn.Linear(64, 10)) for _ in range(2)]
    once = {j: e_step_loss(m, data) for j, m in enumerate(models)}
    doubled = {j: e_step_loss(m, twice) for j, m in enumerate(models)}
    assert doubled == pytest.approx(once)
    w = collaboration_weights(once)
    assert w[0] / w[1] == pytest.approx(np.exp(once[1] - once[0]))
    assert collaboration_weights(doubled) == pytest.approx(w)


def test_epsilon_zero_picks_the_top_weight_peers():
    weights = {0: 0.1, 1: 0.05, 2: 0.4, 3: 0.3, 4: 0.15}
    rng = np.random.default_rng(1)
    for _ in range(20):
        assert choose_neighbours(0, weights, [1, 5, 6], 3, 0.0, rng) == [2, 3, 4]
    explored = {tuple(choose_neighbours(0, weights, [1, 5, 6], 2, 1.0, rng)) for _ in range(30)}
    assert all(set(c) <= {1, 5, 6} and len(set(c)) == 2 for c in explored) and len(explored) > 1
    assert choose_neighbours(0, {0: 1.0}, [3], 3, 0.0, rng) == [3]  # nothing tracked yet: the view


def test_mixture_is_the_weighted_average_of_the_members_softmax():
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    m = Mixture([a, b], [1.0, 3.0])
    expected = 0.25 * a(x).softmax(1) + 0.75 * b(x).softmax(1)
    assert torch.allclose(m(x).exp(), expected, atol=1e-6)


# ------------------------------------------------------------------ the relay, in process
def _run(grid_factory, tmp_path, n, rounds, **kw):
    cfg = run_config(method="federico", num_server_rounds=rounds, local_epochs=1, results_dir=str(tmp_path), **kw)
    strategy = build_strategy(load_settings(cfg))
    plans = {}

    def tamper(cid, reply):
        if reply.metadata.message_type == RELAY and "plan" in reply.content.config_records:
            plans.setdefault(cid, []).append([int(j) for j in reply.content["plan"]["neighbours"]])
        return reply

    grid = grid_factory(cfg, n, tamper=tamper)
    held = []
    real = strategy.run_round

    def run_round(*args, **kwargs):  # after every round: does the server hold a model?
        row = real(*args, **kwargs)
        held.append(_tensors(vars(strategy)))
        return row

    strategy.run_round = run_round
    strategy.start(grid=grid)
    return strategy, grid, json.loads((tmp_path / "metrics.json").read_text()), plans, held


def _tensors(obj, depth=0) -> int:
    """How many tensors, arrays or array records ``obj`` reaches."""
    if isinstance(obj, (torch.Tensor, np.ndarray, Array, ArrayRecord)):
        return 1
    if depth > 6:
        return 0
    if isinstance(obj, RecordDict):
        return len(obj.array_records)
    if isinstance(obj, dict):
        return sum(_tensors(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return sum(_tensors(v, depth + 1) for v in obj)
    return 0


def test_relay_holds_no_model_and_clients_get_only_the_models_they_chose(grid_factory, tmp_path):
    n, rounds = 5, 3
    strategy, grid, doc, plans, held = _run(grid_factory, tmp_path, n, rounds, partition="label-groups", label_groups=2)
    assert isinstance(strategy, FedericoRelay) and held == [0] * rounds
    use = [m for m in grid.sent if m.metadata.message_type == RELAY and m.content["config"]["phase"] == "use"]
    assert len(use) == n * rounds
    for r in range(rounds):
        for msg in use[n * r : n * (r + 1)]:
            cid = grid.contexts[msg.metadata.dst_node_id].node_config["partition-id"]
            got = sorted(int(k.removeprefix("model-")) for k in msg.content.array_records)
            assert got and set(got) <= set(plans[cid][r])
    for row in doc["rounds"]:
        assert set(row["relayed-bytes"]) == {"plan", "serve", "use", "update"}
        assert row["relayed-bytes"]["plan"] == 0 and row["relayed-bytes"]["use"] > 0
        assert set(row["collaboration-weights"]) == {str(i) for i in range(n)}
        for w in row["collaboration-weights"].values():
            assert sum(w.values()) == pytest.approx(1.0)
    # every round's evaluation rides on the next round's first step (plan), the last round's goes alone
    assert [m.metadata.message_type for m in grid.sent].count(MessageType.EVALUATE) == n
    plan = [m for m in grid.sent if m.metadata.message_type == RELAY and m.content["config"]["phase"] == "plan"]
    assert [m.content["evaluate"]["server-round"] for m in plan if "evaluate" in m.content.config_records] == [r for r in range(1, rounds) for _ in range(n)]
    assert (tmp_path / "collaboration-weights.png").stat().st_size > 5000


def test_a_client_unlike_everyone_keeps_most_weight_on_itself(grid_factory, tmp_path):
    # 5 clients in 3 disjoint label groups: two pairs and one client alone with its labels.
    cfg = load_settings(run_config(partition="label-groups", label_groups=3))
    from pflower.datasets.federated import federated_indices

    groups = federated_indices(cfg, 5).groups
    alone = [i for i in range(5) if (groups == groups[i]).sum() == 1]
    assert len(alone) == 1
    _, _, doc, _, _ = _run(grid_factory, tmp_path, 5, 6, partition="label-groups", label_groups=3)
    weights = doc["rounds"][-1]["collaboration-weights"]
    me = str(alone[0])
    assert weights[me][me] > 0.5
    for c, w in weights.items():  # everyone: more weight on its own group than on the others
        same = sum(v for j, v in w.items() if groups[int(j)] == groups[int(c)])
        assert same > 0.5, (c, w)


def test_federico_is_deterministic_for_a_seed(grid_factory, tmp_path):
    _, _, a, _, _ = _run(grid_factory, tmp_path / "a", 4, 2)
    _, _, b, _, _ = _run(grid_factory, tmp_path / "b", 4, 2)
    for ra, rb in zip(a["rounds"], b["rounds"]):
        assert ra["per-client-accuracy"] == rb["per-client-accuracy"]
        assert ra["collaboration-weights"] == rb["collaboration-weights"]


def test_a_client_that_drops_out_leaves_every_view_and_the_rounds_go_on(grid_factory, tmp_path):
    cfg = run_config(method="federico", num_server_rounds=6, local_epochs=1, results_dir=str(tmp_path), federico__view_size=3)
    strategy = build_strategy(load_settings(cfg))
    grid = grid_factory(cfg, 6)
    real = strategy.run_round

    def run_round(grid_, rnd, *args, **kwargs):
        if rnd == 2:
            grid.offline.add(105)  # client 5's SuperNode is gone from round 2 on
        return real(grid_, rnd, *args, **kwargs)

    strategy.run_round = run_round
    strategy.start(grid=grid)
    rounds = json.loads((tmp_path / "metrics.json").read_text())["rounds"]
    # round 1's evaluation went with round 2's first messages: client 5's node was gone by then
    assert all(r["missing"] == [5] for r in rounds)
    assert all(sorted(r["per-client-accuracy"]) == ["0", "1", "2", "3", "4"] for r in rounds)
    views = {c.node_config["partition-id"]: list(client_state(c)["federico"]["view-ids"]) for n, c in grid.contexts.items() if n != 105}
    assert all(5 not in v and len(v) > 0 for v in views.values()), views


def test_relayed_nan_wrong_shapes_and_malformed_shuffles_are_refused_counted_and_never_forwarded(grid_factory, tmp_path):
    """Client 1 serves a NaN model, client 2 sends updates of the wrong shape, client 3 plans
    with a shuffle of unknown ids, client 4 answers shuffles with negative ages: each is
    refused under its reason, counted per round, reaches no client, and the run finishes."""
    from collections import Counter

    from pflower.overlay.peer_sampling import buffer_problem

    cfg = run_config(method="federico", num_server_rounds=3, local_epochs=1, results_dir=str(tmp_path))
    strategy = build_strategy(load_settings(cfg))
    spec = {k: tuple(v.shape) for k, v in from_record(strategy.initial_arrays).items()}
    applied: dict[int, Counter] = {}

    def tamper(cid, reply):
        sent = grid.sent[-1].content.config_records.get("config")
        if sent is None or reply.has_error():  # the identity query
            return reply
        rnd, phase, c = int(sent["server-round"]), sent.get("phase"), reply.content
        count = applied.setdefault(rnd, Counter())
        if phase == "serve" and cid == 1 and "model" in c.array_records:
            c["model"] = ArrayRecord({k: Array(np.full(v.shape, np.nan, dtype=np.float32)) for k, v in from_record(c["model"]).items()})
            count["non-finite"] += 1
        if phase == "use" and cid == 2:
            for name in list(c.array_records):
                arrays = from_record(c[name])
                first = next(iter(arrays))
                c[name] = to_record({**arrays, first: arrays[first][..., :1]})
                count["shape"] += 1
        if phase == "plan" and cid == 3:
            c["gossip"]["ids"] = [99]
            count["malformed"] += 1
        if phase == "serve" and cid == 4:
            for name in [n for n in c.config_records if n.startswith("gossip-reply-")]:
                c[name]["ages"] = [-1] * len(c[name]["ids"])
                count["malformed"] += 1
        return reply

    grid = grid_factory(cfg, 5, tamper=tamper)
    strategy.start(grid=grid)
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert [r["round"] for r in doc["rounds"]] == [1, 2, 3] and all(r["accuracy"] is not None for r in doc["rounds"])
    assert all(applied[r]["non-finite"] + applied[r]["shape"] > 0 for r in (1, 2, 3))  # the corruptions happened
    assert [dict(r["rejected"]) for r in doc["rounds"]] == [dict(applied[r]) for r in (1, 2, 3)]
    for msg in grid.sent:  # no client ever received any of it
        for name, record in msg.content.array_records.items():
            if not len(record):
                continue  # evaluation's empty arrays
            arrays = from_record(record)
            assert {k: tuple(v.shape) for k, v in arrays.items()} == spec, name
            assert all(torch.isfinite(v).all() for v in arrays.values()), name
        for name, record in msg.content.config_records.items():
            if name.startswith("gossip"):
                assert buffer_problem(record["ids"], record["ages"], 5, 4) is None, name


@pytest.mark.parametrize("name", ["update-²", "update-٣", "update-①"])
def test_a_relayed_update_named_by_a_non_ascii_digit_is_refused_not_a_crash(grid_factory, tmp_path, name):
    """Client 2 names its first update of each round ``name`` (``'²'.isdigit()`` is true and
    ``int('²')`` raises; ``int('٣')`` is 3): refused as malformed each round, and the run finishes."""
    cfg = run_config(method="federico", num_server_rounds=2, local_epochs=1, results_dir=str(tmp_path))
    renamed = []

    def tamper(cid, reply):
        sent = grid.sent[-1].content.config_records.get("config")
        if sent is not None and not reply.has_error() and sent.get("phase") == "use" and cid == 2:
            if updates := [n for n in reply.content.array_records if n.startswith("update-")]:
                reply.content[name] = reply.content[updates[0]]
                del reply.content[updates[0]]
                renamed.append(int(sent["server-round"]))
        return reply

    grid = grid_factory(cfg, 5, tamper=tamper)
    build_strategy(load_settings(cfg)).start(grid=grid)
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert renamed and [r["rejected"].get("malformed", 0) for r in doc["rounds"]] == [renamed.count(r) for r in (1, 2)]
