"""The federated view of a data set: each client's train/test tensors and the global test set.

Built from the run settings alone, so every process (server, simulated client, SuperNode)
derives the same partition for the same data seed (``data-seed``, by default ``seed``). Results
are cached per process, keyed by the whole settings (the data seed included).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from pflower.datasets import partition as P
from pflower.datasets import sources as S
from pflower.datasets.shift import domain_of
from pflower.datasets.sources import Pool, Source

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


def load_pool(source: Source) -> Pool:
    """The whole pool of the data set ``source`` names."""
    dataset, data_dir = source.dataset, Path(source.data_dir)
    if dataset == "digits":
        return S.load_digits()
    if dataset == "imagefolder":
        return S.load_image_folder(data_dir, source.image_size)
    if dataset in ("mnist", "fashion-mnist", "emnist"):
        return S.load_idx_family(dataset, data_dir)
    if dataset in ("cifar10", "cifar100"):
        return S.load_cifar(dataset, data_dir, source.download)
    if dataset == "torchvision":
        from pflower.datasets.torchvision_files import load_torchvision

        return load_torchvision(data_dir, source.torchvision_name, source.emnist_split)
    if dataset == "huggingface":  # imports `datasets` (3 s) only here
        from pflower.datasets.huggingface import load_huggingface

        return load_huggingface(source)
    raise S.DataError(f"unknown dataset {dataset!r}")


@lru_cache(maxsize=4)
def _pool(source: Source) -> Pool:
    return load_pool(source)


def pool_for(settings: Settings) -> Pool:
    return _pool(settings.source)


def check_data(settings: Settings, num_clients: int | None = None) -> None:
    """Open the data as every client will and check what they would find: images of the shape
    and classes the server builds its model for, finite values, every label in range, no class
    without samples and, given the number of clients, a partition that leaves each client
    samples (text: its classes are the vocabulary's characters, some of which may never be the
    next one). DataError or PartitionError naming the data and the problem. Nothing is cached: the
    ServerApp checks a pool it never trains on."""
    pool = load_pool(settings.source)
    where = settings.data_dir or settings.dataset
    if len(pool.y) == 0:
        raise S.DataError(f"{where}: the data set holds no images")
    if pool.shape != tuple(settings.image_shape):
        raise S.DataError(f"{where}: the images are {pool.shape} (channels, height, width), its first image says {tuple(settings.image_shape)}")
    if pool.num_classes != settings.num_classes:
        raise S.DataError(f"{where}: the labels make {pool.num_classes} classes, its metadata {settings.num_classes}")
    if (low := int(pool.y.min())) < 0 or (high := int(pool.y.max())) >= pool.num_classes:
        raise S.DataError(f"{where}: labels run from {low} to {high}, outside its {pool.num_classes} classes (0-{pool.num_classes - 1})")
    if not bool(torch.isfinite(pool.x).all()):
        raise S.DataError(f"{where}: some image values are not finite numbers")
    if not settings.text and (empty := np.flatnonzero(np.bincount(pool.y.numpy(), minlength=pool.num_classes) == 0).tolist()):  # text: the vocabulary's classes
        raise S.DataError(f"{where}: {len(empty)} of its {pool.num_classes} classes have no images (class {', '.join(map(str, empty[:10]))})")
    if num_clients is not None:
        split_indices(pool, num_clients, settings)


def pool_subset(pool: Pool, s: Settings) -> np.ndarray | None:
    """The pool indices ``data-fraction`` keeps (stratified by class, seeded by the data seed);
    None for the whole pool."""
    if s.data_fraction >= 1:
        return None
    seed = int(np.random.SeedSequence([s.split_seed, 13]).generate_state(1)[0])
    return P.stratified_subset(pool.y.numpy(), s.data_fraction, seed)


def partition_indices(pool: Pool, num_clients: int, s: Settings) -> tuple[list[np.ndarray], np.ndarray | None]:
    """One index array per client into the pool for the configured partition (of the
    ``data-fraction`` subset, when it is set)."""
    keep = pool_subset(pool, s)
    labels = pool.y.numpy() if keep is None else pool.y.numpy()[keep]
    ids = pool.ids if keep is None or pool.ids is None else pool.ids[keep]
    parts, groups = _partition(labels, ids, num_clients, s)
    return (parts if keep is None else [keep[p] for p in parts]), groups


def natural_id_seed(s: Settings) -> int:
    """The seed of the natural ids ``natural-id-fraction`` draws (from the data seed)."""
    return int(np.random.SeedSequence([s.split_seed, 17]).generate_state(1)[0])


def natural_id_count(s: Settings) -> int:
    """How many natural ids the run's sampling keeps (``natural-id-min-samples``,
    ``natural-id-fraction``): the number of clients that makes each client one writer or role.
    Read from the id column alone (no image is decoded); ValueError with ``data-fraction`` < 1,
    whose subset needs the labels."""
    from pflower.datasets.huggingface import ids_of, open_dataset

    if s.partition != "natural-id" or s.data_fraction < 1:
        raise ValueError("counting the natural ids needs partition 'natural-id' over the whole pool (data-fraction=1)")
    ids = ids_of(open_dataset(str(s.data_path)), s.natural_id_column)
    return len(P.kept_natural_ids(ids, s.natural_id_min_samples, s.natural_id_fraction, natural_id_seed(s)))


def _partition(labels: np.ndarray, ids: np.ndarray | None, num_clients: int, s: Settings) -> tuple[list[np.ndarray], np.ndarray | None]:
    seed = s.split_seed
    if s.partition == "natural-id":
        if ids is None:
            raise P.PartitionError("partition 'natural-id' needs a data set with an id column (natural-id-column)")
        return P.natural_id(ids, num_clients, s.natural_id_min_samples, s.natural_id_fraction, natural_id_seed(s)), None
    if s.partition == "shards":
        return P.shards(labels, num_clients, s.shards_per_client, seed), None
    if s.partition in ("linear", "exponential", "sizes"):
        sizes = P.parse_sizes(s.client_sizes) if s.partition == "sizes" else None
        return P.quantity_skew(labels, num_clients, s.partition, seed, sizes), None
    if s.partition == "iid":
        return P.iid(labels, num_clients, seed), None
    if s.partition == "dirichlet":
        return P.dirichlet(labels, num_clients, s.dirichlet_alpha, seed), None
    if s.partition == "pathological":
        return P.pathological(labels, num_clients, s.classes_per_client, seed, s.samples_per_client), None
    if s.partition == "dominant":
        return P.dominant(labels, num_clients, s.dominant_classes, s.dominant_fraction, seed, s.samples_per_client), None
    if s.partition == "classes":
        return P.listed_classes(labels, num_clients, P.parse_class_groups(s.client_classes), seed, s.samples_per_client), None
    return P.label_groups(labels, num_clients, s.label_groups, seed, s.samples_per_client, s.group_assignment)


@lru_cache(maxsize=8)
def federated_indices(settings: Settings, num_clients: int) -> FederatedIndices:
    """Partition the pool among ``num_clients`` and split every share into train and test."""
    return split_indices(pool_for(settings), num_clients, settings)


def split_indices(pool: Pool, num_clients: int, settings: Settings) -> FederatedIndices:
    """:func:`federated_indices` of ``pool`` (uncached); PartitionError if a client gets under 2 samples."""
    labels = pool.y.numpy()
    parts, groups = partition_indices(pool, num_clients, settings)
    train, test = [], []
    for cid, idx in enumerate(parts):
        if len(idx) < 2:
            keep = pool_subset(pool, settings)
            pooled = f"{len(labels)}" if keep is None else f"{len(keep)}, data-fraction={settings.data_fraction} of {len(labels)},"
            raise P.PartitionError(
                f"partition '{settings.partition}' leaves client {cid} with {len(idx)} samples "
                f"(of {pooled} for {num_clients} clients); use fewer clients or another partition"
            )
        tr, te = P.train_test_split(idx, labels, settings.test_fraction, settings.split_seed + cid)
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
    """(train, test) samples of one client; ``label-noise`` flips training labels only,
    ``feature-shift`` transforms both by the client's domain."""
    if not 0 <= client_id < num_clients:
        raise ValueError(f"client id {client_id} is outside 0..{num_clients - 1}")
    pool = pool_for(settings)
    fi = federated_indices(settings, num_clients)
    tr, te = torch.from_numpy(fi.train[client_id]), torch.from_numpy(fi.test[client_id])
    y_train = pool.y[tr]
    if settings.label_noise != "none" and settings.label_noise_ratio > 0:
        seed = int(np.random.SeedSequence([settings.split_seed, client_id, 7]).generate_state(1)[0])
        y_train = P.noisy_labels(y_train, settings.label_noise, settings.label_noise_ratio, pool.num_classes, seed)
    x_train, x_test = pool.x[tr], pool.x[te]
    if settings.feature_shift != "none":
        domain = domain_of(settings.feature_shift, settings.split_seed, client_id, num_clients)
        x_train, x_test = domain.apply(x_train), domain.apply(x_test)
    return Split(x_train, y_train), Split(x_test, pool.y[te])


def label_counts(settings: Settings, client_id: int, num_clients: int) -> list[int]:
    """How many samples of each class client ``client_id`` holds (train and test, labels before
    any label noise): the partition as drawn."""
    pool = pool_for(settings)
    fi = federated_indices(settings, num_clients)
    held = np.concatenate([fi.train[client_id], fi.test[client_id]])
    return np.bincount(pool.y.numpy()[held], minlength=pool.num_classes).tolist()


def client_domain(settings: Settings, client_id: int, num_clients: int) -> str:
    """What sets client ``client_id``'s inputs apart: its feature-shift domain, or the natural ids
    it holds (``natural-id``); '' when the clients differ in their labels only."""
    if settings.feature_shift != "none":
        return domain_of(settings.feature_shift, settings.split_seed, client_id, num_clients).name(pool_for(settings).shape[0])
    if settings.partition == "natural-id" and (ids := pool_for(settings).ids) is not None:
        keep = pool_subset(pool_for(settings), settings)
        ids = ids if keep is None else ids[keep]
        held = P.natural_ids_of(ids, num_clients, client_id, settings.natural_id_min_samples, settings.natural_id_fraction, natural_id_seed(settings))
        return ", ".join(held[:3]) + (f" (+{len(held) - 3})" if len(held) > 3 else "")
    return ""


def global_test(settings: Settings, num_clients: int) -> Split:
    """The union of all clients' test splits: a test set with the union of their distributions
    (and, under feature shift, of their domains)."""
    if settings.feature_shift != "none":
        tests = [client_data(settings, c, num_clients)[1] for c in range(num_clients)]
        return Split(torch.cat([t.x for t in tests]), torch.cat([t.y for t in tests]))
    pool = pool_for(settings)
    idx = torch.from_numpy(np.concatenate(federated_indices(settings, num_clients).test))
    return Split(pool.x[idx], pool.y[idx])
