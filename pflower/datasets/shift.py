"""Feature shift: clients that differ in their inputs, not their labels (FedBN's setting).

Each client is a *domain*: one deterministic transformation, applied once to all of its data
(train and test alike) after the partition, seeded by (seed, client). ``feature-shift`` names
the kind; a client's strength ``t`` in [0, 1] is its place in a seeded order of the clients,
spread evenly (the first client of the order keeps its data as it is). ``mixed`` gives the
clients the five kinds in turn along that order, each at full strength (t = 1): five domains,
as FedBN's five digit data sets. On the standardized images (per channel, zero mean, unit
variance over the pool), at strength t:

- ``rotation``: by 90° × t, about the centre (the border pixels extend into the corners);
- ``contrast``: each image's deviation from its own mean scaled by 4^-t (1 to 1/4);
- ``noise``: Gaussian noise of standard deviation t, drawn once per sample;
- ``blur``: a Gaussian blur of t × side / 12 pixels (0.67 for 8×8 digits, 2.3 for 28×28);
- ``colour``: per channel c, x·g_c + b_c with g_c = 2^(t·u_c), b_c = t·v_c, u, v uniform in
  [-1, 1] drawn per client (on one channel: brightness and contrast).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

KINDS = ("rotation", "contrast", "noise", "blur", "colour")
#: The identity reply's record of what sets a client's inputs apart (its domain's ``name``).
DOMAIN = "domain"


@dataclass(frozen=True)
class Domain:
    """One client's transformation: its kind, strength in [0, 1] and seed."""

    kind: str
    level: float
    seed: int

    def _colour(self, channels: int) -> tuple[np.ndarray, np.ndarray]:
        u, v = np.random.default_rng(self.seed).uniform(-1, 1, size=(2, channels))
        return 2.0 ** (self.level * u), self.level * v

    def name(self, channels: int = 1) -> str:
        """What the domain is, for metrics.json and the partition figure."""
        t = self.level
        if self.kind == "rotation":
            return f"rotation {90 * t:.0f}°"
        if self.kind == "contrast":
            return f"contrast ×{4**-t:.2f}"
        if self.kind == "noise":
            return f"noise σ {t:.2f}"
        if self.kind == "blur":
            return f"blur {t:.2f} × side/12 px"
        if self.kind == "colour":
            g, b = self._colour(channels)
            return f"colour gain {'/'.join(f'{v:.2f}' for v in g)} offset {'/'.join(f'{v:+.2f}' for v in b)}"
        return "none"

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """The transformed images (a new tensor; ``x`` is [n, C, H, W], float)."""
        t = self.level
        if t == 0 or self.kind == "none" or len(x) == 0:
            return x.clone()
        if self.kind == "rotation":
            a = math.radians(90 * t)
            theta = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]], dtype=x.dtype).expand(len(x), 2, 3)
            grid = F.affine_grid(theta, list(x.shape), align_corners=False)
            return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
        if self.kind == "contrast":
            mean = x.mean(dim=(1, 2, 3), keepdim=True)
            return mean + (x - mean) * 4**-t
        if self.kind == "noise":
            g = torch.Generator().manual_seed(self.seed)
            return x + t * torch.randn(x.shape, generator=g, dtype=x.dtype)
        if self.kind == "blur":
            return _blur(x, t * min(x.shape[-2:]) / 12)
        if self.kind == "colour":
            g, b = (torch.tensor(v, dtype=x.dtype).view(1, -1, 1, 1) for v in self._colour(x.shape[1]))
            return x * g + b
        raise ValueError(f"unknown feature shift {self.kind!r}; one of {', '.join(KINDS)}")


def _blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """A separable Gaussian blur of ``sigma`` pixels, edges reflected."""
    radius = min(max(1, math.ceil(2 * sigma)), min(x.shape[-2:]) - 1)
    k = torch.exp(-(torch.arange(-radius, radius + 1, dtype=x.dtype) ** 2) / (2 * sigma**2))
    k = k / k.sum()
    c = x.shape[1]
    out = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="reflect"), k.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
    return F.conv2d(F.pad(out, (0, 0, radius, radius), mode="reflect"), k.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)


def domain_of(shift: str, seed: int, client_id: int, num_clients: int) -> Domain:
    """Client ``client_id``'s domain under ``feature-shift=shift`` (see the module docstring)."""
    order = np.random.default_rng([seed, 11]).permutation(num_clients)
    place = int(np.flatnonzero(order == client_id)[0])
    domain_seed = int(np.random.SeedSequence([seed, client_id, 13]).generate_state(1)[0])
    if shift == "none":
        return Domain("none", 0.0, domain_seed)
    if shift == "mixed":
        return Domain(KINDS[place % len(KINDS)], 1.0, domain_seed)
    if shift not in KINDS:
        raise ValueError(f"unknown feature shift {shift!r}; one of none, mixed, {', '.join(KINDS)}")
    return Domain(shift, place / max(1, num_clients - 1), domain_seed)
