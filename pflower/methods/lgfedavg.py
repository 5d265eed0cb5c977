"""LG-FedAvg (Liang et al., 2020): local representations, a global head."""

from pflower.methods.declaration import HeadParams, Method, wrap_head

METHOD = Method(
    name="lgfedavg",
    summary="the body stays personal, the head is averaged (FedPer reversed)",
    client="pflower.client_app.lgfedavg:LGFedAvgClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    params=HeadParams,
    wrap=wrap_head,
    averages=True,
)
