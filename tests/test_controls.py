"""The data and training controls the papers state: ``data-seed`` (the data apart from
training, the ``data-fraction`` subset included), ``local-steps`` (minibatch steps instead of
epochs, in the one training loop and through the methods' own epoch keys), and how
``client-classes`` and ``data-fraction`` are checked against the number of clients. The partitions themselves are in tests/test_partition.py, every method's in-process
run with local steps in tests/test_methods.py."""

import numpy as np
import pytest
import torch
from conftest import ROOT, run_config

from pflower import launcher, training
from pflower.build import build_strategy, check_data
from pflower.check import check
from pflower.config import ConfigError, load_settings
from pflower.datasets.federated import Split, client_data, federated_indices
from pflower.records import from_record

N = 4


def _settings(**kw):
    return load_settings(run_config(**{"partition": "dirichlet", "dirichlet_alpha": 0.5, "label_noise": "symmetric", "label_noise_ratio": 0.2,
                                       "feature_shift": "noise", "data_fraction": 0.5, **kw}))  # fmt: skip


def _clients(s):
    """Every client's (train indices, test indices, noisy training labels, shifted training inputs)."""
    fi = federated_indices(s, N)
    return [(fi.train[c], fi.test[c], *(lambda tr: (tr.y, tr.x))(client_data(s, c, N)[0])) for c in range(N)]


def _same_data(a, b) -> bool:
    return all(all(np.array_equal(x, y) if isinstance(x, np.ndarray) else torch.equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b))


def _initial(s):
    return from_record(build_strategy(s).initial_arrays)


def _same_model(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_data_seed_fixes_the_data_and_the_seed_the_training():
    """Same data-seed, another seed: the same clients (indices, noisy labels, shifted inputs) and
    another initial model. Another data-seed, the same seed: other clients, the same initial
    model. data-seed=-1 is seed. (The partition cache is keyed by the whole settings, the data
    seed included: the calls below share one process.)"""
    base = _settings(seed=0, data_seed=7)
    other_seed = _settings(seed=1, data_seed=7)
    other_data = _settings(seed=0, data_seed=8)
    assert _same_data(_clients(base), _clients(other_seed))
    assert not _same_model(_initial(base), _initial(other_seed))
    assert not _same_data(_clients(base), _clients(other_data))
    assert not any(np.array_equal(a[0], b[0]) for a, b in zip(_clients(base), _clients(other_data)))
    assert _same_model(_initial(base), _initial(other_data))
    assert _same_data(_clients(_settings(seed=7)), _clients(base))  # -1: the data seed is seed
    assert _same_data(_clients(_settings(seed=0, data_seed=7)), _clients(base))  # a seed gives the same data every time


@pytest.mark.parametrize("method", ["superfed", "fedfomo"])
def test_the_validation_hold_out_follows_the_data_seed(method):
    """SuPerFed's and FedFomo's hold-out of the training split is data: drawn by the data seed."""
    from pflower.build import client_method

    data = Split(torch.randn(50, 1, 8, 8), torch.arange(50) % 10)

    def held(**kw):
        return client_method(load_settings(run_config(method=method, **kw)))._split(data)[1].x

    assert torch.equal(held(seed=0, data_seed=3), held(seed=1, data_seed=3))
    assert not torch.equal(held(seed=0, data_seed=3), held(seed=0, data_seed=4))


# ---------------------------------------------------- local-steps


def _data(n=20):
    g = torch.Generator().manual_seed(0)
    return Split(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def test_steps_are_exactly_that_many_minibatches_cycling_over_the_data_in_a_new_order_each_pass():
    data = _data(20)
    got = list(training.steps_of(data, 8, torch.Generator().manual_seed(0), epochs=5, steps=7))
    assert [len(y) for _, y in got] == [8, 8, 4, 8, 8, 4, 8]  # 2.33 passes: the last batch of a pass is smaller
    first, second = torch.cat([y for _, y in got[:3]]), torch.cat([y for _, y in got[3:6]])
    assert sorted(first.tolist()) == sorted(data.y.tolist()) == sorted(second.tolist())  # each pass sees every sample once
    orders = [torch.cat([x.flatten(1)[:, 0] for x, _ in got[i : i + 3]]) for i in (0, 3)]
    assert not torch.equal(*orders)  # in another order
    assert len(list(training.steps_of(data, 8, torch.Generator().manual_seed(0), epochs=2))) == 6  # steps=0: epochs
    assert len(list(training.steps_of(data, 64, torch.Generator().manual_seed(0), epochs=1, steps=2))) == 2  # one batch, twice


def test_local_steps_train_the_same_for_a_seed_and_count_steps_not_epochs():
    from pflower.build import build_model

    s = load_settings(run_config())
    data = _data(40)
    calls = []

    def counting(model, x, y):
        calls.append(len(y))
        return training.cross_entropy(model, x, y)

    def trained(seed, steps):
        model = build_model(s, (1, 8, 8), 10, 0)
        training.train(model, data, epochs=5, steps=steps, batch_size=16, lr=0.1, seed=seed, loss_fn=counting)
        return model.state_dict()

    a, b, c = trained(0, 2), trained(0, 2), trained(1, 2)
    assert _same_model(a, b) and not _same_model(a, c)
    assert calls == [16, 16] * 3
    calls.clear()
    trained(0, 0)
    assert len(calls) == 5 * 3  # local-epochs=5 of 3 batches


def test_fedrep_takes_its_head_in_steps_and_its_body_in_epochs(monkeypatch):
    """local-steps replaces local-epochs only: FedRep's body epochs (its own key) stay epochs,
    as do fine-tuning epochs."""
    from pflower.build import build_model, client_method

    s = load_settings(run_config(method="fedrep", local_steps=3, fedrep__body_epochs=2))
    calls = []
    real = training.train

    def spy(model, data, **kw):
        calls.append((kw["epochs"], kw["steps"]))
        return real(model, data, **kw)

    monkeypatch.setattr("pflower.client_app.base.train", spy)
    client = client_method(s)
    model = build_model(s, (1, 8, 8), 10, 0)
    client.fit(model, _data(40), {}, seed=0, server_round=1)
    client.finetune(model, _data(40), seed=0, epochs=1)
    assert calls == [(s.local_epochs, 3), (2, 0), (1, 0)]


# ---------------------------------------------------- the number of clients, before anything starts


@pytest.mark.parametrize(
    "overrides,clients,message",
    [
        ("partition='classes' client-classes='0,1;2,3;4,5,6,7,8,9'", 4, "run config key 'client-classes' = '0,1;2,3;4,5,6,7,8,9' is not allowed: "
         "client-classes gives 3 groups for 4 clients; give one group per client"),
        ("partition='iid' data-fraction=0.002", 10, "run config key 'partition' = 'iid' is not allowed: partition 'iid' leaves client 0 with 1 samples "
         "(of 10, data-fraction=0.002 of 1797, for 10 clients)"),
    ],
)  # fmt: skip
def test_a_partition_the_clients_cannot_fill_is_named_by_pflower_check_and_pflower_sim(monkeypatch, capsys, tmp_path, overrides, clients, message):
    overrides += f" results-dir='{tmp_path}'"
    assert message in check(ROOT, overrides, num_clients=clients)
    monkeypatch.setattr(launcher, "simulate", lambda *a, **k: pytest.fail("pflower-sim started a simulation"))
    assert launcher.main(["-c", overrides, "--num-clients", str(clients)]) == 2
    assert message in capsys.readouterr().err


def test_client_classes_of_the_right_count_pass_the_data_check():
    check_data(load_settings(run_config(partition="classes", client_classes="0,1;2,3;4,5,6,7,8,9")), 3)
    with pytest.raises(ConfigError, match="'client-classes' .* gives 3 groups for 2 clients"):
        check_data(load_settings(run_config(partition="classes", client_classes="0,1;2,3;4,5,6,7,8,9")), 2)


def test_the_serverapp_stops_naming_client_classes_when_the_clients_are_more(grid_factory, tmp_path):
    """The ServerApp learns the number of clients only when they answer: clients that cannot
    build their partition answer with the reason, and the run stops with it."""
    from pflower.strategies.federation import NoClientsError

    cfg = run_config(partition="classes", client_classes="0,1;2,3", num_server_rounds=1, results_dir=str(tmp_path))
    with pytest.raises(NoClientsError, match="client-classes gives 2 groups for 3 clients"):
        build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, 3), timeout=5)
