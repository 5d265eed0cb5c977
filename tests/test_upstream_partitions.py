"""flwr-datasets' partitions next to pflower's own: shards (the FedAvg paper's), quantity skew
(linear, exponential, given sizes) and natural ids; determinism, sizes and coverage of each."""

import numpy as np
import pytest
from conftest import run_config

from pflower.config import ConfigError, load_settings
from pflower.datasets import partition as P
from pflower.datasets.federated import federated_indices
from pflower.datasets.partition import PartitionError

LABELS = np.repeat(np.arange(10), 60)  # 600 samples, 10 balanced classes, shuffled
np.random.default_rng(1).shuffle(LABELS)


def _disjoint(parts) -> np.ndarray:
    every = np.concatenate(parts)
    assert len(every) == len(np.unique(every))
    return every


@pytest.mark.parametrize(
    "make",
    [
        lambda s: P.shards(LABELS, 10, 2, s),
        lambda s: P.quantity_skew(LABELS, 5, "linear", s),
        lambda s: P.quantity_skew(LABELS, 5, "exponential", s),
        lambda s: P.quantity_skew(LABELS, 3, "sizes", s, [50, 100, 200]),
    ],
    ids=["shards", "linear", "exponential", "sizes"],
)
def test_deterministic_for_a_seed(make):
    a, b, c = make(4), make(4), make(5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_shards_are_the_fedavg_papers():
    """20 label-sorted shards of 30 for 10 clients, 2 each: every sample used once, each client at
    most 2 classes (a shard may straddle two labels: then 3 or 4)."""
    parts = P.shards(LABELS, 10, 2, seed=0)
    assert len(_disjoint(parts)) == 600 and all(len(p) == 60 for p in parts)
    classes = [len(np.unique(LABELS[p])) for p in parts]
    assert max(classes) <= 4 and np.mean(classes) <= 2.5


def test_shards_equal_the_upstream_partitioner():
    from flwr_datasets.partitioner import ShardPartitioner

    part = ShardPartitioner(num_partitions=6, partition_by="label", num_shards_per_partition=3, seed=7)
    part.dataset = P._as_hf_dataset(LABELS)
    theirs = [np.sort(part.load_partition(i)["index"]) for i in range(6)]
    assert all(np.array_equal(a, b) for a, b in zip(P.shards(LABELS, 6, 3, 7), theirs, strict=True))


@pytest.mark.parametrize("kind, weights", [("linear", np.arange(1, 6)), ("exponential", np.exp(np.arange(1, 6)))])
def test_quantity_skew_sizes_follow_the_upstream_rule_on_a_uniform_sample(kind, weights):
    parts = P.quantity_skew(LABELS, 5, kind, seed=0)
    assert len(_disjoint(parts)) == 600  # the whole pool
    sizes = np.array([len(p) for p in parts])
    expected = np.floor(weights / weights.sum() * 600).astype(int)
    expected[-1] += 600 - expected.sum()  # upstream gives the remainder to the largest
    assert sizes.tolist() == expected.tolist()
    big = parts[-1]  # a uniform sample: its label shares are close to the pool's
    assert np.abs(np.bincount(LABELS[big], minlength=10) / len(big) - 0.1).max() < 0.06


def test_given_sizes_and_their_errors():
    parts = P.quantity_skew(LABELS, 3, "sizes", 0, [50, 100, 200])
    assert [len(p) for p in parts] == [50, 100, 200] and len(_disjoint(parts)) == 350
    with pytest.raises(PartitionError, match="3 sizes for 4 clients"):
        P.quantity_skew(LABELS, 4, "sizes", 0, [50, 100, 200])
    with pytest.raises(PartitionError, match="asks for 700 samples, the pool has 600"):
        P.quantity_skew(LABELS, 2, "sizes", 0, [300, 400])
    with pytest.raises(PartitionError, match="exponential partition for 10 clients of 600 samples failed: .*not greater than 0"):
        P.quantity_skew(LABELS, 10, "exponential", 0)
    with pytest.raises(ConfigError, match="'client-sizes' = '100,x'.*one whole number >= 2 per client"):
        load_settings(run_config(partition="sizes", client_sizes="100,x"))
    with pytest.raises(ConfigError, match="'shards-per-client' = 3.*only for partition 'shards'"):
        load_settings(run_config(partition="iid", shards_per_client=3))


def test_natural_ids_as_upstream_with_one_id_per_client_and_grouped_otherwise():
    from flwr_datasets.partitioner import NaturalIdPartitioner

    ids = np.array([f"writer{i % 4}" for i in range(40)])
    part = NaturalIdPartitioner(partition_by="writer")
    import datasets

    part.dataset = datasets.Dataset.from_dict({"writer": ids.tolist(), "index": list(range(40))})
    theirs = [np.sort(part.load_partition(i)["index"]) for i in range(4)]
    assert all(np.array_equal(a, b) for a, b in zip(P.natural_id(ids, 4), theirs, strict=True))
    two = P.natural_id(ids, 2)  # writers 0, 1 and writers 2, 3
    assert len(_disjoint(two)) == 40 and sorted(set(ids[two[0]])) == ["writer0", "writer1"]
    assert P.natural_ids_of(ids, 2, 1) == ["writer2", "writer3"]
    with pytest.raises(PartitionError, match="4 distinct ids for 5 clients"):
        P.natural_id(ids, 5)
    with pytest.raises(ConfigError, match="'partition' = 'natural-id'.*needs a data set with an id column"):
        load_settings(run_config(partition="natural-id", natural_id_column="writer"))


@pytest.mark.parametrize("partition, extra", [("shards", {}), ("linear", {}), ("exponential", {}), ("sizes", {"client-sizes": "200,300,400"})])
def test_every_client_gets_a_stratified_train_test_split(partition, extra):
    """On digits through the run config: sizes as the partition says, each client's test share 30 %."""
    s = load_settings({**run_config(partition=partition), **extra})
    fi = federated_indices(s, 3)
    sizes = [len(tr) + len(te) for tr, te in zip(fi.train, fi.test, strict=True)]
    if partition == "sizes":
        assert sizes == [200, 300, 400]
    elif partition == "shards":
        assert len(set(sizes)) == 1
    else:
        assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    for tr, te in zip(fi.train, fi.test, strict=True):
        assert len(te) / (len(tr) + len(te)) == pytest.approx(0.3, abs=0.08)


def test_a_client_of_single_samples_still_gets_a_test_split():
    """A sparse writer (one sample of each class) has no class to stratify by: a random 30 % is held out."""
    labels = np.arange(10)
    train, test = P.train_test_split(np.arange(10), labels, 0.3, seed=0)
    assert len(test) == 3 and len(train) == 7 and len(np.intersect1d(train, test)) == 0
