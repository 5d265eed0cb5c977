"""The ClientApp: thin Flower glue around a method's :class:`ClientMethod`.

Each client keeps its whole personal model in ``context.state["personal"]``; a message
overwrites the arrays it carries (only those the method's declared client state receives,
:mod:`pflower.client_state`), the method trains, and only the arrays it uploads (those the
gradual-sharing schedule releases in this round) go back.
After training the personal state is saved to disk (:mod:`pflower.client_app.store`), so a
resumed run or a restarted SuperNode continues with it, and between messages the context keeps
only where that file is: the next message reads it back.
Everything derived from the run config (settings, data, model) is cached per process; one
model object serves every client of the process.
"""

from __future__ import annotations

import copy
import os
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import ClientAppException
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from torch import nn

from pflower import node_groups, reply_metrics, single_message
from pflower.build import build_model, client_method
from pflower.client_app.base import PERSONAL, ClientMethod
from pflower.client_app.store import SAVED, StateError, StateStore, keep_on_disk
from pflower.client_state import ClientState
from pflower.config import Settings, load_settings
from pflower.datasets.federated import Split, client_data, client_domain, global_test, label_counts, pool_for
from pflower.datasets.folder import FolderError
from pflower.datasets.node import CLASS_NAMES, IDENTITY, NodeData, load_node_data
from pflower.datasets.partition import PartitionError
from pflower.datasets.shift import DOMAIN
from pflower.datasets.sources import DataError
from pflower.device import deterministic_kernels, device
from pflower.records import from_record, received_state, to_record
from pflower.sharing import GradualSharing
from pflower.state_round import STATE_ROUND, MissingStateError


def _deterministic(msg: Message, context: Context, call_next) -> Message:
    """Every message runs with deterministic kernels, set before its handler's first CUDA work."""
    deterministic_kernels()
    return call_next(msg, context)


def _evaluate_first(msg: Message, context: Context, call_next) -> Message:
    """A message that carries the previous round's evaluation (:mod:`pflower.single_message`):
    evaluate first, the personal state the evaluation names, then handle the message; the reply
    carries the evaluation's metrics as ``evaluation``, or why it failed (the message itself is
    handled all the same: a failed evaluation never costs the round's training)."""
    riding = single_message.detach(msg) if msg.has_content() else None
    if riding is None:
        return call_next(msg, context)
    try:
        rt = runtime(context, msg)
        if msg.metadata.message_type.partition(".")[0] == MessageType.TRAIN and _points_to(context, _state_round(_config(msg))):
            rt.unpack(context)  # the message trains from the state the evaluation measures: read it once
        outcome = rt.evaluation(context, riding.config, riding.arrays)
    except Exception as err:  # noqa: BLE001 - reported to the server as the evaluation's error
        log(ERROR, "The evaluation riding on this message failed: %s: %s", type(err).__name__, err)
        outcome = single_message.failure(err)
    reply = call_next(msg, context)
    if reply.has_content():
        reply.content[single_message.EVALUATION if isinstance(outcome, MetricRecord) else single_message.EVALUATION_ERROR] = outcome
    return reply


#: The context record that marks its state as a relay round's work in progress (that round's).
IN_ROUND = "in-round"

#: What a client may find wrong with its data or settings: each is its own clear message.
DATA_PROBLEMS = (DataError, FolderError, PartitionError, StateError, MissingStateError)


def _named_failures(msg: Message, context: Context, call_next) -> Message:
    """A problem with the client's data (unreadable file, a partition it cannot fill, a saved
    state the server names that is not there) is answered
    with one line naming it, as an error reply: the server prints that line, and no engine logs
    a traceback of a message that was never a bug."""
    try:
        return call_next(msg, context)
    except DATA_PROBLEMS as err:
        log(ERROR, "%s", err)
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(err).__name__}: {err}"), reply_to=msg)


def _commit_on_success(msg: Message, context: Context, call_next) -> Message:
    """A client's state changes only when its message succeeds: a message that raises or is
    answered with an error (a training whose state file could not be written, a failed relay
    step) leaves ``context.state`` as the message found it, the state the server still names.
    A SuperNode keeps its context after a failed message, the simulation engine drops it: both
    then go on from the same state."""
    # Arrays are replaced whole, never changed in place; config and metric records may be (small: copied).
    before = RecordDict({name: record if isinstance(record, ArrayRecord) else copy.deepcopy(record) for name, record in context.state.items()})
    try:
        reply = call_next(msg, context)
    except BaseException:
        Runtime.hold(context, before)
        raise
    if reply.has_error():
        Runtime.hold(context, before)
    return reply


def _grouped(msg: Message, context: Context, call_next) -> Message:
    """A message for several clients of a simulated node (``simulated-clients``,
    :mod:`pflower.node_groups`): each client's part, as a message of its own type, goes through
    this ClientApp in turn, with the client's own context (its records under its id in the
    node's) and its own id as ``partition-id``; the reply carries each one's reply, or its error
    as the simulation engine would have answered it alone (the others' replies are kept)."""
    if not msg.has_content() or not node_groups.is_group(msg.content):
        return call_next(msg, context)
    clients = _settings(tuple(sorted(context.run_config.items()))).simulated_clients
    served = node_groups.members(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]), clients)
    if node_groups.asks_members(msg.content):
        return Message(node_groups.members_reply(served), reply_to=msg)
    parts, kinds = node_groups.unpack(msg.content), node_groups.types(msg.content)
    if stray := sorted(set(parts) - set(served)):
        raise ValueError(f"the message names clients {stray[:5]}, which this node does not serve ({served[:3]}...)")
    own: dict[int, RecordDict] = {}
    for key, record in context.state.items():
        cid, sep, name = key.partition(node_groups.SEPARATOR)
        if sep and cid.isdigit():
            own.setdefault(int(cid), RecordDict())[name] = record
    replies = []
    for cid, content in parts.items():
        held = list(own.get(cid, {}))  # its records' names now: a handler changes its context in place
        client = Context(context.run_id, context.node_id, {**context.node_config, "partition-id": cid, "num-partitions": clients},
                         own.get(cid, RecordDict()), context.run_config)  # fmt: skip
        sub = node_groups.with_content(msg, content, message_type=kinds[cid])
        try:
            reply = app(sub, client)
        except Exception as err:  # noqa: BLE001 - this client's error reply, as Flower's engine makes it
            log(ERROR, "Client %d: %s", cid, traceback.format_exc())
            wrapped = ClientAppException(str(err))
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(wrapped)}:<'{wrapped}'>"), reply_to=sub)
        for name in held:
            del context.state[f"{cid}{node_groups.SEPARATOR}{name}"]
        for name, record in client.state.items():
            context.state[f"{cid}{node_groups.SEPARATOR}{name}"] = record
        replies.append((cid, reply))
    return Message(node_groups.pack_replies(replies), reply_to=msg)


app = ClientApp(mods=[_grouped, _commit_on_success, _named_failures, _deterministic, _evaluate_first])


@dataclass(frozen=True)
class Shared:
    """What every client of one run config uses, built once per process: one model serves all
    the clients a process runs, since each message loads a whole state into it."""

    model: nn.Module
    method: ClientMethod
    state: ClientState  # what the method declares of its model's arrays
    sharing: GradualSharing
    fresh: dict[str, torch.Tensor]  # the common initial state


@dataclass
class Runtime:
    """One client: its data, and the run's :class:`Shared` parts."""

    settings: Settings
    client_id: int
    num_clients: int
    train: Split
    test: Split
    shared: Shared

    @property
    def model(self) -> nn.Module:
        return self.shared.model

    @property
    def method(self) -> ClientMethod:
        return self.shared.method

    @property
    def sharing(self) -> GradualSharing:
        return self.shared.sharing

    def initial(self) -> dict[str, torch.Tensor]:
        """The personal state of this client before it ever trained (the method's, from the common init)."""
        self.model.load_state_dict(self.shared.fresh)
        return self.method.initial_state(self.model, self.client_id)

    @cached_property
    def global_test(self) -> Split:
        """The shared test set of ``test-mode='global'`` (the union of all clients' test splits)."""
        return global_test(self.settings, self.num_clients)

    def evaluate(self, model: nn.Module, trained: bool, config: Mapping[str, Any]) -> dict:
        """The method's metrics in the run's ``test-mode``; with ``both``, global ones prefixed ``global-``."""
        mode, m = self.settings.test_mode, self.method
        if mode == "global":
            return m.evaluate(model, self.train, self.global_test, trained, config)
        metrics = m.evaluate(model, self.train, self.test, trained, config)
        if mode == "both":
            metrics |= {f"global-{k}": v for k, v in m.evaluate(model, self.train, self.global_test, trained, config).items()}
        return metrics

    def store(self, context: Context) -> StateStore:
        """This client's saved states: in the node config's ``state-dir`` if set, else the run
        config's (by default under results-dir, falling back to the resumed run's directory)."""
        root = context.node_config.get("state-dir")
        return _store(self.settings, self.client_id, str(root) if root else None, os.getcwd())

    def personal_state(self, context: Context, lineage: str, after_round: int, state_round: int | None, in_progress: bool = True) -> RecordDict:
        """This client's state: its context's, else the saved file its context names (its state
        is on disk between messages) if that is the round the server names, else the one saved
        in ``lineage`` as round ``after_round`` left it (a resumed run, a restarted SuperNode, a
        training reply the server never got): the state a message of round
        ``after_round + 1`` trains from, and the one an evaluation of ``after_round`` measures.
        The server names that round (``state_round``, :mod:`pflower.state_round`): exactly that
        round's file, or :class:`~pflower.state_round.MissingStateError`; 0: the client never
        trained (an empty state: the initial model). None (a checkpoint older than the key): the
        newest saved before. A state a relay step left in the context mid-round (:data:`IN_ROUND`)
        is the state only for the rest of that round: a round left half done (a relayed reply the
        server never got) is not, and the client starts from the round the server names; nor is
        it for an evaluation (``in_progress`` False), which measures a round's end state.
        """
        stale = IN_ROUND in context.state and (not in_progress or int(context.state[IN_ROUND]["round"]) != after_round + 1)
        if PERSONAL in context.state and not stale:
            return context.state
        if _points_to(context, state_round):
            return self._pointed(context)
        if lineage and state_round != 0:
            store = self.store(context)
            saved = store.load(lineage, after_round + 1) if state_round is None else store.load_round(lineage, state_round)
            if saved is not None:
                log(INFO, "Client %d restored its saved personal state (lineage %s, as round %d left it)", self.client_id, lineage, after_round)
                return saved
        return RecordDict() if stale else context.state

    def personal_model(self, state: RecordDict) -> nn.Module:
        """The cached model loaded with the personal ``state`` (or the initial one); a state whose
        arrays differ from the method's declared client state is a :class:`StateError` naming
        the difference (a state of another method or model: nothing loads half)."""
        if PERSONAL not in state:
            self.model.load_state_dict(self.initial())
            return self.model
        personal = from_record(state[PERSONAL])
        if undeclared := self.shared.state.undeclared(n for n in state.keys() if n not in (PERSONAL, IN_ROUND, SAVED)):
            problem = f"it holds record(s) the method does not declare, first '{undeclared[0]}'"
        else:
            problem = self.shared.state.mismatch(personal)
        if problem:
            raise StateError(
                f"client {self.client_id}'s personal state does not match method '{self.settings.method}''s declared client state: "
                f"{problem}; it was saved by another method or model: resume from a run of this configuration"
            )
        self.model.load_state_dict(personal)
        return self.model

    def received(self, record: ArrayRecord) -> dict[str, torch.Tensor]:
        """The arrays of a server's ``record``, checked against what the method receives (its
        declared ``MODEL`` and ``FROM_SERVER`` arrays: names and shapes), on the model's device."""
        if kept := self.shared.state.unreceivable(record.keys()):
            raise ValueError(f"the message carries arrays that method '{self.settings.method}' never receives (its client's own or upload-only): {kept[:5]}")
        state = self.model.state_dict()
        return received_state(record, {k: state[k] for k in self.shared.state.received})

    def resume(self, context: Context, lineage: str, after_round: int, state_round: int | None) -> nn.Module:
        """:meth:`personal_model` of :meth:`personal_state`, which the context holds from now on
        (a message that trains changes it)."""
        self.hold(context, self.personal_state(context, lineage, after_round, state_round))
        return self.personal_model(context.state)

    def unpack(self, context: Context) -> None:
        """The state a context's pointer (:data:`SAVED`) names into the context, in its place."""
        self.hold(context, self._pointed(context))

    def _pointed(self, context: Context) -> RecordDict:
        saved = context.state[SAVED]
        return self.store(context).load_saved(str(saved["lineage"]), int(saved["round"]))

    @staticmethod
    def hold(context: Context, state: RecordDict) -> None:
        """Make ``state``'s records the context's, in place of what it held."""
        if state is not context.state:
            for name in list(context.state.keys()):
                del context.state[name]
            for name, record in state.items():
                context.state[name] = record

    def evaluation(self, context: Context, config: ConfigRecord, arrays: ArrayRecord) -> MetricRecord:
        """The metrics of the personalized model (personal state + ``arrays``) in the run's test
        mode, after the method's fine-tuning epochs on the training split if it has any (never
        saved); ``config`` is the evaluation's: its round, and the state it names (``STATE_AFTER``:
        a context without one reads it). The context is left as it was."""
        rnd = int(config.get("server-round", 0))
        state = self.personal_state(
            context, str(config.get("lineage", "")), int(config.get(single_message.STATE_AFTER, rnd)), _state_round(config), in_progress=False
        )
        model = self.personal_model(state)
        trained = PERSONAL in state
        model.load_state_dict(self.received(arrays), strict=False)
        if epochs := self.method.finetune_epochs:
            self.method.start_round(rnd)
            self.method.finetune(model, self.train, self.seed(rnd, stream=1), epochs)
        metrics = self.evaluate(self.method.predictor(model, state), trained, config)
        return MetricRecord({**metrics, **self.method.report(state), "client-id": self.client_id, **ray_node()})

    def save(self, context: Context, msg: Message) -> ArrayRecord:
        """The model into the personal state, which goes to disk if the message names a lineage
        (the context then keeps only where: :func:`~pflower.client_app.store.keep_on_disk`); returns its record."""
        if IN_ROUND in context.state:  # the round is done: the state is the round's end state
            del context.state[IN_ROUND]
        personal = context.state[PERSONAL] = to_record(self.model.state_dict())
        if lineage := _lineage(msg):
            self.store(context).save(lineage, _round(msg), context.state, _state_round(_config(msg)))
            keep_on_disk(context.state, lineage, _round(msg))
        return personal

    def seed(self, server_round: int, stream: int = 0) -> int:
        """Seed of this client's minibatch order in this round (``stream`` 1: evaluation's fine-tuning)."""
        entropy = [self.settings.seed, self.client_id, server_round] + ([stream] if stream else [])
        return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def ray_node() -> dict[str, list[int]]:
    """The Ray node this process runs on, as the reply key ``ray-node``
    (:data:`pflower.reply_metrics.RAY_NODE`) when it is a Ray worker (a simulation's ClientApp);
    empty elsewhere (a SuperNode, in process): the server records which node ran each client."""
    ray = sys.modules.get("ray")  # never imported here: a deployed ClientApp runs without Ray
    if ray is None or not ray.is_initialized():
        return {}
    return {reply_metrics.RAY_NODE: list(bytes.fromhex(ray.get_runtime_context().get_node_id()))}


@lru_cache(maxsize=8)
def _shared(settings: Settings, shape: tuple[int, int, int] | None = None, num_classes: int | None = None) -> Shared:
    """The run's model and method; ``shape`` and ``num_classes`` for a node's own data (else the data set's)."""
    # Fixed, not inherited: results depend on the thread count (reduction order).
    torch.set_num_threads(settings.client_threads)
    if shape is None:
        pool = pool_for(settings)
        shape, num_classes = settings.image_shape, settings.num_classes
        if pool.shape != shape or pool.num_classes != num_classes:
            raise ValueError(
                f"dataset '{settings.dataset}' in {settings.data_path} has images {pool.shape} and "
                f"{pool.num_classes} classes; expected {shape} and {num_classes}"
            )
    model = build_model(settings, shape, num_classes, settings.seed).to(device())
    method = client_method(settings)
    fresh = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state = method.client_state(model)
    return Shared(model, method, state, GradualSharing.of(model, state.uploaded, settings.gradual_interval), fresh)


@lru_cache(maxsize=4096)
def _store(settings: Settings, client_id: int, state_dir: str | None, cwd: str) -> StateStore:
    """A client's :class:`StateStore`, its folders resolved once (not on every message) for each
    working directory ``cwd`` (relative folders resolve against it)."""
    return StateStore(client_id, Path(state_dir).expanduser().resolve()) if state_dir else StateStore(client_id, *settings.state_paths)


@lru_cache(maxsize=4096)
def _runtime(settings: Settings, client_id: int, num_clients: int) -> Runtime:
    shared = _shared(settings)
    train, test = client_data(settings, client_id, num_clients)
    return Runtime(settings, client_id, num_clients, train, test, shared)


@lru_cache(maxsize=8)
def _settings(items: tuple) -> Settings:
    return load_settings(dict(items))


@lru_cache(maxsize=64)
def _node_runtime(settings: Settings, client_id: int, num_clients: int, data: NodeData, union: tuple[str, ...]) -> Runtime:
    train, test = data.splits(union)
    return Runtime(settings, client_id, num_clients, train, test, _shared(settings, data.shape, len(union)))


def node_data(context: Context, settings: Settings) -> NodeData:
    """This node's own data (``dataset='node'``), named by its node config."""
    return load_node_data(context.node_config, settings.test_fraction, settings.split_seed)


def runtime(context: Context, msg: Message | None = None) -> Runtime:
    """This client's runtime. With ``dataset='node'``, its own data, its labels numbered by the
    federation's class names that ``msg`` carries (its own names before the server sent any)."""
    settings = _settings(tuple(sorted(context.run_config.items())))
    try:
        cid = int(context.node_config["partition-id"])
        n = int(context.node_config["num-partitions"])
    except (KeyError, ValueError) as err:
        raise ValueError(f"node config needs integer 'partition-id' and 'num-partitions' ({err})") from None
    if settings.simulated_clients and n != settings.simulated_clients:
        raise ValueError(f"simulated-clients={settings.simulated_clients}: this node serves several clients, and a message for them "
                         "names them (pflower's strategies send such messages); this one names none")  # fmt: skip
    if settings.node_data:
        data = node_data(context, settings)
        union = tuple(_config(msg).get(CLASS_NAMES, data.names)) if msg is not None else data.names
        return _node_runtime(settings, cid, n, data, union)
    return _runtime(settings, cid, n)


def _received(msg: Message, rt: Runtime) -> dict[str, torch.Tensor]:
    """The arrays of a message (:meth:`Runtime.received`)."""
    if "arrays" not in msg.content.array_records:
        return {}
    return rt.received(msg.content.array_records["arrays"])


def _config(msg: Message) -> ConfigRecord:
    return msg.content.config_records.get("config", ConfigRecord())


def _round(msg: Message) -> int:
    return int(_config(msg).get("server-round", 0))


def _points_to(context: Context, state_round: int | None) -> bool:
    """The context's pointer (:data:`SAVED`) names the state the server names (``state_round``;
    None: it names none). A training reply the server never got (lost, late) leaves the pointer a
    round ahead of the server's: the client then starts from the round the server names, as a
    resumed run (a fresh context) does."""
    return SAVED in context.state and (state_round is None or int(context.state[SAVED]["round"]) == state_round)


def _state_round(config: ConfigRecord) -> int | None:
    """The round whose saved state the server says this client starts from (None: it names none)."""
    return int(config[STATE_ROUND]) if STATE_ROUND in config else None


def _lineage(msg: Message) -> str:
    """The run lineage the server sent (shared by a run and its resumptions); '' if none."""
    return str(_config(msg).get("lineage", ""))


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Who is this client: its stable id, how many clients there are, how much data it has and
    of which classes (its test split's: the training distribution, without label noise; the
    server relates pFedLA's weights to them), how many samples of each class (the partition
    figure), and what sets its inputs apart (its domain, if the run has any)."""
    rt = runtime(context)
    classes = torch.unique(rt.test.y).tolist()
    if rt.settings.node_data:  # in its own numbering of its class names
        data = node_data(context, rt.settings)
        counts = np.bincount(data.y.numpy(), minlength=len(data.names)).tolist()
    else:
        counts = label_counts(rt.settings, rt.client_id, rt.num_clients)
    tested = len(rt.global_test) if rt.settings.test_mode == "global" else len(rt.test)  # what its evaluation's num-examples counts
    reply = MetricRecord({"client-id": rt.client_id, "num-clients": rt.num_clients, "num-examples": len(rt.train), "test-examples": tested,
                          "classes": classes, "label-counts": counts, single_message.CAPABLE: 1})  # fmt: skip
    content = RecordDict({"metrics": reply})
    if rt.settings.node_data:  # what the server builds the model from
        content[IDENTITY] = ConfigRecord({CLASS_NAMES: list(data.names), "shape": list(data.shape)})
    elif domain := client_domain(rt.settings, rt.client_id, rt.num_clients):
        content[DOMAIN] = ConfigRecord({"name": domain})
    return Message(content, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    rt = runtime(context, msg)
    model = rt.resume(context, _lineage(msg), _round(msg) - 1, _state_round(_config(msg)))
    received = _received(msg, rt)
    model.load_state_dict(received, strict=False)
    rt.method.start_round(_round(msg))
    extra = rt.method.before_fit(model, rt.train, msg.content, _round(msg))
    loss = rt.method.fit(model, rt.train, received, rt.seed(_round(msg)), _round(msg))
    personal = rt.save(context, msg)
    metrics = MetricRecord({"num-examples": len(rt.train), "train-loss": loss, "client-id": rt.client_id, **extra, **ray_node()})
    content = RecordDict({"arrays": ArrayRecord({k: personal[k] for k in rt.sharing.keys(_round(msg))}), "metrics": metrics})
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate_(msg: Message, context: Context) -> Message:
    """Evaluate the personalized model (:meth:`Runtime.evaluation`) with the message's arrays."""
    rt = runtime(context, msg)
    metrics = rt.evaluation(context, _config(msg), msg.content.array_records.get("arrays", ArrayRecord()))
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


@app.train("relay")
def relay(msg: Message, context: Context) -> Message:
    """One step of a protocol the clients run among themselves through the server (FedeRiCo).

    The step (``phase`` in the config) reads what the server forwarded and answers with what it
    asks the server to forward; the model goes back into the personal state after every step,
    and to disk after the last step of a round.
    """
    rt = runtime(context, msg)
    model = rt.resume(context, _lineage(msg), _round(msg) - 1, _state_round(_config(msg)))
    phase = str(_config(msg).get("phase", ""))
    rt.method.start_round(_round(msg))
    out = rt.method.relay_step(phase, model, rt.train, msg.content, context.state, rt.client_id, rt.num_clients, _round(msg))
    if phase == rt.method.LAST_STEP:
        rt.save(context, msg)
    else:
        context.state[PERSONAL] = to_record(model.state_dict())
        context.state[IN_ROUND] = ConfigRecord({"round": _round(msg)})
    out["metrics"] = out.metric_records.get("metrics", MetricRecord())
    out["metrics"]["client-id"] = rt.client_id
    return Message(out, reply_to=msg)
