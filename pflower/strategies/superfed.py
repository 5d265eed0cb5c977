"""SuPerFed server: sample-weighted FedAvg of the federated weights only (the local model never
leaves the client), and the clients' accuracy-versus-lambda curves in metrics.json."""

from __future__ import annotations

import numpy as np

from pflower.strategies.fedavg import FedAvg


class SuperFed(FedAvg):
    def round_extras(self, server_round: int) -> dict:
        """``lambda-curve``: mean test accuracy over clients at each lambda; ``lambda-chosen``: each client's lambda."""
        curves = [m["lambda-accuracy"] for m in self.eval_metrics.values() if "lambda-accuracy" in m]
        if not curves:
            return {}
        return {
            "lambda-curve": [float(x) for x in np.mean(np.array(curves, dtype=np.float64), axis=0)],
            "lambda-chosen": {str(c): float(m["lambda"]) for c, m in sorted(self.eval_metrics.items())},
        }
