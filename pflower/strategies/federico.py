"""FedeRiCo's server: a relay. Every decision and every model stays with the clients.

A round runs the clients' four relayed steps (:mod:`pflower.client_app.federico`) and an
evaluation, each one a push and its pulls; between steps the server only moves records
from the client that wrote them to the client they name:

- ``plan`` -> each client names its neighbours and its shuffle partner (and the view it offers);
- ``serve`` <- each client gets who asked for its model and the shuffles addressed to it,
  and answers with its model and its shuffle replies;
- ``use`` <- each client gets the models of the neighbours it named and its shuffle reply,
  and answers with a weighted update for each model's owner;
- ``update`` <- each client gets the updates of its model, and steps.

References to forwarded records live only inside :meth:`run_round`: the server object holds
no model after a round. Bytes relayed per step are logged and recorded (``relayed-bytes``).
"""

from __future__ import annotations

from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from torch import nn

from pflower.config import Settings
from pflower.strategies.base import PflStrategy, RoundFailedError
from pflower.strategies.validation import Reply

RELAY = f"{MessageType.TRAIN}.relay"


class FedericoRelay(PflStrategy):
    @classmethod
    def from_model(cls, settings: Settings, model: nn.Module, upload_keys) -> "FedericoRelay":
        return cls(settings, {}, [])  # no model on the server

    def train_arrays(self, server_round: int, client_id: int) -> ArrayRecord:
        return ArrayRecord()

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        """Never called: the relay aggregates nothing."""

    def round_extras(self, server_round: int) -> dict:
        """``collaboration-weights``: each client's weights over the clients it tracks."""
        weights = {
            str(c): {str(int(j)): float(w) for j, w in zip(m["weight-ids"], m["weights"])}
            for c, m in sorted(self.eval_metrics.items())
            if "weight-ids" in m
        }
        return {"collaboration-weights": weights} if weights else {}

    def _step(self, grid: Grid, rnd: int, phase: str, contents: dict[int, RecordDict], config: dict) -> tuple[dict[int, RecordDict], int, int, list[int]]:
        """Send one step to the clients in ``contents``; (reply contents by client, bytes down, up, missing)."""
        msgs = []
        for cid in sorted(contents):
            content = contents[cid]
            content["config"] = ConfigRecord({**config, "phase": phase})
            msgs.append(Message(content, dst_node_id=self.node_of[cid], message_type=RELAY))
        replies, down, up, missing = self._phase(grid, msgs)
        del msgs
        out: dict[int, RecordDict] = {}
        for r in replies:
            cid = self.client_of.get(r.metadata.src_node_id)
            if cid is None or r.has_error():
                reason = "unknown-node" if cid is None else "error"
                why = f"node {r.metadata.src_node_id} is not a known client" if cid is None else r.error.reason
                self.rejected[reason] += 1
                self.problems.append(f"client {cid}: {phase}: {why}")
                log(WARNING, "FedeRiCo %s: no valid reply from client %s: %s", phase, cid, why)
                continue
            out[cid] = r.content
        log(INFO, "FedeRiCo round %d, %s: %d clients, relayed %d bytes down, %d up", rnd, phase, len(out), down, up)
        return out, down, up, missing

    def run_round(self, grid: Grid, rnd: int, config: dict, train_config: dict, evaluate_config: dict, result: Result) -> dict:
        cfg = {**config, **train_config}
        ids = sorted(self.node_of)
        traffic: dict[str, tuple[int, int]] = {}  # step -> (bytes down, bytes up)
        missing: set[int] = set()

        def step(phase: str, contents: dict[int, RecordDict]) -> dict[int, RecordDict]:
            out, down, up, miss = self._step(grid, rnd, phase, contents, cfg)
            traffic[phase] = (down, up)
            missing.update(miss)
            return out

        plans = step("plan", {c: RecordDict() for c in ids})
        wanted = {i: [int(j) for j in p["plan"].get("neighbours", [])] for i, p in plans.items()}
        partner = {i: [int(j) for j in p["plan"].get("gossip-to", [])] for i, p in plans.items()}

        serve = {j: RecordDict() for j in plans}
        requests = {j: {"requested-by": [], "gossip-from": []} for j in plans}
        for i in sorted(plans):
            for j in wanted[i]:
                if j in serve:
                    requests[j]["requested-by"].append(i)
            for j in partner[i]:
                if j in serve:
                    requests[j]["gossip-from"].append(i)
                    serve[j][f"gossip-{i}"] = plans[i]["gossip"]
        for j in serve:
            serve[j]["requests"] = ConfigRecord(requests[j])
        del plans
        served = step("serve", serve)
        del serve

        use = {i: RecordDict() for i in wanted}
        for i in sorted(wanted):
            for j in wanted[i]:
                if j in served and "model" in served[j].array_records:
                    use[i][f"model-{j}"] = served[j]["model"]
            for j in partner[i]:
                if j in served and f"gossip-reply-{i}" in served[j].config_records:
                    use[i]["gossip-reply"] = served[j][f"gossip-reply-{i}"]
        del served
        used = step("use", use)
        del use

        update = {j: RecordDict() for j in used}
        for i in sorted(used):
            for name in used[i].array_records:
                j = int(name.removeprefix("update-"))
                if j in update:
                    update[j][f"update-from-{i}"] = used[i][name]
        del used
        updated = step("update", update)
        del update
        if len(updated) < self.settings.min_replies:
            raise RoundFailedError(self._failure(rnd, len(ids), len(updated), sorted(missing)))

        e_down, e_up, e_missing = self.evaluate_phase(grid, rnd, {**config, **evaluate_config}, result)
        return {
            "train-loss": None,
            "bytes-down": sum(d for d, _ in traffic.values()) + e_down,
            "bytes-up": sum(u for _, u in traffic.values()) + e_up,
            "relayed-bytes": {phase: d for phase, (d, _) in traffic.items()},
            "sampled": len(ids),
            "missing": sorted(missing | set(e_missing)),
        }
