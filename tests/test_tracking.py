"""Experiment tracking: TensorBoard event files and MLflow runs hold each round's metrics.json
numbers (rows completed a round later included), written by the ServerApp; a missing extra is
named with the key that needs it."""

import json

import numpy as np
import pytest
from conftest import InProcessGrid, run_config

from pflower.config import ConfigError, check_server, load_settings
from pflower.tracking import SCALARS, TensorBoardTracker


def _serve(cfg: dict, results) -> None:
    """The ServerApp's main with 3 in-process clients, results in ``results``."""
    from flwr.app import Context, RecordDict

    from pflower.client_app.app import app as client_app
    from pflower.server_app import app as server_app

    cfg = {**cfg, "results-dir": str(results)}
    server_app._main(InProcessGrid(client_app, cfg, 3), Context(1, 0, {}, RecordDict(), cfg))


def _events(directory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"images": 0, "histograms": 0, "scalars": 0})
    events.Reload()
    return events


def test_tensorboard_and_mlflow_have_every_rounds_metrics_and_a_resumed_run_goes_on(tmp_path):
    """FedAvg, 3 clients, 2 rounds then resumed to 3: each round's evaluation rides on the next
    round's messages, so its row is completed a round later and only then tracked."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = run_config(method="fedavg", num_server_rounds=2, local_epochs=1, tensorboard=True, mlflow=True, mlflow_tracking_uri=uri)
    _serve(cfg, tmp_path / "a")
    _serve({**cfg, "num-server-rounds": 3, "resume-from": str(tmp_path / "a")}, tmp_path / "b")
    doc = json.loads((tmp_path / "b" / "metrics.json").read_text())
    rows = doc["rounds"]
    first, second = _events(tmp_path / "a" / "tensorboard"), _events(tmp_path / "b" / "tensorboard")
    for k in ("accuracy", "weighted-accuracy", "loss", "train-loss", "bytes-down", "cumulative-bytes-up"):
        got = [(e.step, e.value) for e in first.Scalars(k) + second.Scalars(k)]
        assert got == [(r["round"], pytest.approx(r[k], rel=1e-6)) for r in rows], k
    hist = second.Histograms("per-client-accuracy")[0]
    assert hist.step == 3 and hist.histogram_value.num == 3
    assert hist.histogram_value.sum == pytest.approx(sum(rows[-1]["per-client-accuracy"].values()), rel=1e-6)
    assert {"figures/accuracy", "figures/partition"} <= set(second.Tags()["images"])
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("pflower").experiment_id])  # one run for the lineage
    assert run.info.status == "FINISHED" and run.data.params["method"] == "fedavg" and run.data.tags["pflower.lineage"] == doc["lineage"]
    history = client.get_metric_history(run.info.run_id, "accuracy")
    assert [(m.step, m.value) for m in history] == [(r["round"], pytest.approx(r["accuracy"])) for r in rows]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "per-client-accuracy/2")] == [r["per-client-accuracy"]["2"] for r in rows]
    assert {"metrics.json", "accuracy.png", "partition.png"} <= {a.path for a in client.list_artifacts(run.info.run_id)}


def test_pfedla_weights_and_superfed_lambda_curve_as_images(tmp_path):
    alpha = {str(i): np.full((3, 4), 0.25).tolist() for i in range(4)}
    tracker = TensorBoardTracker(tmp_path, {"method": "x"})
    tracker.round({"round": 1, "accuracy": 0.5, "alpha": alpha, "lambda-curve": np.linspace(0.3, 0.6, 11).tolist(), "evaluated": 4})
    tracker.finish({"rounds": [{"round": 1}]}, [])
    events = _events(tmp_path)
    assert set(events.Tags()["images"]) == {"alpha", "lambda-curve"} and events.Scalars("accuracy")[0].value == 0.5
    assert "config/text_summary" in events.Tags()["tensors"]


def test_scalars_are_metrics_json_numbers():
    assert {"accuracy", "loss", "bytes-down", "cumulative-bytes-up", "wall-seconds"} <= set(SCALARS)


def test_a_missing_extra_is_named_with_its_key(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("tensorboard", "mlflow") else real(name, *a))
    s = load_settings(run_config(tensorboard=True, mlflow=True, results_dir=str(tmp_path)))  # clients need no extra
    with pytest.raises(ConfigError, match=r"'tensorboard' = True.*pip install 'pflower\[tensorboard\]'.*'mlflow' = True.*pip install 'pflower\[mlflow\]'"):
        check_server(s)
    with pytest.raises(ConfigError, match="'mlflow-experiment' = 'x'.*only for mlflow=true"):
        load_settings(run_config(mlflow_experiment="x"))


def test_a_serverapp_that_dies_leaves_its_mlflow_run_failed_and_its_events_flushed(tmp_path, monkeypatch):
    """The ServerApp dies saving round 2's checkpoint, after round 2's messages completed round
    1's row (tracked): MLflow's run is FAILED with the error as a tag (not RUNNING for ever),
    TensorBoard has round 1 and the failure; the resumed run repeats round 2, which completes
    round 1 again, and goes on in the same MLflow run, which keeps one value per round."""
    from mlflow.tracking import MlflowClient

    from pflower.strategies import loop

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = run_config(method="fedavg", num_server_rounds=3, local_epochs=1, tensorboard=True, mlflow=True, mlflow_tracking_uri=uri)
    real = loop.save_checkpoint

    def dies_saving_round_2(directory, checkpoint):
        if checkpoint.round == 2:
            raise RuntimeError("the ServerApp died")
        real(directory, checkpoint)

    monkeypatch.setattr(loop, "save_checkpoint", dies_saving_round_2)
    with pytest.raises(RuntimeError, match="died"):
        _serve(cfg, tmp_path / "a")
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("pflower").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["pflower.failure"] == "RuntimeError: the ServerApp died"
    events = _events(tmp_path / "a" / "tensorboard")
    assert [e.step for e in events.Scalars("accuracy")] == [1] and "failure/text_summary" in events.Tags()["tensors"]
    monkeypatch.setattr(loop, "save_checkpoint", real)
    _serve({**cfg, "resume-from": str(tmp_path / "a")}, tmp_path / "b")
    (run,) = client.search_runs([client.get_experiment_by_name("pflower").experiment_id])
    assert run.info.status == "FINISHED" and "pflower.failure" not in run.data.tags
    rows = json.loads((tmp_path / "b" / "metrics.json").read_text())["rounds"]
    for key in ("accuracy", "bytes-down", "wall-seconds"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2, 3], key
    assert [m.value for m in client.get_metric_history(run.info.run_id, "accuracy")] == [pytest.approx(r["accuracy"]) for r in rows]
