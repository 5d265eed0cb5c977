"""FedeRiCo client: decentralized EM over collaborators found through a peer-sampling overlay.

The client owns its model, its overlay view, and a table of tracked losses L_ij of peers' models
on its own training data. A round is four relayed steps (the server only forwards them, see
:mod:`pflower.strategies.federico`) and an evaluation:

1. ``plan``: (a newcomer first trains its model locally once: warm-started models make the first
   losses informative, our choice; the paper leaves the start open) age the view; pick a shuffle partner (the oldest peer) and the ``federico-neighbours``
   peers whose models it wants: with probability ``federico-epsilon`` per slot a random peer of the
   view, otherwise the tracked peer of highest weight.
2. ``serve``: answer shuffles and hand out its model to whoever asked for it.
3. ``use`` (E-step, then the local part of the M-step): L_ij <- (1 - beta) L_ij + beta loss_ij
   for its own and every received model (beta = ``federico-momentum``), w_i = softmax(-L_i.) over
   the tracked clients; then for every model j it used (its own included) it trains a copy on its
   data (the one training loop, ``local-epochs`` or ``local-steps``) and sends j the weighted update w_ij (theta_j -
   theta_j'), a multi-step gradient.
4. ``update``: theta_j <- theta_j - sum_i w_ij delta_ij, the sum of the weighted updates it
   received and its own (as the paper sums its collaborators' weighted gradients).

Prediction is the mixture sum_j w_ij softmax(f_theta_j(x)) over its own model and the models it
received this round, with their weights renormalized. All state lives in ``context.state``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict
from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.datasets.federated import Split
from pflower.methods.federico import GOSSIP, GOSSIP_REPLY, MODEL, PLAN, REQUESTS, gossip_from, gossip_reply, model_of, update_for, update_from
from pflower.overlay import View
from pflower.records import from_record, received_state, to_record
from pflower.training import evaluate

TABLES = "federico"  # ConfigRecord: view, tracked losses, this round's choices
OWN_UPDATE = "federico-own-update"  # ArrayRecord: w_ii * delta_ii, applied in the update step
PEER = "federico-peer-"  # ArrayRecord per peer model received this round (for the mixture)


def collaboration_weights(losses: dict[int, float]) -> dict[int, float]:
    """w = softmax(-L) over the tracked clients."""
    ids = sorted(losses)
    w = torch.softmax(-torch.tensor([losses[i] for i in ids], dtype=torch.float64), 0)
    return {i: float(x) for i, x in zip(ids, w)}


def e_step_loss(model: nn.Module, data: Split) -> float:
    """The E-step's loss of a model on a client's training data: the mean over samples.

    The paper's EM uses the data's log-likelihood, the *sum* over samples; then w = softmax(-n L)
    and at n = 160 a gap of 0.05 nats per sample is a factor e^8 (about 3,000) between two
    collaborators, so the weights are one-hot from the first round, which the paper's own
    Fig. 5b (weights spread over similar clients) rules out. The mean keeps them spread.
    """
    return evaluate(model, data).loss


def track(losses: dict[int, float], observed: dict[int, float], beta: float) -> dict[int, float]:
    """EMA of each observed loss (a first observation is taken as is)."""
    out = dict(losses)
    for j, loss in observed.items():
        out[j] = loss if j not in out else (1 - beta) * out[j] + beta * loss
    return out


def choose_neighbours(owner: int, weights: dict[int, float], view: Sequence[int], k: int, epsilon: float, rng: np.random.Generator) -> list[int]:
    """Epsilon-greedy: per slot, a random view peer with probability epsilon, else the best-weighted tracked peer."""
    ranked = sorted((j for j in weights if j != owner), key=lambda j: (-weights[j], j))
    chosen: list[int] = []
    for _ in range(k):
        explore = [j for j in view if j not in chosen and j != owner]
        exploit = [j for j in ranked if j not in chosen]
        if explore and (not exploit or rng.random() < epsilon):
            chosen.append(explore[int(rng.integers(len(explore)))])
        elif exploit:
            chosen.append(exploit[0])
        else:
            break
    return chosen


class Mixture(nn.Module):
    """log sum_j w_j softmax(f_j(x)): the mixture's class log-probabilities."""

    def __init__(self, models: Sequence[nn.Module], weights: Sequence[float]):
        super().__init__()
        self.members = nn.ModuleList(models)
        w = torch.tensor(weights, dtype=torch.float32)
        self.register_buffer("weights", w / w.sum())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = sum(w * m(x).softmax(1) for w, m in zip(self.weights, self.members))
        return probs.clamp_min(1e-12).log()


def _tables(state: RecordDict) -> ConfigRecord:
    return state[TABLES] if TABLES in state.config_records else ConfigRecord()


def _buffer(record: ConfigRecord) -> dict[int, int]:
    return {int(i): int(a) for i, a in zip(record.get("ids", []), record.get("ages", []))}


def _as_record(buffer: dict[int, int]) -> ConfigRecord:
    return ConfigRecord({"ids": list(buffer), "ages": list(buffer.values())})


class FedericoClient(ClientMethod):
    """See the module docstring."""

    def client_state(self, model: nn.Module) -> ClientState:
        """The model, relayed whole; besides it, its tables and this round's exchanges (private)."""
        return ClientState.of(model, records={
            TABLES: "its overlay view, tracked losses and this round's choices",
            OWN_UPDATE: "its own weighted update, applied in the update step",
            PEER: "each peer model received this round, for the mixture",
        })  # fmt: skip

    LAST_STEP = "update"
    EVALUATES = "the mixture of its own and its neighbours' models, weighted by its collaboration weights"

    def _rng(self, client_id: int, server_round: int, step: int) -> np.random.Generator:
        return np.random.default_rng([self.settings.seed, client_id, server_round, step])

    def _view(self, state: RecordDict, client_id: int, num_clients: int) -> View:
        t = _tables(state)
        if "view-ids" in t:
            return View.from_lists(client_id, self.settings.params.view_size, list(t["view-ids"]), list(t["view-ages"]))
        contact = (client_id + 1) % num_clients  # joins through one contact; the shuffles do the rest
        return View(client_id, self.settings.params.view_size, {contact: 0} if contact != client_id else {})

    def _losses(self, state: RecordDict) -> dict[int, float]:
        t = _tables(state)
        return {int(i): float(v) for i, v in zip(t.get("tracked-ids", []), t.get("tracked-losses", []))}

    def _save_tables(self, state: RecordDict, view: View, losses: dict[int, float], extra: dict | None = None) -> None:
        ids, ages = view.to_lists()
        tracked = sorted(losses)
        t = _tables(state)
        t.update({"view-ids": ids, "view-ages": ages, "tracked-ids": tracked, "tracked-losses": [losses[i] for i in tracked], **(extra or {})})
        state[TABLES] = t

    def weights(self, state: RecordDict) -> dict[int, float]:
        losses = self._losses(state)
        return collaboration_weights(losses) if losses else {}

    # ------------------------------------------------------------ the relayed steps
    def relay_step(
        self, phase: str, model: nn.Module, data: Split, incoming: RecordDict, state: RecordDict,
        client_id: int, num_clients: int, server_round: int,
    ) -> RecordDict:  # fmt: skip
        s = self.settings
        view = self._view(state, client_id, num_clients)
        losses = self._losses(state)
        if phase == "plan":
            if not losses:  # a newcomer: train locally first, so peers' losses on its model mean something
                seed = int(np.random.SeedSequence([s.seed, client_id, server_round, 3]).generate_state(1)[0])
                self._train_local(model, data, seed)
            view.tick()
            rng = self._rng(client_id, server_round, 0)
            partner = view.oldest()
            shuffle = view.shuffle_buffer(rng, partner)
            weights = collaboration_weights(losses) if losses else {}
            neighbours = choose_neighbours(client_id, weights, view.peers, s.params.neighbours, s.params.epsilon, rng)
            self._save_tables(state, view, losses, {"neighbours": neighbours, "partner": [] if partner is None else [partner]})
            plan = {"neighbours": neighbours, "gossip-to": [] if partner is None else [partner]}
            return RecordDict({PLAN: ConfigRecord(plan), GOSSIP: _as_record(shuffle)})

        if phase == "serve":
            rng = self._rng(client_id, server_round, 1)
            requests = incoming[REQUESTS] if REQUESTS in incoming.config_records else ConfigRecord()
            out = RecordDict()
            for i in sorted(int(x) for x in requests.get("gossip-from", [])):
                out[gossip_reply(i)] = _as_record(view.reply_buffer(rng, i))
            for i in sorted(int(x) for x in requests.get("gossip-from", [])):
                view.merge(_buffer(incoming[gossip_from(i)]))
            if requests.get("requested-by", []):
                out[MODEL] = to_record(model.state_dict(), self.client_state(model).uploaded)
            self._save_tables(state, view, losses)
            return out

        if phase == "use":
            t = _tables(state)
            neighbours = [int(j) for j in t.get("neighbours", [])]
            partner = [int(j) for j in t.get("partner", [])]
            if partner:
                if GOSSIP_REPLY in incoming.config_records:
                    view.merge(_buffer(incoming[GOSSIP_REPLY]))
                else:
                    view.remove(partner[0])  # it did not answer
            own = {k: v.detach().clone() for k, v in model.state_dict().items()}  # the model is reused below
            peers = {}
            for j in neighbours:
                if model_of(j) in incoming.array_records:
                    peers[j] = received_state(incoming[model_of(j)], own)
                else:
                    view.remove(j)  # gone: forget it until gossip brings it back
                    losses.pop(j, None)
            for name in [n for n in state.array_records if n.startswith(PEER)]:
                del state[name]
            train = {client_id: own, **peers}
            observed = {}
            for j, theta in train.items():
                model.load_state_dict(theta, strict=False)
                observed[j] = e_step_loss(model, data)
            losses = track(losses, observed, s.params.momentum)
            weights = collaboration_weights(losses)
            out = RecordDict()
            for j, theta in train.items():
                model.load_state_dict(theta, strict=False)
                seed = int(np.random.SeedSequence([s.seed, client_id, server_round, j, 5]).generate_state(1)[0])
                self._train_local(model, data, seed)
                after = model.state_dict()
                update = {k: weights[j] * (theta[k] - after[k]) for k in self.client_state(model).uploaded}
                if j == client_id:
                    state[OWN_UPDATE] = to_record(update)
                else:
                    out[update_for(j)] = to_record(update)
                    state[f"{PEER}{j}"] = to_record(theta)
            model.load_state_dict(own)
            self._save_tables(state, view, losses, {"own-weight": weights[client_id], "peer-weights": [weights[j] for j in peers], "peers": list(peers)})
            return out

        if phase == "update":
            own = model.state_dict()
            keys = self.client_state(model).uploaded
            total = {k: torch.zeros_like(own[k], dtype=torch.float64) for k in keys}
            if OWN_UPDATE in state.array_records:
                own_update = received_state(state[OWN_UPDATE], own)
                total = {k: total[k] + own_update[k].double() for k in keys}
            senders = sorted(i for i in range(num_clients) if update_from(i) in incoming.array_records)
            for i in senders:
                delta = received_state(incoming[update_from(i)], own)
                total = {k: total[k] + delta[k].double() for k in keys}
            model.load_state_dict({k: (own[k].double() - total[k]).to(own[k].dtype) for k in keys}, strict=False)
            if OWN_UPDATE in state.array_records:
                del state[OWN_UPDATE]
            return RecordDict({"metrics": MetricRecord({"updates-received": len(senders), "num-examples": len(data)})})

        raise ValueError(f"unknown FedeRiCo step {phase!r}")

    # ------------------------------------------------------------ evaluation
    def predictor(self, model: nn.Module, state: RecordDict) -> nn.Module:
        """The mixture of its own model and this round's peer models, weighted by w (renormalized)."""
        t = _tables(state)
        peers = [int(j) for j in t.get("peers", [])]
        members, weights = [model], [float(t.get("own-weight", 1.0))]
        for j, w in zip(peers, t.get("peer-weights", [])):
            if f"{PEER}{j}" in state.array_records:
                m = copy.deepcopy(model)
                m.load_state_dict(from_record(state[f"{PEER}{j}"]), strict=False)
                members.append(m)
                weights.append(float(w))
        return Mixture(members, weights)

    def report(self, state: RecordDict) -> dict:
        """Its collaboration weights over every tracked client (ids and values, for metrics.json)."""
        w = self.weights(state)
        return {"weight-ids": list(w), "weights": list(w.values())}
