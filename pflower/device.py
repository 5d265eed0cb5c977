"""Where a process computes.

One rule for where tensors live: what a client receives and sends is on the CPU (Flower's
records, :mod:`pflower.records`); what it computes is on its model's device, chosen here.
"""

from __future__ import annotations

import os

import torch

#: Environment variable that pins the ClientApp's device: ``cpu``, ``cuda`` or ``cuda:N``.
DEVICE_ENV = "PFLOWER_DEVICE"


def device() -> torch.device:
    """``PFLOWER_DEVICE`` if set; else CUDA when the process sees a GPU, CPU otherwise."""
    pinned = os.environ.get(DEVICE_ENV, "")
    if not pinned:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(pinned)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{DEVICE_ENV}={pinned!r} is not allowed: use cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{DEVICE_ENV}={pinned!r}, but this process sees no GPU")
    return dev
