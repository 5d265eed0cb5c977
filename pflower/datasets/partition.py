"""Partitions of one data pool into clients, and per-client train/test splits.

Every function is deterministic for a seed and returns one index array per client.
``dirichlet``, ``shards`` (the FedAvg paper's) and the quantity skews ``linear``,
``exponential`` and ``sizes`` use flwr-datasets' partitioners (``iid`` gives the same shards as
its IidPartitioner, ``natural_id`` the same partitions as its NaturalIdPartitioner when there
are as many ids as clients, both without the import); the pFedLA settings (``pathological``: k
classes with equal samples per class; ``dominant``: all classes, a few dominant) and the
FedeRiCo setting (``label-groups``) and explicit class lists (``listed_classes``) have no
counterpart there; ``stratified_subset`` draws ``data-fraction`` of the pool before any of them.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch


class PartitionError(ValueError):
    """A partition that cannot be built (e.g. a client would get no samples); ``key``: the
    run-config key the problem is about (a run config error names it)."""

    def __init__(self, message: str, key: str = "partition"):
        super().__init__(message)
        self.key = key


def _as_hf_dataset(labels: np.ndarray, index: np.ndarray | None = None):
    """The labels as the Hugging Face data set flwr-datasets' partitioners take, each row with its
    pool ``index`` (by default its position)."""
    from datasets import Dataset

    index = np.arange(len(labels)) if index is None else index
    return Dataset.from_dict({"label": labels.tolist(), "index": index.tolist()})


def _upstream(partitioner, dataset, num_clients: int, what: str) -> list[np.ndarray]:
    """Each client's pool indices from a flwr-datasets partitioner on ``dataset``; its refusal
    (a client left empty, too few samples) as a PartitionError naming the partition."""
    partitioner.dataset = dataset
    try:
        with warnings.catch_warnings():  # SizePartitioner's note that sizes below the pool leave samples out: meant
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)  # pyarrow's, on the ShardPartitioner's sort
            return [np.sort(np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64)) for i in range(num_clients)]
    except (ValueError, KeyError) as err:
        raise PartitionError(f"{what} partition for {num_clients} clients of {len(dataset)} samples failed: {err}") from None


def shards(labels: np.ndarray, num_clients: int, shards_per_client: int, seed: int) -> list[np.ndarray]:
    """The FedAvg paper's pathological non-IID split (flwr-datasets' ShardPartitioner): the pool
    sorted by label, cut into ``num_clients`` x ``shards_per_client`` equal shards, each client
    given that many at random (the remainder of the cut is unused)."""
    from flwr_datasets.partitioner import ShardPartitioner

    if num_clients * shards_per_client * 2 > len(labels):
        raise PartitionError(
            f"shards-per-client={shards_per_client}: {num_clients} clients x {shards_per_client} shards of at least 2 samples need "
            f"{num_clients * shards_per_client * 2}, the pool has {len(labels)}; give at most {max(1, len(labels) // (2 * num_clients))}"
        )
    part = ShardPartitioner(num_partitions=num_clients, partition_by="label", num_shards_per_partition=shards_per_client, seed=seed)
    return _upstream(part, _as_hf_dataset(labels), num_clients, "shards")


def parse_sizes(text: str) -> list[int]:
    """``client-sizes``: '100,200,700' as [100, 200, 700]; ValueError unless whole numbers >= 2."""
    try:
        sizes = [int(v) for v in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 2:
        raise ValueError("must be one whole number >= 2 per client, comma-separated (e.g. '100,200,700')")
    return sizes


def parse_class_groups(text: str) -> list[list[int]]:
    """``client-classes``: '0,1,2;3,4' as [[0, 1, 2], [3, 4]]; ValueError unless every group
    is class ids (whole numbers >= 0), each once in its group."""
    form = "must be one group of class ids per client, groups separated by ';', ids by ',' (e.g. '0,1,2;3,4;5')"
    if not text.strip():
        raise ValueError(form)
    groups = []
    for i, group in enumerate(text.split(";")):
        try:
            ids = [int(v) for v in group.split(",")]
        except ValueError:
            raise ValueError(f"{form}; group {i + 1} ({group.strip()!r}) is not a list of whole numbers") from None
        if min(ids) < 0:
            raise ValueError(f"{form}; group {i + 1} has class {min(ids)}, class ids start at 0")
        if len(set(ids)) < len(ids):
            raise ValueError(f"{form}; group {i + 1} lists class {next(k for k in ids if ids.count(k) > 1)} twice")
        groups.append(ids)
    return groups


def listed_classes(labels: np.ndarray, num_clients: int, groups: list[list[int]], seed: int, samples_per_client: int = 0) -> list[np.ndarray]:
    """Client i holds the classes ``groups[i]`` lists (``client-classes``, pFedLA's Figs. 5-6).

    Each class's samples, in a seeded random order, are split evenly among the clients that list
    it (sizes within one; which of them get one more is random, not by id); a class no client
    lists is unused. With ``samples_per_client`` > 0 every client keeps that many of its share,
    equal per class (within one).
    """
    if len(groups) != num_clients:
        raise PartitionError(f"client-classes gives {len(groups)} groups for {num_clients} clients; give one group per client", key="client-classes")
    rng = np.random.default_rng(seed)
    pools = _class_pools(labels, rng)
    if beyond := sorted({c for g in groups for c in g if c >= len(pools)}):
        raise PartitionError(f"client-classes lists class {beyond[0]}; the data set's class ids are 0-{len(pools) - 1}", key="client-classes")
    shares: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, pool in enumerate(pools):
        users = np.array([i for i, g in enumerate(groups) if c in g], dtype=np.int64)
        if len(users) == 0:
            continue
        for i, chunk in zip(rng.permutation(users), np.array_split(pool, len(users))):
            shares[i].append(chunk)
    parts = [np.sort(np.concatenate(p)) for p in shares]
    if samples_per_client:
        parts = [_class_balanced_subset(p, labels, samples_per_client, rng, "share of the classes client-classes lists") for p in parts]
    return parts


def stratified_subset(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of a seeded ``fraction`` of the pool, stratified by class (``data-fraction``):
    each class keeps round(fraction × its samples), at least one, drawn at random."""
    rng = np.random.default_rng(seed)
    keep = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        keep.append(rng.permutation(idx)[: max(1, int(round(fraction * len(idx))))])
    return np.sort(np.concatenate(keep))


def quantity_skew(labels: np.ndarray, num_clients: int, kind: str, seed: int, sizes: list[int] | None = None) -> list[np.ndarray]:
    """Clients of different sizes, each a uniform sample of the pool: flwr-datasets'
    LinearPartitioner (client i's share ∝ i + 1), ExponentialPartitioner (∝ e^(i + 1)) or
    SizePartitioner (``sizes``, one per client). They cut the data set in its stored order, so
    they are given the pool in a seeded random order: the skew is in quantity only."""
    from flwr_datasets.partitioner import ExponentialPartitioner, LinearPartitioner, SizePartitioner

    if kind == "sizes":
        if sizes is None or len(sizes) != num_clients:
            raise PartitionError(f"client-sizes gives {0 if sizes is None else len(sizes)} sizes for {num_clients} clients; give one per client")
        if sum(sizes) > len(labels):
            raise PartitionError(f"client-sizes asks for {sum(sizes)} samples, the pool has {len(labels)}")
        part = SizePartitioner(sizes)
    else:
        part = (LinearPartitioner if kind == "linear" else ExponentialPartitioner)(num_partitions=num_clients)
    perm = np.random.default_rng(seed).permutation(len(labels))
    parts = _upstream(part, _as_hf_dataset(labels[perm], perm), num_clients, kind)
    if small := [i for i, p in enumerate(parts) if len(p) < 2]:
        raise PartitionError(
            f"{kind} partition leaves client {small[0]} with {len(parts[small[0]])} samples (of {len(labels)} for {num_clients} clients); use fewer clients"
        )
    return parts


def kept_natural_ids(ids: np.ndarray, min_samples: int = 0, fraction: float = 1.0, seed: int = 0) -> np.ndarray:
    """The natural ids LEAF's sampling keeps, sorted: those with at least ``min_samples`` samples
    (``natural-id-min-samples``), then round(``fraction`` × them), at least one, drawn at random
    (``natural-id-fraction``, seeded by ``seed``). PartitionError naming the key if none is left."""
    values, counts = np.unique(ids, return_counts=True)
    eligible = values[counts >= min_samples]
    if len(eligible) == 0:
        raise PartitionError(
            f"natural-id-min-samples={min_samples}: no id has that many samples; the most an id has is {int(counts.max(initial=0))}",
            key="natural-id-min-samples",
        )
    if fraction >= 1:
        return eligible
    rng = np.random.default_rng(seed)
    return np.sort(rng.permutation(eligible)[: max(1, int(round(fraction * len(eligible))))])


def _natural_groups(ids: np.ndarray, num_clients: int, min_samples: int, fraction: float, seed: int) -> list[np.ndarray]:
    """The kept ids (:func:`kept_natural_ids`) of each client: ``array_split`` of them in sorted order."""
    kept = kept_natural_ids(ids, min_samples, fraction, seed)
    if len(kept) < num_clients:
        total = len(np.unique(ids))
        if fraction < 1:
            key, why = "natural-id-fraction", f"natural-id-fraction={fraction} keeps {len(kept)} of the {total if min_samples == 0 else 'eligible'} ids"
        elif min_samples:
            key, why = "natural-id-min-samples", f"natural-id-min-samples={min_samples} keeps {len(kept)} of {total} ids"
        else:
            key, why = "partition", f"natural-id partition: {len(kept)} distinct ids"
        raise PartitionError(f"{why} for {num_clients} clients; every client needs one at least", key=key)
    return np.array_split(kept, num_clients)


def natural_id(ids: np.ndarray, num_clients: int, min_samples: int = 0, fraction: float = 1.0, seed: int = 0) -> list[np.ndarray]:
    """Clients by a natural id (writer, user, domain): the ids LEAF's sampling keeps
    (:func:`kept_natural_ids`), sorted, client i holding the samples of ``array_split(kept,
    num_clients)[i]``; the other ids' samples are unused. With every id kept and as many ids as
    clients, client i holds the i-th id's samples, flwr-datasets' NaturalIdPartitioner's
    partition i (tested)."""
    groups = _natural_groups(ids, num_clients, min_samples, fraction, seed)
    values, inverse = np.unique(ids, return_inverse=True)
    owner = np.full(len(values) + 1, num_clients)  # the last: ids no client holds
    for client, held in enumerate(groups):
        owner[np.searchsorted(values, held)] = client
    client_of = owner[inverse.ravel()]
    order = np.argsort(client_of, kind="stable")  # pool order within a client
    return np.split(order, np.cumsum(np.bincount(client_of, minlength=num_clients + 1))[:num_clients])[:num_clients]


def natural_ids_of(ids: np.ndarray, num_clients: int, client_id: int, min_samples: int = 0, fraction: float = 1.0, seed: int = 0) -> list[str]:
    """The natural ids client ``client_id`` holds under :func:`natural_id`."""
    return [str(v) for v in _natural_groups(ids, num_clients, min_samples, fraction, seed)[client_id]]


def iid(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Uniformly random, equal-size partitions: contiguous shards of a seeded permutation.

    The same shards as flwr-datasets' IidPartitioner on the permuted pool (tested), without
    importing flwr-datasets, which takes about 4 s and every simulated client process pays it.
    """
    perm = np.random.default_rng(seed).permutation(len(labels))
    return np.array_split(perm, num_clients)


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Per-class client proportions ~ Dir(alpha) (flwr-datasets DirichletPartitioner)."""
    from flwr_datasets.partitioner import DirichletPartitioner

    if 2 * num_clients > len(labels):
        raise PartitionError(f"dirichlet partition: {num_clients} clients need at least 2 samples each, the pool has {len(labels)}")
    min_size = max(2, min(10, len(labels) // (4 * num_clients)))
    part = DirichletPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        alpha=alpha,
        min_partition_size=min_size,
        self_balancing=False,
        seed=seed,
    )
    part.dataset = _as_hf_dataset(labels)
    try:
        return [np.sort(np.asarray(part.load_partition(i)["index"], dtype=np.int64)) for i in range(num_clients)]
    except ValueError as err:
        raise PartitionError(
            f"dirichlet partition with alpha={alpha} failed for {num_clients} clients of {len(labels)} samples (each needs {min_size}): {err}; "
            "a larger dirichlet-alpha spreads the classes more evenly, fewer clients leave each more samples"
        ) from None


def _class_pools(labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled indices of every class present in ``labels``, by class id."""
    num_classes = int(labels.max()) + 1
    return [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]


def _balanced_class_choice(num_clients: int, num_classes: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """k distinct classes per client, every class used equally often (within one)."""
    usage = np.zeros(num_classes)
    choice = np.empty((num_clients, k), dtype=np.int64)
    for i in range(num_clients):
        picked = np.argsort(usage + rng.random(num_classes) * 0.5)[:k]  # least used, random ties
        usage[picked] += 1
        choice[i] = np.sort(picked)
    return choice


def _largest(feasible, start: int) -> int:
    """The largest n <= ``start`` with ``feasible(n)`` (0 if none): what an error can offer."""
    n = start
    while n > 0 and not feasible(n):
        n -= 1
    return n


def _too_few(samples_per_client: int, c: int, need: int, have: int, most: int) -> PartitionError:
    return PartitionError(
        f"samples-per-client={samples_per_client} needs {need} samples of class {c}, the pool has {have}; "
        f"at most {most} per client with these clients and classes"
    )


def pathological(labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int, samples_per_client: int = 0) -> list[np.ndarray]:
    """Each client gets ``classes_per_client`` random classes, the same number of samples each.

    By default the per-class count is the largest one that every chosen class can supply to all
    the clients that chose it, so partitions are disjoint and class-balanced (pFedLA non-IID 1)
    and shrink as clients are added. ``samples_per_client`` > 0 fixes each client's size
    instead (split over its classes within one sample), whatever the number of clients: the
    paper's protocol, whose 100-client runs have as much data per client as its 10-client runs.
    """
    rng = np.random.default_rng(seed)
    pools = _class_pools(labels, rng)
    choice = _balanced_class_choice(num_clients, len(pools), classes_per_client, rng)
    users = np.bincount(choice.ravel(), minlength=len(pools))
    per_class = min(len(pools[c]) // users[c] for c in range(len(pools)) if users[c] > 0)
    if samples_per_client:
        have = np.array([len(p) for p in pools])
        split = rng.permuted(np.tile(np.arange(classes_per_client), (num_clients, 1)), axis=1)  # which classes get the remainder

        def counts_for(total: int) -> np.ndarray:
            base = np.full((num_clients, classes_per_client), total // classes_per_client)
            return base + (split < total % classes_per_client)

        def need_for(total: int) -> np.ndarray:
            need = np.zeros(len(pools), dtype=np.int64)
            np.add.at(need, choice.ravel(), counts_for(total).ravel())
            return need

        counts, need = counts_for(samples_per_client), need_for(samples_per_client)
        if (need > have).any():
            c = int(np.argmax(need > have))
            most = _largest(lambda t: bool((need_for(t) <= have).all()), min(samples_per_client - 1, len(labels) // num_clients))
            raise _too_few(samples_per_client, c, int(need[c]), int(have[c]), most)
    elif per_class == 0:
        raise PartitionError(f"pathological partition: {num_clients} clients x {classes_per_client} classes leaves no samples per class for some client")
    else:
        counts = np.full((num_clients, classes_per_client), per_class)
    taken = np.zeros(len(pools), dtype=np.int64)
    parts = []
    for cls, cnt in zip(choice, counts):
        idx = []
        for c, n in zip(cls, cnt):
            idx.append(pools[c][taken[c] : taken[c] + n])
            taken[c] += n
        parts.append(np.sort(np.concatenate(idx)))
    return parts


def _split_by_proportions(pools: list[np.ndarray], props: np.ndarray) -> list[np.ndarray]:
    """Cut each class pool among clients by ``props[client, class]`` (columns normalized)."""
    props = props / props.sum(axis=0, keepdims=True)
    parts: list[list[np.ndarray]] = [[] for _ in range(props.shape[0])]
    for c, pool in enumerate(pools):
        cuts = (np.cumsum(props[:, c]) * len(pool)).astype(np.int64)[:-1]
        for i, chunk in enumerate(np.split(pool, cuts)):
            parts[i].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def _largest_remainder(props: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """Integer counts per row that sum to ``total`` and follow ``props`` (rows sum to 1); equal
    remainders are broken at random, so no class is favoured for its id."""
    raw = props * total
    counts = np.floor(raw).astype(np.int64)
    short = total - counts.sum(axis=1)
    jitter = rng.random(props.shape) * 1e-9
    order = np.argsort(-(raw - counts + jitter), axis=1, kind="stable")
    for i, k in enumerate(short):
        counts[i, order[i, :k]] += 1
    return counts


def dominant(
    labels: np.ndarray, num_clients: int, dominant_classes: int, dominant_fraction: float, seed: int,
    samples_per_client: int = 0,
) -> list[np.ndarray]:  # fmt: skip
    """Every client has all classes; ``dominant_classes`` of them hold ``dominant_fraction``.

    Dominant classes are spread evenly over clients (pFedLA non-IID 2). By default each class
    pool is cut among clients in proportion to how much each client wants of that class (the
    whole pool is used); ``samples_per_client`` > 0 gives every client exactly that many
    samples in those proportions instead, whatever the number of clients.
    """
    rng = np.random.default_rng(seed)
    pools = _class_pools(labels, rng)
    num_classes = len(pools)
    choice = _balanced_class_choice(num_clients, num_classes, dominant_classes, rng)
    props = np.full((num_clients, num_classes), (1 - dominant_fraction) / (num_classes - dominant_classes))
    for i, cls in enumerate(choice):
        props[i, cls] = dominant_fraction / dominant_classes
    if not samples_per_client:
        return _split_by_proportions(pools, props)
    state = rng.bit_generator.state  # the same tie-breaks for every total tried below
    have = np.array([len(p) for p in pools])

    def counts_for(total: int) -> np.ndarray:
        rng.bit_generator.state = state
        return _largest_remainder(props, total, rng)

    counts = counts_for(samples_per_client)
    need = counts.sum(axis=0)
    if (need > have).any():
        c = int(np.argmax(need > have))
        most = _largest(lambda t: bool((counts_for(t).sum(axis=0) <= have).all()), min(samples_per_client - 1, len(labels) // num_clients))
        raise _too_few(samples_per_client, c, int(need[c]), int(have[c]), most)
    starts = np.vstack([np.zeros(num_classes, dtype=np.int64), np.cumsum(counts, axis=0)[:-1]])
    return [np.sort(np.concatenate([pools[c][starts[i, c] : starts[i, c] + counts[i, c]] for c in range(num_classes)]))
            for i in range(num_clients)]  # fmt: skip


def label_groups(
    labels: np.ndarray, num_clients: int, groups: int, seed: int, samples_per_client: int = 0, assignment: str = "balanced"
) -> tuple[list[np.ndarray], np.ndarray]:
    """Labels split into ``groups`` disjoint sets; client i draws from group ``group_of[i]``.

    ``assignment`` 'balanced': clients go to groups round-robin over a random order; 'random':
    each client draws its group uniformly (FedeRiCo's "each client samples from one
    distribution"; a group may get no client, and its classes are then unused). Each group's
    samples are shared equally among its clients, or with ``samples_per_client`` > 0 every client
    keeps that many of its share, equal per class (within one). Returns (parts, group_of).
    """
    rng = np.random.default_rng(seed)
    pools = _class_pools(labels, rng)
    class_groups = np.array_split(rng.permutation(len(pools)), groups)
    if assignment == "random":
        group_of = rng.integers(groups, size=num_clients)
    else:
        group_of = np.empty(num_clients, dtype=np.int64)
        group_of[rng.permutation(num_clients)] = np.arange(num_clients) % groups
    props = np.zeros((num_clients, len(pools)))
    for g, classes in enumerate(class_groups):
        members = np.flatnonzero(group_of == g)
        if len(members) == 0:
            continue
        props[np.ix_(members, classes)] = 1.0
    unused = props.sum(axis=0) == 0
    props[:, unused] = 1.0  # groups without clients: their classes are dropped below
    parts = _split_by_proportions(pools, props)
    if unused.any():
        dropped = np.isin(labels, np.flatnonzero(unused))
        parts = [p[~dropped[p]] for p in parts]
    if samples_per_client:
        parts = [_class_balanced_subset(p, labels, samples_per_client, rng, "share of its label group") for p in parts]
    return parts, group_of


def _class_balanced_subset(part: np.ndarray, labels: np.ndarray, size: int, rng: np.random.Generator, share: str) -> np.ndarray:
    """``size`` indices of ``part``, equal per class (within one), at random within a class."""
    classes = np.unique(labels[part])
    counts = _largest_remainder(np.full((1, len(classes)), 1 / len(classes)), size, rng)[0]
    have = np.array([(labels[part] == c).sum() for c in classes])
    if (counts > have).any():
        raise PartitionError(
            f"samples-per-client={size} needs {int(counts.max())} samples per class, a client's {share} has "
            f"{int(have.min())}; the most is {int(have.min()) * len(classes)}"
        )
    chosen = [rng.permutation(part[labels[part] == c])[:k] for c, k in zip(classes, counts)]
    return np.sort(np.concatenate(chosen))


def train_test_split(indices: np.ndarray, labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified split of one client's indices: train and test share the label distribution.
    A client whose every class has one sample (a sparse writer of a natural-id partition) would
    get no test sample so, or with ``test_fraction`` of 0.5 and above no training sample: it
    holds out a random ``test_fraction`` instead (at least one, and at least one left to train)."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels[indices]):
        idx = rng.permutation(indices[labels[indices] == c])
        n_test = int(round(test_fraction * len(idx)))
        if len(idx) > 1:
            n_test = min(max(n_test, 1), len(idx) - 1)
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    train_idx, test_idx = np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
    if (len(test_idx) == 0 or len(train_idx) == 0) and len(indices) > 1:
        order = rng.permutation(indices)
        k = min(max(1, int(round(test_fraction * len(indices)))), len(indices) - 1)
        return np.sort(order[k:]), np.sort(order[:k])
    return train_idx, test_idx


def noisy_labels(y: torch.Tensor, kind: str, ratio: float, num_classes: int, seed: int) -> torch.Tensor:
    """Flip exactly round(ratio * n) labels, chosen at random: ``pair`` sends class c to
    c + 1 (mod classes), ``symmetric`` to a uniformly drawn other class."""
    rng = np.random.default_rng(seed)
    out = y.clone()
    idx = torch.from_numpy(rng.permutation(len(y))[: int(round(ratio * len(y)))])
    if kind == "pair":
        out[idx] = (y[idx] + 1) % num_classes
    else:
        shift = torch.from_numpy(rng.integers(1, num_classes, size=len(idx)))
        out[idx] = (y[idx] + shift) % num_classes
    return out
