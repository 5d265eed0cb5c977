"""Where a process computes, and with which kernels.

One rule for where tensors live: what a client receives and sends is on the CPU (Flower's
records, :mod:`pflower.records`); what it computes is on its model's device, chosen here.
"""

from __future__ import annotations

import os

import torch

#: Environment variable that pins the ClientApp's device: ``cpu``, ``cuda`` or ``cuda:N``.
DEVICE_ENV = "PFLOWER_DEVICE"
#: The cuBLAS workspace settings under which its kernels are deterministic (CUDA's documentation).
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


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


def uses_cuda() -> bool:
    """Whether this process computes on CUDA (:func:`device`)."""
    return device().type == "cuda"


def deterministic_kernels() -> None:
    """Deterministic kernels for this process, set before it starts CUDA.

    cuDNN without benchmarking (which picks kernels by timing) and with its deterministic
    algorithms, no TF32 in matrix products and convolutions, cuBLAS's fixed workspace (read when
    CUDA starts), and PyTorch's deterministic implementations wherever it has them. An op
    without one warns rather than fails (``warn_only``): the GPU path has not run here, and a
    warning in the log names what breaks "same seed, same numbers" without losing the run.
    PyTorch's switch is thrown only in a process that computes on CUDA: pflower's CPU ops are
    deterministic without it, and it costs a process about 1.5 s at start (measured: 4.2 s
    against 2.7 s for ``import torch`` and the rest), which every deployed message pays.
    """
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_DETERMINISTIC:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC[0]
    if uses_cuda():
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    torch.backends.cudnn.rnn.fp32_precision = "ieee"
