"""A quickstart-style ClientApp with no pflower code: it trains and evaluates what it is sent.

Each node makes its own data from its ``partition-id``: points of 2 of 4 Gaussian classes.
"""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

app = ClientApp()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.hidden(x))))


def load_data(partition_id: int, n: int = 96):
    g = torch.Generator().manual_seed(partition_id)
    classes = torch.tensor([partition_id % 4, (partition_id + 1) % 4])
    y = classes[torch.randint(0, 2, (n,), generator=g)]
    centers = torch.eye(4, 8) * 3
    return centers[y] + torch.randn(n, 8, generator=g), y


def _model(msg: Message) -> Net:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model


@app.train()
def train(msg: Message, context: Context):
    model = _model(msg)
    received = float(torch.cat([p.detach().flatten() for p in model.parameters()]).norm())
    x, y = load_data(int(context.node_config["partition-id"]))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for i in range(0, len(y), 16):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i : i + 16]), y[i : i + 16])
        loss.backward()
        opt.step()
    metrics = MetricRecord({"num-examples": len(y), "train-loss": loss.item(), "received-norm": received})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    model = _model(msg).eval()
    x, y = load_data(int(context.node_config["partition-id"]) + 1000)
    with torch.no_grad():
        logits = model(x)
    metrics = {"num-examples": len(y), "loss": float(nn.functional.cross_entropy(logits, y)), "accuracy": float((logits.argmax(1) == y).float().mean())}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
