"""Server-side hypernetworks as plain tensors: pFedLA's (one per client, stacked over clients,
producing aggregation weights) and pFedHN's :class:`ModelGenerator` (one shared network producing
every client's whole model).

pFedLA's hypernetworks:

Client i's hypernetwork maps its embedding v_i (one shared table, one row per client) through
an MLP of three ReLU layers to one head per model layer; head l gives alpha_i^l, a distribution
over the N clients (ReLU, then normalized; an all-zero row falls back to the client itself).

Heads are factored as W_i^l K^T with a fixed key matrix K [N, k]: K is the identity when
N <= ``key-dim`` (exactly the paper's Linear(hidden -> N) head per layer), and a fixed random
projection for larger N, so memory per client stays O(hidden * key-dim), not O(N).
Parameters are gathered for the clients at hand and updated by scatter (plain SGD), so no
gradient buffer ever has the size of all N hypernetworks.

Three choices make the weights learn quickly at any model size and N (the paper leaves the
first two open; the third is the order of its Algorithm 1):

- The heads' raw outputs start at 1/N each (their sum is 1), so the normalization is nearly
  the identity and a step on a head moves alpha by as much. Raw outputs of 1 (sum N) damp
  every step on alpha by 1/N^2 (``head-start='sum-n'``, the ablation).
- The hypernetwork's loss for layer l is divided by the clients' squared norms in that layer,
  sum_j ||theta_j^l||^2 (the trace of the Gram matrix of the models that the weights mix):
  the gradient in alpha is then the same for a 400- and a 16-million-parameter layer and for
  any scale of its parameters. Without it (``layer-loss='raw'``), the first layer of the MNIST
  CNN (416 parameters) barely moves while the 65k-parameter one does. Dividing by the clients'
  spread instead, sum_j ||theta_j^l - mean_k theta_k^l||^2, equalizes the layers too but blows
  the step up where the clients agree: on IID data every step then fits noise and pFedLA falls
  to Local's accuracy, far below FedAvg's (bench/pfedla_differences.py, ``spread``).
- The step is taken at the client models after the round's training (Algorithm 1 updates
  theta, line 7, before v_i and psi_i, line 8): the weights then move toward the models the
  next round will mix. At the models the round started from, every client's model is the
  initial one in round 1, so the weights get no gradient there, and later the step measures
  how the weights would have changed a model that is already replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: Initial spread of the heads' raw outputs around 1/N, relative to 1/N: alpha starts near uniform.
HEAD_INIT_SPREAD = 0.1


@dataclass
class HyperNetworks:
    """Stacked hypernetwork parameters of N clients (see the module docstring)."""

    params: dict[str, torch.Tensor]
    keys: torch.Tensor  # [N, k], fixed
    #: [N] bool: clients that are not in the federation (a node that never answered): no weight
    #: goes to their models, which never trained. None: every client is there.
    absent: torch.Tensor | None = None

    @classmethod
    def create(cls, num_clients: int, num_layers: int, emb_dim: int, hidden: int, key_dim: int, seed: int, head_start: str = "sum-1") -> HyperNetworks:
        """``head_start``: the heads' raw outputs start at 1/N each (``sum-1``) or 1 each (``sum-n``, the ablation)."""
        g = torch.Generator().manual_seed(seed)
        n, k = num_clients, min(num_clients, key_dim)

        def uniform(*shape: int, fan_in: int) -> torch.Tensor:
            """In place: at N = 1000 the heads alone are 160 MB, and each temporary as much."""
            bound = fan_in**-0.5
            return torch.rand(*shape, generator=g).mul_(2).sub_(1).mul_(bound)

        keys = torch.eye(n) if n <= key_dim else torch.randn(n, k, generator=g) / k**0.5
        start = {"sum-1": 1.0 / n, "sum-n": 1.0}[head_start]
        params = {
            "emb": torch.randn(n, emb_dim, generator=g),
            "w1": uniform(n, emb_dim, hidden, fan_in=emb_dim),
            "b1": torch.zeros(n, hidden),
            "w2": uniform(n, hidden, hidden, fan_in=hidden),
            "b2": torch.zeros(n, hidden),
            "w3": uniform(n, hidden, hidden, fan_in=hidden),
            "b3": torch.zeros(n, hidden),
            # Raw outputs `start` each (the bias; exactly so while N <= key-dim, roughly through a
            # random projection) with a small slope: alpha starts near uniform.
            "hw": uniform(n, num_layers, hidden, k, fan_in=hidden).mul_(HEAD_INIT_SPREAD * start),
            "hb": (torch.linalg.pinv(keys) @ torch.full((n,), start)).expand(n, num_layers, k).clone(),
        }
        return cls(params, keys)

    @property
    def num_clients(self) -> int:
        return self.keys.shape[0]

    def gather(self, ids: torch.Tensor, requires_grad: bool = False) -> dict[str, torch.Tensor]:
        """Copies of the parameters of clients ``ids`` (leaf tensors for autograd if asked)."""
        return {name: t[ids].clone().requires_grad_(requires_grad) for name, t in self.params.items()}

    def alpha(self, ids: torch.Tensor, p: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Aggregation weights of clients ``ids``: [len(ids), layers, N], rows sum to 1."""
        p = self.gather(ids) if p is None else p
        x = p["emb"]
        for w, b in (("w1", "b1"), ("w2", "b2"), ("w3", "b3")):
            x = F.relu(torch.einsum("sd,sdh->sh", x, p[w]) + p[b])
        q = torch.einsum("sh,slhk->slk", x, p["hw"]) + p["hb"]  # [S, L, k]
        a = F.relu(q @ self.keys.T)  # [S, L, N]
        if self.absent is not None:
            a = a.masked_fill(self.absent, 0.0)
        total = a.sum(-1, keepdim=True)
        return torch.where(total > 0, a / total.clamp_min(1e-12), self_weights(ids, a))

    def step(self, ids: torch.Tensor, grads: dict[str, torch.Tensor], lr: float) -> None:
        """Plain SGD on the rows of clients ``ids``."""
        for name, g in grads.items():
            self.params[name][ids] -= lr * g


def self_weights(ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Every layer of client ids[s] on itself alone: one-hot rows shaped like ``like`` [S, L, N]."""
    return F.one_hot(ids, like.shape[-1]).to(like.dtype)[:, None, :].expand_as(like)


def keep_retained(alpha: torch.Tensor, ids: torch.Tensor, retained: torch.Tensor | None) -> torch.Tensor:
    """``alpha`` [S, L, N] with the retained layers (``retained`` [S, L], bool) on the client itself:
    HeurpFedLA's client starts those layers from its own model, which no weight changes."""
    if retained is None:
        return alpha
    return torch.where(retained[:, :, None], self_weights(ids, alpha), alpha)


def mix(alpha: torch.Tensor, theta: torch.Tensor, segments: list[tuple[int, int]]) -> torch.Tensor:
    """Personalized models: layer l of row s is sum_j alpha[s, l, j] * theta[j, layer l].

    ``alpha`` [S, L, N], ``theta`` [N, P] (flat client models), ``segments`` the [start, end)
    of each layer in the flat vector. Returns [S, P].
    """
    return torch.cat([alpha[:, l, :] @ theta[:, a:b] for l, (a, b) in enumerate(segments)], dim=1)


def layer_norms(theta: torch.Tensor, segments: list[tuple[int, int]], chunk: int = 64) -> torch.Tensor:
    """sum_j ||theta_j^l||^2 per layer l: [L], in float64, ``chunk`` rows at a time (a float64
    copy of all of ``theta`` is 612 MiB at N = 1000 with the MNIST CNN)."""
    out = torch.zeros(len(segments), dtype=torch.float64)
    for start in range(0, theta.shape[0], chunk):
        sq = theta[start : start + chunk].double().square()
        out += torch.stack([sq[:, a:b].sum() for a, b in segments])
    return out


def hypernetwork_update(
    hn: HyperNetworks,
    ids: torch.Tensor,
    theta: torch.Tensor,
    delta: torch.Tensor,
    segments: list[tuple[int, int]],
    lr: float,
    norms: torch.Tensor | None = None,
) -> None:
    """One SGD step of the hypernetworks of clients ``ids``: the paper's Eq. 10-11,
    Delta psi_i = (grad_psi bar_theta_i)^T Delta theta_i, with the weights' Jacobian taken at the
    client models ``theta`` and ``delta`` each client's update (trained minus what it was sent).

    The personalized models bar_theta = mix(alpha, theta) are regenerated with autograd and moved
    along ``delta``: the gradient reaching them is -delta^l / ``norms_l`` in layer l (:func:`layer_norms`
    of ``theta`` unless given; a layer whose norms are all 0 has no say). So weight flows to the
    clients whose models lie where the update went.
    """
    norms = layer_norms(theta, segments) if norms is None else norms
    scale = torch.cat([torch.full((b - a,), 1.0 / s if s > 1e-12 else 0.0) for (a, b), s in zip(segments, norms.tolist())])
    p = hn.gather(ids, requires_grad=True)
    bar = mix(hn.alpha(ids, p), theta, segments)
    grads = torch.autograd.grad(bar, list(p.values()), grad_outputs=-delta * scale, allow_unused=True)
    hn.step(ids, {k: g for k, g in zip(p, grads) if g is not None}, lr)


@dataclass
class ModelGenerator:
    """pFedHN's hypernetwork: one MLP shared by all clients, from client i's embedding v_i to its
    whole model (flat): Linear(e -> h), then ``n_hidden`` x (ReLU, Linear(h -> h)), then one
    Linear(h -> P) head (the official code's one head per tensor, side by side). Initialized like
    ``nn.Linear`` (uniform +-1/sqrt(fan_in)) and ``nn.Embedding`` (N(0, 1)); SGD with momentum and
    weight decay, the embeddings of the clients at hand only.
    """

    params: dict[str, torch.Tensor]
    velocity: dict[str, torch.Tensor]

    @classmethod
    def create(cls, num_clients: int, size: int, emb_dim: int, hidden: int, n_hidden: int, seed: int) -> ModelGenerator:
        g = torch.Generator().manual_seed(seed)

        def linear(fan_in: int, fan_out: int) -> tuple[torch.Tensor, torch.Tensor]:
            bound = fan_in**-0.5
            return (torch.rand(fan_in, fan_out, generator=g) * 2 - 1) * bound, (torch.rand(fan_out, generator=g) * 2 - 1) * bound

        params = {"emb": torch.randn(num_clients, emb_dim, generator=g)}
        dims = [emb_dim] + [hidden] * (n_hidden + 1)
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            params[f"w{i}"], params[f"b{i}"] = linear(a, b)
        params["head_w"], params["head_b"] = linear(hidden, size)
        return cls(params, {k: torch.zeros_like(v) for k, v in params.items()})

    @property
    def depth(self) -> int:
        return sum(1 for k in self.params if k.startswith("w"))

    def generate(self, ids: torch.Tensor, p: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The models of clients ``ids``: [len(ids), P]. ``p``: parameters to use instead, their
        ``emb`` already the rows of ``ids`` (leaf copies for autograd)."""
        if p is None:
            p, emb = self.params, self.params["emb"][ids]
        else:
            emb = p["emb"]
        x = emb @ p["w0"] + p["b0"]
        for i in range(1, self.depth):
            x = F.relu(x) @ p[f"w{i}"] + p[f"b{i}"]
        return x @ p["head_w"] + p["head_b"]

    def step(self, ids: torch.Tensor, grads: dict[str, torch.Tensor], lr: float, momentum: float, weight_decay: float) -> None:
        """SGD with momentum and weight decay (PyTorch's rule); the embedding rows of ``ids`` only."""
        for name, g in grads.items():
            rows = ids if name == "emb" else slice(None)
            param, vel = self.params[name], self.velocity[name]
            d = g + weight_decay * param[rows]
            vel[rows] = momentum * vel[rows] + d if momentum else d
            param[rows] -= lr * vel[rows]


def generator_grads(gen: ModelGenerator, ids: torch.Tensor, trained: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The gradient that moves pFedHN's generated models of clients ``ids`` toward their trained
    models (grad_outputs = generated - trained: -delta, as the official code), summed over the
    clients, and the models generated; ``emb``'s gradient has one row per client of ``ids``."""
    p = {k: (v[ids] if k == "emb" else v).clone().requires_grad_(True) for k, v in gen.params.items()}
    generated = gen.generate(ids, p)
    grads = torch.autograd.grad(generated, list(p.values()), grad_outputs=generated.detach() - trained)
    return dict(zip(p, grads)), generated.detach()


def generator_update(
    gen: ModelGenerator, parts: list[tuple[torch.Tensor, torch.Tensor]], lr: float, momentum: float = 0.9, weight_decay: float = 1e-3
) -> list[torch.Tensor]:
    """One step of pFedHN's hypernetwork toward the trained models of every (ids, trained) chunk of
    a round: each chunk's gradient against the same starting hypernetwork, summed (each client's
    contribution one step's worth), then one step. Returns each chunk's models before the step."""
    total: dict[str, torch.Tensor] = {}
    emb_rows, used = [], []
    for ids, trained in parts:
        grads, generated = generator_grads(gen, ids, trained)
        used.append(generated)
        emb_rows.append(grads.pop("emb"))
        for k, g in grads.items():
            total[k] = total[k] + g if k in total else g
    all_ids = torch.cat([ids for ids, _ in parts])
    gen.step(all_ids, {"emb": torch.cat(emb_rows), **total}, lr, momentum, weight_decay)
    return used
