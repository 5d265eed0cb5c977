"""Clustered FL's server (Sattler, Müller & Samek, 2020): clusters of clients, one model each.

The run starts with one cluster of every client and the initial model. Each round a sampled
client is sent its cluster's model θ_c and uploads the model it trained, θ_i; its update is
Δθ_i = θ_i − θ_c. Then, for each cluster c whose clients replied (S_c, n_i samples each):

- ‖Δθ_c‖ = ‖Σ_{i∈S_c} (n_i / n) Δθ_i‖ (the mean update) and max_{i∈S_c} ‖Δθ_i‖;
- if the round is past ``warmup_rounds``, every client of c replied, c has ``min_split_size``
  clients or more, ‖Δθ_c‖ < ε₁ and max ‖Δθ_i‖ > ε₂: the bipartition c₁, c₂ of c that
  minimizes the largest cosine similarity α_ij of updates across it (:func:`optimal_bipartition`),
  made if √((1 − α_cross)/2) > γ_max, α_cross that largest similarity;
- each resulting cluster's model becomes θ_c + Σ (n_i / n) Δθ_i over its own replying clients,
  i.e. their models averaged by samples (FedAvg within the cluster).

A cluster none of whose clients replied keeps its model. Norms and similarities are over the
arrays that are not BatchNorm running statistics (those are averaged as the model's). Evaluation
messages carry each client's cluster model; ``global_arrays`` is the cluster models averaged by
their clients' samples (the one model until a split).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord
from flwr.common.logger import log
from torch import nn

from pflower.client_state import ClientState, Role
from pflower.config import Settings
from pflower.records import FlatSpec, from_record, to_record
from pflower.strategies.fedavg import weighted_average
from pflower.strategies.loop import TrainRounds
from pflower.strategies.validation import Reply


def cosine_similarities(updates: torch.Tensor) -> torch.Tensor:
    """α_ij = ⟨Δθ_i, Δθ_j⟩ / (‖Δθ_i‖ ‖Δθ_j‖) of the rows of ``updates`` [n, P] (a zero row: 0)."""
    norms = updates.norm(dim=1, keepdim=True)
    unit = updates / torch.where(norms > 0, norms, torch.ones_like(norms))
    return unit @ unit.T


def optimal_bipartition(similarity: torch.Tensor) -> tuple[list[int], list[int]]:
    """The split of 0..n−1 into two non-empty parts that minimizes the largest similarity across
    them (the paper's optimal bipartition): pairs merged in order of decreasing similarity until
    two groups remain (single linkage, exact for this objective). Ties go to the lower indices;
    the first part holds 0."""
    n = len(similarity)
    if n < 2:
        raise ValueError(f"a bipartition needs at least 2 items, not {n}")
    group = list(range(n))
    pairs = sorted(((i, j) for i in range(n) for j in range(i + 1, n)), key=lambda p: (-float(similarity[p]), p))
    groups = n
    for i, j in pairs:
        if groups == 2:
            break
        a, b = group[i], group[j]
        if a != b:
            group = [min(a, b) if g == max(a, b) else g for g in group]
            groups -= 1
    first = [k for k in range(n) if group[k] == group[0]]
    return first, [k for k in range(n) if group[k] != group[0]]


def split_check(
    updates: torch.Tensor, weights: torch.Tensor, *, eps1: float, eps2: float, gamma_max: float, may_split: bool
) -> tuple[dict, tuple[list[int], list[int]] | None]:
    """One cluster's round: its norms (``mean-norm``, ``max-norm``) and, where ``may_split`` and
    mean < ε₁ and max > ε₂, the optimal bipartition of its clients (``cross-similarity`` α_cross)
    if √((1 − α_cross)/2) > γ_max and the updates across it are not parallel; returns the record
    and the two parts (indices into ``updates``' rows), or None where it does not split."""
    mean_norm = float(weighted_average(updates, weights).norm())
    max_norm = float(updates.norm(dim=1).max())
    record: dict = {"mean-norm": mean_norm, "max-norm": max_norm}
    if not (may_split and len(updates) >= 2 and mean_norm < eps1 and max_norm > eps2):
        return record, None
    sim = cosine_similarities(updates)
    first, second = optimal_bipartition(sim)
    cross = float(sim[first][:, second].max())
    record["cross-similarity"] = cross
    # parallel updates (identical clients) stay together: a cosine of P coordinates is exact only
    # to about P epsilons of its dtype, so 1 - α below that is rounding, not an angle
    parallel = 1.0 - cross <= updates.shape[1] * torch.finfo(updates.dtype).eps
    if not parallel and math.sqrt((1.0 - cross) / 2) > gamma_max:
        return record, (first, second)
    return record, None


class ClusteredFL(TrainRounds):
    """Clustered FL's server; the initial arrays are the model every cluster starts from.

    Parameters
    ----------
    eps1 : float (default: 0.4)
        ε₁: a cluster may split only when the norm of its mean update is below this.
    eps2 : float (default: 1.0)
        ε₂: ... and only when its largest client update is above this.
    gamma_max : float (default: 0.0)
        γ_max: a split is made only if √((1 − α_cross)/2) exceeds it (0: any split).
    warmup_rounds : int (default: 0)
        No cluster splits in the first this many rounds.
    min_split_size : int (default: 3)
        A cluster splits only if it has at least this many clients.
    parameters : list of str or None (default: None)
        The arrays whose updates the clients' cosine similarities and norms compare (pass the
        model's parameters to leave BatchNorm's statistics out, as pflower's own runs do); None:
        every array of the initial model, statistics included.
    **kwargs
        :class:`~pflower.strategies.loop.TrainRounds`' parameters."""

    ROW_KEYS = {
        "clusters": "the clusters after the round (their client ids)",
        "cfl": "each cluster's record of the round: its clients, how many replied, its update norms, whether it split",
    }

    def __init__(
        self, *, eps1: float = 0.4, eps2: float = 1.0, gamma_max: float = 0.0, warmup_rounds: int = 0, min_split_size: int = 3,
        parameters: Sequence[str] | None = None, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        self.parameters = list(parameters) if parameters is not None else None
        if not eps1 > 0 or not eps2 >= 0:
            raise ValueError(f"eps1={eps1} must be > 0 and eps2={eps2} >= 0")
        if not 0 <= gamma_max < 1:
            raise ValueError(f"gamma_max={gamma_max} must be in [0, 1)")
        if warmup_rounds < 0 or min_split_size < 2:
            raise ValueError(f"warmup_rounds={warmup_rounds} must be >= 0 and min_split_size={min_split_size} >= 2")
        self.eps1, self.eps2, self.gamma_max = eps1, eps2, gamma_max
        self.warmup_rounds, self.min_split_size = warmup_rounds, min_split_size
        self.dtypes: dict[str, torch.dtype] = {}
        self.clusters: list[list[int]] = []  # client ids of each cluster, ascending
        self.models: list[dict[str, torch.Tensor]] = []  # each cluster's model
        self.cluster_of: dict[int, int] = {}
        self.stats: dict[int, list[dict]] = {}  # the last aggregated round's per-cluster record, for its metrics row
        self._records: dict[int, ArrayRecord] = {}  # cluster index (-1: the global arrays) -> its arrays

    @classmethod
    def from_settings(cls, settings: Settings, model: nn.Module, state: ClientState) -> ClusteredFL:
        p = settings.params
        strategy = cls(
            **cls.common_kwargs(settings), eps1=p.eps1, eps2=p.eps2, gamma_max=p.gamma_max, warmup_rounds=p.warmup_rounds, min_split_size=p.min_split_size,
            parameters=state.parameters(Role.MODEL),
        )  # fmt: skip
        strategy.initial_arrays = to_record(model.state_dict(), state.received)
        return strategy

    def prepare(self, initial_arrays: ArrayRecord) -> None:
        super().prepare(initial_arrays)
        state = from_record(initial_arrays)
        self.dtypes = {k: v.dtype for k, v in state.items()}
        self.model_spec = FlatSpec.of(state)
        self.update_spec = FlatSpec.of(state, self.parameters)  # None: every array
        self._set([list(range(self.federation.num_clients))], [state])
        n = self.federation.num_clients
        if self.min_split_size > n:
            log(WARNING, "Clustered FL: min-split-size=%d exceeds the federation's %d clients: no cluster can split (it is FedAvg)", self.min_split_size, n)
        elif (sampled := max(1, round(self.fraction_train * n))) < n:
            log(WARNING, "Clustered FL: fraction-train=%g samples %d of the %d clients a round, and the first cluster (every client) splits "
                "only in a round where all its clients replied: no cluster can split (it is FedAvg)", self.fraction_train, sampled, n)  # fmt: skip

    def _set(self, clusters: list[list[int]], models: list[dict[str, torch.Tensor]]) -> None:
        self.clusters, self.models = clusters, models
        self.cluster_of = {cid: k for k, members in enumerate(clusters) for cid in members}
        self._records.clear()

    def _record(self, k: int) -> ArrayRecord:
        if k not in self._records:
            self._records[k] = to_record(self.models[k])
        return self._records[k]

    def train_arrays(self, server_round: int, ids: list[int]) -> dict[int, ArrayRecord]:
        """Each client's cluster's model; a client in no cluster (it was away when its cluster
        split) joins the first."""
        for cid in ids:
            if cid not in self.cluster_of:
                log(INFO, "Clustered FL: client %d, in no cluster (away when its cluster split), joins cluster %s", cid, self.clusters[0])
                self.clusters[0] = sorted([*self.clusters[0], cid])
                self.cluster_of[cid] = 0
        return {cid: self._record(self.cluster_of[cid]) for cid in ids}

    def evaluate_arrays(self, server_round: int, ids: list[int]) -> dict[int, ArrayRecord]:
        return self.train_arrays(server_round, ids)

    def global_arrays(self) -> ArrayRecord:
        """The cluster models averaged by their clients' training samples."""
        if not self.models:
            return ArrayRecord()
        if len(self.models) == 1:
            return self._record(0)
        if -1 not in self._records:
            n = torch.tensor([float(sum(self.federation.num_examples.get(c, 1) for c in members)) for members in self.clusters])
            flat = weighted_average(self.model_spec.stack(self.models, torch.float64), n)
            self._records[-1] = to_record({k: v.to(self.dtypes[k]) for k, v in self.model_spec.unflatten(flat).items()})
        return self._records[-1]

    def update_reference(self, client_id: int) -> Mapping[str, torch.Tensor]:
        return self.models[self.cluster_of[client_id]]

    def _average(self, replies: list[Reply]) -> dict[str, torch.Tensor]:
        weights = torch.tensor([float(r.num_examples) for r in replies], dtype=torch.float64)
        flat = weighted_average(self.model_spec.stack((r.arrays for r in replies), torch.float64), weights)
        return {k: v.to(self.dtypes[k]) for k, v in self.model_spec.unflatten(flat).items()}

    def aggregate(self, server_round: int, replies: list[Reply]) -> None:
        by_cluster: dict[int, list[Reply]] = {}
        for r in sorted(replies, key=lambda r: r.client_id):
            by_cluster.setdefault(self.cluster_of[r.client_id], []).append(r)
        clusters, models, stats = [], [], []
        for k, (members, model) in enumerate(zip(self.clusters, self.models)):
            got = by_cluster.get(k, [])
            if not got:
                clusters.append(members)
                models.append(model)
                stats.append({"clients": members, "replied": 0})
                continue
            updates = self.update_spec.stack((r.arrays for r in got), torch.float64) - self.update_spec.flatten(model).double()
            weights = torch.tensor([float(r.num_examples) for r in got], dtype=torch.float64)
            here = [c for c in members if c in self.federation.node_of]  # a client that never answered blocks no split
            may_split = server_round > self.warmup_rounds and len(got) == len(here) and len(here) >= self.min_split_size
            if server_round > self.warmup_rounds and len(here) >= self.min_split_size and len(got) < len(here):
                away = sorted(set(here) - {r.client_id for r in got})
                log(INFO, "Clustered FL, round %d: cluster %s may split only once all its clients reply; %s did not", server_round, members, away)
            record, parts = split_check(updates, weights, eps1=self.eps1, eps2=self.eps2, gamma_max=self.gamma_max, may_split=may_split)
            groups = [got] if parts is None else [[got[i] for i in part] for part in parts]
            if parts is not None:
                log(INFO, "Clustered FL, round %d: cluster %s splits into %s and %s", server_round, members, *([r.client_id for r in g] for g in groups))
            for g in groups:
                clusters.append([r.client_id for r in g] if parts is not None else members)
                models.append(self._average(g))
            stats.append({"clients": members, "replied": len(got), **record, "split": parts is not None})
        self._set(clusters, models)
        self.stats = {server_round: stats}

    def round_extras(self, server_round: int) -> dict:
        """``clusters``: the clusters after the round; ``cfl``: each cluster's record of the round
        (its clients, how many replied, its norms, whether it split)."""
        return {"clusters": self.clusters, "cfl": self.stats.get(server_round, [])}

    def state_dict(self) -> dict:
        """The clusters (client ids) and their models, each array stacked over the clusters in order."""
        models = {k: torch.stack([m[k] for m in self.models]) for k in self.dtypes}
        return {**super().state_dict(), "clusters": [list(m) for m in self.clusters], "models": models}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        clusters = [[int(c) for c in members] for members in state["clusters"]]
        self._set(clusters, [{k: state["models"][k][i].to(self.dtypes[k]) for k in self.dtypes} for i in range(len(clusters))])
