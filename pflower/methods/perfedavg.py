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
    # The defaults barely move in a few rounds (digits, 12 rounds: training loss 2.29 -> 2.29, both
    # steps at 0.01: -> 2.12). These steps had the lowest final training loss (0.30; the test split
    # was not looked at) of (alpha, beta) in (0.005, 0.001), (0.01, 0.01), (0.05, 0.05), (0.1, 0.1),
    # (0.02, 0.1), (0.1, 0.02); beta 0.1 is the run's default lr.
    example={"perfedavg.alpha": 0.02, "perfedavg.beta": 0.1},
)
