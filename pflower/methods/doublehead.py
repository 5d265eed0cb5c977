"""Double head (Li et al.): a global and a local head on a shared base; combines with gradual sharing."""

from pflower.methods.declaration import Method


def wrap(model, params):
    from pflower.models.doublehead import DoubleHead

    return DoubleHead(model)


METHOD = Method(
    name="doublehead",
    summary="a base and a global head averaged, a local head that never leaves the client",
    client="pflower.client_app.doublehead:DoubleHeadClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    wrap=wrap,
    averages=True,
    gradual=True,
    example={"gradual-interval": 1, "test-mode": "both"},
)
