"""The run loop every pflower strategy shares, and Flower's ``Strategy.start`` contract.

:class:`PflStrategy` is a Flower Message-API ``Strategy`` built with keyword arguments (all
with defaults). ``start(grid, initial_arrays, num_rounds, timeout, train_config,
evaluate_config, evaluate_fn)`` honours each argument as Flower's own strategies do: the
initial arrays define the model, the configs go into every message of their phase, and
``evaluate_fn(round, arrays)`` evaluates the strategy's global arrays on the server before the
first round and after each one. A run:

1. identity (:class:`~pflower.strategies.federation.Federation`), then :meth:`prepare` builds
   the server state from the initial arrays; a checkpoint (``resume-from``) is loaded;
2. every round: :meth:`run_round` (the subclass's round), then evaluation every
   ``evaluate_every`` rounds by ``fraction_evaluate`` of the clients (every client in the last
   round), through the reply gate. With ``single_message`` (the default) a round's evaluation
   rides on the next round's first phase (:mod:`pflower.single_message`) and only the last
   round's is a phase of its own: one message per client per round, the same metrics;
3. a metrics row per round (metrics.json) and a checkpoint, when the strategy has a
   ``results_dir``. A row whose evaluation rides on the next round is written at once and
   completed (and logged) when that evaluation is back.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from pflower.checkpoint import Checkpoint, save_checkpoint
from pflower.client_state import ClientState
from pflower.config import ConfigError, Settings
from pflower.records import to_record
from pflower.results import RAY_NODES, Recorder
from pflower.single_message import STATE_AFTER
from pflower.strategies.federation import EVALUATE_SAMPLE, Federation, NoClientsError, Phase
from pflower.strategies.gate import ReplyGate
from pflower.strategies.grouped_grid import GroupedGrid
from pflower.strategies.held import HeldEvaluation
from pflower.strategies.outbox import Outbox
from pflower.strategies.validation import ArraySpec, Reply
from pflower.tracking import open_trackers

#: The aggregated evaluation metrics a metrics.json row carries (None where a round is not evaluated).
EVALUATION_METRICS = ("accuracy", "weighted-accuracy", "loss", "top5-accuracy", "ece", "mce")


class RoundFailedError(RuntimeError):
    """A round got fewer valid training replies than ``min_replies``; the message says why."""


def weighted_metrics(replies: list[Reply]) -> dict[str, float]:
    """Every number all ``replies`` report (but num-examples and client-id), averaged weighted by
    their num-examples, as Flower's strategies aggregate metrics."""
    n = np.array([r.num_examples for r in replies], dtype=np.float64)
    shared = set.intersection(*(set(r.metrics) for r in replies)) - {"num-examples", "client-id"} if replies else set()
    out = {}
    for key in sorted(shared):
        values = [r.metrics[key] for r in replies]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = float((np.array(values, dtype=np.float64) * n).sum() / n.sum())
    return out


class PflStrategy(Strategy):
    """The shared run loop; a subclass implements :meth:`run_round` (and :meth:`prepare`).

    ``STATEFUL_CLIENTS``: the method needs clients that keep their own model between rounds
    (pflower's ClientApp, which answers the identity query); others also work with ClientApps
    that only train and evaluate what they are sent.

    Parameters
    ----------
    fraction_evaluate : float (default: 1.0)
        Share of clients sampled for evaluation in a round that evaluates, in (0, 1]; every
        client evaluates in the last round.
    evaluate_every : int (default: 1)
        Evaluate every this many rounds (and always the last).
    single_message : bool (default: True)
        A round's evaluation rides on the next round's training message (the same metrics as
        False, which sends evaluations in a phase of their own; half the messages).
    min_replies : int (default: 1)
        A round with fewer valid training replies stops the run, naming each client's problem.
    round_timeout : float (default: 600.0)
        Seconds to wait for the replies of one phase.
    max_update_norm : float (default: 0.0)
        Reject a training reply whose update has a larger L2 norm; 0: no bound.
    max_examples_factor : float (default: 2.0)
        Reject a reply whose ``num-examples`` exceeds this times what the client reported before.
    seed : int (default: 0)
        Seeds client sampling (and, in pflower's run config, the model and the data).
    results_dir : str or Path or None (default: None)
        Where metrics.json, the figures and a checkpoint a round go; None: nowhere.
    run_config : Mapping or None (default: None)
        The run config metrics.json records.
    """

    STATEFUL_CLIENTS = False
    #: The strategy handles arrays that go one way only (a method's ``FROM_SERVER`` and
    #: ``TO_SERVER`` arrays, :mod:`pflower.client_state`); the others send and take the same arrays.
    ONE_WAY_ARRAYS = False
    #: The keys every strategy's metrics.json rows may hold (docs/results.md says what each is).
    #: A subclass declares only the keys it adds, each with what it holds; :meth:`row_keys`
    #: joins them up its bases, and docs/results.md's table of them is generated.
    ROW_KEYS: Mapping[str, str] = dict.fromkeys(
        ("round", "accuracy", "weighted-accuracy", "loss", "top5-accuracy", "ece", "mce", "train-loss", "train-metrics", "global-accuracy",
         "bytes-down", "bytes-up", "cumulative-bytes-down", "cumulative-bytes-up", "wall-seconds", "sampled", "evaluated", "missing",
         "rejected", "per-client-accuracy", "server-evaluation", "ray-nodes"), ""
    )  # fmt: skip

    @classmethod
    def row_keys(cls) -> dict[str, str]:
        """Every key this strategy's rows may hold: its own and its bases', with what each holds."""
        out: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            out.update(vars(klass).get("ROW_KEYS", {}))
        return out

    def __init__(
        self,
        *,
        fraction_evaluate: float = 1.0,
        evaluate_every: int = 1,
        single_message: bool = True,
        min_replies: int = 1,
        round_timeout: float = 600.0,
        max_update_norm: float = 0.0,
        max_examples_factor: float = 2.0,
        seed: int = 0,
        results_dir: str | Path | None = None,
        run_config: Mapping[str, Any] | None = None,
    ):
        if not 0 < fraction_evaluate <= 1:
            raise ValueError(f"fraction_evaluate={fraction_evaluate} must be in (0, 1]")
        if evaluate_every < 1:
            raise ValueError(f"evaluate_every={evaluate_every} must be >= 1")
        self.fraction_evaluate = fraction_evaluate
        self.evaluate_every = evaluate_every
        self.single_message = single_message
        self.min_replies = min_replies
        self.round_timeout = round_timeout
        self.seed = seed
        self.results_dir = None if results_dir is None else Path(results_dir).expanduser().resolve()
        self.run_config = dict(run_config or {})
        self.federation = Federation(seed)
        self.gate = ReplyGate(max_update_norm, max_examples_factor)
        self.initial_arrays: ArrayRecord | None = None  # set by from_settings; start() may give others
        self.num_rounds = 0
        self.eval_metrics: dict[int, dict] = {}  # the last evaluation reply of each client
        #: The evaluation protocol (what clients evaluate, fine-tuning epochs), for metrics.json.
        self.evaluation: dict = {}

    # ------------------------------------------------------------ building
    @staticmethod
    def common_kwargs(settings: Settings) -> dict[str, Any]:
        """The keyword arguments every strategy takes, from a pflower run config."""
        s = settings
        return dict(fraction_evaluate=s.fraction_evaluate, evaluate_every=s.evaluate_every, single_message=s.single_message, min_replies=s.min_replies,
                    round_timeout=s.round_timeout, max_update_norm=s.max_update_norm, max_examples_factor=s.max_examples_factor,
                    seed=s.seed, results_dir=s.results_dir, run_config=s.to_run_config())  # fmt: skip

    @classmethod
    def from_settings(cls, settings: Settings, model, state: ClientState) -> PflStrategy:
        """The strategy of a pflower run: its keyword arguments from the run config, its initial
        arrays what the method's client declares it receives (:class:`~pflower.client_state.ClientState`)."""
        strategy = cls(**cls.common_kwargs(settings))
        strategy.initial_arrays = to_record(model.state_dict(), state.received)
        return strategy

    # -------------------------------------------------------------- hooks
    def prepare(self, initial_arrays: ArrayRecord) -> None:
        """Build the server state from the initial arrays, once the clients are known."""

    def run_round(self, grid: Grid, rnd: int, config: dict, train_config: dict, result: Result) -> dict:
        """One round before evaluation; returns its metrics row (bytes-down, bytes-up, sampled,
        missing, train-loss) and records train metrics and arrays in ``result``."""
        raise NotImplementedError

    def evaluate_arrays(self, server_round: int, ids: list[int]) -> Mapping[int, ArrayRecord]:
        """Arrays sent to each of ``ids`` for evaluation (default: none; it evaluates its own)."""
        return {cid: ArrayRecord() for cid in ids}

    def global_arrays(self) -> ArrayRecord:
        """The strategy's global model (what ``evaluate_fn`` gets, before round 1 and after each):
        FedAvg's average of the uploaded arrays, the clients' models averaged by samples for
        servers that keep one per client, the mean generated model for pFedHN; empty for Local and
        FedeRiCo, which keep no model on the server."""
        return ArrayRecord()

    def round_extras(self, server_round: int) -> dict:
        """Method-specific entries for round ``server_round``'s row of metrics.json, from the
        server state at the end of the round."""
        return {}

    def evaluation_extras(self, server_round: int) -> dict:
        """Method-specific entries from round ``server_round``'s evaluation replies (``eval_metrics``)."""
        return {}

    def state_dict(self) -> dict:
        """Everything a resumed run needs (tensors, numbers, strings; loadable with weights_only),
        the evaluation held for the next round included."""
        held = self.federation.held.state_dict() if self.federation.held is not None else None
        return {**self.federation.state_dict(), **self.gate.state_dict(), "held-evaluation": held}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` after discovery found the clients again and :meth:`prepare` ran."""
        self.federation.load_state_dict(state)
        self.gate.load_state_dict(state)

    def summary(self) -> None:
        """The run's first line: the method the run config names (with the strategy that runs it,
        where its name differs: FedPer runs on FedAvg's), its rounds and its evaluation."""
        strategy, method = type(self).__name__, str(self.run_config.get("method", ""))
        name = strategy if not method or method == strategy.lower() else f"{method} ({strategy} strategy)"
        log(INFO, "%s: %d rounds, evaluation by %.0f%% of the clients every %d round(s)%s",
            name, self.num_rounds, 100 * self.fraction_evaluate, self.evaluate_every,
            ", riding on the next round's messages" if self.single_message else "")  # fmt: skip

    # ---------------------------------------------------------- evaluation
    def evaluates(self, server_round: int) -> bool:
        return server_round % self.evaluate_every == 0 or server_round == self.num_rounds

    def evaluation_sample(self, server_round: int) -> list[int]:
        """Every client in the last round; else ``fraction_evaluate`` of them, by (seed, round)."""
        if server_round == self.num_rounds:
            return self.federation.ids
        return self.federation.sample(self.fraction_evaluate, server_round, EVALUATE_SAMPLE)

    def evaluate_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """The config every evaluation message of ``server_round`` carries (default: ``config``)."""
        return config

    def evaluation_outbox(self, server_round: int, config: ConfigRecord) -> Outbox:
        """Round ``server_round``'s evaluation messages, each built as it is sent (:class:`Outbox`)."""
        ids = self.evaluation_sample(server_round)
        return self.federation.outbox(ids, MessageType.EVALUATE, self.evaluate_arrays(server_round, ids), self.evaluate_config(server_round, config))

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list[Message]:
        return list(self.evaluation_outbox(server_round, config))

    def aggregate_evaluate(self, server_round: int, replies) -> MetricRecord | None:
        """Mean and sample-weighted accuracy, and every other metric the replies share weighted by samples."""
        valid = self.gate.accept(replies, self.federation.client_of, None, MessageType.EVALUATE)
        if not valid:
            return None
        self.eval_metrics = {r.client_id: r.metrics for r in valid}
        out = weighted_metrics(valid)
        shared = set(out)
        if "accuracy" in shared:
            acc = np.array([float(r.metrics["accuracy"]) for r in valid])
            out["weighted-accuracy"] = out["accuracy"]
            out["accuracy"] = float(acc.mean())
        if "global-accuracy" in shared:  # test-mode 'both'
            out["global-accuracy"] = float(np.mean([float(r.metrics["global-accuracy"]) for r in valid]))
        return MetricRecord(out)

    def evaluate_phase(self, grid: Grid, rnd: int, config: dict, result: Result) -> Phase:
        """The round's evaluation (if it evaluates); the aggregate goes to ``result``. With
        ``single_message`` every round's but the last rides on the next round's first phase."""
        if not self.evaluates(rnd):
            return Phase([], 0, 0, [])
        self.federation.query_new_nodes(grid, self.round_timeout)  # e.g. a client that died in training and is back
        outbox = self.evaluation_outbox(rnd, ConfigRecord({**config, STATE_AFTER: rnd}))
        if self.single_message and rnd < self.num_rounds:
            self.federation.hold(HeldEvaluation.of_outbox(rnd, outbox))
            return Phase([], 0, 0, [])
        phase = self.federation.phase(grid, outbox, self.round_timeout)
        self.evaluated(rnd, phase.replies, result)
        return phase

    def evaluated(self, rnd: int, replies: list[Message], result: Result) -> None:
        """Aggregate round ``rnd``'s evaluation replies into ``result``."""
        ev = self.aggregate_evaluate(rnd, replies)
        if ev is not None:
            result.evaluate_metrics_clientapp[rnd] = ev

    # ------------------------------------------------------------ the loop
    def connect(self, grid: Grid, initial_arrays: ArrayRecord | None = None, timeout: float | None = None) -> ArrayRecord:
        """Find the clients, then build the server state from the initial arrays (the first
        steps of :meth:`start`, for callers that drive rounds themselves); returns those arrays."""
        initial_arrays = initial_arrays if initial_arrays is not None else self.initial_arrays
        if initial_arrays is None:
            raise ValueError(f"{type(self).__name__}.start() needs initial_arrays (the initial model)")
        self.federation.discover(grid, timeout or self.round_timeout)
        if self.STATEFUL_CLIENTS and self.federation.stateless:
            nodes = sorted(self.federation.node_of[c] for c in self.federation.stateless)
            raise NoClientsError(
                f"{type(self).__name__} needs clients that keep their own model (pflower's ClientApp, which answers the "
                f"identity query); {len(nodes)} node(s) have no query handler: {nodes[:5]}"
            )
        self.gate.reported[MessageType.TRAIN].update(self.federation.num_examples)
        self.gate.reported[MessageType.EVALUATE].update(self.federation.test_examples)
        self.gate.num_clients = self.federation.num_clients
        self.prepare(initial_arrays)
        self.federation.fixed = True
        return initial_arrays

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> Result:
        """Run the federation (see the module docstring); ``checkpoint`` continues a run after its round.

        ``initial_arrays`` defaults to the arrays :meth:`from_settings` took from the model;
        ``num_rounds`` to the run config's ``num-server-rounds`` (3 without one, as Flower's);
        ``timeout`` overrides ``round_timeout``.
        """
        self.num_rounds = num_rounds or int(self.run_config.get("num-server-rounds", 3))
        self.round_timeout = timeout or self.round_timeout
        if int(self.run_config.get("simulated-clients", 0)):  # several clients per node: one node per client here
            grid = GroupedGrid(grid, self.round_timeout)
        self.summary()
        lineage = checkpoint.lineage if checkpoint else uuid.uuid4().hex
        trackers = open_trackers(self.run_config, self.results_dir, lineage)
        recorder = Recorder(self.results_dir, self.run_config, self.num_rounds, rounds=checkpoint.rounds if checkpoint else None, trackers=trackers)
        try:
            result = self._run(grid, initial_arrays, checkpoint, lineage, recorder, train_config, evaluate_config, evaluate_fn)
            recorder.finish()
        except BaseException as err:
            recorder.abort(err)
            raise
        return result

    def _run(self, grid: Grid, initial_arrays: ArrayRecord | None, checkpoint: Checkpoint | None, lineage: str, recorder: Recorder,
             train_config: ConfigRecord | None, evaluate_config: ConfigRecord | None, evaluate_fn) -> Result:  # fmt: skip
        """:meth:`start`'s discovery, resumption and rounds."""
        started = time.time()
        initial_arrays = self.connect(grid, initial_arrays)
        result = Result(arrays=initial_arrays)
        first = 1
        if checkpoint is not None:
            if (was := checkpoint.strategy["num-clients"]) != self.federation.num_clients:
                why = f"the checkpoint has {was} clients, this federation {self.federation.num_clients}"
                raise ConfigError([("resume-from", str(self.run_config.get("resume-from", "")), why)])
            self.load_state_dict(checkpoint.strategy)
            first = checkpoint.round + 1
            log(INFO, "Resuming lineage %s after round %d", lineage, checkpoint.round)
            if (held := checkpoint.strategy.get("held-evaluation")) is not None:  # it goes with the first resumed round
                self.federation.hold(HeldEvaluation.from_state_dict(held, self.evaluate_arrays))
            elif pending := checkpoint.strategy.get("pending-evaluation", 0):  # a checkpoint of pflower 0.x before held evaluations
                config = ConfigRecord({**dict(evaluate_config or {}), "server-round": pending, "lineage": lineage, STATE_AFTER: pending})
                self.federation.hold(
                    HeldEvaluation.of(pending, self.configure_evaluate(pending, self.global_arrays(), config, grid), self.federation.client_of)
                )
        elif evaluate_fn is not None and (res := evaluate_fn(0, self.global_arrays())) is not None:
            result.evaluate_metrics_serverapp[0] = res
            recorder.extra["initial-server-evaluation"] = dict(res)
        timeline = {"serverapp-started": started, "clients-ready": time.time()}
        recorder.extra.update({"strategy": type(self).__name__, "num-clients": len(self.federation.node_of), "lineage": lineage,
                               "timeline": timeline, "evaluation": self.evaluation})  # fmt: skip
        if self.federation.classes:
            recorder.extra["client-classes"] = {str(c): v for c, v in sorted(self.federation.classes.items())}
        if counts := self.federation.consistent_label_counts():
            recorder.extra["client-label-counts"] = {str(c): v for c, v in sorted(counts.items())}
        if self.federation.domains:
            recorder.extra["client-domains"] = {str(c): v for c, v in sorted(self.federation.domains.items())}
        for rnd in range(first, self.num_rounds + 1):
            t0 = time.perf_counter()
            if rnd > first:  # a SuperNode that restarted comes back under a new node id
                self.federation.query_new_nodes(grid, self.round_timeout)
            self.gate.new_round()
            config = {"server-round": rnd, "lineage": lineage}
            try:
                row = self.run_round(grid, rnd, config, dict(train_config or {}), result)
            except RoundFailedError:  # the evaluation that came back with the failed round still counts
                if (held := self.federation.take_sent_held()) is not None:
                    self._evaluation_back(held, result, recorder)
                raise
            if self.federation.held is not None:  # the round sent no phase to ride on: the evaluation goes alone
                alone = self.federation.phase(grid, [], self.round_timeout)
                row.update({"bytes-down": row["bytes-down"] + alone.down, "bytes-up": row["bytes-up"] + alone.up})
            if (held := self.federation.take_sent_held()) is not None:
                self._evaluation_back(held, result, recorder)
            ev_phase = self.evaluate_phase(grid, rnd, {**dict(evaluate_config or {}), **config}, result)
            row.update({"bytes-down": row["bytes-down"] + ev_phase.down, "bytes-up": row["bytes-up"] + ev_phase.up,
                        "missing": sorted(set(row["missing"]) | set(ev_phase.missing))})  # fmt: skip
            if evaluate_fn is not None and (res := evaluate_fn(rnd, self.global_arrays())) is not None:
                result.evaluate_metrics_serverapp[rnd] = res
                row["server-evaluation"] = dict(res)
            recorder.add_round(self._row(rnd, row, result, time.perf_counter() - t0), log_it=self.federation.held is None)
            if recorder.dir is not None:
                save_checkpoint(recorder.dir, Checkpoint(lineage, rnd, self.run_config, self.state_dict(), recorder.rounds))
        if self.federation.held is not None:  # resumed with no round left to carry it: it goes alone
            phase = self.federation.phase(grid, [], self.round_timeout)
            self._evaluation_back(self.federation.take_sent_held(), result, recorder)
            last = recorder.rounds[-1]
            recorder.complete_round(last["round"], {"bytes-down": last["bytes-down"] + phase.down, "bytes-up": last["bytes-up"] + phase.up})
        return result

    def _evaluation_back(self, held: HeldEvaluation, result: Result, recorder: Recorder) -> None:
        """Round ``held.round``'s evaluation came back with this round's replies: aggregate it
        (its rejections counted in that round's row) and complete that round's row."""
        row = next(r for r in recorder.rounds if r["round"] == held.round)
        with self.gate.round_of(row["rejected"]) as rejected:
            self.evaluated(held.round, held.replies, result)
        fields = {**self._evaluation(held.round, result), "rejected": dict(rejected)}
        if held.missing:
            fields["missing"] = sorted(set(row["missing"]) | set(held.missing))
        recorder.complete_round(held.round, fields)

    def _evaluation(self, rnd: int, result: Result) -> dict:
        """Round ``rnd``'s evaluation entries of its metrics.json row (none before it is back)."""
        if rnd not in result.evaluate_metrics_clientapp:
            return {k: None for k in EVALUATION_METRICS} | {"evaluated": 0}
        ev = result.evaluate_metrics_clientapp[rnd]
        return {
            **{k: ev.get(k) for k in EVALUATION_METRICS},
            "evaluated": len(self.eval_metrics),
            "per-client-accuracy": {str(c): float(m["accuracy"]) for c, m in sorted(self.eval_metrics.items()) if "accuracy" in m},
            **({"global-accuracy": ev["global-accuracy"]} if "global-accuracy" in ev else {}),
            **self.evaluation_extras(rnd),
        }

    def _row(self, rnd: int, row: dict, result: Result, seconds: float) -> dict:
        evaluation = self._evaluation(rnd, result)
        metrics = {k: evaluation.pop(k) for k in EVALUATION_METRICS}
        out = {"round": rnd, **metrics, **row, "wall-seconds": seconds, "rejected": dict(self.gate.rejected), **evaluation, **self.round_extras(rnd)}
        if nodes := self.gate.nodes():  # a simulation: the Ray nodes that ran the round's clients
            out[RAY_NODES] = nodes
        return out


class TrainRounds(PflStrategy):
    """Rounds of training, aggregation, evaluation: Flower's ``configure_train`` / ``aggregate_train``.

    A subclass says what each sampled client is sent (:meth:`train_arrays`, for all of them at
    once), which arrays a reply must carry (:meth:`upload_spec_for`), what a client started
    from (:meth:`update_reference`, for ``max-update-norm``) and how valid replies update the
    server state (:meth:`aggregate`). Every reply passes the gate first.

    Parameters
    ----------
    fraction_train : float (default: 1.0)
        Share of clients sampled for training each round, in (0, 1].
    **common
        :class:`PflStrategy`'s parameters.
    """

    def __init__(self, *, fraction_train: float = 1.0, **common):
        super().__init__(**common)
        if not 0 < fraction_train <= 1:
            raise ValueError(f"fraction_train={fraction_train} must be in (0, 1]")
        self.fraction_train = fraction_train
        self.upload_spec: dict[str, ArraySpec] = {}

    @staticmethod
    def common_kwargs(settings: Settings) -> dict[str, Any]:
        return {**PflStrategy.common_kwargs(settings), "fraction_train": settings.fraction_train}

    def prepare(self, initial_arrays: ArrayRecord) -> None:
        """The arrays a training reply carries: those of the initial model."""
        from pflower.records import from_record

        self.upload_spec = {k: ArraySpec.of(v) for k, v in from_record(initial_arrays).items()}

    # -------------------------------------------------------------- hooks
    def train_arrays(self, server_round: int, ids: list[int]) -> Mapping[int, ArrayRecord]:
        """Arrays sent to each sampled client for training."""
        raise NotImplementedError

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """Update server state from the round's valid training replies."""
        raise NotImplementedError

    def upload_spec_for(self, server_round: int) -> Mapping[str, ArraySpec]:
        """The arrays a training reply of ``server_round`` must carry (default: every upload key)."""
        return self.upload_spec

    def update_reference(self, client_id: int) -> Mapping | None:
        """What ``client_id`` started training from this round (for ``max-update-norm``); None: no bound."""
        return None

    def train_extras(self, server_round: int, ids: list[int]) -> Mapping[int, Mapping]:
        """More records for each training message, by name (FedFomo: other clients' models)."""
        return {}

    def check_reply(self, reply: Reply) -> None:
        """The method's own rule for a training reply's metrics; raise ``Rejected`` (default: none)."""

    # ---------------------------------------------------- Flower Strategy API
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list[Message]:
        ids = self.federation.sample(self.fraction_train, server_round)
        return self.federation.messages(ids, MessageType.TRAIN, self.train_arrays(server_round, ids), config, self.train_extras(server_round, ids))

    def aggregate_train(self, server_round: int, replies) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.gate.accept(
            replies, self.federation.client_of, self.upload_spec_for(server_round), MessageType.TRAIN, self.update_reference, self.check_reply
        )
        if valid:
            self.aggregate(server_round, valid)
        return self.global_arrays(), MetricRecord({**weighted_metrics(valid), "replies": len(valid)})

    def _failure(self, rnd: int, sampled: int, n_valid: int, silent: list[int]) -> str:
        why = [*self.gate.problems, *(f"client {c}: no reply within round-timeout={self.round_timeout:g} s" for c in silent)]
        shown = "; ".join(why[:5]) + (f"; and {len(why) - 5} more" if len(why) > 5 else "")
        return f"round {rnd}: {n_valid} valid training replies of {sampled} sampled clients, fewer than min-replies={self.min_replies}: {shown or 'no replies'}"

    def run_round(self, grid: Grid, rnd: int, config: dict, train_config: dict, result: Result) -> dict:
        """Train the sampled clients and aggregate their valid replies."""
        msgs = self.configure_train(rnd, self.global_arrays(), ConfigRecord({**train_config, **config}), grid)
        sampled = len(msgs)
        phase = self.federation.phase(grid, msgs, self.round_timeout)
        del msgs  # sent: free them before aggregation
        self.federation.trained_in(rnd, self.federation.answered(phase.replies))
        arrays, train_metrics = self.aggregate_train(rnd, phase.replies)
        if train_metrics["replies"] < self.min_replies:
            raise RoundFailedError(self._failure(rnd, sampled, int(train_metrics["replies"]), phase.missing))
        result.train_metrics_clientapp[rnd] = train_metrics
        result.arrays = arrays or result.arrays
        others = {k: v for k, v in train_metrics.items() if k not in ("train-loss", "replies")}
        return {"train-loss": train_metrics.get("train-loss"), "bytes-down": phase.down, "bytes-up": phase.up,
                "sampled": sampled, "missing": phase.missing, **({"train-metrics": others} if others else {})}  # fmt: skip
