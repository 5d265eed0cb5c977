"""The per-client state API: every method declares each array of its model (and any record it
keeps besides) once; the ClientApp and the server act on that declaration."""

from __future__ import annotations

import importlib

import pytest
import torch
from conftest import InProcessGrid, run_config
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import nn

from pflower.build import build_model, build_strategy, client_method
from pflower.client_app.base import PERSONAL
from pflower.client_app.store import StateError
from pflower.client_state import ClientState, Role
from pflower.config import load_settings
from pflower.methods import declarations
from pflower.records import to_record

client_app = importlib.import_module("pflower.client_app.app")
pytestmark = pytest.mark.usefixtures("no_figures")
METHODS = sorted(declarations())


def _settings(method: str, **more):
    return load_settings({**run_config(local_epochs=1, samples_per_client=40), **declarations()[method].example, "method": method, **more})


def _state(method: str) -> tuple[nn.Module, ClientState]:
    s = _settings(method)
    model = build_model(s, s.image_shape, s.num_classes, s.seed)
    return model, client_method(s).client_state(model)


@pytest.mark.parametrize("method", METHODS)
def test_every_array_of_every_method_has_one_role_and_the_server_starts_from_what_clients_receive(method):
    model, state = _state(method)
    assert list(state.entries) == list(model.state_dict())
    assert not set(state.private) & (set(state.uploaded) | set(state.received))
    assert all(e.role is Role.PRIVATE for k, e in state.entries.items() if not model.state_dict()[k].is_floating_point())
    strategy = build_strategy(_settings(method))
    assert list(strategy.initial_arrays.keys()) == state.received


PRIVATE = {  # what a method's declaration keeps on the client, by a key it must hold
    "scaffold": "scaffold.c_i.",
    "fedem": "pi",
    "ditto": "local.",
    "apfl": "alpha",
    "superfed": "local.",
    "fedper": "head.",
    "local": "",
}


@pytest.mark.parametrize("method", sorted(PRIVATE))
def test_what_a_method_keeps_is_private(method):
    _, state = _state(method)
    assert any(k.startswith(PRIVATE[method]) for k in state.private)


def test_scaffold_declares_c_from_the_server_and_delta_c_to_it():
    _, state = _state("scaffold")
    params = [k for k in state.keys(Role.MODEL) if state.entries[k].parameter]
    assert state.keys(Role.FROM_SERVER) == [f"scaffold.c.{k}" for k in params]
    assert state.keys(Role.TO_SERVER) == [f"scaffold.delta_c.{k}" for k in params]
    assert [k for k in state.private if k.startswith("scaffold.")] == [f"scaffold.c_i.{k}" for k in params]


@pytest.mark.parametrize("method", METHODS)
def test_replies_carry_only_uploaded_arrays_and_messages_only_received_ones(tmp_path, method):
    """One in-process run of two rounds: every training reply's arrays are among the declared
    uploads, every message's among what the client receives."""
    cfg = {**run_config(local_epochs=1, samples_per_client=40), **declarations()[method].example, "method": method, "num-server-rounds": 2}
    cfg["results-dir"] = str(tmp_path)
    _, state = _state(method)
    uploaded, replied = set(state.uploaded), []

    def inspect(cid, reply):
        if reply.has_content() and "arrays" in reply.content.array_records:
            replied.append(set(reply.content.array_records["arrays"].keys()))
        return reply

    grid = InProcessGrid(client_app.app, cfg, 3, tamper=inspect)
    build_strategy(load_settings(cfg)).start(grid=grid)
    assert all(keys <= uploaded for keys in replied), [sorted(k - uploaded)[:3] for k in replied]
    assert all(set(m.content.array_records["arrays"].keys()) <= set(state.received) for m in grid.sent if "arrays" in m.content.array_records)


def _runtime(method: str, **more):
    client_app._shared.cache_clear()
    client_app._runtime.cache_clear()
    return client_app._runtime(_settings(method, **more), 0, 3)


def test_a_message_carrying_a_private_array_is_refused_naming_it():
    rt = _runtime("scaffold")
    c_i = next(k for k in rt.shared.state.private if k.startswith("scaffold.c_i."))
    with pytest.raises(ValueError, match=f"never receives.*{c_i}"):
        rt.received(ArrayRecord({c_i: to_record(rt.model.state_dict(), [c_i])[c_i]}))
    delta = rt.shared.state.keys(Role.TO_SERVER)[0]
    with pytest.raises(ValueError, match="never receives"):
        rt.received(to_record(rt.model.state_dict(), [delta]))
    assert set(rt.received(to_record(rt.model.state_dict(), rt.shared.state.received))) == set(rt.shared.state.received)


def test_a_saved_state_of_another_method_or_shape_is_refused_naming_the_difference():
    other = _runtime("fedavg").model.state_dict()
    rt = _runtime("scaffold")
    with pytest.raises(StateError, match="method 'scaffold'.*lacks .* declared array"):
        rt.personal_model(RecordDict({PERSONAL: to_record(other)}))
    wrong = dict(rt.model.state_dict())
    key = next(iter(wrong))
    wrong[key] = torch.zeros(3)
    with pytest.raises(StateError, match=f"'{key}' has shape \\[3\\]"):
        rt.personal_model(RecordDict({PERSONAL: to_record(wrong)}))
    with pytest.raises(StateError, match="record.*'federico'"):
        rt.personal_model(RecordDict({PERSONAL: to_record(rt.model.state_dict()), "federico": ConfigRecord({"ids": [1]})}))
    rt.personal_model(RecordDict({PERSONAL: to_record(rt.model.state_dict())}))


def test_federico_declares_its_records():
    _, state = _state("federico")
    assert state.undeclared(["federico", "federico-own-update", "federico-peer-7"]) == []
    assert state.undeclared(["federico-peer", "other"]) == ["federico-peer", "other"]


def test_a_declaration_naming_what_the_model_lacks_or_twice_or_an_integer_array_is_refused():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    with pytest.raises(ValueError, match="'nope' is not in the model"):
        ClientState.of(model, ["nope"])
    with pytest.raises(ValueError, match="'0.weight' is declared both"):
        ClientState.of(model, ["0.weight"], from_server=["0.weight"])
    with pytest.raises(ValueError, match="num_batches_tracked.*only float arrays travel"):
        ClientState.of(model, ["1.num_batches_tracked"])
    state = ClientState.of(model)
    assert state.private == ["1.num_batches_tracked"]
    assert state.parameters(Role.MODEL) == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_a_client_still_overriding_upload_keys_is_refused_when_defined():
    """The hook before client_state would be ignored, and what it kept private uploaded."""
    from pflower.client_app.base import ClientMethod

    with pytest.raises(TypeError, match="overrides upload_keys, which pflower no longer calls: declare client_state"):

        class Old(ClientMethod):
            def upload_keys(self, model):
                return []


def test_one_way_arrays_on_a_server_that_sends_and_takes_the_same_arrays_are_refused(monkeypatch):
    from pflower.client_app.base import ClientMethod

    def declared(self, model):
        keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
        return ClientState.of(model, keys[:-1], to_server=keys[-1:])

    monkeypatch.setattr(ClientMethod, "client_state", declared)
    with pytest.raises(ValueError, match="method 'fedavg' declares arrays that go one way only .* its server FedAvg"):
        build_strategy(_settings("fedavg"))


def test_a_user_built_scaffold_must_be_told_its_parameters():
    from pflower.strategies import Scaffold

    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    state = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
    with pytest.raises(ValueError, match=r"pass parameters=\[k for k, _ in model.named_parameters\(\)\]"):
        Scaffold().prepare(to_record(state))
    strategy = Scaffold(parameters=[k for k, _ in model.named_parameters()])
    strategy.prepare(to_record(state))
    assert sorted(strategy.control) == ["0.bias", "0.weight", "1.bias", "1.weight"]


def test_fedfomo_weighs_only_arrays_its_client_receives():
    """Another client's model arrives in a record of its own: a private array in it is refused too."""
    from flwr.app import RecordDict

    from pflower.methods.fedfomo import PEER_PREFIX

    rt = _runtime("fedfomo", model="cnn-bn")
    private = {k: v for k, v in rt.model.state_dict().items() if k in rt.shared.state.private and v.is_floating_point()}
    assert any(k.endswith("running_mean") for k in private)  # BatchNorm's statistics stay with the client
    incoming = RecordDict({f"{PEER_PREFIX}1": to_record({**{k: rt.model.state_dict()[k] for k in rt.shared.state.received}, **private})})
    with pytest.raises(ValueError, match="arrays this model does not have"):
        rt.method.before_fit(rt.model, rt.train, incoming, 2)
