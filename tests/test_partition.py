"""Partition properties: class counts, disjointness, per-client train/test distributions, determinism."""

import numpy as np
import pytest

from pflower.config import load_settings
from pflower.datasets import partition as P
from pflower.datasets.federated import client_data, federated_indices, global_test
from pflower.datasets.partition import PartitionError

LABELS = np.repeat(np.arange(10), 300)  # 3,000 samples, 10 balanced classes
np.random.default_rng(0).shuffle(LABELS)


def _assert_disjoint(parts):
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx))


@pytest.mark.parametrize("k", [1, 2, 4, 10])
def test_pathological_k_classes_equal_samples(k):
    parts = P.pathological(LABELS, 10, k, seed=3)
    _assert_disjoint(parts)
    sizes = set()
    for p in parts:
        classes, counts = np.unique(LABELS[p], return_counts=True)
        assert len(classes) == k
        assert len(set(counts)) == 1  # same number of samples per class
        sizes.add(len(p))
    assert len(sizes) == 1


def test_pathological_uses_classes_evenly():
    parts = P.pathological(LABELS, 10, 4, seed=0)
    uses = np.bincount(np.concatenate([np.unique(LABELS[p]) for p in parts]), minlength=10)
    assert uses.max() - uses.min() <= 1


def test_dominant_share():
    parts = P.dominant(LABELS, 10, 2, 0.8, seed=1)
    _assert_disjoint(parts)
    for p in parts:
        counts = np.sort(np.bincount(LABELS[p], minlength=10))[::-1]
        assert (counts > 0).all()  # every class present
        assert counts[:2].sum() / counts.sum() == pytest.approx(0.8, abs=0.05)


def test_dirichlet_small_alpha_is_skewed_and_large_alpha_is_balanced():
    skewed = P.dirichlet(LABELS, 10, 0.1, seed=0)
    flat = P.dirichlet(LABELS, 10, 100.0, seed=0)
    _assert_disjoint(skewed)
    assert sum(len(p) for p in skewed) == len(LABELS)

    def top_share(parts):
        return np.mean([np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts])

    assert top_share(skewed) > 0.4
    assert top_share(flat) < 0.2


def test_iid_covers_everything_equally():
    parts = P.iid(LABELS, 7, seed=0)
    _assert_disjoint(parts)
    assert sum(len(p) for p in parts) == len(LABELS)
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_iid_gives_flwr_datasets_iid_shards():
    from flwr_datasets.partitioner import IidPartitioner

    perm = np.random.default_rng(3).permutation(len(LABELS))
    part = IidPartitioner(num_partitions=7)
    part.dataset = P._as_hf_dataset(LABELS[perm])
    theirs = [perm[np.asarray(part.load_partition(i)["index"])] for i in range(7)]
    assert all(np.array_equal(a, b) for a, b in zip(P.iid(LABELS, 7, seed=3), theirs))


@pytest.mark.parametrize("groups", [2, 3, 4])
def test_label_groups_disjoint_label_sets(groups):
    parts, group_of = P.label_groups(LABELS, 8, groups, seed=0)
    _assert_disjoint(parts)
    assert sorted(np.bincount(group_of).tolist()) == sorted(np.bincount(np.arange(8) % groups).tolist())
    label_sets = {}
    for i, p in enumerate(parts):
        label_sets.setdefault(group_of[i], set()).update(np.unique(LABELS[p]).tolist())
    sets = list(label_sets.values())
    for a in range(len(sets)):
        for b in range(a + 1, len(sets)):
            assert not sets[a] & sets[b]
    assert set().union(*sets) == set(range(10))
    for i in range(8):  # same group -> same labels
        for j in range(8):
            if group_of[i] == group_of[j]:
                assert set(np.unique(LABELS[parts[i]])) == set(np.unique(LABELS[parts[j]]))


def test_label_groups_random_assignment_draws_each_client_a_group():
    """'random' (FedeRiCo's): groups of unequal sizes occur, and an empty group's classes go unused."""
    sizes, empty = set(), 0
    for seed in range(40):
        parts, group_of = P.label_groups(LABELS, 8, 4, seed=seed, assignment="random")
        _assert_disjoint(parts)
        counts = np.bincount(group_of, minlength=4)
        sizes.add(tuple(sorted(counts)))
        used = set(np.unique(LABELS[np.concatenate(parts)]).tolist())
        assert len(used) == sum(size for size, n in zip([3, 3, 2, 2], counts) if n)  # groups of 3, 3, 2, 2 classes
        empty += int((counts == 0).any())
        for i in range(8):
            for j in range(8):
                if group_of[i] == group_of[j]:
                    assert set(np.unique(LABELS[parts[i]])) == set(np.unique(LABELS[parts[j]]))
    assert len(sizes) > 3 and 0 < empty < 40


def test_label_groups_samples_per_client_equal_per_class():
    parts, group_of = P.label_groups(LABELS, 8, 2, seed=1, samples_per_client=101)
    _assert_disjoint(parts)
    for p in parts:
        counts = np.bincount(LABELS[p], minlength=10)
        assert len(p) == 101 and sorted(counts[counts > 0].tolist()) == [20, 20, 20, 20, 21]
    with pytest.raises(PartitionError, match="samples-per-client=400 needs 80 samples per class.* has 75; the most is 375"):
        P.label_groups(LABELS, 8, 2, seed=1, samples_per_client=400)


@pytest.mark.parametrize(
    "fn",
    [
        lambda s: P.pathological(LABELS, 10, 4, s),
        lambda s: P.dominant(LABELS, 10, 2, 0.8, s),
        lambda s: P.dirichlet(LABELS, 10, 0.5, s),
        lambda s: P.iid(LABELS, 10, s),
        lambda s: P.label_groups(LABELS, 10, 3, s)[0],
        lambda s: P.label_groups(LABELS, 10, 3, s, samples_per_client=50, assignment="random")[0],
    ],
)
def test_deterministic_for_a_seed(fn):
    a, b, c = fn(5), fn(5), fn(6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_train_test_split_is_stratified():
    idx = np.flatnonzero(np.isin(LABELS, [1, 4, 7]))
    tr, te = P.train_test_split(idx, LABELS, 0.3, seed=0)
    assert len(np.intersect1d(tr, te)) == 0 and len(tr) + len(te) == len(idx)
    p_tr = np.bincount(LABELS[tr], minlength=10) / len(tr)
    p_te = np.bincount(LABELS[te], minlength=10) / len(te)
    assert np.abs(p_tr - p_te).max() < 0.02
    assert len(te) / len(idx) == pytest.approx(0.3, abs=0.01)


@pytest.mark.parametrize("fraction", [0.5, 0.6, 0.9])
def test_a_client_of_single_sample_classes_keeps_training_samples_at_any_test_fraction(fraction):
    """One sample in each of 4 classes and test-fraction >= 0.5: every sample went to test, the
    client's identity ('num-examples is 0') was refused and discovery waited out its timeout.
    A random share is held out instead, leaving at least one to train on."""
    labels = np.arange(4)
    tr, te = P.train_test_split(np.arange(4), labels, fraction, seed=1)
    assert len(tr) >= 1 and len(te) >= 1 and sorted([*tr, *te]) == [0, 1, 2, 3]
    s = load_settings({"partition": "classes", "client-classes": "0,1,2,3;4;5", "samples-per-client": 4, "test-fraction": fraction})
    fi = federated_indices(s, 3)
    assert all(len(t) >= 1 for t in fi.train) and all(len(t) >= 1 for t in fi.test)


def test_client_data_on_digits_matches_partition():
    s = load_settings({"partition": "pathological", "classes-per-client": 3, "seed": 2})
    fi = federated_indices(s, 5)
    for cid in range(5):
        train, test = client_data(s, cid, 5)
        assert set(train.y.unique().tolist()) == set(test.y.unique().tolist())
        assert len(train.y.unique()) == 3
        assert len(train) == len(fi.train[cid]) and len(test) == len(fi.test[cid])
        assert train.x.shape[1:] == (1, 8, 8)
    g = global_test(s, 5)
    assert len(g) == sum(len(t) for t in fi.test)


def test_too_many_clients_names_the_empty_client():
    s = load_settings({"partition": "pathological", "classes-per-client": 1})
    with pytest.raises(PartitionError, match="client"):
        federated_indices(s, 2000)


# ---------------------------------------------------- samples-per-client (the paper's equal data)
POOL = np.repeat(np.arange(10), 1000)  # 10,000 samples like the MNIST test set
np.random.default_rng(1).shuffle(POOL)


@pytest.mark.parametrize("n", [10, 100])
def test_pathological_samples_per_client_is_the_same_for_any_number_of_clients(n):
    parts = P.pathological(POOL, n, 4, seed=0, samples_per_client=60)
    _assert_disjoint(parts)
    assert [len(p) for p in parts] == [60] * n
    for p in parts:
        classes, counts = np.unique(POOL[p], return_counts=True)
        assert len(classes) == 4 and sorted(counts.tolist()) == [15, 15, 15, 15]
    # without it, clients shrink as they are added
    assert len(P.pathological(POOL, n, 4, seed=0)[0]) == {10: 1000, 100: 100}[n]


@pytest.mark.parametrize("n", [10, 100])
def test_dominant_samples_per_client_is_the_same_for_any_number_of_clients(n):
    parts = P.dominant(POOL, n, 2, 0.8, seed=0, samples_per_client=90)
    _assert_disjoint(parts)
    assert [len(p) for p in parts] == [90] * n
    for p in parts:
        counts = np.sort(np.bincount(POOL[p], minlength=10))[::-1]
        assert counts[:2].sum() == 72 and set(counts[2:].tolist()) == {2, 3}  # 80 % in 2 classes; 18 over 8 others


def test_samples_per_client_split_over_classes_within_one():
    parts = P.pathological(POOL, 10, 4, seed=0, samples_per_client=10)
    assert all(sorted(np.bincount(POOL[p])[np.bincount(POOL[p]) > 0].tolist()) == [2, 2, 3, 3] for p in parts)


@pytest.mark.parametrize(
    "partition",
    [
        lambda labels, spc: P.pathological(labels, 10, 2, seed=0, samples_per_client=spc),
        lambda labels, spc: P.dominant(labels, 20, 2, 0.8, seed=0, samples_per_client=spc),
    ],
)
def test_samples_per_client_beyond_the_pool_names_the_most_it_can_give(partition):
    """The error names the key, the short class and the largest size that works (and it does)."""
    import re

    labels = np.concatenate([np.repeat(np.arange(9), 500), np.full(105, 9)])  # class 9 is short
    with pytest.raises(PartitionError, match=r"samples-per-client=2000 needs \d+ samples of class \d, the pool has \d+") as err:
        partition(labels, 2000)
    most = int(re.search(r"at most (\d+) per client", str(err.value)).group(1))
    assert all(len(p) == most for p in partition(labels, most))
    with pytest.raises(PartitionError):
        partition(labels, most + 1)


def test_remainders_favour_no_class():
    """Rounding extras land at random, not on the lowest class ids."""
    parts = P.dominant(POOL, 20, 2, 0.8, seed=0, samples_per_client=100)
    totals = np.bincount(np.concatenate([POOL[p] for p in parts]), minlength=10)
    assert totals.max() - totals.min() < 12  # the lowest-id tie-break gave 208 .. 192


def test_samples_per_client_reaches_client_data():
    s = load_settings({"partition": "pathological", "classes-per-client": 2, "samples-per-client": 40, "test-fraction": 0.25})
    for cid in range(5):
        train, test = client_data(s, cid, 5)
        assert len(train) + len(test) == 40 and len(test) == 10


# ---------------------------------------------------- classes listed per client (client-classes)
GROUPS = [[0, 1, 2], [2, 3], [4, 5, 6, 7, 8, 9], [2]]


def test_listed_classes_give_each_client_its_classes_and_split_a_shared_class_evenly():
    parts = P.listed_classes(POOL, 4, GROUPS, seed=0)
    _assert_disjoint(parts)
    for p, group in zip(parts, GROUPS):
        assert sorted(np.unique(POOL[p]).tolist()) == group
    # class 2 (1,000 samples) is listed by clients 0, 1, 3: 334/333/333 in some order; the others whole
    assert sorted(int((POOL[p] == 2).sum()) for p in (parts[0], parts[1], parts[3])) == [333, 333, 334]
    assert [int((POOL[parts[0]] == c).sum()) for c in (0, 1)] == [1000, 1000]
    assert len(np.concatenate(parts)) == len(POOL)


def test_listed_classes_leave_an_unlisted_class_unused_and_keep_samples_per_client_equal_per_class():
    parts = P.listed_classes(POOL, 2, [[0, 1], [1, 2, 3]], seed=0, samples_per_client=30)
    assert [len(p) for p in parts] == [30, 30]
    assert np.bincount(POOL[parts[0]], minlength=10).tolist()[:2] == [15, 15]
    assert sorted(np.bincount(POOL[parts[1]], minlength=10)[1:4].tolist()) == [10, 10, 10]
    assert not np.isin(POOL[np.concatenate(parts)], np.arange(4, 10)).any()
    with pytest.raises(PartitionError, match="samples-per-client=3000 needs 1500 samples per class, a client's share of the classes client-classes lists"):
        P.listed_classes(POOL, 2, [[0, 1], [1, 2, 3]], seed=0, samples_per_client=3000)


def test_listed_classes_need_one_group_per_client_and_the_error_names_client_classes():
    with pytest.raises(PartitionError, match="client-classes gives 4 groups for 3 clients; give one group per client") as err:
        P.listed_classes(POOL, 3, GROUPS, seed=0)
    assert err.value.key == "client-classes"
    with pytest.raises(PartitionError, match="client-classes lists class 10; the data set's class ids are 0-9"):
        P.listed_classes(POOL, 2, [[0], [10]], seed=0)


def test_parse_class_groups():
    assert P.parse_class_groups("0,1,2; 3 ,4;5") == [[0, 1, 2], [3, 4], [5]]
    for bad in ("", "0,1;;2", "a", "0;-1", "1,1"):
        with pytest.raises(ValueError, match="must be one group of class ids per client"):
            P.parse_class_groups(bad)


def test_the_classes_partition_reaches_client_data():
    s = load_settings({"partition": "classes", "client-classes": "0,1;1,2;3,4,5,6,7,8,9"})
    for cid, group in enumerate([[0, 1], [1, 2], [3, 4, 5, 6, 7, 8, 9]]):
        train, test = client_data(s, cid, 3)
        assert sorted(train.y.unique().tolist()) == group == sorted(test.y.unique().tolist())


# ---------------------------------------------------- data-fraction: a stratified subset of the pool
SKEWED = np.concatenate([np.full(2000, 0), np.full(500, 1), np.full(40, 2), np.full(3, 3)])


@pytest.mark.parametrize("fraction", [0.1, 0.15, 0.5])
def test_stratified_subset_keeps_the_class_proportions(fraction):
    keep = P.stratified_subset(SKEWED, fraction, seed=0)
    assert len(keep) == len(np.unique(keep)) and np.array_equal(keep, np.sort(keep))
    counts = np.bincount(SKEWED[keep], minlength=4)
    assert counts.tolist() == [max(1, round(fraction * n)) for n in (2000, 500, 40, 3)]  # at least 1: no class vanishes


def test_stratified_subset_is_deterministic_for_a_seed():
    a, b, c = (P.stratified_subset(LABELS, 0.2, seed=s) for s in (3, 3, 4))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


PARTITIONS = [
    {"partition": "iid"},
    {"partition": "dirichlet", "dirichlet-alpha": 1.0},
    {"partition": "pathological", "classes-per-client": 3},
    {"partition": "dominant"},
    {"partition": "label-groups"},
    {"partition": "classes", "client-classes": "0,1,2;3,4,5;6,7,8,9"},
    {"partition": "shards"},
    {"partition": "linear"},
    {"partition": "sizes", "client-sizes": "20,30,40"},
]


@pytest.mark.parametrize("keys", PARTITIONS, ids=[k["partition"] for k in PARTITIONS])
def test_data_fraction_partitions_a_stratified_subset_under_any_partition(keys):
    """Every client's indices (train and test) come from the seeded subset; the same settings
    give the same subset and clients."""
    from pflower.datasets.federated import pool_for, pool_subset

    s = load_settings({**keys, "data-fraction": 0.25, "seed": 1})
    keep = pool_subset(pool_for(s), s)
    labels = pool_for(s).y.numpy()
    assert np.bincount(labels[keep]).tolist() == [round(0.25 * n) for n in np.bincount(labels)]
    fi = federated_indices(s, 3)
    held = np.concatenate([*fi.train, *fi.test])
    assert np.isin(held, keep).all() and len(held) == len(np.unique(held))
    again = federated_indices(load_settings({**keys, "data-fraction": 0.25, "seed": 1}).model_copy(update={"client_threads": 2}), 3)
    assert all(np.array_equal(a, b) for a, b in zip(fi.train + fi.test, again.train + again.test))


def load_digits_labels() -> np.ndarray:
    from pflower.datasets.federated import pool_for

    return pool_for(load_settings({})).y.numpy()


def test_data_fraction_shrinks_the_clients_and_samples_per_client_draws_from_the_subset():
    whole = federated_indices(load_settings({"partition": "iid"}), 3)
    tenth = federated_indices(load_settings({"partition": "iid", "data-fraction": 0.1}), 3)
    per_class = np.bincount(load_digits_labels())
    assert sum(map(len, whole.train + whole.test)) == 1797
    assert sum(map(len, tenth.train + tenth.test)) == sum(round(0.1 * n) for n in per_class) == 179
    s = load_settings({"partition": "pathological", "classes-per-client": 2, "samples-per-client": 30, "data-fraction": 0.5})
    fi = federated_indices(s, 5)
    assert [len(a) + len(b) for a, b in zip(fi.train, fi.test)] == [30] * 5
    with pytest.raises(PartitionError, match=r"samples-per-client=200 needs 100 samples of class \d, the pool has (8|9)\d; at most \d+ per client"):
        federated_indices(s.model_copy(update={"samples_per_client": 200}), 5)  # half of digits' ~180 per class
    with pytest.raises(PartitionError, match=r"leaves client \d+ with [01] samples \(of 179, data-fraction=0.1 of 1797, for 100 clients\)"):
        federated_indices(load_settings({"partition": "iid", "data-fraction": 0.1}), 100)
