"""SCAFFOLD client: local steps corrected by the control variates, c_i updated by option II.

The server's message carries the global model x and its control variate c (into the model's
``scaffold.c`` buffers, :mod:`pflower.models.controls`). Each of the K local steps is the run's
optimizer on the gradient g_i(y) + c − c_i (the cross-entropy's gradient and the linear term
⟨c − c_i, y⟩'s: y ← y − η_l (g_i(y) − c_i + c) with plain SGD). Then, by the paper's option II,

    Δc_i = −c + (x − y) / (K·η_l),    c_i ← c_i + Δc_i,

K the steps taken and η_l the round's step size. With momentum β the optimizer moves a constant
gradient by η_l·Σ_{k=1..K} (1 − β^k) / (1 − β) in K steps, not K·η_l: that sum divides instead,
so c_i stays an estimate of the mean gradient (with β = 0 it is K·η_l, the paper's formula).
The client uploads y and Δc_i; c_i stays in its personal state (a client sampled for the first
time starts from c_i = 0). BatchNorm statistics get no correction and travel as the model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pflower.client_app.base import ClientMethod
from pflower.client_state import ClientState
from pflower.datasets.federated import Split
from pflower.models import communicable_keys
from pflower.models.controls import C_CLIENT, C_SERVER, DELTA_C, PREFIX, controls


def step_sum(steps: int, lr: float, momentum: float) -> float:
    """How far K = ``steps`` steps of SGD (heavy-ball ``momentum`` β, as PyTorch's) move a constant
    gradient of 1: lr·Σ_{k=1..K} (1 − β^k) / (1 − β), which is K·lr without momentum."""
    if momentum == 0:
        return steps * lr
    return lr * sum((1 - momentum**k) / (1 - momentum) for k in range(1, steps + 1))


class ScaffoldClient(ClientMethod):
    def client_state(self, model: nn.Module) -> ClientState:
        """The model (x in, y out: parameters and float buffers); c from the server, Δc_i to
        it; c_i private."""
        keys = communicable_keys(model)
        control = [k for k in keys if k.startswith(PREFIX)]
        return ClientState.of(
            model,
            [k for k in keys if k not in control],
            from_server=[k for k in control if k.startswith(C_SERVER)],
            to_server=[k for k in control if k.startswith(DELTA_C)],
        )

    def fit(self, model: nn.Module, data: Split, received: dict[str, torch.Tensor], seed: int, server_round: int) -> float:
        s = self.settings
        if s.optimizer != "sgd":
            raise ValueError(f"SCAFFOLD's control variates (option II) need optimizer='sgd', not {s.optimizer!r}")
        params = dict(model.named_parameters())
        c, c_i, delta_c = controls(model, C_SERVER), controls(model, C_CLIENT), controls(model, DELTA_C)
        x = {k: p.detach().clone() for k, p in params.items()}
        correction = {k: c[k] - c_i[k] for k in params}
        steps = 0

        def loss_fn(m: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            nonlocal steps
            steps += 1
            linear = sum((p * correction[k]).sum() for k, p in params.items())
            return F.cross_entropy(m(xb), yb) + (linear - linear.detach())  # the gradient of <c - c_i, y>; the value reported is the CE's

        loss = self._train_local(model, data, seed, loss_fn=loss_fn)
        moved = step_sum(steps, s.lr * self.lr_factor, s.momentum)
        with torch.no_grad():
            for k, p in params.items():
                delta_c[k].copy_((x[k] - p) / moved - c[k] if steps else torch.zeros_like(p))
                c_i[k].add_(delta_c[k])
        return loss
