"""On a GPU host only: every method trains on the GPU, in process and on Flower with a quarter GPU
per ClientApp (what ``pflower-sim --gpus-per-client 0.25`` submits), with deterministic kernels."""

import json
import warnings

import pytest
import torch
from conftest import ROOT, in_process_rounds, run_config

from pflower.bench import run_config_string
from pflower.methods import declarations

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here (torch.cuda.is_available() is False)"),
]
METHODS = sorted(declarations())


@pytest.fixture(scope="module")
def gpu_superlink(tmp_path_factory):
    """A simulation SuperLink whose ClientApps train on the GPU (the suite pins the CPU elsewhere)."""
    from pflower.launcher import simulation_superlink

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PFLOWER_DEVICE", "cuda")
        home = tmp_path_factory.mktemp("flwr-home-cuda")
        with simulation_superlink(home):
            yield home


@pytest.mark.e2e
@pytest.mark.parametrize("method", METHODS)
def test_every_method_on_flower_with_a_quarter_gpu_per_client(gpu_superlink, tmp_path, method):
    """No xdist group: each worker starts its own SuperLink and Ray head, so the runs share the
        GPU and the host's cores (on an H200 with 16 cores one run took about 40 s, mostly its start
        and its actors', and the 22 one after the other did not fit 15 minutes). Run them as ``-m cuda``: beside other
    modules a worker would start its SuperLink again each time it comes back to this one."""
    from pflower.launcher import submit

    example = run_config_string(dict(declarations()[method].example))
    config = f"method='{method}' num-server-rounds=2 local-epochs=1 results-dir='{tmp_path}' {example}"
    _, status, log = submit(ROOT, gpu_superlink, config, num_clients=4, cpus=1, gpus=0.25, echo=False)
    assert status == "finished:completed", log
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert [r["round"] for r in doc["rounds"]] == [1, 2]
    assert sorted(doc["final"]["per-client-accuracy"]) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("method", METHODS)
def test_same_seed_same_numbers_on_the_gpu(monkeypatch, tmp_path, client_module, method):
    """Two in-process runs of the method's example on the GPU agree exactly, and no op lacked a
    deterministic kernel."""
    monkeypatch.setenv("PFLOWER_DEVICE", "cuda")
    cfg = {**run_config(method=method, num_server_rounds=2, local_epochs=1), **declarations()[method].example}
    runs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in ("a", "b"):
            client_module._shared.cache_clear()
            runs.append(in_process_rounds(cfg, tmp_path / name))
    assert [str(w.message) for w in caught if "deterministic" in str(w.message)] == []
    assert runs[0] == runs[1]
