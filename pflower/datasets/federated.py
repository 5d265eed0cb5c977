"""The federated view of a data set: each client's train/test tensors and the global test set.

Built from the run settings alone, so every process (server, simulated client, SuperNode)
derives the same partition for the same seed. Results are cached per process.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from pflower.datasets import partition as P
from pflower.datasets.sources import Pool, load_pool

if TYPE_CHECKING:  # annotations only: the configuration validates data folders with pflower.datasets
    from pflower.config import Settings


@dataclass(frozen=True)
class Split:
    """Samples of one client (or the global test set)."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class FederatedIndices:
    """Per-client train and test indices into the pool; ``groups`` for label-groups."""

    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]
    groups: np.ndarray | None


@lru_cache(maxsize=4)
def _pool(dataset: str, data_dir: str, download: bool, image_size: int) -> Pool:
    return load_pool(dataset, Path(data_dir), download, image_size)


def pool_for(settings: Settings) -> Pool:
    return _pool(settings.dataset, str(settings.data_path) if settings.data_dir else "", settings.download, settings.image_size)


def partition_indices(labels: np.ndarray, num_clients: int, s: Settings) -> tuple[list[np.ndarray], np.ndarray | None]:
    """One index array per client for the configured partition."""
    if s.partition == "iid":
        return P.iid(labels, num_clients, s.seed), None
    if s.partition == "dirichlet":
        return P.dirichlet(labels, num_clients, s.dirichlet_alpha, s.seed), None
    if s.partition == "pathological":
        return P.pathological(labels, num_clients, s.classes_per_client, s.seed, s.samples_per_client), None
    if s.partition == "dominant":
        return P.dominant(labels, num_clients, s.dominant_classes, s.dominant_fraction, s.seed, s.samples_per_client), None
    return P.label_groups(labels, num_clients, s.label_groups, s.seed, s.samples_per_client, s.group_assignment)


@lru_cache(maxsize=8)
def federated_indices(settings: Settings, num_clients: int) -> FederatedIndices:
    """Partition the pool among ``num_clients`` and split every share into train and test."""
    labels = pool_for(settings).y.numpy()
    parts, groups = partition_indices(labels, num_clients, settings)
    train, test = [], []
    for cid, idx in enumerate(parts):
        if len(idx) < 2:
            raise P.PartitionError(
                f"partition '{settings.partition}' leaves client {cid} with {len(idx)} samples "
                f"(of {len(labels)} for {num_clients} clients); use fewer clients or another partition"
            )
        tr, te = P.train_test_split(idx, labels, settings.test_fraction, settings.seed + cid)
        train.append(tr)
        test.append(te)
    return FederatedIndices(tuple(train), tuple(test), groups)


def holdout(data: Split, fraction: float, seed: int) -> tuple[Split, Split]:
    """(train, validation): a fixed random ``fraction`` of ``data`` held out (SuPerFed's choice of
    lambda, FedFomo's weights)."""
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(data)))
    k = max(1, int(round(fraction * len(data))))
    tr, va = order[k:], order[:k]
    return Split(data.x[tr], data.y[tr]), Split(data.x[va], data.y[va])


def client_data(settings: Settings, client_id: int, num_clients: int) -> tuple[Split, Split]:
    """(train, test) samples of one client; ``label-noise`` flips training labels only."""
    if not 0 <= client_id < num_clients:
        raise ValueError(f"client id {client_id} is outside 0..{num_clients - 1}")
    pool = pool_for(settings)
    fi = federated_indices(settings, num_clients)
    tr, te = torch.from_numpy(fi.train[client_id]), torch.from_numpy(fi.test[client_id])
    y_train = pool.y[tr]
    if settings.label_noise != "none" and settings.label_noise_ratio > 0:
        seed = int(np.random.SeedSequence([settings.seed, client_id, 7]).generate_state(1)[0])
        y_train = P.noisy_labels(y_train, settings.label_noise, settings.label_noise_ratio, pool.num_classes, seed)
    return Split(pool.x[tr], y_train), Split(pool.x[te], pool.y[te])


def global_test(settings: Settings, num_clients: int) -> Split:
    """The union of all clients' test splits: a test set with the union of their distributions."""
    pool = pool_for(settings)
    idx = torch.from_numpy(np.concatenate(federated_indices(settings, num_clients).test))
    return Split(pool.x[idx], pool.y[idx])
