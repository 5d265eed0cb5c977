"""Experiment tracking: TensorBoard event files and MLflow runs, written by the ServerApp.

Off by default; ``tensorboard=true`` writes ``<results-dir>/tensorboard/`` and ``mlflow=true``
logs to MLflow (``mlflow-tracking-uri``, by default a SQLite file in the results-dir), each
needing its optional extra (``pip install 'pflower[tensorboard]'`` / ``'pflower[mlflow]'``).
The :class:`~pflower.results.Recorder` hands every metrics.json row to the trackers when the row
is complete (a row whose evaluation rides on the next round's messages when that evaluation is
back), and the run's figures at the end. Each round is one step (its round number): the numbers
of :data:`SCALARS` under their metrics.json names, the clients' accuracies (TensorBoard: a
histogram; MLflow: ``per-client-accuracy/<client>``), pFedLA's weights and SuPerFed's λ curve
as images (TensorBoard). A resumed run logs its own rounds: into its results-dir's event folder,
and into its lineage's MLflow run when that run is in the same store.
"""

from __future__ import annotations

import importlib.util
import io
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

#: The per-round numbers both trackers log, by their metrics.json names.
SCALARS = (
    "accuracy", "weighted-accuracy", "loss", "train-loss", "global-accuracy", "oracle-accuracy", "top5-accuracy", "ece", "mce",
    "bytes-down", "bytes-up", "cumulative-bytes-down", "cumulative-bytes-up", "wall-seconds",
)  # fmt: skip
#: Run-config key -> (the module it needs, the pflower extra that installs it).
EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}


def missing_extras(run_config: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """(key, value, why) for each tracker turned on whose package is not installed."""
    return [
        (key, True, f"needs the optional extra: pip install 'pflower[{extra}]' (the '{module}' package is not installed where the ServerApp runs)")
        for key, (module, extra) in EXTRAS.items()
        if run_config.get(key) and importlib.util.find_spec(module) is None
    ]


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of :data:`SCALARS` a row has (a round that does not evaluate has no accuracy)."""
    return {k: float(row[k]) for k in SCALARS if isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)}


def figure_array(draw, *args, **kwargs) -> np.ndarray:
    """``draw(*args, path, **kwargs)``'s figure (a :mod:`pflower.plots` function that saves to
    ``path``), drawn into memory as an RGB array [H, W, 3]."""
    from PIL import Image

    buf = io.BytesIO()
    draw(*args, buf, **kwargs)
    buf.seek(0)
    return np.asarray(Image.open(buf).convert("RGB"))


class TensorBoardTracker:
    """Event files in ``directory`` (one SummaryWriter; the run config as text at the start)."""

    def __init__(self, directory: Path, run_config: Mapping[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(directory))
        table = "\n".join(f"| {k} | {v} |" for k, v in run_config.items())
        self.writer.add_text("config", "| key | value |\n|---|---|\n" + table, 0)

    def round(self, row: Mapping[str, Any]) -> None:
        from pflower import plots

        step = int(row["round"])
        for k, v in scalars(row).items():
            self.writer.add_scalar(k, v, step)
        if accuracies := list((row.get("per-client-accuracy") or {}).values()):
            self.writer.add_histogram("per-client-accuracy", np.asarray(accuracies, dtype=np.float64), step)
        if "alpha" in row:
            image = figure_array(plots.plot_alpha_heatmaps, plots.alpha_array(row["alpha"]), title=f"aggregation weights, round {step}")
            self.writer.add_image("alpha", image, step, dataformats="HWC")
        if "lambda-curve" in row:
            image = figure_array(plots.plot_lambda_curves, [row], title=f"accuracy vs lambda, round {step}")
            self.writer.add_image("lambda-curve", image, step, dataformats="HWC")
        self.writer.flush()

    def finish(self, doc: Mapping[str, Any], figures: list[Path]) -> None:
        from PIL import Image

        step = doc["rounds"][-1]["round"] if doc["rounds"] else 0
        for path in figures:
            self.writer.add_image(f"figures/{path.stem}", np.asarray(Image.open(path).convert("RGB")), step, dataformats="HWC")
        self.writer.close()

    def abort(self, err: BaseException) -> None:
        """The run died: what it wrote so far is flushed and the event file closed."""
        self.writer.add_text("failure", f"{type(err).__name__}: {err}", 0)
        self.writer.close()


class MlflowTracker:
    """One MLflow run per lineage: the run config as parameters, every row's numbers as metrics,
    metrics.json and the figures as artifacts."""

    def __init__(self, uri: str, experiment: str, run_config: Mapping[str, Any], lineage: str, artifacts: Path):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(experiment, artifact_location=artifacts.as_uri())
        runs = self.client.search_runs([exp_id], filter_string=f"tags.`pflower.lineage` = '{lineage}'", max_results=1)
        #: The last round this lineage's run has: a run killed between tracking a row and its
        #: checkpoint repeats that round when resumed, and MLflow would keep the round twice.
        self.logged = 0
        if runs:  # a resumed run goes on in its lineage's run (no longer failed)
            self.run_id = runs[0].info.run_id
            self.logged = max((m.step for m in self.client.get_metric_history(self.run_id, "bytes-down")), default=0)
            self.client.update_run(self.run_id, status="RUNNING")
            if "pflower.failure" in runs[0].data.tags:
                self.client.delete_tag(self.run_id, "pflower.failure")
            return
        name = f"{run_config.get('method', 'run')} seed {run_config.get('seed', 0)}"
        self.run_id = self.client.create_run(exp_id, run_name=name, tags={"pflower.lineage": lineage}).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in run_config.items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def round(self, row: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now = int(row["round"]), int(time.time() * 1000)
        if step <= self.logged:
            return
        values = scalars(row) | {f"per-client-accuracy/{c}": float(a) for c, a in (row.get("per-client-accuracy") or {}).items()}
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def finish(self, doc: Mapping[str, Any], figures: list[Path]) -> None:
        for path in figures:
            self.client.log_artifact(self.run_id, str(path))
        if figures and (metrics := figures[0].parent / "metrics.json").is_file():
            self.client.log_artifact(self.run_id, str(metrics))
        self.client.set_terminated(self.run_id)

    def abort(self, err: BaseException) -> None:
        """The run died: its MLflow run ends FAILED, with the error as a tag (a resumed run of the
        lineage marks it RUNNING again)."""
        self.client.set_tag(self.run_id, "pflower.failure", f"{type(err).__name__}: {err}"[:5000])
        self.client.set_terminated(self.run_id, status="FAILED")


def open_trackers(run_config: Mapping[str, Any], directory: Path | None, lineage: str) -> list:
    """The trackers the run config turns on (none without a results directory)."""
    if directory is None:
        return []
    trackers: list = []
    if run_config.get("tensorboard"):
        trackers.append(TensorBoardTracker(directory / "tensorboard", run_config))
    if run_config.get("mlflow"):
        uri = str(run_config.get("mlflow-tracking-uri") or f"sqlite:///{directory / 'mlflow.db'}")
        experiment = str(run_config.get("mlflow-experiment") or "pflower")
        trackers.append(MlflowTracker(uri, experiment, run_config, lineage, directory / "mlflow-artifacts"))
    return trackers
