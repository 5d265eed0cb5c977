"""FedEM (Marfoq et al., NeurIPS 2021): every client's data a mixture of K shared distributions;
the server federates K component models, each client learns its own mixture weights π by EM.

The model is :class:`pflower.models.mixture.Mixture` (the components and π in one state). A
client reports its π in its training reply (``PI_METRIC``): the server averages component k
with the weights n_t π_tk.
"""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams
from pflower.reply_metrics import UNIT, Numbers

#: The most components a run may have: each costs one model each way per client and round, and
#: one more local training.
MAX_COMPONENTS = 32
#: The training reply's π (K numbers in [0, 1]; the server requires it, of length K).
PI_METRIC = "fedem-pi"


class FedEMParams(MethodParams):
    components: int = Field(
        4,
        ge=1,
        le=MAX_COMPONENTS,
        description="K, the shared component models (each client trains all K each round and sends them: K models each way); 1 is FedAvg",
    )


def wrap(model, params: FedEMParams):
    from pflower.models.mixture import Mixture

    return Mixture(model, params.components)


METHOD = Method(
    name="fedem",
    summary="K component models, each averaged by the server with the weights n_t π_tk; each client's own mixture weights π by EM (the π-mixture of their softmax outputs predicts)",
    client="pflower.client_app.fedem:FedEMClient",
    strategy="pflower.strategies.fedem:FedEM",
    params=FedEMParams,
    wrap=wrap,
    averages=True,
    example={"fedem.components": 2},
    no_finetune="its prediction is a mixture of models, not one network",
    train_metrics={PI_METRIC: Numbers(UNIT)},
)
