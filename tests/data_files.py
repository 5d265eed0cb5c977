"""Tiny data sets written in the tests, in each on-disk format pflower reads (no data is committed).

Each writer puts ``n`` random images with labels ``i % classes`` where torchvision or Hugging
Face keep them, and returns the images (uint8 [n, C, H, W], in the order pflower pools them:
train, then test) and labels as pflower should read them.
"""

from __future__ import annotations

import bz2
import gzip
import pickle
from pathlib import Path

import numpy as np


def idx_bytes(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def _images(n: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


def write_idx_family(root: Path, name: str, n: int = 12, classes: int = 10, split: str = "balanced", gz: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's ``root/<name>/raw`` IDX files (MNIST, FashionMNIST, KMNIST, EMNIST), a train and a test split."""
    raw = root / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    stems = [f"emnist-{split}-train", f"emnist-{split}-test"] if name == "EMNIST" else ["train", "t10k"]
    xs, ys = [], []
    for k, stem in enumerate(stems):
        x = _images(n, (28, 28), k)
        y = (np.arange(n) % classes + (1 if split == "letters" and name == "EMNIST" else 0)).astype(np.uint8)
        for suffix, arr in (("images-idx3-ubyte", x), ("labels-idx1-ubyte", y)):
            data = idx_bytes(arr)
            (raw / f"{stem}-{suffix}{'.gz' if gz else ''}").write_bytes(gzip.compress(data) if gz else data)
        xs.append(x.transpose(0, 2, 1) if name == "EMNIST" else x)  # EMNIST is stored transposed
        ys.append(y.astype(np.int64) - (1 if split == "letters" and name == "EMNIST" else 0))
    return np.concatenate(xs)[:, None], np.concatenate(ys)


def write_svhn(root: Path, n: int = 12, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``train_32x32.mat`` and ``test_32x32.mat``: X [32, 32, 3, n], y [n, 1] with 10 for digit 0."""
    from scipy.io import savemat

    root.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for k, split in enumerate(("train", "test")):
        x = _images(n, (3, 32, 32), k)
        y = np.arange(n) % classes
        savemat(str(root / f"{split}_32x32.mat"), {"X": x.transpose(2, 3, 1, 0), "y": np.where(y == 0, 10, y).reshape(-1, 1).astype(np.uint8)})
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def write_cifar10(root: Path, n: int = 12, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``cifar-10-batches-py/{data_batch_1..5,test_batch}``: pickled dicts with 'data' [m, 3072] and
    'labels', ``n`` images in the training batches together (spread over the five) and ``n`` in the test batch."""
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for k, names in enumerate(([f"data_batch_{i}" for i in range(1, 6)], ["test_batch"])):
        x = _images(n, (3, 32, 32), k)
        y = np.arange(n) % classes
        for name, part in zip(names, np.array_split(np.arange(n), len(names))):
            with open(base / name, "wb") as f:
                pickle.dump({"data": x[part].reshape(len(part), -1), "labels": y[part].tolist()}, f)
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def write_cifar100(root: Path, n: int = 12, classes: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """``cifar-100-python/{train,test,meta}``: pickled dicts with 'data' [n, 3072] and 'fine_labels'."""
    base = root / "cifar-100-python"
    base.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for k, split in enumerate(("train", "test")):
        x = _images(n, (3, 32, 32), k)
        y = (np.arange(n) * 7) % classes
        with open(base / split, "wb") as f:
            pickle.dump({"data": x.reshape(n, -1), "fine_labels": y.tolist(), "coarse_labels": (y // 5).tolist()}, f)
        xs.append(x)
        ys.append(y)
    with open(base / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)]}, f)
    return np.concatenate(xs), np.concatenate(ys)


def write_usps(root: Path, n: int = 12, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``usps.bz2`` and ``usps.t.bz2``: libsvm lines 'label 1:v 2:v ... 256:v', labels 1..10, v in [-1, 1]."""
    root.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for k, name in enumerate(("usps.bz2", "usps.t.bz2")):
        values = np.random.default_rng(k).uniform(-1, 1, size=(n, 256)).astype(np.float32)
        y = np.arange(n) % classes
        lines = [f"{label + 1} " + " ".join(f"{j + 1}:{v:.6f}" for j, v in enumerate(row)) for label, row in zip(y, values)]
        (root / name).write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
        xs.append(((np.asarray([[f"{v:.6f}" for v in row] for row in values], dtype=np.float32) + 1) / 2 * 255).astype(np.uint8).reshape(n, 1, 16, 16))
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def hf_dataset(n: int = 30, size: int = 8, writers: int = 3, seed: int = 0):
    """A Hugging Face Dataset: grayscale ``image`` (PIL), ``label`` (ClassLabel of 10), ``writer`` ids."""
    import datasets
    from PIL import Image

    x = _images(n, (size, size), seed)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[f"d{i}" for i in range(10)]), "writer": datasets.Value("string")}
    )
    rows = {"image": [Image.fromarray(a) for a in x], "label": [i % 10 for i in range(n)], "writer": [f"w{i % writers}" for i in range(n)]}
    return datasets.Dataset.from_dict(rows, features=features), x[:, None], np.arange(n) % 10


def write_femnist(path: Path, counts: tuple[int, ...] = (12, 10, 8, 6, 3), size: int = 28, classes: int = 62, seed: int = 0) -> np.ndarray:
    """flwrlabs/femnist's columns as ``pflower-data femnist`` saves them (``save_to_disk`` of a
    DatasetDict with one split, ``train``): grey ``image`` (PIL), ``writer_id`` (string),
    ``hsf_id`` (int64) and ``character`` (ClassLabel of ``classes``); writer ``f000k_14`` has
    ``counts[k]`` images, labels ``i % classes`` in row order. Returns each row's writer."""
    import datasets
    from PIL import Image

    writers = np.repeat([f"f{k:04d}_14" for k in range(len(counts))], counts)
    x = _images(len(writers), (size, size), seed)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "writer_id": datasets.Value("string"),
            "hsf_id": datasets.Value("int64"),
            "character": datasets.ClassLabel(names=[str(i) for i in range(classes)]),
        }
    )
    rows = {"image": [Image.fromarray(a) for a in x], "writer_id": writers.tolist(), "hsf_id": [i % 8 for i in range(len(x))],
            "character": [i % classes for i in range(len(x))]}  # fmt: skip
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(str(path))
    return writers


#: Lines for the Shakespeare fixture (every character in LEAF's vocabulary).
PLAY = (
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n"
    "And by opposing end them. To die-to sleep,\nNo more; and by a sleep to say we end\n"
)


def write_shakespeare(path: Path, counts: tuple[int, ...] = (12, 10, 8, 6, 3), length: int = 80) -> tuple[list[str], list[str], list[str]]:
    """flwrlabs/shakespeare's columns as ``pflower-data shakespeare`` saves them (``save_to_disk``
    of a DatasetDict with one split, ``train``, every column a string): ``character_id`` (role
    ``k`` has ``counts[k]`` lines), ``x`` (``length`` characters of :data:`PLAY`) and ``y`` (the
    next character). Returns (roles, x, y) in row order."""
    import datasets

    roles, xs, ys = [], [], []
    for k, count in enumerate(counts):
        for j in range(count):
            start = (11 * k + 5 * j) % (len(PLAY) - length - 1)
            roles.append(f"THE_PLAY_ROLE{k}")
            xs.append(PLAY[start : start + length])
            ys.append(PLAY[start + length])
    rows = {"character_id": roles, "x": xs, "y": ys}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(path))
    return roles, xs, ys
