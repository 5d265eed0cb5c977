"""The base of every pflower strategy: a Flower ``Strategy`` with the seams all methods share.

- Client identity: a ``query`` round maps Flower node ids (random per run) to the stable
  client ids the clients report (their ``partition-id``).
- Sampling: ``fraction-train`` of the clients, drawn from (seed, round) alone.
- Validation: every reply goes through :func:`check_reply` (plus the update-norm and
  num-examples bounds) before a subclass sees it; rejected replies are logged and counted per
  reason, and a round with fewer than ``min-replies`` valid training replies stops the run.
- Bytes: the array payload of every message sent and received is measured.
- The round loop (:meth:`start`): train, aggregate, evaluate every client, record, checkpoint.

Subclasses implement :meth:`train_arrays`, :meth:`evaluate_arrays` and :meth:`aggregate`, and
extend :meth:`state_dict` / :meth:`load_state_dict` with whatever server state they keep.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO, WARNING

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from pflower.checkpoint import Checkpoint, save_checkpoint
from pflower.config import ConfigError, Settings
from pflower.records import payload_bytes
from pflower.results import Recorder
from pflower.strategies.validation import ArraySpec, Rejected, Reply, check_reply


#: Error codes with which Flower answers for a node that is gone: the client is missing, not faulty.
UNAVAILABLE = frozenset({ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE})


#: Poll schedule of :func:`send_and_receive`: wait 5% of the time the phase has taken so far,
#: at least 5 ms and at most 0.5 s.
POLL_FIRST, POLL_SHARE, POLL_MAX = 0.005, 0.05, 0.5


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float) -> list[Message]:
    """Push ``messages``, then pull their replies until all came or ``timeout`` seconds passed.

    Flower's own ``Grid.send_and_receive`` sleeps a fixed 3 s between pulls on the SuperLink's
    HTTP grid (deployment) and 0.1 s on the in-memory one (simulation), which every phase of
    every round pays. Here a reply is noticed within about 5% of the phase's length, and a
    long phase still costs the SuperLink only a couple of requests per second.
    """
    pending = set(grid.push_messages(messages))
    start = time.monotonic()
    replies: list[Message] = []
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        elapsed = time.monotonic() - start
        if not pending or elapsed >= timeout:
            break
        time.sleep(min(max(POLL_FIRST, POLL_SHARE * elapsed), POLL_MAX, timeout - elapsed))
    return replies


class NoClientsError(RuntimeError):
    """No client answered the identity query in time."""


class RoundFailedError(RuntimeError):
    """A round got fewer valid training replies than ``min-replies``; the message says why."""


class PflStrategy(Strategy):
    """Shared machinery; see the module docstring."""

    def __init__(self, settings: Settings, template: Mapping[str, torch.Tensor], upload_keys: Sequence[str]):
        self.settings = settings
        self.upload_spec = {k: ArraySpec.of(template[k]) for k in upload_keys}
        self.node_of: dict[int, int] = {}  # client id -> node id
        self.client_of: dict[int, int] = {}  # node id -> client id
        self.num_examples: dict[int, int] = {}  # training examples each client reported when it joined
        self.test_examples: dict[int, int] = {}  # test examples of its first evaluation reply
        self.client_classes: dict[int, list[int]] = {}  # the classes of its training split, if it said
        self.num_clients = 0
        self.rejected: Counter[str] = Counter()
        self.problems: list[str] = []  # this round's rejections, "client 3: reason"
        self.eval_metrics: dict[int, dict] = {}  # the last evaluation reply of each client
        #: The evaluation protocol (what clients evaluate, fine-tuning epochs), for metrics.json.
        self.evaluation: dict = {}

    # ----------------------------------------------------------------- hooks
    def train_arrays(self, server_round: int, client_id: int) -> ArrayRecord:
        """Arrays sent to ``client_id`` for training."""
        raise NotImplementedError

    def evaluate_arrays(self, server_round: int, client_id: int) -> ArrayRecord:
        """Arrays sent to ``client_id`` for evaluation (default: none, it evaluates its own)."""
        return ArrayRecord()

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """Update server state from the round's valid training replies."""
        raise NotImplementedError

    def global_arrays(self) -> ArrayRecord:
        """The current global model, if the method has one."""
        return ArrayRecord()

    def upload_spec_for(self, server_round: int) -> Mapping[str, ArraySpec]:
        """The arrays a training reply of ``server_round`` must carry (default: every upload key)."""
        return self.upload_spec

    def update_reference(self, client_id: int) -> Mapping[str, torch.Tensor] | None:
        """What ``client_id`` started training from this round (for ``max-update-norm``); None: no bound."""
        return None

    def round_extras(self, server_round: int) -> dict:
        """Method-specific entries for round ``server_round``'s row of metrics.json."""
        return {}

    def state_dict(self) -> dict:
        """Everything a resumed run needs (tensors, numbers, strings; loadable with weights_only)."""
        return {"num-clients": self.num_clients, "num-examples": dict(self.num_examples), "test-examples": dict(self.test_examples)}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` after :meth:`discover` found the clients again."""
        self.num_examples.update(state["num-examples"])
        self.test_examples.update(state["test-examples"])

    @classmethod
    def from_model(cls, settings: Settings, model: torch.nn.Module, upload_keys: Sequence[str]) -> "PflStrategy":
        return cls(settings, model.state_dict(), upload_keys)

    # --------------------------------------------------------- client identity
    def discover(self, grid: Grid, timeout: float) -> None:
        """Ask every new node for its client id until all clients are known or time runs out.

        Nodes that answer with an error (a ClientApp that cannot start, e.g. unreadable data) are
        asked again; if every node has answered and none could start, the run stops at once
        with their reasons instead of waiting out the timeout.
        """
        deadline = time.monotonic() + timeout
        failed: dict[int, str] = {}
        while True:
            nodes = self.query_new_nodes(grid, timeout, failed)
            if self.num_clients and len(self.node_of) >= self.num_clients:
                break
            if nodes and not self.node_of and set(nodes) <= set(failed):
                reasons = "; ".join(f"node {n}: {why}" for n, why in sorted(failed.items())[:3])
                raise NoClientsError(f"no client could start ({len(failed)} of {len(nodes)} nodes answered with an error): {reasons}")
            if time.monotonic() > deadline:
                if not self.node_of:
                    raise NoClientsError(f"no client answered the identity query within {timeout:.0f} s")
                log(WARNING, "Only %d of %d clients answered; going on with them", len(self.node_of), self.num_clients)
                break
            time.sleep(0.5)
        ids = sorted(self.node_of)
        shown = f"{ids[0]}..{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 3 else str(ids)
        log(INFO, "Clients: %d (ids %s)", len(ids), shown)

    def query_new_nodes(self, grid: Grid, timeout: float, failed: dict[int, str] | None = None) -> list[int]:
        """Ask nodes not yet known (new, or a restarted SuperNode under a new node id) who they are.

        Returns the current node ids; ``failed`` collects the nodes that answered with an error.
        """
        failed = {} if failed is None else failed
        nodes = list(grid.get_node_ids())
        new = [n for n in nodes if n not in self.client_of]
        if new:
            msgs = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in new]
            for reply in send_and_receive(grid, msgs, timeout):
                if (why := self._register(reply)) is None:
                    failed.pop(reply.metadata.src_node_id, None)
                else:
                    failed[reply.metadata.src_node_id] = why
        return nodes

    def _register(self, reply: Message) -> str | None:
        """Record a node's identity; returns why it could not be registered, or None."""
        node = reply.metadata.src_node_id
        try:
            r = check_reply(reply, None, None)
            n_clients = int(r.metrics["num-clients"])
        except (Rejected, KeyError, TypeError, ValueError) as err:
            log(WARNING, "Node %s did not identify itself: %s", node, err)
            return str(err)
        if r.client_id in self.node_of and self.node_of[r.client_id] != node:
            log(INFO, "Client %d is back as node %s", r.client_id, node)
            self.client_of.pop(self.node_of[r.client_id], None)
        self.node_of[r.client_id] = node
        self.client_of[node] = r.client_id
        self.num_examples[r.client_id] = r.num_examples
        classes = r.metrics.get("classes")
        if isinstance(classes, list) and all(isinstance(c, int) for c in classes):
            self.client_classes[r.client_id] = classes
        self.num_clients = max(self.num_clients, n_clients)
        return None

    def sample(self, server_round: int) -> list[int]:
        """``fraction-train`` of the known clients; depends only on (seed, round)."""
        ids = np.array(sorted(self.node_of))
        k = max(1, int(round(self.settings.fraction_train * len(ids))))
        if k >= len(ids):
            return ids.tolist()
        rng = np.random.default_rng([self.settings.seed, server_round])
        return sorted(rng.choice(ids, size=k, replace=False).tolist())

    # ------------------------------------------------------------- validation
    def _check_bounds(self, reply: Reply, kind: str, spec: Mapping[str, ArraySpec] | None) -> None:
        """``num-examples`` against what the client reported before; the update norm."""
        s = self.settings
        before = (self.num_examples if kind == MessageType.TRAIN else self.test_examples).get(reply.client_id)
        if before is not None and reply.num_examples > s.max_examples_factor * before:
            raise Rejected(
                "num-examples",
                f"num-examples {reply.num_examples} exceeds max-examples-factor={s.max_examples_factor:g} x the {before} it reported before",
            )
        if spec and s.max_update_norm > 0 and (ref := self.update_reference(reply.client_id)) is not None:
            norm = sum(float((reply.arrays[k].double() - ref[k].double()).square().sum()) for k in spec) ** 0.5
            if norm > s.max_update_norm:
                raise Rejected("update-norm", f"update norm {norm:.4g} exceeds max-update-norm={s.max_update_norm:g}")

    def accept(self, replies: Iterable[Message], spec: Mapping[str, ArraySpec] | None, kind: str = MessageType.TRAIN) -> list[Reply]:
        """The valid replies of one phase (``kind``); every other one is logged and counted under its reason."""
        valid: dict[int, Reply] = {}
        for msg in replies:
            expected = self.client_of.get(msg.metadata.src_node_id)
            try:
                if expected is None:
                    raise Rejected("unknown-node", f"node {msg.metadata.src_node_id} is not a known client")
                reply = check_reply(msg, expected, spec)
                if reply.client_id in valid:
                    raise Rejected("duplicate", "second reply in one phase")
                self._check_bounds(reply, kind, spec)
            except Rejected as err:
                self.rejected[err.reason] += 1
                self.problems.append(f"client {expected}: {err}")
                log(WARNING, "Rejected a reply of client %s: %s", expected, err)
                continue
            valid[reply.client_id] = reply
            if kind == MessageType.EVALUATE:
                self.test_examples.setdefault(reply.client_id, reply.num_examples)
            if spec is not None:  # decoded: drop the wire bytes, so a round holds one copy of each update
                for name in list(msg.content.array_records):
                    del msg.content[name]
        return [valid[c] for c in sorted(valid)]

    # ---------------------------------------------------- Flower Strategy API
    def _messages(self, ids: Iterable[int], kind: str, arrays_of, server_round: int, config: ConfigRecord) -> list[Message]:
        return [
            Message(
                RecordDict({"arrays": arrays_of(server_round, cid), "config": config}),
                dst_node_id=self.node_of[cid],
                message_type=kind,
            )
            for cid in ids
        ]

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list[Message]:
        return self._messages(self.sample(server_round), MessageType.TRAIN, self.train_arrays, server_round, config)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.accept(replies, self.upload_spec_for(server_round))
        if valid:
            self.aggregate(server_round, valid)
        n = sum(r.num_examples for r in valid)
        loss = sum(float(r.metrics.get("train-loss", 0.0)) * r.num_examples for r in valid) / max(n, 1)
        return self.global_arrays(), MetricRecord({"train-loss": loss, "replies": len(valid)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list[Message]:
        return self._messages(sorted(self.node_of), MessageType.EVALUATE, self.evaluate_arrays, server_round, config)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        valid = self.accept(replies, None, MessageType.EVALUATE)
        if not valid:
            return None
        acc = np.array([float(r.metrics["accuracy"]) for r in valid])
        n = np.array([r.num_examples for r in valid], dtype=np.float64)
        self.eval_metrics = {r.client_id: r.metrics for r in valid}
        weighted = {
            key: float((np.array([float(r.metrics.get(key, 0.0)) for r in valid]) * n).sum() / n.sum())
            for key in ("loss", "top5-accuracy", "ece", "mce")
        }
        out = {"accuracy": float(acc.mean()), "weighted-accuracy": float((acc * n).sum() / n.sum()), **weighted}
        if all("global-accuracy" in r.metrics for r in valid):  # test-mode 'both'
            out["global-accuracy"] = float(np.mean([float(r.metrics["global-accuracy"]) for r in valid]))
        return MetricRecord(out)

    def _failure(self, rnd: int, sampled: int, n_valid: int, silent: list[int]) -> str:
        why = [*self.problems, *(f"client {c}: no reply within round-timeout={self.settings.round_timeout:g} s" for c in silent)]
        shown = "; ".join(why[:5]) + (f"; and {len(why) - 5} more" if len(why) > 5 else "")
        return (
            f"round {rnd}: {n_valid} valid training replies of {sampled} sampled clients, fewer than "
            f"min-replies={self.settings.min_replies}: {shown or 'no replies'}"
        )

    def summary(self) -> None:
        s = self.settings
        log(INFO, "%s: method=%s dataset=%s partition=%s rounds=%d fraction-train=%.2f",
            type(self).__name__, s.method, s.dataset, s.partition, s.num_server_rounds, s.fraction_train)
        log(INFO, "Uploaded arrays per client: %d tensors", len(self.upload_spec))

    # --------------------------------------------------------------- the loop
    def _phase(self, grid: Grid, messages: list[Message]) -> tuple[list[Message], int, int, list[int]]:
        """Send, wait up to ``round-timeout``; (replies, bytes down, bytes up, missing clients).

        A client is missing when no reply came in time or Flower answered for it that its node
        is unavailable (a SuperNode that died); such replies are not passed on.
        """
        down = sum(payload_bytes(m.content) for m in messages)
        replies = send_and_receive(grid, messages, self.settings.round_timeout)
        replies = [r for r in replies if not (r.has_error() and r.error.code in UNAVAILABLE)]
        up = sum(payload_bytes(r.content) for r in replies if not r.has_error())
        answered = {r.metadata.src_node_id for r in replies}
        missing = sorted(self.client_of[m.metadata.dst_node_id] for m in messages if m.metadata.dst_node_id not in answered)
        return replies, down, up, missing

    def run_round(self, grid: Grid, rnd: int, config: dict, train_config: dict, evaluate_config: dict, result: Result) -> dict:
        """One round: train the sampled clients, aggregate, then every client evaluates.

        Records train metrics and arrays in ``result`` (evaluation through :meth:`evaluate_phase`)
        and returns this round's traffic for metrics.json (bytes, sampled, missing).
        """
        msgs = self.configure_train(rnd, self.global_arrays(), ConfigRecord({**config, **train_config}), grid)
        sampled = len(msgs)
        replies, down, up, silent = self._phase(grid, msgs)
        del msgs  # sent: free them before aggregation
        arrays, train_metrics = self.aggregate_train(rnd, replies)
        if train_metrics["replies"] < self.settings.min_replies:
            raise RoundFailedError(self._failure(rnd, sampled, int(train_metrics["replies"]), silent))
        result.train_metrics_clientapp[rnd] = train_metrics
        result.arrays = arrays or result.arrays
        e_down, e_up, e_silent = self.evaluate_phase(grid, rnd, {**config, **evaluate_config}, result)
        return {
            "train-loss": train_metrics["train-loss"],
            "bytes-down": down + e_down,
            "bytes-up": up + e_up,
            "sampled": sampled,
            "missing": sorted(set(silent) | set(e_silent)),
        }

    def evaluate_phase(self, grid: Grid, rnd: int, config: dict, result: Result) -> tuple[int, int, list[int]]:
        """Every known client evaluates; the aggregate goes to ``result``. (bytes down, bytes up, missing)."""
        self.query_new_nodes(grid, self.settings.round_timeout)  # e.g. a client that died in training and is back
        msgs = self.configure_evaluate(rnd, self.global_arrays(), ConfigRecord(config), grid)
        replies, down, up, silent = self._phase(grid, msgs)
        ev = self.aggregate_evaluate(rnd, replies)
        if ev is not None:
            result.evaluate_metrics_clientapp[rnd] = ev
        return down, up, silent

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn=None,
        checkpoint: Checkpoint | None = None,
    ) -> Result:
        """Run the federation: identity query, then per round train -> aggregate -> evaluate.

        After every round the whole state goes to ``<results-dir>/checkpoint.pt``; with
        ``checkpoint`` (from ``resume-from``) the run continues after that checkpoint's round.
        """
        s = self.settings
        num_rounds = num_rounds or s.num_server_rounds
        timeout = timeout or s.round_timeout
        self.summary()
        lineage = checkpoint.lineage if checkpoint else uuid.uuid4().hex
        recorder = Recorder(s, rounds=checkpoint.rounds if checkpoint else None)
        result = Result()
        started = time.time()
        self.discover(grid, timeout)
        first = 1
        if checkpoint is not None:
            if (was := checkpoint.strategy["num-clients"]) != self.num_clients:
                why = f"the checkpoint has {was} clients, this federation {self.num_clients}"
                raise ConfigError([("resume-from", s.resume_from, why)])
            self.load_state_dict(checkpoint.strategy)
            first = checkpoint.round + 1
            log(INFO, "Resuming lineage %s after round %d", lineage, checkpoint.round)
        # Unix times of the ServerApp's start and of the end of client discovery (start-up figures).
        timeline = {"serverapp-started": started, "clients-ready": time.time()}
        recorder.extra.update({"num-clients": len(self.node_of), "lineage": lineage, "timeline": timeline, "evaluation": self.evaluation})
        if self.client_classes:
            recorder.extra["client-classes"] = {str(c): v for c, v in sorted(self.client_classes.items())}
        run_config = s.to_run_config()
        for rnd in range(first, num_rounds + 1):
            t0 = time.perf_counter()
            if rnd > first:  # a SuperNode that restarted comes back under a new node id
                self.query_new_nodes(grid, timeout)
            self.rejected.clear()
            self.problems.clear()
            config = {"server-round": rnd, "lineage": lineage}
            row = self.run_round(grid, rnd, config, dict(train_config or {}), dict(evaluate_config or {}), result)
            ev = result.evaluate_metrics_clientapp.get(rnd) or {}
            recorder.add_round(
                {
                    "round": rnd,
                    "accuracy": ev.get("accuracy"),
                    "weighted-accuracy": ev.get("weighted-accuracy"),
                    "loss": ev.get("loss"),
                    "top5-accuracy": ev.get("top5-accuracy"),
                    "ece": ev.get("ece"),
                    "mce": ev.get("mce"),
                    **row,
                    "wall-seconds": time.perf_counter() - t0,
                    "rejected": dict(self.rejected),
                    "per-client-accuracy": {str(c): float(m["accuracy"]) for c, m in sorted(self.eval_metrics.items())},
                    **({"global-accuracy": ev["global-accuracy"]} if "global-accuracy" in ev else {}),
                    **self.round_extras(rnd),
                }
            )
            save_checkpoint(recorder.dir, Checkpoint(lineage, rnd, run_config, self.state_dict(), recorder.rounds))
        recorder.finish()
        return result
