"""A quickstart-style ClientApp (Flower's quickstart-pytorch, with the data read from local IDX
files instead of the Hub): each node takes its iid share of the MNIST files by ``partition-id``,
trains the CNN pflower uses for MNIST (same layers, plain SGD) and evaluates on its held-out 30%,
on the GPU where its actor was given one (as the quickstart does).

``client-work='none'`` makes both handlers no-ops that only reply (the received arrays back, fixed
metrics): the floor of Flower's engine in ``bench/cheap_clients.py``."""

import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

app = ClientApp()
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 16, 5), nn.Conv2d(16, 32, 5)
        self.fc1, self.fc2 = nn.Linear(32 * 4 * 4, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def _idx(path: Path) -> np.ndarray:
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3])]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def load_data(context: Context):
    """(train, test) tensors of this node's iid share of every IDX pair in data-dir, read once per
    process and partition (as Flower's quickstart keeps its ``FederatedDataset`` in a global)."""
    cfg, node = context.run_config, context.node_config
    return _partition(str(cfg["data-dir"]), int(cfg["seed"]), float(cfg["test-fraction"]), int(node["num-partitions"]), int(node["partition-id"]))


@lru_cache(maxsize=1)
def _pool(root: str) -> tuple[np.ndarray, np.ndarray]:
    images = sorted(Path(root).glob("*images-idx3-ubyte*"))
    x = np.concatenate([_idx(p) for p in images]).astype(np.float32)[:, None] / 255.0
    y = np.concatenate([_idx(p.with_name(p.name.replace("images-idx3", "labels-idx1"))) for p in images]).astype(np.int64)
    return (x - x.mean()) / x.std(), y


@lru_cache(maxsize=4096)
def _partition(root: str, seed: int, test_fraction: float, partitions: int, partition: int):
    x, y = _pool(root)
    mine = np.array_split(np.random.default_rng(seed).permutation(len(y)), partitions)[partition]
    cut = int(len(mine) * (1 - test_fraction))
    tr, te = mine[:cut], mine[cut:]
    return (torch.from_numpy(x[tr]), torch.from_numpy(y[tr])), (torch.from_numpy(x[te]), torch.from_numpy(y[te]))


def _idle(context: Context) -> bool:
    return context.run_config.get("client-work", "full") == "none"


@app.train()
def train(msg: Message, context: Context):
    if _idle(context):
        content = RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"train_loss": 0.0, "num-examples": 1})})
        return Message(content, reply_to=msg)
    model = Net().to(DEVICE)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    (x, y), _ = load_data(context)
    x, y = x.to(DEVICE), y.to(DEVICE)
    cfg, bs = context.run_config, int(context.run_config["batch-size"])
    opt = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]))
    model.train()
    for _ in range(int(cfg["local-epochs"])):
        order = torch.randperm(len(y), device=DEVICE)
        for i in range(0, len(y), bs):
            b = order[i : i + bs]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[b]), y[b])
            loss.backward()
            opt.step()
    metrics = MetricRecord({"train_loss": loss.item(), "num-examples": len(y)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    if _idle(context):
        return Message(RecordDict({"metrics": MetricRecord({"eval_loss": 0.0, "eval_acc": 0.0, "num-examples": 1})}), reply_to=msg)
    model = Net().to(DEVICE)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, (x, y) = load_data(context)
    x, y = x.to(DEVICE), y.to(DEVICE)
    model.eval()
    with torch.no_grad():
        logits = model(x)
    metrics = {"eval_loss": float(nn.functional.cross_entropy(logits, y)), "eval_acc": float((logits.argmax(1) == y).float().mean()), "num-examples": len(y)}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
