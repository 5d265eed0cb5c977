"""FedFomo (Zhang et al., ICLR 2021): each client weighs other clients' models by how much they
improve its held-out loss, first-order, and the server sends it the models it found useful.

Record names both sides use: the server sends peer j's model as ``peer_model(j)``; a client
reports the weights it computed as ``IDS`` / ``WEIGHTS`` in its training reply's metrics.
"""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams
from pflower.reply_metrics import CLIENT_ID, Number, Numbers

IDS, WEIGHTS = "fomo-ids", "fomo-weights"
PEER_PREFIX = "fomo-model-"


def peer_model(j: int) -> str:
    return f"{PEER_PREFIX}{j}"


class FedFomoParams(MethodParams):
    m: int = Field(5, ge=1, le=1000, description="other clients' models the server sends each sampled client (FL-bench's default)")
    epsilon: float = Field(0.3, ge=0, le=1, description="per model slot, the probability of a random client instead of the highest affinity")
    val_fraction: float = Field(
        0.2, gt=0, lt=1, description="share of a client's training split held out to weigh the models (never trained on; FedeRiCo's setup)"
    )


METHOD = Method(
    name="fedfomo",
    summary="each client mixes the other clients' models that lower its held-out loss (first-order weights); the server picks them by affinity",
    client="pflower.client_app.fedfomo:FedFomoClient",
    strategy="pflower.strategies.fedfomo:FedFomo",
    params=FedFomoParams,
    train_metrics={
        IDS: Numbers(CLIENT_ID, distinct=True, requires=(WEIGHTS,)),
        WEIGHTS: Numbers(Number(), length=IDS),
    },
)
