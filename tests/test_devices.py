"""Where tensors live: every method's example run on a fake accelerator gives the CPU's numbers.

The fake device (:mod:`fake_device`) refuses, as CUDA does, an op that mixes it with a CPU
tensor, and draws its random numbers from a generator of its own: a client that subtracts a
received (CPU) tensor from its model's or draws its model's weights on the device fails here,
naming the line, without a GPU.
"""

import functools
import math
import os

import pytest
import torch
from conftest import in_process_rounds, run_config
from data_files import write_cifar10, write_shakespeare
from fake_device import FAKE, FakeDevice, MixedDevices

from pflower.build import build_strategy
from pflower.config import load_settings
from pflower.methods import declarations

#: Models every method also runs on here, besides its example's.
MODELS = ("leaf-cnn", "resnet18", "lstm")


def on_model(model: str, tmp_path, monkeypatch) -> dict:
    """Run-config keys that run ``model``: LEAF's CNN on the default 8x8 digits; ResNet-18
    (BatchNorm) on CIFAR-10-shaped data (32x32 colour images in CIFAR-10's files, written here),
    built at 1/16 of its width (4 channels in its first stage, 45 thousand parameters instead of
    11 million): the same 41 layers, normalization layers, shortcuts and head, which is what a
    method sees of a model (test_resnet.py trains the full width); LEAF's stacked LSTM on
    Shakespeare-shaped text (two speaking roles of 12 and 10 lines of 80 characters in
    flwrlabs/shakespeare's columns, a client each), lines of 4 characters instead of 80 and 16
    units instead of 256: the same four layers, embedding, two LSTMs and head (test_leaf.py
    builds the full size)."""
    if model == "lstm":
        from pflower.models import lstm

        monkeypatch.setattr(lstm, "CharLSTM", functools.partial(lstm.CharLSTM, hidden=16))
        write_shakespeare(tmp_path / "shakespeare", (12, 10), length=4)
        return {"model": model, "dataset": "huggingface", "data-dir": str(tmp_path / "shakespeare"), "hf-text-column": "x", "hf-label-column": "y",
                "partition": "natural-id", "natural-id-column": "character_id", "samples-per-client": 0}  # fmt: skip
    if model != "resnet18":
        return {"model": model}
    from pflower.models import resnet

    monkeypatch.setattr(resnet, "ResNet18", functools.partial(resnet.ResNet18, width=4))
    write_cifar10(tmp_path / "cifar10", n=60)
    return {"model": model, "dataset": "torchvision", "torchvision-name": "CIFAR10", "data-dir": str(tmp_path / "cifar10")}


@pytest.mark.parametrize("model", ["example", *MODELS])
@pytest.mark.parametrize("method", sorted(declarations()))
def test_every_method_on_a_fake_device_matches_the_cpu(monkeypatch, tmp_path, client_module, no_figures, method, model):
    """The method's example run on the CPU, then on the fake device: with the example's model
    (2 rounds, 3 clients of 60 samples), and with each of :data:`MODELS` at the smallest scale
    that runs all of a method on it (1 round: training and the evaluation after it, 2 clients of
    20 samples; later rounds run the same code on any model), where every client must also have
    trained and evaluated (for ResNet-18: every method trains it in process on CIFAR-10-shaped
    data; for the LSTM, on Shakespeare-shaped text)."""
    cfg = {**run_config(method=method, num_server_rounds=2, local_epochs=1, samples_per_client=60), **declarations()[method].example}
    clients = 3
    if model != "example":
        cfg = {**cfg, "num-server-rounds": 1, "samples-per-client": 20, **on_model(model, tmp_path, monkeypatch)}
        clients = 2
        if method == "pfedhn":  # its hypernetwork ends in Linear(hidden-dim -> every parameter): 100 x LEAF's CNN is most of the test's time
            cfg["pfedhn.hidden-dim"] = 8
    on_cpu = in_process_rounds(cfg, tmp_path / "cpu", clients)
    if model != "example":
        assert [(r["sampled"], r["evaluated"], r["rejected"], r["missing"]) for r in on_cpu] == [(2, 2, {}, [])]
        assert 0 <= on_cpu[0]["accuracy"] <= 1 and math.isfinite(on_cpu[0]["loss"])
        assert method == "federico" or math.isfinite(on_cpu[0]["train-loss"])  # FedeRiCo's relay records no train-loss
    client_module._shared.cache_clear()
    monkeypatch.setattr(client_module, "device", lambda: FAKE)
    failure = None
    with FakeDevice() as fake:
        try:
            on_fake = in_process_rounds(cfg, tmp_path / "fake", clients)
        except Exception as err:  # noqa: BLE001 - the device errors below say more
            failure = err
    assert not fake.errors, "\n".join(dict.fromkeys(fake.errors))
    assert failure is None, failure
    assert on_fake == on_cpu if model != "lstm" else close(on_fake, on_cpu)


def close(a, b, rel: float = 1e-6) -> bool:
    """``a`` is ``b`` but for floats within ``rel``: the LSTM's numbers on the fake device agree with
    the CPU's to float32 rounding only, since PyTorch's CPU LSTM runs its own kernels (oneDNN's,
    fused cells) where the fake device, like CUDA, runs PyTorch's LSTM op by op."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)
    return a == b


def test_the_fake_device_refuses_what_cuda_refuses_and_keeps_the_values():
    """A CPU tensor of one or more dimensions in an op on the fake device is refused wherever the
    op holds it (an argument, a list, a list of lists); a 0-dimensional one is a scalar."""
    with FakeDevice() as fake:
        a = torch.ones(3).to(FAKE)
        for op in (lambda: a + torch.ones(3), lambda: torch.cat([a, torch.ones(3)]), lambda: torch._foreach_add([a], [torch.ones(3)])):
            with pytest.raises(MixedDevices, match=r"mixes meta with CPU tensors of shape \(3,\)"):
                op()
        b = a * torch.tensor(2.0)
        values, index = torch.max(torch.stack([b, a]), 0)
    assert len(fake.errors) == 3
    assert (b.device, values.device, index.device) == (FAKE,) * 3
    assert torch.equal(values.cpu(), torch.full((3,), 2.0)) and torch.equal(index.cpu(), torch.zeros(3, dtype=torch.long))


def test_pflower_device_pins_the_device(monkeypatch):
    from pflower.device import DEVICE_ENV, device

    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert device() == torch.device("cpu")
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(ValueError, match="PFLOWER_DEVICE='tpu' is not allowed: use cpu, cuda or cuda:N"):
        device()
    if not torch.cuda.is_available():
        monkeypatch.setenv(DEVICE_ENV, "cuda")
        with pytest.raises(ValueError, match="sees no GPU"):
            device()


@pytest.fixture
def nondeterministic(monkeypatch):
    """Kernel settings as a fresh process has them (and TF32 on), in a process that computes on
    CUDA (as far as the settings go; the models stay on the CPU); put back after."""
    import pflower.device
    from pflower.device import deterministic_kernels

    monkeypatch.setattr(pflower.device, "uses_cuda", lambda: True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
    for backend in (torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn):
        backend.fp32_precision = "tf32"
    yield
    deterministic_kernels()
    torch.use_deterministic_algorithms(False)


def test_a_cpu_process_leaves_pytorchs_deterministic_switch_off(monkeypatch):
    """On the CPU the switch buys nothing and costs every process start: only the flags are set."""
    from pflower.device import deterministic_kernels

    monkeypatch.setenv("PFLOWER_DEVICE", "cpu")
    torch.use_deterministic_algorithms(False)
    deterministic_kernels()
    assert not torch.are_deterministic_algorithms_enabled()
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == (True, False)


def kernel_settings() -> dict:
    return {
        "deterministic algorithms": (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
        "cudnn": (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark),
        "fp32": (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision),
        "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


DETERMINISTIC = {"deterministic algorithms": (True, True), "cudnn": (True, False), "fp32": ("ieee",) * 3, "cublas": ":4096:8"}


def test_the_client_app_sets_deterministic_kernels_before_it_builds_its_model(monkeypatch, grid_factory, tmp_path, client_module, nondeterministic):
    seen = []
    real = client_module.build_model
    monkeypatch.setattr(client_module, "build_model", lambda *a: seen.append(kernel_settings()) or real(*a))
    cfg = run_config(results_dir=str(tmp_path))
    build_strategy(load_settings(cfg)).connect(grid_factory(cfg, 1), timeout=5)  # a query round
    assert seen == [DETERMINISTIC]


def test_the_server_app_sets_deterministic_kernels(nondeterministic):
    from flwr.app import Context, RecordDict

    from pflower.config import ConfigError
    from pflower.server_app.app import main

    with pytest.raises(ConfigError):
        main(None, Context(1, 0, {}, RecordDict(), {"num-server-rounds": 0}))
    assert kernel_settings() == DETERMINISTIC


def test_the_server_app_runs_on_the_torch_threads_its_config_names(tmp_path):
    """Not the machine's cores: a ServerApp whose small tensor ops spread over cores the clients
    keep busy waits on its own threads (the reply checks took 8.6 ms instead of 0.36 under load)."""
    from flwr.app import Context, RecordDict

    from pflower.server_app.app import main

    class FirstMessage(Exception):
        pass

    class Grid:  # the run stops where it would first reach a client
        def __getattr__(self, name):
            raise FirstMessage

    before = torch.get_num_threads()
    try:
        for threads, cfg in ((3, {"server_threads": 3}), (1, {})):
            torch.set_num_threads(2)
            with pytest.raises(FirstMessage):
                main(Grid(), Context(1, 0, {}, RecordDict(), run_config(results_dir=str(tmp_path / f"r{threads}"), **cfg)))
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_deployed_supernodes_each_see_one_gpu_round_robin(monkeypatch, tmp_path):
    from pflower.deploy import Deployment

    spawned = {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,GPU-5e1f")
    dep = Deployment(tmp_path, nodes=3, tls=False, auth=False)
    monkeypatch.setattr(dep, "_spawn", lambda name, cmd, env=None: spawned.setdefault(name, env))
    for i in range(3):
        dep.start_node(i)
    assert [spawned[f"node{i}"]["CUDA_VISIBLE_DEVICES"] for i in range(3)] == ["0", "GPU-5e1f", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the user hid every GPU: so do the nodes
    assert dep.node_env(1)["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert ("CUDA_VISIBLE_DEVICES" in dep.node_env(0)) == torch.cuda.is_available()
