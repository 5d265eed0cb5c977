"""pFedLA server cost: time per round and peak memory for N = 10, 100 and 1000 clients.

The real strategy (``PFedLA.start``: identity query, personalized models, reply validation,
hypernetwork updates, metrics and checkpoint every round) runs against a grid of stand-in
clients that answer instantly: a training reply is the received model plus small noise. So the
figures are the server's own cost. Each N runs in a fresh process; its memory is measured
above the resident size after a 2-client warm-up run (the runtime's fixed cost: about 0.6 GB
of torch, Flower and matplotlib, the same for every N): the state between rounds (the largest
resident size as a round starts, and after the last) and the peak (with a round's messages and
replies in flight, at most 64 messages as in a simulation: the last round evaluates every
client, each personalized model built as its message goes). Budget: 1.5 x what N client
models and the hypernetworks need.

    .venv/bin/python bench/pfedla_server.py                 # N = 10, 100, 1000
    .venv/bin/python bench/pfedla_server.py --clients 1000 --hn-hidden-dim 50 --hn-key-dim 50
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch
from flwr.app import Message, MessageType, Metadata, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

ROOT = Path(__file__).resolve().parents[1]
MNIST = ROOT.parent / "shared" / "data" / "mnist"
SERVER_PHASES = ("configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class StandInClients(Grid):
    """N clients that reply at once: trained model = received + N(0, 0.01^2) noise."""

    def __init__(self, num_clients: int, seed: int = 0):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.n = num_clients
        self.gen = torch.Generator().manual_seed(seed)
        self.replies: dict[str, Message] = {}

    def get_node_ids(self):
        return [1000 + i for i in range(self.n)]

    def _reply(self, msg: Message, message_id: str) -> Message:
        """The stand-in client's reply to ``msg``, which the grid gave ``message_id``."""
        from pflower.records import from_record, to_record

        cid = msg.metadata.dst_node_id - 1000
        metrics = {"client-id": cid, "num-examples": 100}
        if msg.metadata.message_type == MessageType.QUERY:
            content = RecordDict({"metrics": MetricRecord({**metrics, "num-clients": self.n})})
        elif msg.metadata.message_type == MessageType.EVALUATE:
            content = RecordDict({"metrics": MetricRecord({**metrics, "accuracy": 0.5, "loss": 1.0})})
        else:
            got = from_record(msg.content.array_records["arrays"])
            trained = {k: v + 0.01 * torch.randn(v.shape, generator=self.gen) for k, v in got.items()}
            content = RecordDict({"arrays": to_record(trained), "metrics": MetricRecord({**metrics, "train-loss": 1.0})})
        metadata = Metadata(run_id=1, message_id=uuid.uuid4().hex, src_node_id=msg.metadata.dst_node_id, dst_node_id=1,
                            reply_to_message_id=message_id, group_id="", created_at=time.time(), ttl=3600.0,
                            message_type=msg.metadata.message_type)  # fmt: skip
        return Message(content=content, metadata=metadata)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            message_id = uuid.uuid4().hex
            self.replies[message_id] = self._reply(msg, message_id)
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def set_run(self, run):  # pragma: no cover
        raise NotImplementedError

    run = property(lambda self: None)
    create_message = send_and_receive = set_run


def measure(num_clients: int, fraction: float, rounds: int, hidden: int, key_dim: int) -> dict:
    """One process, one N: run the strategy and time its server-side phases. Its phases keep at
    most :data:`SIMULATION_WINDOW` messages in flight, as on Flower's in-memory grid."""
    from pflower.build import build_strategy
    from pflower.config import load_settings
    from pflower.strategies import federation

    federation.window_for = lambda grid: federation.SIMULATION_WINDOW
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as out:
        # Warm-up run with 2 clients: torch, autograd, Flower and matplotlib allocate their
        # one-time buffers here, so the baseline below leaves out the runtime's fixed cost.
        warm = {"method": "pfedla", "dataset": "mnist", "data-dir": str(MNIST), "num-server-rounds": 1, "results-dir": out}
        build_strategy(load_settings(warm)).start(grid=StandInClients(2))
        cfg = {
            "method": "pfedla",
            "dataset": "mnist",
            "data-dir": str(MNIST),
            "num-server-rounds": rounds,
            "fraction-train": fraction,
            "fraction-evaluate": fraction,
            "pfedla.hidden-dim": hidden,
            "pfedla.key-dim": key_dim,
            "results-dir": out,
        }
        settings = load_settings(cfg)
        base = rss_bytes()
        strategy = build_strategy(settings)
        spent = {name: 0.0 for name in SERVER_PHASES}
        per_round: list[float] = []

        def timed(name, fn):
            def wrapper(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    spent[name] += time.perf_counter() - t0

            return wrapper

        for name in SERVER_PHASES:
            setattr(strategy, name, timed(name, getattr(strategy, name)))
        at_rest: list[int] = []  # resident size as each round starts: the state between rounds
        configure_train = strategy.configure_train

        def round_start(*args, **kwargs):  # a round's server time: from its start to the next's
            at_rest.append(rss_bytes() - base)
            per_round.append(sum(spent.values()))
            return configure_train(*args, **kwargs)

        strategy.configure_train = round_start
        strategy.start(grid=StandInClients(num_clients))
        at_rest.append(rss_bytes() - base)
        per_round.append(sum(spent.values()))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model_bytes = strategy.theta.shape[1] * 4
    hn_bytes = sum(t.numel() * t.element_size() for t in [*strategy.hn.params.values(), strategy.hn.keys])
    rounds_s = [b - a for a, b in zip(per_round[:-1], per_round[1:])]
    sampled = len(strategy.federation.sample(strategy.fraction_train, 1))
    return {
        "clients": num_clients,
        "sampled": sampled,
        "hn-hidden-dim": hidden,
        "hn-key-dim": key_dim,
        "server-seconds-per-round": sorted(rounds_s)[len(rounds_s) // 2],
        "server-memory-bytes": peak - base,
        "state-bytes": max(at_rest),
        "budget-bytes": int(1.5 * (num_clients * model_bytes + hn_bytes)),
        "hypernetwork-bytes": hn_bytes,
        "theta-bytes": strategy.theta.numel() * 4,
        "phase-seconds": {k: round(v / rounds, 3) for k, v in spent.items()},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="*", default=[10, 100, 1000])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--hn-hidden-dim", type=int, default=100)
    p.add_argument("--hn-key-dim", type=int, default=100)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child process mode
    args = p.parse_args()
    if args.one:
        n = args.clients[0]
        print(json.dumps(measure(n, 1.0 if n <= 10 else 0.1, args.rounds, args.hn_hidden_dim, args.hn_key_dim)))
        return 0
    print("| N | sampled | hn hidden/key | server s/round | s/round per (sampled x N) | models + hypernetworks MiB "
          "| state between rounds MiB | peak MiB | budget MiB | state within | peak within |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.clients:
        cmd = [
            sys.executable,
            __file__,
            "--one",
            "--clients",
            str(n),
            "--rounds",
            str(args.rounds),
            "--hn-hidden-dim",
            str(args.hn_hidden_dim),
            "--hn-key-dim",
            str(args.hn_key_dim),
        ]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        t = r["server-seconds-per-round"]
        mb, rest = r["server-memory-bytes"] / 2**20, r["state-bytes"] / 2**20
        need, budget = (r["theta-bytes"] + r["hypernetwork-bytes"]) / 2**20, r["budget-bytes"] / 2**20
        print(
            f"| {n} | {r['sampled']} | {r['hn-hidden-dim']}/{r['hn-key-dim']} | {t:.3f} | {t / (r['sampled'] * n):.2e} "
            f"| {need:.0f} | {rest:.0f} | {mb:.0f} | {budget:.0f} | {'yes' if rest <= budget else 'no'} | {'yes' if mb <= budget else 'no'} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
