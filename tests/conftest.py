"""Shared fixtures: run configs built from pyproject's defaults, and an in-process Flower grid."""

from __future__ import annotations

import os
import re
import tomllib
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, Error, Message, Metadata, RecordDict
from flwr.common.config import flatten_dict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

ROOT = Path(__file__).resolve().parents[1]
#: The data root the data tests read (MNIST's files in its ``mnist`` folder, CIFAR-10's JPEG tree
#: in ``cifar10-jpg``): ``$PFLOWER_TEST_DATA``, else the ``shared/data`` beside the checkout.
DATA_ROOT = Path(os.environ.get("PFLOWER_TEST_DATA") or ROOT.parent / "shared" / "data")
MNIST_DIR = DATA_ROOT / "mnist"
#: Why a test that reads MNIST's own files skips, and how to get them.
NO_MNIST = f"no MNIST in {MNIST_DIR}: `pflower-data mnist --root {DATA_ROOT}` fetches it (or set PFLOWER_TEST_DATA to a data root that has it)"


def digits_as_mnist(folder: Path) -> Path:
    """MNIST's test files (``t10k-*-ubyte``) made of scikit-learn's embedded digits (1,797, 10
    classes), each 8x8 image scaled to 24x24 and placed in a 28x28 frame at 4 offsets (7,188
    images, about 720 a class): real, learnable digits in MNIST's format, for the tests that need
    MNIST-like files where no MNIST is (a fresh clone anywhere)."""
    from data_files import idx_bytes
    from sklearn.datasets import load_digits

    digits = load_digits()
    scaled = np.kron(digits.images / 16.0, np.ones((3, 3)))  # 24x24
    framed = [np.pad(scaled, ((0, 0), (top, 4 - top), (left, 4 - left))) for top, left in ((2, 2), (1, 3), (3, 1), (0, 4))]
    images = (np.concatenate(framed) * 255).round().astype(np.uint8)
    labels = np.tile(digits.target, len(framed)).astype(np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in (("t10k-images-idx3-ubyte", images), ("t10k-labels-idx1-ubyte", labels)):
        (folder / name).write_bytes(idx_bytes(arr))
    return folder


def mnist_like(tmp_path_factory) -> Path:
    """MNIST's folder where there is one, else :func:`digits_as_mnist` in a temporary folder."""
    return MNIST_DIR if MNIST_DIR.is_dir() else digits_as_mnist(tmp_path_factory.mktemp("mnist-like"))


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory) -> Path:
    return mnist_like(tmp_path_factory)


DEFAULTS = flatten_dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])

#: The suite compares runs with references it computes on the CPU (in process at rel=1e-5 and
#: below, Flower against in process at 1e-9): every ClientApp it runs, in this process or in the
#: SuperLinks and Ray heads it starts, computes on the CPU too, GPU or not. tests/test_cuda.py
#: chooses the GPU itself.
os.environ["PFLOWER_DEVICE"] = "cpu"


#: xdist groups, longest first: collected first, each starts on a worker of its own at once
#: instead of after a worker's share of the unit tests (pyproject's addopts turn off xdist's
#: reordering of groups by their number of tests, which queued them behind the resume sweep's).
#: Four, one per worker: a fifth would share the worker of the first to run short of tests.
LONG_GROUPS = ("deployment", "simulation-faults", "simulation", "crash")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        group = item.get_closest_marker("xdist_group")
        return LONG_GROUPS.index(group.args[0]) if group and group.args[0] in LONG_GROUPS else len(LONG_GROUPS)

    items.sort(key=rank)  # stable: file order within a group and among the rest


def with_metadata(msg: Message, **changes) -> Message:
    """A copy of ``msg`` whose metadata has ``changes`` (message_id=..., src_node_id=...), built
    with Flower's public ``Metadata`` constructor instead of writing its private fields."""
    m = msg.metadata
    fields = dict(run_id=m.run_id, message_id=m.message_id, src_node_id=m.src_node_id, dst_node_id=m.dst_node_id,
                  reply_to_message_id=m.reply_to_message_id, group_id=m.group_id, created_at=m.created_at, ttl=m.ttl,
                  message_type=m.message_type)  # fmt: skip
    metadata = Metadata(**{**fields, **changes})
    if msg.has_error():
        return Message(error=msg.error, metadata=metadata)
    return Message(content=msg.content, metadata=metadata)


def run_config(**overrides) -> dict:
    """pyproject's run config with overrides given as python names: shared keys as they are
    (lr=..., num_server_rounds=...), a method's own keys after its name and a double underscore
    (heurpfedla__top_k=2 for 'heurpfedla.top-k')."""
    cfg = dict(DEFAULTS)
    for k, v in overrides.items():
        key = k.replace("__", ".").replace("_", "-")
        assert key in cfg, f"unknown run-config key {key}"
        cfg[key] = v
    return cfg


def representatives() -> dict[str, dict]:
    """One method per server strategy (the first by name), with its declared example config:
    the distinct server paths that end-to-end tests run."""
    from pflower.methods import declarations

    chosen: dict[str, dict] = {}
    for name, m in declarations().items():
        if m.strategy not in {declarations()[c].strategy for c in chosen}:
            chosen[name] = dict(m.example)
    return chosen


def over_the_wire(msg: Message) -> Message:
    """``msg`` as the other side gets it: Flower's protobuf form, to bytes and back."""
    from flwr.common.serde import message_from_proto, message_to_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage

    return message_from_proto(ProtoMessage.FromString(message_to_proto(msg).SerializeToString()))


def context_over_the_wire(context: Context) -> Context:
    """``context`` as a SuperNode keeps it between messages: Flower's protobuf form and back."""
    from flwr.common.serde import context_from_proto, context_to_proto
    from flwr.proto.message_pb2 import Context as ProtoContext

    return context_from_proto(ProtoContext.FromString(context_to_proto(context).SerializeToString()))


class InProcessGrid(Grid):
    """A Grid that hands each message straight to a ClientApp in this process.

    Runs the real ServerApp-side strategy code and the real ClientApp handlers without Ray or a
    SuperLink. Every message, reply and node context goes through Flower's wire format
    (:func:`over_the_wire`), so what a method sends is what a deployment carries. ``tamper`` may
    rewrite any reply after that (to test validation); an exception in the ClientApp becomes an
    error reply, as in Flower. A node keeps the context a raising ClientApp left, as a SuperNode
    does; with ``simulation`` it keeps the one from before, as Flower's simulation engine does
    (its ClientApp works on a copy that comes back only with a reply).
    """

    def __init__(self, client_app, cfg: dict, num_clients: int, tamper: Callable[[int, Message], Message] | None = None,
                 node_configs: dict[int, dict] | None = None, simulation: bool = False):  # fmt: skip
        self.simulation = simulation
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.app = client_app
        self.tamper = tamper
        node_configs = node_configs or {}
        self.contexts = {
            100 + i: Context(1, 100 + i, {"partition-id": i, "num-partitions": num_clients, **node_configs.get(i, {})}, RecordDict(), dict(cfg))
            for i in range(num_clients)
        }
        self.offline: set[int] = set()
        self.sent: list[Message] = []
        self.replies: dict[str, Message] = {}  # message id -> reply not pulled yet

    def set_run(self, run):  # pragma: no cover - not used in-process
        raise NotImplementedError

    @property
    def run(self):  # pragma: no cover
        raise NotImplementedError

    def create_message(self, *args, **kwargs):  # pragma: no cover
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.contexts if n not in self.offline]

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Run the ClientApp on each message now; its reply waits for :meth:`pull_messages`."""
        ids = []
        for msg in messages:
            msg = with_metadata(msg, message_id=uuid.uuid4().hex)
            self.sent.append(msg)
            ids.append(msg.metadata.message_id)
            node = msg.metadata.dst_node_id
            if node in self.offline:  # as Flower answers for a SuperNode that is gone
                self.replies[msg.metadata.message_id] = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="offline"), reply_to=msg)
                continue
            context = context_over_the_wire(self.contexts[node]) if self.simulation else self.contexts[node]
            try:
                reply = over_the_wire(self.app(over_the_wire(msg), context))  # its own copy, as a node's is: `sent` keeps what was sent
            except Exception as err:  # noqa: BLE001 - Flower turns ClientApp exceptions into error replies
                reply = Message(Error(code=1, reason=str(err)), reply_to=msg)
                context = self.contexts[node] if self.simulation else context
            self.contexts[node] = context_over_the_wire(context)
            if self.tamper is not None:
                reply = self.tamper(self.contexts[node].node_config["partition-id"], reply)
            self.replies[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))


def client_state(context: Context) -> RecordDict:
    """A client's state as its next message finds it: its context's, or the saved file the
    context names (:data:`pflower.client_app.store.SAVED`)."""
    from pflower.client_app.app import runtime
    from pflower.client_app.store import SAVED

    if SAVED not in context.state:
        return context.state
    saved = context.state[SAVED]
    return runtime(context).store(context).load_round(str(saved["lineage"]), int(saved["round"]))


def assert_same_state(a: dict, b: dict) -> None:
    """Two strategy state dicts are equal: tensors exactly, dicts of tensors entry by entry."""
    import torch

    assert a.keys() == b.keys()
    for key, x in a.items():
        y = b[key]
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), key
        elif isinstance(x, dict) and x and isinstance(next(iter(x.values())), torch.Tensor):
            assert x.keys() == y.keys() and all(torch.equal(x[i], y[i]) for i in x), key
        else:
            assert x == y, key


def faulty_app(directory: Path, fault: str, partition: int = 0) -> Path:
    """A copy of this Flower app whose ClientApp is ``tests/faulty_client.py`` with ``fault``."""
    directory.mkdir(parents=True, exist_ok=True)
    source = (ROOT / "tests" / "faulty_client.py").read_text()
    source = source.replace('FAULT = "nan"', f"FAULT = {fault!r}").replace("FAULTY_PARTITION = 0", f"FAULTY_PARTITION = {partition}")
    (directory / "faulty_client.py").write_text(source)
    project = (ROOT / "pyproject.toml").read_text()
    project = project.replace('clientapp = "pflower.client_app.app:app"', 'clientapp = "faulty_client:app"')
    project = project.replace('fab-include = ["pflower/**/*.py"]', 'fab-include = ["faulty_client.py"]')
    project = re.sub(r"^fab-exclude = \[[^]]*\]\n", "", project, flags=re.M)  # its patterns would match no file here
    (directory / "pyproject.toml").write_text(project)
    return directory


@pytest.fixture(scope="session")
def superlink(tmp_path_factory):
    """A simulation SuperLink (and its Ray head) shared by the tests of one xdist worker, of
    every module: the fault simulations' worker runs two modules' tests on one; yields its FLWR_HOME."""
    from pflower.launcher import simulation_superlink

    home = tmp_path_factory.mktemp("flwr-home")
    with simulation_superlink(home):
        yield home


def run_on_flower(superlink: Path, config: str, clients: int = 3, cpus: int = 2, app: Path = ROOT, clients_per_node: int = 1):
    """Submit ``app`` with ``config`` to the ``superlink`` fixture: (run id, status, log).

    ``cpus=2`` (the default here) gives each ClientApp both cores, so Ray starts one worker
    instead of two: the suite runs three Flower systems at once on two cores.
    """
    from pflower.launcher import submit

    return submit(app, superlink, config, num_clients=clients, cpus=cpus, echo=False, clients_per_node=clients_per_node)


def load_app(directory: Path, name: str):
    """The ClientApp of a :func:`faulty_app` directory, imported in this process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, directory / "faulty_client.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.app


@pytest.fixture
def no_figures(monkeypatch):
    """Finished runs draw no figures: a third of a short in-process run's time, and not what the
    tests that use this check."""
    monkeypatch.setattr("pflower.results.draw_run", lambda doc, directory: [])


@pytest.fixture
def grid_factory():
    from pflower.client_app.app import app

    def make(cfg: dict, num_clients: int, **kw) -> InProcessGrid:
        return InProcessGrid(app, cfg, num_clients, **kw)

    return make


@pytest.fixture
def client_module():
    """The module ``pflower.client_app.app`` (its package exports the ClientApp under the same
    name), with the models it caches per process built anew (on the device in force) and dropped after."""
    import importlib

    module = importlib.import_module("pflower.client_app.app")
    caches = (module._shared, module._runtime, module._node_runtime)
    for cache in caches:
        cache.cache_clear()
    yield module
    for cache in caches:
        cache.cache_clear()


def in_process_rounds(cfg: dict, results: Path, num_clients: int = 3) -> list[dict]:
    """Run ``cfg`` in process (results in ``results``); its per-round metrics without timings
    (:func:`pflower.results.outcome`: what a run on Flower of the same config shares)."""
    import json

    from pflower.build import build_strategy
    from pflower.client_app.app import app
    from pflower.config import load_settings
    from pflower.results import outcome

    cfg = {**cfg, "results-dir": str(results)}
    build_strategy(load_settings(cfg)).start(grid=InProcessGrid(app, cfg, num_clients))
    doc = json.loads((results / "metrics.json").read_text())
    return [outcome(r) for r in doc["rounds"]]


def assert_quickstart_run(doc: dict, net, strategy: str) -> None:
    """What examples/quickstart's ServerApp promises in its metrics.json (``net``: the client's
    ``Net``): initial_arrays reach evaluate_fn before round 1 and every client in round 1,
    evaluate_fn runs after every round; pFedLA evaluates every 2nd round with half the 4 clients
    and all in the last, FedAvg every round, training 3 of them."""
    import torch

    torch.manual_seed(42)
    norm = float(torch.cat([p.detach().flatten() for p in net().parameters()]).norm())
    rounds = doc["rounds"]
    assert doc["initial-server-evaluation"]["norm"] == pytest.approx(norm)
    assert rounds[0]["train-metrics"]["received-norm"] == pytest.approx(norm, rel=1e-6)
    assert all("norm" in r["server-evaluation"] for r in rounds) and doc["num-clients"] == 4
    if strategy == "pfedla":
        assert [r["evaluated"] for r in rounds] == [0, 2, 4] and rounds[0]["accuracy"] is None
        assert len(rounds[-1]["alpha"]) == 4 and rounds[-1]["sampled"] == 4
    else:
        assert [r["evaluated"] for r in rounds] == [4, 4, 4] and all(r["sampled"] == 3 for r in rounds)
