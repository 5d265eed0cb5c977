"""FedEM client: one EM step on its mixture weights π, then each component trained on its share.

The training message carries the K components (the server's averages); π is the client's own,
kept in its personal state. A round, as the authors' code orders it (``MixtureClient.step``):

1. E-step: for every training sample i, with the received components in evaluation mode,
   q_ik = π_k exp(−ℓ_k(x_i, y_i)) / Σ_j π_j exp(−ℓ_j(x_i, y_i)), ℓ_k component k's cross-entropy;
2. M-step: π_k = mean_i q_ik;
3. each component k trained for the round's local training (``local-epochs``, or
   ``local-steps`` steps each) on the loss mean_{i in batch} (q_ik / π_k) ℓ_k(x_i, y_i), its
   own parameters only, through the one training loop with the round's seed: the weighted mean
   of its losses over the samples it explains (the weights average 1 over the client's data).

The client uploads the K trained components and π (the reply metric ``fedem-pi``); the server
averages component k with the weights n_t π_tk, the samples each client's component k
explains (:mod:`pflower.strategies.fedem`). The authors' code divides by the batch size alone
and averages by n_t: with SGD the responsibilities then scale each client's step, but Adam
normalizes that scale away, every component takes the same full step on every client's data,
and no component specializes (docs/methods/fedem.md). π is not averaged: the client keeps its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.datasets.federated import Split
from pflower.methods.fedem import PI_METRIC
from pflower.models import communicable_keys
from pflower.models.mixture import COMPONENTS, Mixture
from pflower.training import batches


@torch.no_grad()
def sample_losses(model: Mixture, data: Split, batch_size: int = 512) -> torch.Tensor:
    """ℓ_k(x_i, y_i) [K, n]: each component's cross-entropy on each sample, in evaluation mode."""
    dev = model.pi.device
    model.eval()
    out: list[list[torch.Tensor]] = [[] for _ in model.components]
    for x, y in batches(data, batch_size):
        x, y = x.to(dev), y.to(dev)
        for losses, component in zip(out, model.components):
            losses.append(F.cross_entropy(component(x), y, reduction="none"))
    return torch.stack([torch.cat(losses) for losses in out])


def responsibilities(losses: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """The E-step: q [K, n], q_ik ∝ π_k exp(−losses_ki), each column summing to 1.

    A loss that is not finite (a component whose output overflowed) counts as +inf: that
    component explains the sample with probability 0. A sample that no component of positive
    weight scores keeps π as its q (no evidence), so π stays a distribution: a NaN π would be
    saved in the client's personal state and poison every later round."""
    prior = torch.log(pi)[:, None]
    log_q = prior - losses
    log_q = torch.where(log_q.isnan(), -torch.inf, log_q)
    scored = (log_q > -torch.inf).any(0)
    return torch.softmax(torch.where(scored, log_q, prior), 0)


def weighted_cross_entropy(logits: torch.Tensor, y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """mean_i w_i CE(logits_i, y_i): the batch's size divides (the weights are q_ik / π_k, whose
    mean over the client's data is 1)."""
    return (F.cross_entropy(logits, y, reduction="none") * weights).mean()


def sample_weights(q: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """w [K, n], w_ki = q_ki / π_k (0 where π_k = 0: the component explains none of the client's
    samples, and the server gives its upload the weight n_t π_k = 0)."""
    return torch.where(pi[:, None] > 0, q / pi[:, None].clamp_min(torch.finfo(q.dtype).tiny), 0.0)


def em_step(model: Mixture, data: Split) -> torch.Tensor:
    """The E-step's q [K, n] with the model's components and π; π set to the M-step's mean q."""
    q = responsibilities(sample_losses(model, data), model.pi)
    model.pi.copy_(q.mean(1))
    return q


class FedEMClient(ClientMethod):
    EVALUATES = "the mixture of the K components as the server sends them, weighted by its own π (the π-weighted mean of their softmax outputs)"

    def __init__(self, settings):
        super().__init__(settings)
        self._q: torch.Tensor | None = None  # the E-step of the message at hand (before_fit to fit)

    def client_state(self, model: nn.Module) -> ClientState:
        """The K components (parameters and float buffers) are the model; π stays private."""
        return ClientState.of(model, [k for k in communicable_keys(model) if k.startswith(COMPONENTS)])

    def before_fit(self, model: nn.Module, data: Split, incoming, server_round: int) -> dict:
        """The E-step and the M-step on π (kept for :meth:`fit`); reports π, which the server
        weighs this client's components by."""
        self._q = em_step(model, data) if len(data) else None
        return {PI_METRIC: [float(p) for p in model.pi]}

    def fit(self, model: nn.Module, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        """Each component's weighted training after the E-step and M-step (:meth:`before_fit`'s,
        else done here); returns the sum over the components of their mean weighted losses
        (with K = 1, FedAvg's loss)."""
        q, self._q = self._q, None
        if len(data) == 0:
            return 0.0
        if q is None:
            q = em_step(model, data)
        weights_of = sample_weights(q, model.pi)
        labels = data.y.to(q.device)
        indexed = Split(data.x, torch.arange(len(data)))  # the loop's minibatches carry the samples' indices
        total = 0.0
        for component, weights in zip(model.components, weights_of):

            def loss_fn(m: nn.Module, x: torch.Tensor, i: torch.Tensor, component=component, weights=weights) -> torch.Tensor:
                return weighted_cross_entropy(component(x), labels[i], weights[i])

            total += self._train_local(model, indexed, seed, params=list(component.parameters()), loss_fn=loss_fn)
        return total
