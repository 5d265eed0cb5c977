"""Clustered FL: the cosine similarities, the optimal bipartition and the split criterion by hand
on small update vectors; the server's FedAvg within each cluster, its split and partial
participation by hand on mock replies, with state and resumption exact; in process: bytes each
way are FedAvg's, a run splits its clients along their label groups, and it learns on digits."""

import json
import logging
import math

import pytest
import torch
from conftest import InProcessGrid, assert_same_state, run_config
from flwr.app import RecordDict

from pflower.build import build_model, build_strategy
from pflower.checkpoint import load_checkpoint
from pflower.client_app.app import app as client_app
from pflower.config import ConfigError, load_settings
from pflower.records import from_record, payload_bytes, to_record
from pflower.strategies.cfl import ClusteredFL, cosine_similarities, optimal_bipartition, split_check
from pflower.strategies.validation import Reply

D = torch.float64


def test_cosine_similarities_by_hand():
    u = torch.tensor([[3.0, 4.0], [-3.0, -4.0], [4.0, -3.0], [0.0, 0.0]], dtype=D)
    s = cosine_similarities(u)
    want = torch.tensor([[1, -1, 0, 0], [-1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], dtype=D)
    assert torch.allclose(s, want, atol=1e-12)  # a zero update is similar to nothing


def test_four_clients_in_two_opposite_directions_split_into_the_right_pairs():
    """Clients 0 and 2 move one way, 1 and 3 the other: the bipartition is {0, 2}, {1, 3}, the
    largest similarity across it the (negative) one of the closest opposite pair."""
    u = torch.tensor([[1.0, 0.1, 0.0], [-1.0, 0.0, 0.1], [0.9, 0.0, 0.0], [-1.0, -0.2, 0.0]], dtype=D)
    s = cosine_similarities(u)
    assert optimal_bipartition(s) == ([0, 2], [1, 3])
    record, parts = split_check(u, torch.ones(4, dtype=D), eps1=0.5, eps2=0.5, gamma_max=0.0, may_split=True)
    mean = u.mean(0)
    assert record["mean-norm"] == pytest.approx(float(mean.norm()))
    assert record["mean-norm"] < 0.1
    assert record["max-norm"] == pytest.approx(math.sqrt(1.04))
    assert parts == ([0, 2], [1, 3])
    assert record["cross-similarity"] == pytest.approx(float(max(s[i, j] for i in (0, 2) for j in (1, 3))))
    assert record["cross-similarity"] < -0.9


def test_the_bipartition_is_the_optimum_of_every_split():
    """On random similarity matrices of 2 to 6 clients: no split of the clients in two has a smaller
    largest similarity across it (brute force over all 2^(n−1) − 1 of them)."""
    g = torch.Generator().manual_seed(0)
    for n in (2, 3, 4, 5, 6):
        for _ in range(20):
            s = cosine_similarities(torch.randn(n, 4, generator=g, dtype=D))
            first, second = optimal_bipartition(s)
            assert sorted(first + second) == list(range(n)) and first and second and 0 in first
            best = min(float(s[[i for i in range(n) if m >> i & 1]][:, [i for i in range(n) if not m >> i & 1]].max()) for m in range(1, 2**n - 1))
            assert float(s[first][:, second].max()) == pytest.approx(best, abs=1e-12)


def test_the_bipartition_cuts_a_chain_where_complete_linkage_does_not():
    """Similarities −|x_i − x_j| of points 0, 2, 3.9, 5.7, 7.4 on a line (gaps 2, 1.9, 1.8, 1.7):
    the optimum cuts the widest gap, {0} | rest, largest similarity across −2. Complete linkage
    (the reference code's) merges {3, 4} (1.7), {1, 2} (1.9), then {0} with {1, 2} (3.9 < 5.4),
    ending at {0, 1, 2} | {3, 4}, whose largest similarity across is −1.8: worse for the objective."""
    x = torch.tensor([0.0, 2.0, 3.9, 5.7, 7.4], dtype=D)
    s = -(x[:, None] - x[None, :]).abs()
    assert optimal_bipartition(s) == ([0], [1, 2, 3, 4])
    assert float(s[[0]][:, [1, 2, 3, 4]].max()) == pytest.approx(-2.0)
    assert float(s[[0, 1, 2]][:, [3, 4]].max()) == pytest.approx(-1.8)


def test_no_split_when_the_mean_update_is_large_or_every_update_small_or_gamma_max_refuses():
    u = torch.tensor([[1.0, 0.0], [0.8, 0.2], [-1.0, 0.1], [-0.9, 0.0]], dtype=D)
    w = torch.tensor([1.0, 1.0, 4.0, 1.0], dtype=D)  # weighted mean (−3.1, 0.6) / 7: norm ≈ 0.451
    mean_norm = math.hypot(3.1, 0.6) / 7
    record, parts = split_check(u, w, eps1=0.4, eps2=0.5, gamma_max=0.0, may_split=True)
    assert record == {"mean-norm": pytest.approx(mean_norm), "max-norm": pytest.approx(math.hypot(1.0, 0.1))} and parts is None
    assert split_check(u, w, eps1=0.5, eps2=0.5, gamma_max=0.0, may_split=True)[1] == ([0, 1], [2, 3])
    assert split_check(u, w, eps1=0.5, eps2=1.01, gamma_max=0.0, may_split=True)[1] is None  # max norm 1.005 is not > 1.01
    assert split_check(u, w, eps1=0.5, eps2=0.5, gamma_max=0.0, may_split=False)[1] is None
    record, parts = split_check(u, w, eps1=0.5, eps2=0.5, gamma_max=0.99, may_split=True)
    assert parts is None and math.sqrt((1 - record["cross-similarity"]) / 2) < 0.99  # the split was found, γ_max refused it


def test_identical_or_parallel_updates_never_split_whatever_the_rounding():
    """Clients whose updates are the same direction (identical, or scaled) have α = 1 across any
    split: γ_max = 0 must not split them because their computed cosine is 1 − 2e-16 (it did, for
    about a third of random 1,000-coordinate directions and for every 100,000-coordinate one).
    Updates 1e-6 apart in angle still split."""
    g = torch.Generator().manual_seed(0)
    for size, tries in ((1_000, 20), (100_000, 2)):
        for _ in range(tries):
            v = torch.randn(1, size, generator=g, dtype=D)
            for scale in ([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 0.3, 7.0]):
                u = v * torch.tensor(scale, dtype=D)[:, None]
                record, parts = split_check(u, torch.ones(4, dtype=D), eps1=1e9, eps2=0.0, gamma_max=0.0, may_split=True)
                assert parts is None, (size, scale, record)
    u = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 2e-6], [1.0, 2e-6]], dtype=D)  # α across: 1 − 2e-12
    assert split_check(u, torch.ones(4, dtype=D), eps1=1e9, eps2=0.0, gamma_max=0.0, may_split=True)[1] == ([0, 1], [2, 3])


def _strategy(**kw) -> tuple[ClusteredFL, dict]:
    torch.manual_seed(3)
    x0 = {"w": torch.randn(2, 2), "b": torch.randn(2), "bn.running_mean": torch.randn(2)}
    strategy = ClusteredFL(**{"eps1": 0.5, "eps2": 0.5, "warmup_rounds": 1, "parameters": ["w", "b"], **kw})
    strategy.federation.num_clients = 4
    strategy.federation.node_of = {c: 100 + c for c in range(4)}
    strategy.prepare(to_record(x0))
    return strategy, x0


def _reply(cid: int, base: dict, direction: float, n: int, stat: float = 5.0) -> Reply:
    """Client ``cid`` moved ``base`` by ``direction`` times a fixed pattern (the running statistic by ``stat``)."""
    pattern = {"w": torch.tensor([[1.0, 0.5], [0.0, -0.5]]), "b": torch.tensor([0.5, 0.0])}
    arrays = {k: base[k] + direction * pattern[k] + 0.01 * cid for k in ("w", "b")}
    return Reply(cid, n, {}, {**arrays, "bn.running_mean": base["bn.running_mean"] + stat})


def _average(replies: list[Reply]) -> dict:
    n = sum(r.num_examples for r in replies)
    return {k: sum(r.num_examples * r.arrays[k].double() for r in replies) / n for k in replies[0].arrays}


def test_fedavg_within_clusters_a_split_and_partial_participation_by_hand():
    """4 clients, sample counts 10, 20, 30, 40. Round 1 (warm-up): one cluster, its model their
    average by samples. Round 2: 0 and 2 move one way, 1 and 3 the other, the mean update small:
    the cluster splits into {0, 2} and {1, 3}, each averaging its own members. Round 3: only 0 and
    2 reply; cluster {1, 3} keeps its model. Running statistics are averaged, not in the norms."""
    strategy, x0 = _strategy()
    n = {0: 10, 1: 20, 2: 30, 3: 40}
    assert strategy.clusters == [[0, 1, 2, 3]] and all(from_record(strategy.train_arrays(1, [c])[c]).keys() == x0.keys() for c in n)

    replies = [_reply(c, x0, (1, -1, 1, -1)[c], n[c]) for c in n]
    strategy.aggregate(1, replies)
    assert strategy.clusters == [[0, 1, 2, 3]] and strategy.round_extras(1)["cfl"][0]["split"] is False  # warm-up
    for k, v in _average(replies).items():
        assert torch.allclose(strategy.models[0][k].double(), v, atol=1e-6), k
    m1 = dict(strategy.models[0])

    replies = [_reply(c, m1, (2, -1, 2, -1.5)[c], n[c]) for c in (3, 1, 0, 2)]  # arrival order does not matter
    strategy.aggregate(2, replies)
    assert strategy.clusters == [[0, 2], [1, 3]]
    updates = {r.client_id: torch.cat([(r.arrays[k] - m1[k]).reshape(-1) for k in ("w", "b")]).double() for r in replies}
    mean = sum(n[c] * updates[c] for c in n) / 100
    (record,) = strategy.round_extras(2)["cfl"]
    assert record["mean-norm"] == pytest.approx(float(mean.norm()), rel=1e-6)  # the statistic's +5 is not in it
    assert record["mean-norm"] < 0.5
    assert record["max-norm"] == pytest.approx(max(float(u.norm()) for u in updates.values()), rel=1e-6)
    assert record["split"] is True and record["clients"] == [0, 1, 2, 3] and record["replied"] == 4
    by_id = {r.client_id: r for r in replies}
    for cluster, members in enumerate(([0, 2], [1, 3])):
        for k, v in _average([by_id[c] for c in members]).items():
            assert torch.allclose(strategy.models[cluster][k].double(), v, atol=1e-6), (cluster, k)
        for c in members:  # each client is sent its cluster's model, to train and to evaluate
            assert all(torch.equal(from_record(strategy.train_arrays(3, [c])[c])[k], strategy.models[cluster][k]) for k in x0)
            assert all(torch.equal(from_record(strategy.evaluate_arrays(3, [c])[c])[k], strategy.models[cluster][k]) for k in x0)
    glob = from_record(strategy.global_arrays())  # the cluster models averaged by their clients' samples
    num = strategy.federation.num_examples
    weights = [sum(num.get(c, 1) for c in m) for m in ([0, 2], [1, 3])]
    for k in x0:
        want = (weights[0] * strategy.models[0][k].double() + weights[1] * strategy.models[1][k].double()) / sum(weights)
        assert torch.allclose(glob[k].double(), want, atol=1e-6), k

    state = strategy.state_dict()
    resumed, _ = _strategy()
    resumed.load_state_dict(state)
    assert_same_state(resumed.state_dict(), state)
    assert resumed.clusters == [[0, 2], [1, 3]] and resumed.cluster_of == {0: 0, 2: 0, 1: 1, 3: 1}

    kept = dict(strategy.models[1])
    for s in (strategy, resumed):
        s.aggregate(3, [_reply(c, s.models[0], 0.3, n[c]) for c in (0, 2)])
        assert s.clusters == [[0, 2], [1, 3]] and all(torch.equal(s.models[1][k], kept[k]) for k in x0)
        assert s.round_extras(3)["cfl"][1] == {"clients": [1, 3], "replied": 0}
    assert_same_state(resumed.state_dict(), strategy.state_dict())


def test_a_cluster_splits_only_when_all_its_clients_replied_and_it_is_large_enough():
    """Round 2 with three of the four clients: no split (the criterion needs every member's
    update). A cluster below ``min_split_size`` does not split either."""
    strategy, x0 = _strategy()
    strategy.aggregate(2, [_reply(c, x0, (1, -1, 1, -1)[c], 10) for c in (0, 1, 2)])
    assert strategy.clusters == [[0, 1, 2, 3]] and strategy.round_extras(2)["cfl"][0]["replied"] == 3
    strategy, x0 = _strategy(min_split_size=5)
    strategy.aggregate(2, [_reply(c, x0, (1, -1, 1, -1)[c], 10) for c in range(4)])
    assert strategy.clusters == [[0, 1, 2, 3]]


def test_a_client_away_blocks_no_split_and_joins_the_first_cluster_when_back(caplog):
    """Client 3 never answered (not in the federation's nodes): the other three's replies split
    the cluster; when 3 comes back it is in no cluster and joins the first."""
    strategy, x0 = _strategy(min_split_size=3)
    del strategy.federation.node_of[3]
    strategy.aggregate(2, [_reply(c, x0, (1, -1, 1)[c], 10) for c in (0, 1, 2)])
    assert strategy.clusters == [[0, 2], [1]]
    strategy.federation.node_of[3] = 103
    arrays = strategy.train_arrays(3, [1, 3])
    left, x1 = _strategy(min_split_size=3)  # a client that left (still known): no split, and the log says why
    with caplog.at_level(logging.INFO):
        left.aggregate(2, [_reply(c, x1, (1, -1, 1)[c], 10) for c in (0, 1, 2)])
    assert left.clusters == [[0, 1, 2, 3]] and "cluster [0, 1, 2, 3] may split only once all its clients reply; [3] did not" in caplog.text
    assert strategy.clusters == [[0, 2, 3], [1]] and arrays[3] is strategy.train_arrays(3, [0])[0]


def test_runs_that_can_never_split_are_named_in_the_log(caplog):
    """1 or 2 clients under the default ``min-split-size`` 3 never split, nor does a run that
    samples fewer than all clients a round (the first cluster holds every client and splits only
    when all of them replied): the server says so at the start instead of running FedAvg
    silently. 3 clients, or 4 with fraction-train 0.9 (all 4 sampled), say nothing."""
    cases = ((1, 1.0, "min-split-size=3 exceeds the federation's 1 clients"), (2, 1.0, "min-split-size=3 exceeds the federation's 2 clients"),
             (3, 1.0, None), (10, 0.5, "fraction-train=0.5 samples 5 of the 10 clients a round"), (4, 0.9, None))  # fmt: skip
    for clients, fraction, warning in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flwr"):
            strategy = ClusteredFL(fraction_train=fraction)
            strategy.federation.num_clients = clients
            strategy.prepare(to_record({"w": torch.zeros(2)}))
        assert strategy.clusters == [list(range(clients))]
        assert (warning in caplog.text) if warning else "Clustered FL" not in caplog.text, (clients, fraction, caplog.text)


@pytest.mark.parametrize(
    "key,value,fragment",
    [("cfl.eps1", 0.0, "greater than 0"), ("cfl.eps2", -1.0, "greater than or equal to 0"), ("cfl.gamma-max", 1.0, "less than 1"),
     ("cfl.warmup-rounds", -1, "greater than or equal to 0"), ("cfl.min-split-size", 1, "greater than or equal to 2")],
)  # fmt: skip
def test_bad_keys_are_refused_naming_key_value_and_rule(key, value, fragment):
    with pytest.raises(ConfigError) as err:
        load_settings(run_config(method="cfl", **{key.replace(".", "__").replace("-", "_"): value}))
    msg = str(err.value)
    assert "\n" not in msg.strip() and f"'{key}'" in msg and repr(value) in msg and fragment in msg


def _run(tmp_path, rounds: int, clients: int, **kw) -> tuple[dict, ClusteredFL]:
    cfg = run_config(method="cfl", num_server_rounds=rounds, results_dir=str(tmp_path), **kw)
    settings = load_settings(cfg)
    strategy = build_strategy(settings)
    strategy.start(grid=InProcessGrid(client_app, cfg, clients), checkpoint=load_checkpoint(settings) if settings.resume_from else None)
    return json.loads((tmp_path / "metrics.json").read_text()), strategy


def test_bytes_each_way_are_fedavgs(tmp_path, no_figures):
    """A client is sent its cluster's model and uploads its own: FedAvg's bytes each way."""
    kw = dict(local_epochs=1, samples_per_client=60, single_message=False)
    ours, strategy = _run(tmp_path / "cfl", 1, 3, **kw)
    cfg = run_config(method="fedavg", num_server_rounds=1, results_dir=str(tmp_path / "fedavg"), **kw)
    build_strategy(load_settings(cfg)).start(grid=InProcessGrid(client_app, cfg, 3))
    fedavg = json.loads((tmp_path / "fedavg" / "metrics.json").read_text())
    s = load_settings(cfg)
    base = build_model(s, s.image_shape, s.num_classes, 0)
    model = payload_bytes(RecordDict({"a": to_record({k: v for k, v in base.state_dict().items() if v.is_floating_point()})}))
    row, theirs = ours["rounds"][0], fedavg["rounds"][0]
    assert row["bytes-up"] == theirs["bytes-up"] == 3 * model
    assert row["bytes-down"] == theirs["bytes-down"] == 6 * model  # training, then evaluation
    assert payload_bytes(RecordDict({"a": strategy.train_arrays(2, [0])[0]})) == model


SPLITTING = dict(local_epochs=1, samples_per_client=60, partition="label-groups", cfl__warmup_rounds=1, cfl__eps1=100.0, cfl__eps2=0.0, cfl__gamma_max=0.5)


def test_clients_split_along_their_label_groups_and_a_resumed_run_keeps_the_clusters(tmp_path, no_figures):
    """4 clients in 2 label groups, splits allowed from round 2: round 2 splits the clients by
    group and nothing splits again (γ_max keeps each group together). A run stopped after round
    2 and resumed to 4 ends with the uninterrupted run's rows and server state."""
    doc, full = _run(tmp_path / "full", 4, 4, **SPLITTING)
    groups = sorted({tuple(c for c, classes in doc["client-classes"].items() if classes == g) for g in doc["client-classes"].values()})
    assert len(groups) == 2 and doc["rounds"][0]["clusters"] == [[0, 1, 2, 3]]
    assert sorted(tuple(str(c) for c in m) for m in doc["rounds"][1]["clusters"]) == groups
    assert [r["clusters"] for r in doc["rounds"][2:]] == [doc["rounds"][1]["clusters"]] * 2
    assert [r["cfl"][0]["split"] for r in doc["rounds"][:2]] == [False, True]

    _run(tmp_path / "first", 2, 4, **SPLITTING)
    resumed_doc, resumed = _run(tmp_path / "second", 4, 4, resume_from=str(tmp_path / "first"), **SPLITTING)
    time = {"wall-seconds", "bytes-down", "bytes-up", "cumulative-bytes-down", "cumulative-bytes-up"}  # the first leg's last evaluation went alone
    assert [{k: v for k, v in r.items() if k not in time} for r in resumed_doc["rounds"]] == [
        {k: v for k, v in r.items() if k not in time} for r in doc["rounds"]
    ]
    assert_same_state(resumed.state_dict(), full.state_dict())


def test_clustered_fl_learns_on_the_default_data(tmp_path, no_figures):
    """Three rounds on digits (3 clients, the default 5 local epochs): the mean test accuracy rises every round."""
    doc, _ = _run(tmp_path, 3, 3)
    acc = [r["accuracy"] for r in doc["rounds"]]
    assert acc[0] < acc[1] < acc[2] and acc[2] > acc[0] + 0.2, acc
    assert doc["strategy"] == "ClusteredFL" and doc["evaluation"]["evaluates"] == "its cluster's model as the server sends it"
