"""SuPerFed server: sample-weighted FedAvg of the federated weights only (the local model never
leaves the client), the federation's held-out loss curve for the clients' choice of lambda, and
the clients' accuracy-versus-lambda curves in metrics.json."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import ConfigRecord, Message, MetricRecord

from pflower.methods.superfed import POOLED_KEY
from pflower.strategies.fedavg import FedAvg


class SuperFed(FedAvg):
    """SuPerFed's server: FedAvg of the federated model, and the clients' held-out loss curves
    over the mixing weight λ pooled and sent back with the next evaluation.

    Parameters
    ----------
    **kwargs
        :class:`~pflower.strategies.fedavg.FedAvg`'s parameters.
    """

    ROW_KEYS = {
        "lambda-curve": "mean test accuracy over clients at each λ",
        "lambda-chosen": "each client's λ, chosen on held-out data",
        "lambda-pooled-val-loss": "the federation's held-out loss curve over λ",
        "oracle-accuracy": "mean accuracy at each client's best λ on its test split (the paper's protocol, for comparison only)",
    }

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.pooled_val_loss: list[float] = []  # the last evaluation's; empty before the first

    def evaluate_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """Send the previous evaluation's pooled held-out curve along (none before the first)."""
        if self.pooled_val_loss:
            return ConfigRecord({**config, POOLED_KEY: list(self.pooled_val_loss)})
        return config

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Pool the trained clients' held-out loss curves, weighted by their held-out sizes."""
        out = super().aggregate_evaluate(server_round, replies)
        rows = [(m["lambda-val-loss"], float(m["val-examples"])) for m in self.eval_metrics.values() if "lambda-val-loss" in m]
        if rows:
            curves, n = np.array([c for c, _ in rows], dtype=np.float64), np.array([w for _, w in rows])
            self.pooled_val_loss = [float(x) for x in n @ curves / n.sum()]
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "pooled-val-loss": list(self.pooled_val_loss)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.pooled_val_loss = list(state.get("pooled-val-loss", []))

    def evaluation_extras(self, server_round: int) -> dict:
        """``lambda-curve``: mean test accuracy over clients at each lambda; ``lambda-chosen``:
        each client's lambda; ``lambda-pooled-val-loss``: the federation's held-out curve;
        ``oracle-accuracy``: mean accuracy at each client's best lambda on its test split (the
        paper's protocol, for comparison only: it picks lambda on the data it reports)."""
        curves = [m["lambda-accuracy"] for m in self.eval_metrics.values() if "lambda-accuracy" in m]
        if not curves:
            return {}
        acc = np.array(curves, dtype=np.float64)
        return {
            "lambda-curve": [float(x) for x in acc.mean(axis=0)],
            "lambda-chosen": {str(c): float(m["lambda"]) for c, m in sorted(self.eval_metrics.items()) if "lambda" in m},
            "lambda-pooled-val-loss": list(self.pooled_val_loss),
            "oracle-accuracy": float(acc.max(axis=1).mean()),
        }
