"""pFedHN (Shamsian et al., ICML 2021): a server-side hypernetwork generates each client's whole model."""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams


class PFedHNParams(MethodParams):
    embedding_dim: int = Field(0, ge=0, le=4096, description="size of each client's embedding; 0: 1 + N/4 (the official code's)")
    hidden_dim: int = Field(100, ge=1, le=256, description="width of the hypernetwork's MLP")
    n_hidden: int = Field(3, ge=0, le=64, description="hidden layers of the MLP after its first")
    hn_lr: float = Field(0.01, gt=0, description="SGD step of the hypernetwork and embeddings (the official code's)")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum of the hypernetwork")
    weight_decay: float = Field(0.001, ge=0, description="weight decay of the hypernetwork")


METHOD = Method(
    name="pfedhn",
    summary="one server-side hypernetwork generates each client's whole model from the client's embedding",
    client="pflower.client_app.pfedhn:PFedHNClient",
    strategy="pflower.strategies.pfedhn:PFedHN",
    params=PFedHNParams,
)
