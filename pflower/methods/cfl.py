"""Clustered FL (Sattler, Müller & Samek, IEEE TNNLS 2020): FedAvg that splits a cluster of
clients in two when its training has stalled while some clients still move far, by the cosine
similarity of their updates; each cluster has its own model."""

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams


class ClusteredFLParams(MethodParams):
    eps1: float = Field(
        0.4, gt=0, description="ε₁: a cluster may split only when the norm of its mean update ‖Σ_i (n_i/n) Δθ_i‖ is below this (it is near a stationary point)"
    )
    eps2: float = Field(
        1.0, ge=0, description="ε₂: ... and only when its largest client update max_i ‖Δθ_i‖ is above this (some client is far from its own optimum)"
    )
    gamma_max: float = Field(
        0.0, ge=0, lt=1, description="γ_max: a split is made only if √((1 − α_cross)/2) > γ_max, α_cross the largest cosine similarity across it (0: any split)"
    )
    warmup_rounds: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="no cluster splits in the first this many rounds (0: from round 1, as the paper's algorithm; the reference code waits 20)",
    )
    min_split_size: int = Field(3, ge=2, le=1_000_000, description="a cluster splits only if it has at least this many clients (the reference code's 3)")


METHOD = Method(
    name="cfl",
    summary="clusters of clients, one model each, FedAvg within a cluster; a stalled cluster splits in two by its clients' update similarities",
    client="pflower.client_app.cfl:ClusteredFLClient",
    strategy="pflower.strategies.cfl:ClusteredFL",
    params=ClusteredFLParams,
    example={"partition": "label-groups"},
)
