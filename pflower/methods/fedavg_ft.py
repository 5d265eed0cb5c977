"""FedAvg+ (FedeRiCo's baseline): FedAvg whose clients fine-tune the global model one local epoch
before every evaluation; it shows what fine-tuning alone buys."""

from pflower.methods.declaration import Method

METHOD = Method(
    name="fedavg-ft",
    summary="FedAvg, evaluated after 1 local epoch of fine-tuning (FedeRiCo's FedAvg+)",
    client="pflower.client_app.fedavg_ft:FedAvgFTClient",
    strategy="pflower.strategies.fedavg:FedAvg",
    averages=True,
    gradual=True,
    no_finetune="it fine-tunes 1 epoch by definition; for another number use method='fedavg'",
)
