"""FedAvg (McMahan et al., 2017): one global model; the clients train it, the server averages it."""

from pflower.methods.declaration import Method

METHOD = Method(
    name="fedavg",
    summary="one global model: clients train it, the server averages their models by samples",
    client="pflower.client_app.base:ClientMethod",
    strategy="pflower.strategies.fedavg:FedAvg",
    averages=True,
    gradual=True,
)
