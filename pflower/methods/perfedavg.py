"""Per-FedAvg (Fallah et al., 2020): MAML-style federated training; clients adapt the global model
with one step before they predict."""

from typing import Literal

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams


class PerFedAvgParams(MethodParams):
    variant: Literal["fo", "hf"] = Field("fo", description="`fo` (first-order) or `hf` (Hessian-free: the Hessian-vector product by a second backward pass)")
    alpha: float = Field(0.005, gt=0, description="inner step, and the one adaptation step before evaluation (the pFedMe authors' MNIST runs of Per-FedAvg)")
    beta: float = Field(0.001, gt=0, description="outer (meta) step of the global model (the same runs)")


METHOD = Method(
    name="perfedavg",
    summary="MAML-style FedAvg; each client adapts the global model with one step before it predicts",
    client="pflower.client_app.perfedavg:PerFedAvgClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    params=PerFedAvgParams,
    averages=True,
    gradual=True,
)
