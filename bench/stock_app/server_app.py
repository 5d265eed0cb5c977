"""A quickstart-style ServerApp: Flower's own FedAvg over every node; it writes when each round
ended (its centralized evaluate_fn is called once before round 1 and after every round)."""

import json
import time
from pathlib import Path

import torch
from client_app import Net
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    torch.manual_seed(int(context.run_config["seed"]))
    stamps: list[float] = []
    out = Path(context.run_config["results-dir"])

    def stamp(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        stamps.append(time.monotonic())
        out.mkdir(parents=True, exist_ok=True)
        (out / "rounds.json").write_text(json.dumps({"round-seconds": [b - a for a, b in zip(stamps, stamps[1:])]}))
        return MetricRecord({})

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=3)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        train_config=ConfigRecord({}),
        num_rounds=int(context.run_config["num-server-rounds"]),
        evaluate_fn=stamp,
    )
