"""pFedLA's server-side hypernetworks as plain tensors, one per client, stacked over clients.

Client i's hypernetwork maps its embedding v_i (one shared table, one row per client) through
an MLP of three ReLU layers to one head per model layer; head l gives alpha_i^l, a distribution
over the N clients (ReLU, then normalized; an all-zero row falls back to the client itself).

Heads are factored as W_i^l K^T with a fixed key matrix K [N, k]: K is the identity when
N <= ``key-dim`` (exactly the paper's Linear(hidden -> N) head per layer), and a fixed random
projection for larger N, so memory per client stays O(hidden * key-dim), not O(N).
Parameters are gathered for the clients at hand and updated by scatter (plain SGD), so no
gradient buffer ever has the size of all N hypernetworks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

@dataclass
class HyperNetworks:
    """Stacked hypernetwork parameters of N clients (see the module docstring)."""

    params: dict[str, torch.Tensor]
    keys: torch.Tensor  # [N, k], fixed

    @classmethod
    def create(cls, num_clients: int, num_layers: int, emb_dim: int, hidden: int, key_dim: int, seed: int) -> "HyperNetworks":
        g = torch.Generator().manual_seed(seed)
        n, k = num_clients, min(num_clients, key_dim)

        def uniform(*shape: int, fan_in: int) -> torch.Tensor:
            bound = fan_in**-0.5
            return (torch.rand(*shape, generator=g) * 2 - 1) * bound

        keys = torch.eye(n) if n <= key_dim else torch.randn(n, k, generator=g) / k**0.5
        params = {
            "emb": torch.randn(n, emb_dim, generator=g),
            "w1": uniform(n, emb_dim, hidden, fan_in=emb_dim),
            "b1": torch.zeros(n, hidden),
            "w2": uniform(n, hidden, hidden, fan_in=hidden),
            "b2": torch.zeros(n, hidden),
            "w3": uniform(n, hidden, hidden, fan_in=hidden),
            "b3": torch.zeros(n, hidden),
            # Small heads with a positive bias: every client starts near uniform weights.
            "hw": uniform(n, num_layers, hidden, k, fan_in=hidden) * 0.1,
            "hb": (torch.linalg.pinv(keys) @ torch.ones(n)).expand(n, num_layers, k).clone(),
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
        total = a.sum(-1, keepdim=True)
        own = F.one_hot(ids, self.num_clients).to(a.dtype)[:, None, :].expand_as(a)
        return torch.where(total > 0, a / total.clamp_min(1e-12), own)

    def step(self, ids: torch.Tensor, grads: dict[str, torch.Tensor], lr: float) -> None:
        """Plain SGD on the rows of clients ``ids``."""
        for name, g in grads.items():
            self.params[name][ids] -= lr * g


def mix(alpha: torch.Tensor, theta: torch.Tensor, segments: list[tuple[int, int]]) -> torch.Tensor:
    """Personalized models: layer l of row s is sum_j alpha[s, l, j] * theta[j, layer l].

    ``alpha`` [S, L, N], ``theta`` [N, P] (flat client models), ``segments`` the [start, end)
    of each layer in the flat vector. Returns [S, P].
    """
    return torch.cat([alpha[:, l, :] @ theta[:, a:b] for l, (a, b) in enumerate(segments)], dim=1)


def hypernetwork_update(
    hn: HyperNetworks, ids: torch.Tensor, theta: torch.Tensor, trained: torch.Tensor, segments: list[tuple[int, int]], lr: float
) -> torch.Tensor:
    """One SGD step of the hypernetworks of clients ``ids`` toward their trained models.

    The personalized models bar_theta are regenerated from the snapshot ``theta`` with autograd;
    backpropagating grad_outputs = bar_theta - trained (= -delta, as in pFedHN) makes the step
    a descent on 0.5 * ||bar_theta - trained||^2, i.e. it moves bar_theta toward the trained
    models. Returns the bar_theta used (before the step).
    """
    p = hn.gather(ids, requires_grad=True)
    bar = mix(hn.alpha(ids, p), theta, segments)
    grads = torch.autograd.grad(bar, list(p.values()), grad_outputs=bar.detach() - trained)
    hn.step(ids, dict(zip(p, grads)), lr)
    return bar.detach()
