"""Data sources: one pool of images and labels per data set, read from local files only.

``digits`` is embedded in scikit-learn; the MNIST family is read from IDX files (gzipped or
not) in ``data-dir``; ``imagefolder`` from an image tree (:mod:`pflower.datasets.folder`); CIFAR
from such a tree or through torchvision from a local root, downloading only when
``download=true``. Each source is a function returning its :class:`Pool`; torchvision's files
(:mod:`pflower.datasets.torchvision_files`) and Hugging Face's (:mod:`pflower.datasets.huggingface`)
have modules of their own, and :func:`pflower.datasets.federated.load_pool` picks by name.
Every split found (train and test files) is pooled: pflower partitions the pool into clients and
splits each client's share into train and test itself.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


class DataError(ValueError):
    """Missing or unreadable data files; the message names the file and the reason."""


@dataclass(frozen=True)
class Source:
    """The run-config keys that name a data set (hashable: each process caches a pool by them)."""

    dataset: str
    data_dir: str = ""
    download: bool = False
    image_size: int = 0
    torchvision_name: str = ""
    emnist_split: str = "balanced"
    image_column: str = "image"
    label_column: str = "label"
    id_column: str = ""
    text_column: str = ""


@dataclass(frozen=True)
class Pool:
    """All samples of a data set: normalized images [n, C, H, W] (or, for text, each line's
    characters as their indices in the vocabulary, uint8 [n, length]), labels [n] and, for a data
    set with an id column (``natural-id-column``), each sample's natural id (writer, user, domain)."""

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    ids: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])


def _normalize(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Standardize images in [0, 1] per channel over the pool (in place when ``x`` is already
    contiguous float32: the pools are large, 737 MB for CIFAR-10)."""
    t = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32) if isinstance(x, np.ndarray) else x).contiguous()
    mean = t.mean(dim=(0, 2, 3), keepdim=True)
    std = t.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return t.sub_(mean).div_(std)


def _unit(x: np.ndarray) -> torch.Tensor:
    """uint8 images as float32 in [0, 1], in one pass."""
    return torch.from_numpy(x).to(torch.float32).div_(255.0)


def load_digits() -> Pool:
    """scikit-learn's embedded digits, read from the CSV file it ships (what
    ``sklearn.datasets.load_digits`` reads, tested) without importing sklearn.datasets, which
    costs about 1.5 s in every ClientApp process (one per message in deployment)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("dataset 'digits' needs scikit-learn installed")
    csv = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    data = np.loadtxt(csv, delimiter=",", dtype=np.float32)
    x = data[:, :-1].reshape(-1, 1, 8, 8) / 16.0
    return Pool(_normalize(x), torch.from_numpy(data[:, -1].astype(np.int64)), 10)


#: Deflate's largest ratio of output to input bytes: what a gzip file can hold at most.
DEFLATE_MAX_RATIO = 1032


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (``.gz`` or raw) into a numpy array. Reads no more than the header says
    (a gzip body that inflates past it is refused, not held in memory)."""
    gz = path.suffix == ".gz"
    try:
        with (gzip.open if gz else open)(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] != 0x08:
                raise DataError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
            ndim = head[3]
            shape = f.read(4 * ndim)
            dims = tuple(int.from_bytes(shape[4 * i : 4 + 4 * i], "big") for i in range(len(shape) // 4))
            expected = math.prod(dims)  # Python's integers: dims near 2**32 cannot wrap around to the file's length
            room = path.stat().st_size * DEFLATE_MAX_RATIO if gz else path.stat().st_size
            cap = min(expected, room) + 1
            body = f.read(cap) if len(dims) == ndim else b""
    except (OSError, EOFError, zlib.error) as err:  # zlib.error: a corrupt gzip body
        raise DataError(f"cannot read IDX file {path}: {err}") from None
    if len(dims) != ndim or len(body) != expected:
        has = "fewer" if len(dims) != ndim else len(body) if len(body) < cap else f"more than {cap - 1}"
        raise DataError(f"{path} is truncated or corrupt: header says {expected} bytes of data, file has {has}")
    try:
        return np.frombuffer(body, dtype=np.uint8).reshape(dims)
    except ValueError:  # no data, but dims past what an array can have: (0, 2**32 - 1, 2**32 - 1)
        raise DataError(f"{path} is corrupt: its header's dims {list(dims)} are past what an array can hold") from None


#: The classes of each IDX family (EMNIST: its balanced split): a label outside is refused.
IDX_CLASSES = {"mnist": 10, "fashion-mnist": 10, "emnist": 47}


#: The IDX files a family's folder holds, by split stem (the publishers' names), in the order
#: they are pooled (by name, as published runs pooled them).
IDX_STEMS = {"mnist": ("t10k", "train"), "fashion-mnist": ("t10k", "train"), "emnist": ("emnist-balanced-test", "emnist-balanced-train")}


def _idx_file(root: Path, name: str) -> Path | None:
    """``root/name``, or its ``.gz``, as it exists (the unzipped one where torchvision keeps
    both: the same data, read once); a name that is not a regular file (a FIFO, a folder) is
    refused: opening a FIFO would wait forever."""
    for path in (root / name, root / f"{name}.gz"):
        if path.is_file():
            return path
        if path.exists():
            raise DataError(f"{path} is not a regular file (a FIFO, a folder or a device): IDX data must be a file")
    return None


def _idx_pairs(root: Path, name: str) -> list[tuple[Path, Path]]:
    """(images, labels) file pairs of the family's splits in ``root``, by their own names only
    (:data:`IDX_STEMS`, raw or gzipped, each file of a pair either way): a copy beside them
    (``.bak``, ``old-train-...``, another family's files) is never pooled."""
    pairs = []
    for stem in IDX_STEMS[name]:
        img, lbl = _idx_file(root, f"{stem}-images-idx3-ubyte"), _idx_file(root, f"{stem}-labels-idx1-ubyte")
        if img and not lbl:
            raise DataError(f"{img} has no matching labels file {stem}-labels-idx1-ubyte{img.suffix if img.suffix == '.gz' else ''} in {root}")
        if lbl and not img:
            raise DataError(f"{lbl} has no matching images file {stem}-images-idx3-ubyte{lbl.suffix if lbl.suffix == '.gz' else ''} in {root}")
        if img and lbl:
            pairs.append((img, lbl))
    return pairs


def load_idx_family(name: str, root: Path) -> Pool:
    """MNIST, Fashion-MNIST or EMNIST (balanced split) from IDX files in ``root``; labels as the
    files hold them, within the family's classes (:data:`IDX_CLASSES`): a subset lacking a class
    keeps its digits' numbers."""
    pairs = _idx_pairs(root, name)
    if not pairs:
        test, first = IDX_STEMS[name]
        raise DataError(
            f"no IDX files for {name} in {root}: expected {first}-images-idx3-ubyte.gz with {first}-labels-idx1-ubyte.gz "
            f"(or the {test}-* test files; raw or gzipped)"
        )
    xs, ys = [], []
    for img, lbl in pairs:
        x, y = read_idx(img), read_idx(lbl)
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise DataError(f"{img.name} ({x.shape}) and {lbl.name} ({y.shape}) do not match")
        if xs and x.shape[1:] != xs[0].shape[1:]:
            raise DataError(f"{img} holds {x.shape[1]}x{x.shape[2]} images, {pairs[0][0].name} {xs[0].shape[1]}x{xs[0].shape[2]}: one size per data set")
        if len(y) and int(y.max()) >= IDX_CLASSES[name]:
            raise DataError(f"{lbl} holds label {int(y.max())}: {name}'s labels are 0..{IDX_CLASSES[name] - 1}")
        xs.append(x)
        ys.append(y)
    if not sum(map(len, ys)):
        raise DataError(f"no images for {name} in {root}: {', '.join(img.name for img, _ in pairs)} hold 0 images")
    x = np.concatenate(xs).astype(np.float32)[:, None] / 255.0
    if name == "emnist":
        x = x.transpose(0, 1, 3, 2)  # EMNIST images are stored transposed
    y = np.concatenate(ys).astype(np.int64)
    return Pool(_normalize(x), torch.from_numpy(y), IDX_CLASSES[name])


def load_image_folder(root: Path, image_size: int = 0, expect_classes: int | None = None) -> Pool:
    """An image tree (:mod:`pflower.datasets.folder`): every split pooled, as for the other sources."""
    from pflower.datasets.folder import FolderError, load_folder

    try:
        x, y, classes = load_folder(root, image_size)
    except FolderError as err:
        raise DataError(str(err)) from None
    if expect_classes is not None and len(classes) != expect_classes:
        raise DataError(f"{root} has {len(classes)} class folders, expected {expect_classes}")
    return Pool(_normalize(_unit(x)), torch.from_numpy(y), len(classes))


def load_cifar(name: str, root: Path, download: bool) -> Pool:
    """CIFAR-10/100 from torchvision's files under ``root``, or from an image tree there
    (``train/<class>/``, ``test/<class>/``, as ``shared/data/cifar10-jpg``)."""
    from pflower.datasets.folder import is_image_folder

    if is_image_folder(root):
        return load_image_folder(root, 0, 10 if name == "cifar10" else 100)
    from torchvision import datasets

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:
        splits = [cls(root=str(root), train=t, download=download) for t in (True, False)]
    except RuntimeError as err:
        raise DataError(f"{name} not found under {root} ({err}); set download=true to fetch it") from None
    except OSError as err:  # a download that cannot reach its server, a folder it cannot write
        raise DataError(
            f"download=true: {name} could not be fetched into {root} ({err}); offline, put torchvision's files there and set download=false"
        ) from None
    x = np.concatenate([s.data for s in splits]).astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    y = np.concatenate([np.asarray(s.targets) for s in splits]).astype(np.int64)
    return Pool(_normalize(x), torch.from_numpy(y), 10 if name == "cifar10" else 100)
