"""APFL (Deng et al., 2020): each client mixes its local and the global model with a learned alpha."""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams
from pflower.reply_metrics import UNIT


class APFLParams(MethodParams):
    alpha: float = Field(
        0.5,
        ge=0,
        le=1,
        description="initial mixing weight α of the local model (learned from there by the run's optimizer, its weight decay included; FL-bench's default)",
    )


def wrap(model, params: APFLParams):
    from pflower.models.mixing import MixedModel, with_alpha

    return with_alpha(MixedModel(model), params.alpha)


METHOD = Method(
    name="apfl",
    summary="a local and the global model mixed by a learned α per client (α·v + (1 − α)·w predicts)",
    client="pflower.client_app.apfl:APFLClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    params=APFLParams,
    wrap=wrap,
    averages=True,
    evaluation_metrics={"alpha": UNIT},
)
