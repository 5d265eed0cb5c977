"""FedRep (Collins et al., 2021): head epochs with the body frozen, then body epochs; the body is averaged."""

from pydantic import Field

from pflower.methods.declaration import HeadParams, Method, wrap_head


class FedRepParams(HeadParams):
    body_epochs: int = Field(1, ge=1, le=1000, description="body epochs after `local-epochs` head epochs (or `local-steps` head steps)")


METHOD = Method(
    name="fedrep",
    summary="the head trained first with the body frozen, then the body; the body is averaged",
    client="pflower.client_app.fedrep:FedRepClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    params=FedRepParams,
    wrap=wrap_head,
    averages=True,
    gradual=True,
)
