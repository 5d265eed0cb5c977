"""SuPerFed (Hahn, Jeong and Lee, KDD 2022): a federated and a local model joined by a low-loss line.

``POOLED_KEY`` is the evaluate-config key both sides use: the federation's held-out loss curve.
"""

from typing import Literal

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams
from pflower.reply_metrics import LOSS, UNIT, Count, Numbers

#: Lambdas on the clients' grid (pflower.models.mixing.LAMBDA_GRID: 0, 0.1, ..., 1).
GRID_POINTS = 11

#: Evaluate-config key of the federation's held-out loss curve (one value per grid lambda).
POOLED_KEY = "superfed-pooled-val-loss"


class SuperFedParams(MethodParams):
    mixing: Literal["model", "layer"] = Field("model", description="`model` (one λ for all layers) or `layer` (one λ per layer)")
    mu: float = Field(0.01, ge=0, description="weight of Σ‖w_f − w_g‖ (per tensor, un-squared)")
    nu: float = Field(1.0, ge=0, description="weight of cos²(w_f, w_l)")
    start: float = Field(0.4, ge=0, le=1, description="mixing (and the cos² term) start after this share of the rounds; before, λ = 0 and w_l is frozen")


def wrap(model, params: SuperFedParams):
    from pflower.models.mixing import MixedModel

    return MixedModel(model, params.mixing)


METHOD = Method(
    name="superfed",
    summary="a federated and a local model trained on one low-loss line; λ chosen on held-out data",
    client="pflower.client_app.superfed:SuperFedClient",
    strategy="pflower.strategies.superfed:SuperFed",
    params=SuperFedParams,
    wrap=wrap,
    averages=True,
    no_finetune="its prediction is a line of models, not one network",
    example={"superfed.mixing": "layer", "superfed.start": 0.3},
    evaluation_metrics={
        "lambda": UNIT,
        "lambda-accuracy": Numbers(UNIT, GRID_POINTS, requires=("lambda",)),
        "lambda-val-loss": Numbers(LOSS, GRID_POINTS, requires=("val-examples",)),
        "val-examples": Count("train", requires=("lambda-val-loss",)),
    },
)
