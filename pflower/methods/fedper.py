"""FedPer (Arivazhagan et al., 2019): the classifier head stays personal, the body is averaged."""

from pflower.methods.declaration import Method

METHOD = Method(
    name="fedper",
    summary="the head stays personal, the body is averaged",
    client="pflower.client_app.fedper:FedPerClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    averages=True,
    gradual=True,
)
