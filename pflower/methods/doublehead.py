"""Double head (Li et al.): a global and a local head on a shared base; combines with gradual sharing."""

from typing import Literal

from pydantic import Field

from pflower.methods.declaration import Method, MethodParams


class DoubleHeadParams(MethodParams):
    heads: Literal["last", "classifier"] = Field(
        "last", description="what each head is: `last` (the last Linear) or `classifier` (every fully connected layer, the paper's split)"
    )


def wrap(model, params: DoubleHeadParams):
    from pflower.models.doublehead import DoubleHead

    return DoubleHead(model, params.heads)


METHOD = Method(
    name="doublehead",
    summary="a base and a global head averaged, a local head that never leaves the client",
    client="pflower.client_app.doublehead:DoubleHeadClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    params=DoubleHeadParams,
    wrap=wrap,
    averages=True,
    gradual=True,
    example={"gradual-interval": 1, "test-mode": "both"},
)
