import torch
from client_app import Net
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from pflower.strategies import FedAvg, PFedLA

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    torch.manual_seed(42)
    model = Net()
    results = context.run_config["results-dir"] or None  # metrics.json, figures, a checkpoint a round
    if context.run_config["strategy"] == "pfedla":
        strategy = PFedLA(fraction_evaluate=0.5, evaluate_every=2, results_dir=results)
    else:
        strategy = FedAvg(fraction_train=0.67, results_dir=results)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"norm": float(torch.cat([p.detach().flatten() for p in model.parameters()]).norm())})

    initial = ArrayRecord(model.state_dict())
    num_rounds = context.run_config["num-server-rounds"]
    strategy.start(grid=grid, initial_arrays=initial, num_rounds=num_rounds, evaluate_fn=evaluate_fn)
