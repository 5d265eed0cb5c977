"""FedeRiCo's server: a relay. Every decision and every model stays with the clients.

A round runs the clients' four relayed steps (:mod:`pflower.client_app.federico`) and the
shared evaluation, each one a push and its pulls; between steps the server only moves records
from the client that wrote them to the client they name:

- ``plan`` -> each client names its neighbours and its shuffle partner (and the view it offers);
- ``serve`` <- each client gets who asked for its model and the shuffles addressed to it,
  and answers with its model and its shuffle replies;
- ``use`` <- each client gets the models of the neighbours it named and its shuffle reply,
  and answers with a weighted update for each model's owner;
- ``update`` <- each client gets the updates of its model, and steps.

Every relayed reply passes the reply gate before anything of it is forwarded: error replies and
unknown nodes are refused whole; a model or an update must have the model's arrays (keys,
shapes, dtypes) and be finite; a shuffle buffer must be well formed (the overlay's format, ids
of this federation); a plan must name clients of this federation. A refused record is counted
under its reason in ``rejected`` and reaches no client; the round goes on without it.
References to forwarded records live only inside :meth:`run_round`: the server object holds no
model after a round. Bytes relayed per step are logged and recorded (``relayed-bytes``).
"""

from __future__ import annotations

from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from pflower.client_state import ClientState
from pflower.config import Settings
from pflower.methods.federico import GOSSIP, GOSSIP_REPLY, MODEL, PLAN, REQUESTS, gossip_from, gossip_reply, model_of, update_for, update_from
from pflower.overlay.peer_sampling import buffer_problem
from pflower.records import from_record
from pflower.strategies.loop import PflStrategy, RoundFailedError
from pflower.strategies.validation import ArraySpec, Rejected

RELAY = "train.relay"


class FedericoRelay(PflStrategy):
    """FedeRiCo's relay (see the module docstring): the server only passes messages on.

    Parameters
    ----------
    view_size : int (default: 4)
        Peers in each client's partial view: it bounds a shuffle buffer's length.
    **kwargs
        :class:`~pflower.strategies.loop.PflStrategy`'s parameters.
    """

    STATEFUL_CLIENTS = True

    ROW_KEYS = {
        "collaboration-weights": "each client's weights over the clients it tracks",
        "relayed-bytes": "the bytes relayed down in each of the round's four steps",
    }

    def __init__(self, *, view_size: int = 4, **kwargs):
        super().__init__(**kwargs)
        self.view_size = view_size
        self.model_spec: dict[str, ArraySpec] = {}

    @classmethod
    def from_settings(cls, settings: Settings, model, state: ClientState) -> FedericoRelay:
        from pflower.records import to_record

        strategy = cls(**cls.common_kwargs(settings), view_size=settings.params.view_size)
        strategy.initial_arrays = to_record(model.state_dict(), state.received)  # the shape of what clients relay
        return strategy

    def prepare(self, initial_arrays: ArrayRecord) -> None:
        """Keep the shapes of what clients relay (to check it), never a model."""
        self.model_spec = {k: ArraySpec.of(v) for k, v in from_record(initial_arrays).items()}
        self.initial_arrays = None

    def configure_train(self, server_round, arrays, config, grid):
        raise NotImplementedError("FedeRiCo has no single training phase: a round is four relayed steps (start() runs them)")

    def aggregate_train(self, server_round, replies):
        raise NotImplementedError("FedeRiCo aggregates nothing: each client steps its own model")

    def evaluation_extras(self, server_round: int) -> dict:
        """``collaboration-weights``: each client's weights over the clients it tracks."""
        weights = {
            str(c): {str(int(j)): float(w) for j, w in zip(m["weight-ids"], m["weights"])} for c, m in sorted(self.eval_metrics.items()) if "weight-ids" in m
        }
        return {"collaboration-weights": weights} if weights else {}

    # ------------------------------------------------------------ the gate
    def _client(self, client: int) -> bool:
        """A client id of the federation's range (present now or not)."""
        return isinstance(client, int) and not isinstance(client, bool) and 0 <= client < self.federation.num_clients

    def _buffer(self, client: int, record: ConfigRecord, what: str) -> bool:
        why = buffer_problem(record.get("ids"), record.get("ages"), self.federation.num_clients, self.view_size)
        if why is not None:
            self.gate.reject(client, Rejected("malformed", why), what)
        return why is None

    def _plan(self, client: int, content: RecordDict) -> tuple[list[int], list[int]] | None:
        """(neighbours, partner) of a well-formed plan, else None (refused): two lists of distinct
        clients of this federation other than itself, at most one partner. A client that is not
        here (a node that never answered, or left) is dropped from the plan, as one whose reply
        does not come is: a view holding it is no fault of the planner."""
        plan = content.config_records.get(PLAN)
        if plan is None or GOSSIP not in content.config_records:
            self.gate.reject(client, Rejected("malformed", f"a plan needs the records '{PLAN}' and '{GOSSIP}'"), "plan")
            return None
        if not self._buffer(client, content[GOSSIP], "shuffle"):
            return None
        wanted, partner = plan.get("neighbours", []), plan.get("gossip-to", [])
        well_formed = (
            isinstance(wanted, list) and isinstance(partner, list) and len(partner) <= 1
            and len(set(wanted)) == len(wanted) and all(self._client(j) and j != client for j in wanted + partner)
        )  # fmt: skip
        if not well_formed:
            self.gate.reject(client, Rejected("malformed", f"plan must name distinct other clients of this federation: {wanted!r} / {partner!r}"), "plan")
            return None
        here = self.federation.node_of
        return [int(j) for j in wanted if j in here], [int(j) for j in partner if j in here]

    def _step(self, grid: Grid, rnd: int, phase: str, contents: dict[int, RecordDict], config: dict, traffic: dict, missing: set) -> dict[int, RecordDict]:
        """Send one step to the clients in ``contents``; their valid replies by client."""
        msgs = []
        for cid in sorted(contents):
            content = contents[cid]
            content["config"] = ConfigRecord({**config, "phase": phase, **self.federation.pin(cid)})
            msgs.append(Message(content, dst_node_id=self.federation.node_of[cid], message_type=RELAY))
        out_phase = self.federation.phase(grid, msgs, self.round_timeout)
        del msgs
        traffic[phase] = (out_phase.down, out_phase.up)
        missing.update(out_phase.missing)
        out: dict[int, RecordDict] = {}
        for r in out_phase.replies:
            cid = self.federation.client_of.get(r.metadata.src_node_id)
            if cid is None:
                self.gate.reject(None, Rejected("unknown-node", f"node {r.metadata.src_node_id} is not a known client"), phase)
            elif r.has_error():
                self.gate.reject(cid, Rejected("client-error", f"client error: {r.error.reason}"), phase)
            else:
                out[cid] = r.content
        log(INFO, "FedeRiCo round %d, %s: %d clients, relayed %d bytes down, %d up", rnd, phase, len(out), out_phase.down, out_phase.up)
        return out

    # ----------------------------------------------------------- the round
    def run_round(self, grid: Grid, rnd: int, config: dict, train_config: dict, result: Result) -> dict:
        cfg = {**train_config, **config}  # the server's keys (round, lineage) win
        ids = self.federation.ids
        traffic: dict[str, tuple[int, int]] = {}  # step -> (bytes down, bytes up)
        missing: set[int] = set()

        plans = {}
        for i, content in self._step(grid, rnd, "plan", {c: RecordDict() for c in ids}, cfg, traffic, missing).items():
            if (plan := self._plan(i, content)) is not None:
                plans[i] = (plan, content[GOSSIP])

        serve = {j: RecordDict() for j in plans}
        requests = {j: {"requested-by": [], "gossip-from": []} for j in plans}
        for i, ((wanted, partner), shuffle) in sorted(plans.items()):
            for j in wanted:
                if j in serve:
                    requests[j]["requested-by"].append(i)
            for j in partner:
                if j in serve:
                    requests[j]["gossip-from"].append(i)
                    serve[j][gossip_from(i)] = shuffle
        for j in serve:
            serve[j][REQUESTS] = ConfigRecord(requests[j])
        served = self._step(grid, rnd, "serve", serve, cfg, traffic, missing)
        del serve

        models: dict[int, ArrayRecord] = {}
        replies: dict[tuple[int, int], ConfigRecord] = {}  # (from, to) -> shuffle reply
        for j, content in served.items():
            if MODEL in content.array_records and self.gate.arrays(j, content[MODEL], self.model_spec, "model"):
                models[j] = content[MODEL]
            for i in requests.get(j, {}).get("gossip-from", []):
                if gossip_reply(i) in content.config_records and self._buffer(j, content[gossip_reply(i)], "shuffle reply"):
                    replies[(j, i)] = content[gossip_reply(i)]
        del served

        use = {i: RecordDict() for i in plans}
        given: dict[int, set[int]] = {i: set() for i in plans}  # whose models each client got
        for i, ((wanted, partner), _) in sorted(plans.items()):
            for j in wanted:
                if j in models:
                    use[i][model_of(j)] = models[j]
                    given[i].add(j)
            for j in partner:
                if (j, i) in replies:
                    use[i][GOSSIP_REPLY] = replies[(j, i)]
        del models, replies
        used = self._step(grid, rnd, "use", use, cfg, traffic, missing)
        del use

        update = {j: RecordDict() for j in used}
        for i, content in sorted(used.items()):
            for name in content.array_records:
                j = name.removeprefix("update-")
                target = int(j) if j.isascii() and j.isdigit() else None
                if target is None or name != update_for(target) or target not in given.get(i, ()):
                    self.gate.reject(i, Rejected("malformed", f"update '{name}' of a model it was not given this round"), "update")
                elif target not in update:
                    continue  # its owner's reply of this step did not come: it takes no update this round
                elif self.gate.arrays(i, content[name], self.model_spec, f"update of client {target}'s model"):
                    update[target][update_from(i)] = content[name]
        del used
        updated = self._step(grid, rnd, "update", update, cfg, traffic, missing)
        del update
        self.federation.trained_in(rnd, updated)  # the last step's replies: each saved its state
        if len(updated) < self.min_replies:
            why = "; ".join(self.gate.problems[:5]) or "no replies"
            raise RoundFailedError(f"round {rnd}: {len(updated)} clients finished the round, fewer than min-replies={self.min_replies}: {why}")
        return {
            "train-loss": None,
            "bytes-down": sum(d for d, _ in traffic.values()),
            "bytes-up": sum(u for _, u in traffic.values()),
            "relayed-bytes": {phase: d for phase, (d, _) in traffic.items()},
            "sampled": len(ids),
            "missing": sorted(missing),
        }
