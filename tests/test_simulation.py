"""End to end on real Flower: a SuperLink in simulation mode, Ray, and every server strategy."""

import json

import pytest
from conftest import run_on_flower as _run

from pflower.bench import run_config_string
from pflower.methods import declarations

pytestmark = pytest.mark.e2e
SIMULATION = pytest.mark.xdist_group("simulation")
FAULTS = pytest.mark.xdist_group("simulation-faults")  # the shorter simulation worker takes these

#: Samples per client where a run on Flower is compared with the same run in process (equality,
#: not learning): the resume sweep's size, enough for every method's splits.
SAMPLES = 60
#: On real Flower, 3 short rounds with its declared example config, each server strategy whose
#: messages differ in kind from the one-model-down, one-model-up of FedAvg and pFedLA (which
#: run on Flower in the deployment tests, and pFedLA in test_simulation_equals_in_process_run,
#: the quickstart and fault tests): FedeRiCo's relay between clients, FedFomo's models of other clients, SuPerFed's lambda
#: curves. Every message and context of the in-process layer goes through Flower's wire format
#: (conftest.over_the_wire), where every method runs every round and schedule; learning itself
#: is checked there too.
ON_FLOWER = ("federico", "fedfomo", "superfed")
METHOD_CONFIGS = {name: run_config_string(dict(declarations()[name].example)) for name in ON_FLOWER}


def _two_phase_in_process(tmp_path, method: str) -> list[dict]:
    """The method's run in process with every evaluation a phase of its own (single-message=false)."""
    from conftest import in_process_rounds, run_config

    cfg = {**run_config(), **declarations()[method].example, "method": method, "num-server-rounds": 3, "local-epochs": 1, "single-message": False,
           "samples-per-client": SAMPLES}  # fmt: skip
    return in_process_rounds(cfg, tmp_path / "two-phase")


@SIMULATION
@pytest.mark.parametrize("method", sorted(METHOD_CONFIGS))
def test_every_server_strategy_runs_on_flower(superlink, tmp_path, method):
    """3 rounds on Flower, one message per node per round, the 3 clients on 2 simulated nodes
    (one message carries clients 0 and 2): the metrics of the same run in process with one
    client a node and two phases a round (Flower's engine, the grouping and the schedule change
    nothing)."""
    results = tmp_path / method
    config = f"method='{method}' num-server-rounds=3 local-epochs=1 samples-per-client={SAMPLES} results-dir='{results}' {METHOD_CONFIGS[method]}"
    run_id, status, log = _run(superlink, config, clients_per_node=2)
    assert status == "finished:completed", log
    doc = json.loads((results / "metrics.json").read_text())
    assert doc["config"]["single-message"] is True and doc["config"]["simulated-clients"] == 3
    for a, b in zip(doc["rounds"], _two_phase_in_process(tmp_path, method), strict=True):
        assert a["per-client-accuracy"] == b["per-client-accuracy"]
        assert (a["loss"], a["train-loss"]) == pytest.approx((b["loss"], b["train-loss"]), rel=1e-9)
    assert doc["config"]["method"] == method and doc["num-clients"] == 3
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    for r in rounds:
        assert 0.0 <= r["accuracy"] <= 1.0 and 0.0 <= r["weighted-accuracy"] <= 1.0
        assert r["loss"] > 0 and r["wall-seconds"] > 0
        assert r["missing"] == [] and r["rejected"] == {}
        assert (r["bytes-up"] > 0) == (method != "local")
    assert (sum(r["bytes-down"] for r in rounds) > 0) == (method != "local")  # FedFomo's round 1 sends nothing
    if method == "federico":  # the relay's four steps, and every client's collaboration weights
        assert all(set(r["relayed-bytes"]) == {"plan", "serve", "use", "update"} for r in rounds)
        assert sorted(rounds[-1]["collaboration-weights"]) == ["0", "1", "2"]
    if method == "fedfomo":  # from round 2 each client got the others' models and weighed them
        assert all(len(w) == 2 for w in rounds[-1]["fomo-weights"].values())
    assert sorted(doc["final"]["per-client-accuracy"]) == ["0", "1", "2"]
    assert (results / "accuracy.png").exists()
    assert "[round 3/3] accuracy" in log


@SIMULATION
def test_simulation_equals_in_process_run(superlink, tmp_path, grid_factory):
    """Same seed, same numbers: Ray's worker placement and threads do not change the result, nor
    clients grouped on nodes (3 clients on 2 nodes; one client a node runs on Flower in the
    fault, quickstart and CLI tests, each against its in-process run)."""
    from conftest import run_config

    from pflower.build import build_strategy
    from pflower.config import load_settings

    ray_dir, local_dir = tmp_path / "ray", tmp_path / "local"
    _, status, log = _run(superlink, f"num-server-rounds=2 fraction-train=0.67 results-dir='{ray_dir}'", cpus=1, clients_per_node=2)  # two Ray workers
    assert status == "finished:completed", log
    # in process with two phases a round; on Flower round 1's evaluation went with round 2's
    # training messages, and alone to the client not sampled for training in round 2
    cfg = run_config(num_server_rounds=2, fraction_train=0.67, results_dir=str(local_dir), single_message=False)
    build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, 3))
    ray_rounds = json.loads((ray_dir / "metrics.json").read_text())["rounds"]
    local_rounds = json.loads((local_dir / "metrics.json").read_text())["rounds"]
    for a, b in zip(ray_rounds, local_rounds):
        assert a["per-client-accuracy"] == b["per-client-accuracy"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-9)
        assert a["sampled"] == b["sampled"] == 2


@SIMULATION
def test_shards_and_feature_shift_on_flower_equal_the_run_in_process(superlink, tmp_path):
    """A Hugging Face data set saved on disk (a fixture written here, read offline by every
    ClientApp process), flwr-datasets' shards with every client a feature-shift domain, FedBN, 2
    rounds on Flower with TensorBoard on: the same partition (label counts), domains and metrics
    as in process; the ServerApp writes the partition figure and the event file."""
    from conftest import in_process_rounds, run_config
    from data_files import hf_dataset

    data = tmp_path / "hf-disk"
    hf_dataset(n=150)[0].save_to_disk(str(data))
    keys = dict(method="fedbn", model="cnn-bn", dataset="huggingface", data_dir=str(data), partition="shards", feature_shift="mixed",
                num_server_rounds=2, local_epochs=1)  # fmt: skip
    results = tmp_path / "flower"
    _, status, log = _run(superlink, f"{run_config_string({k.replace('_', '-'): v for k, v in keys.items()})} tensorboard=true results-dir='{results}'")
    assert status == "finished:completed", log
    doc = json.loads((results / "metrics.json").read_text())
    rounds = in_process_rounds(run_config(**keys), tmp_path / "in-process")
    local = json.loads((tmp_path / "in-process" / "metrics.json").read_text())
    assert doc["client-label-counts"] == local["client-label-counts"] and doc["client-domains"] == local["client-domains"]
    assert sorted(doc["client-domains"].values()) == ["contrast ×0.25", "noise σ 1.00", "rotation 90°"]
    assert [r["per-client-accuracy"] for r in doc["rounds"]] == [r["per-client-accuracy"] for r in rounds]
    assert (results / "partition.png").is_file() and any((results / "tensorboard").glob("events.out.tfevents.*"))


@FAULTS
def test_bad_config_fails_the_run_with_one_message(superlink, tmp_path):
    """A key the strategy refuses (after the schema accepted every value; the schema's own
    messages are in test_config) ends the Flower run as failed, with one line and no traceback."""
    run_id, status, log = _run(superlink, f"method='heurpfedla' heurpfedla.top-k=9 results-dir='{tmp_path}'")
    assert status == "finished:failed"
    assert "run config key 'heurpfedla.top-k' = 9 is not allowed: must be <= 4 (layers of the model)" in log
    assert "Traceback" not in log
    assert not (tmp_path / "metrics.json").exists()


@FAULTS
def test_a_users_serverapp_runs_pflower_strategies_with_a_quickstart_clientapp(superlink, tmp_path):
    """examples/quickstart (the README's ServerApp): PFedLA built with keyword arguments, against a
    ClientApp with no pflower code and no query handler, on Flower's simulation engine (its FedAvg
    branch runs in process: tests/test_quickstart.py). initial_arrays reach evaluate_fn before
    round 1 and every client in round 1; evaluate_fn runs after every round; pFedLA evaluates
    every 2nd round with half the clients, and all in the last."""
    import importlib.util

    from conftest import ROOT, assert_quickstart_run

    app = ROOT / "examples" / "quickstart"
    _, status, log = _run(superlink, f"strategy='pfedla' num-server-rounds=3 results-dir='{tmp_path}'", clients=4, app=app)
    assert status == "finished:completed", log
    doc = json.loads((tmp_path / "metrics.json").read_text())
    spec = importlib.util.spec_from_file_location("quickstart_client_app", app / "client_app.py")
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    assert_quickstart_run(doc, client.Net, "pfedla")
    assert doc["rounds"][-1]["accuracy"] > 0.4
