"""pFedLA (Ma et al., CVPR 2022): server-side hypernetworks learn layer-wise aggregation weights per client."""

from typing import Literal

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams


class PFedLAParams(MethodParams):
    hn_lr: float = Field(100.0, ge=0, description="SGD step of the hypernetworks and embeddings on the norm-scaled loss; 0 freezes the weights (the ablation)")
    head_start: Literal["sum-1", "sum-n"] = Field(
        "sum-1",
        description="the heads' raw outputs start at 1/N each (`sum-1`: the weights learn) or at 1 each (`sum-n`, as the paper leaves it: every step on the weights damped by 1/N², the ablation)",
    )
    layer_loss: Literal["norm", "raw"] = Field(
        "norm",
        description="each layer's hypernetwork loss divided by the clients' squared norms in that layer (`norm`) or not (`raw`, as the paper leaves it: large layers dominate, the ablation)",
    )
    embedding_dim: int = Field(100, ge=1, le=4096, description="size of each client's embedding")
    hidden_dim: int = Field(100, ge=1, le=4096, description="width of the hypernetworks' 3-layer ReLU MLP")
    key_dim: int = Field(
        100,
        ge=1,
        le=4096,
        description="heads are Linear(hidden → N) per layer while N ≤ this; beyond it a fixed random projection of this size keeps memory per client independent of N",
    )


METHOD = Method(
    name="pfedla",
    summary="each client's model mixed layer by layer from all clients' models, weights learned by server-side hypernetworks",
    client="pflower.client_app.pfedla:PFedLAClient",
    strategy="pflower.strategies.pfedla:PFedLA",
    params=PFedLAParams,
)
