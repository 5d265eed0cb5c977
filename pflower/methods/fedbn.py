"""FedBN (Li et al., 2021): normalization layers stay personal, everything else is averaged."""

from pflower.methods.declaration import Method

METHOD = Method(
    name="fedbn",
    summary="normalization layers stay personal (use a model with them: `model='cnn-bn'`)",
    client="pflower.client_app.fedbn:FedBNClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    averages=True,
    gradual=True,
    example={"model": "cnn-bn"},
)
