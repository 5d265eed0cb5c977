"""FedProx (Li et al., 2020): FedAvg with a proximal term that keeps local training near the global model."""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams


class FedProxParams(MethodParams):
    mu: float = Field(0.01, ge=0, description="weight of (mu/2)·‖w − w_global‖² in the local loss")


METHOD = Method(
    name="fedprox",
    summary="FedAvg with (mu/2)·‖w − w_global‖² added to the local loss",
    client="pflower.client_app.fedprox:FedProxClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    params=FedProxParams,
    averages=True,
    gradual=True,
)
