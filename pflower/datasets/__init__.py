"""Data: sources (local files only), partitions, and each client's train/test split
(:mod:`pflower.datasets.federated`). The package imports nothing itself: the configuration reads
data folders with its modules, and the federation's split reads the configuration."""
