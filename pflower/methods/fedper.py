"""FedPer (Arivazhagan et al., 2019): the classifier head stays personal, the body is averaged."""

from pflower.methods.declaration import HeadParams, Method, wrap_head

METHOD = Method(
    name="fedper",
    summary="the head stays personal, the body is averaged",
    client="pflower.client_app.fedper:FedPerClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    params=HeadParams,
    wrap=wrap_head,
    averages=True,
    gradual=True,
)
