"""Data: sources (local files only), partitions, and each client's train/test split."""

from pflower.datasets.federated import Split, client_data, client_domain, federated_indices, global_test, holdout, label_counts, pool_for
from pflower.datasets.partition import PartitionError
from pflower.datasets.sources import DataError, Pool

__all__ = [
    "DataError",
    "PartitionError",
    "Pool",
    "Split",
    "client_data",
    "client_domain",
    "federated_indices",
    "global_test",
    "holdout",
    "label_counts",
    "pool_for",
]
