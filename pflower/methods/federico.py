"""FedeRiCo (decentralized EM): clients choose collaborators epsilon-greedily through a gossip
overlay; the server only relays."""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams


class FedericoParams(MethodParams):
    view_size: int = Field(4, ge=1, description="peers in each client's partial view (gossip peer sampling)")
    neighbours: int = Field(3, ge=1, description="peers whose models a client uses each round (besides its own)")
    epsilon: float = Field(0.3, ge=0, le=1, description="per neighbour slot, the probability of a random view peer instead of the best-weighted one")
    momentum: float = Field(0.5, gt=0, le=1, description="β of the loss EMA, L ← (1 − β) L + β loss")


METHOD = Method(
    name="federico",
    summary="no central model: each client mixes the models of collaborators it picks by EM; the server relays",
    client="pflower.client_app.federico:FedericoClient",
    strategy="pflower.strategies.federico:FedericoRelay",
    params=FedericoParams,
    example={"partition": "label-groups"},
    no_finetune="its prediction is a mixture of models, not one network",
)
