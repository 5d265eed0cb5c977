"""Ditto (Li et al., ICML 2021): a global model by FedAvg and a personal model regularized toward it."""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams


class DittoParams(MethodParams):
    lam: float = Field(1.0, ge=0, description="λ of the personal objective CE(v) + λ/2·‖v − w‖² (FL-bench's default; the paper tunes it in {0.01, 0.1, 1, 2})")
    personal_epochs: int = Field(1, ge=1, le=1000, description="epochs of the personal model each round, after `local-epochs` of the global one")


def wrap(model, params):
    from pflower.models.mixing import MixedModel

    return MixedModel(model)


METHOD = Method(
    name="ditto",
    summary="a global model by FedAvg and a personal model trained toward it (λ/2·‖v − w‖²); the personal one predicts",
    client="pflower.client_app.ditto:DittoClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    params=DittoParams,
    wrap=wrap,
    averages=True,
)
