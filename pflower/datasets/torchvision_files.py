"""torchvision's data sets from a local root, in the file layout torchvision keeps them in.

``root`` is what ``torchvision.datasets.<Name>(root, download=True)`` was given: the files it
downloaded are read here directly, never downloaded and without importing torchvision, and
without its checksum test (a copy converted or cut down elsewhere reads as well). Every split
found is pooled, as for pflower's other sources (a split with some of its files missing is an
error naming them, never dropped):

- ``MNIST``, ``FashionMNIST``, ``KMNIST``: ``root/<Name>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``
- ``EMNIST``: ``root/EMNIST/raw/emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]``;
  the images are stored transposed and are turned upright here; ``letters`` labels 1..26 become 0..25
- ``SVHN``: ``root/{train,test}_32x32.mat``: 'X' uint8 [32, 32, 3, n], 'y' a column of n whole
  numbers (label 10 is digit 0, as torchvision reads it; the 531,131 ``extra`` images are not pooled)
- ``CIFAR10``: ``root/cifar-10-batches-py/{data_batch_1..5,test_batch}``; ``CIFAR100``:
  ``root/cifar-100-python/{train,test}`` (the 100 fine labels). The batches are pickles, read by
  an unpickler that admits only what the format holds (dicts, lists, strings, numbers and numpy
  arrays): a file with anything else is refused before any of it runs. Each batch's data must be
  [n, 3072] bytes with n labels
- ``USPS``: ``root/usps.bz2`` and ``root/usps.t.bz2`` (libsvm text, values in [-1, 1], labels 1..10;
  a line otherwise is an error naming it, never a value wrapped around in a byte)

A split that holds no images loads as nothing; a data set whose splits all hold none is an error.
"""

from __future__ import annotations

import bz2
import io
import pickle
from pathlib import Path

import numpy as np
import torch

from pflower.datasets.sources import DataError, Pool, _normalize, _unit, read_idx

#: torchvision's class name -> (image shape (channels, height, width), number of classes); EMNIST's
#: classes depend on its split (:data:`EMNIST_CLASSES`).
TORCHVISION_INFO: dict[str, tuple[tuple[int, int, int], int]] = {
    "MNIST": ((1, 28, 28), 10),
    "FashionMNIST": ((1, 28, 28), 10),
    "KMNIST": ((1, 28, 28), 10),
    "EMNIST": ((1, 28, 28), 47),
    "SVHN": ((3, 32, 32), 10),
    "CIFAR10": ((3, 32, 32), 10),
    "CIFAR100": ((3, 32, 32), 100),
    "USPS": ((1, 16, 16), 10),
}
#: torchvision's EMNIST splits and their classes.
EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}
IDX_FAMILY = ("MNIST", "FashionMNIST", "KMNIST", "EMNIST")


class LayoutError(DataError):
    """No files of the data set where torchvision keeps them; the message names what was expected."""


def info(name: str, emnist_split: str = "balanced") -> tuple[tuple[int, int, int], int]:
    """(image shape, number of classes) of a data set, without reading it."""
    shape, classes = TORCHVISION_INFO[name]
    return shape, EMNIST_CLASSES[emnist_split] if name == "EMNIST" else classes


def split_files(root: Path, name: str, emnist_split: str = "balanced") -> list[list[Path]]:
    """The files of each split torchvision would read, relative to ``root`` (an IDX file may
    also be gzipped); :func:`found` tells which splits are there."""
    if name in IDX_FAMILY:
        raw = root / name / "raw"
        if name == "EMNIST":
            stems = [f"emnist-{emnist_split}-{s}" for s in ("train", "test")]
        else:
            stems = ["train", "t10k"]
        return [[raw / f"{s}-images-idx3-ubyte", raw / f"{s}-labels-idx1-ubyte"] for s in stems]
    if name == "SVHN":
        return [[root / "train_32x32.mat"], [root / "test_32x32.mat"]]
    if name == "CIFAR10":
        base = root / "cifar-10-batches-py"
        return [[base / f"data_batch_{i}" for i in range(1, 6)], [base / "test_batch"]]
    if name == "CIFAR100":
        return [[root / "cifar-100-python" / "train"], [root / "cifar-100-python" / "test"]]
    if name == "USPS":
        return [[root / "usps.bz2"], [root / "usps.t.bz2"]]
    raise LayoutError(f"torchvision data set {name!r} is not one pflower reads ({', '.join(TORCHVISION_INFO)})")


class _NDArray:
    """What a pickle's ``numpy.ndarray`` names: an argument of ``_reconstruct`` only, never a call
    (``ndarray(shape)`` in a REDUCE would allocate any shape the file asks for)."""


class _BatchUnpickler(pickle.Unpickler):
    """CIFAR's batches hold dicts, lists, strings, numbers and numpy arrays: the globals a pickle
    of those names are all it may load; any other (a payload's ``os.system``) is refused.

    What it builds is bounded by the file: ``_codecs.encode`` may turn out no more bytes in all
    than the file holds (one string encoded again and again asked for 9 GiB), and at most
    :attr:`MAX_ARRAYS` arrays are made, each from bytes the file holds (protocol 5's
    ``_frombuffer`` views them; ``bytes()`` only makes the empty bytes of an empty array).
    """

    MAX_ARRAYS = 16  # a batch holds one ('data'); a cut-down copy may hold each field as an array
    RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}
    FROMBUFFER = {("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer")}

    def __init__(self, file, size: int):
        super().__init__(file, encoding="latin1")
        self.bytes_left, self.arrays = size, 0

    def find_class(self, module: str, name: str):
        if (module, name) in self.RECONSTRUCT:
            return self._reconstruct
        if (module, name) in self.FROMBUFFER:
            return self._frombuffer
        if (module, name) in {("builtins", "bytes"), ("__builtin__", "bytes")}:
            return _no_bytes
        if (module, name) == ("numpy", "ndarray"):
            return _NDArray
        if (module, name) == ("numpy", "dtype"):
            return np.dtype
        if (module, name) == ("_codecs", "encode"):
            return self._encode
        raise pickle.UnpicklingError(f"refers to {module}.{name}, which CIFAR's batches never hold (a pickle that runs code?)")

    def _count(self) -> None:
        self.arrays += 1
        if self.arrays > self.MAX_ARRAYS:
            raise pickle.UnpicklingError(f"makes more than {self.MAX_ARRAYS} arrays; a CIFAR batch holds one")

    def _reconstruct(self, subtype, shape, typecode) -> np.ndarray:
        """numpy's own ``_reconstruct(ndarray, (0,), b'b')``: an empty array the next BUILD fills."""
        self._count()
        if subtype is not _NDArray:
            raise pickle.UnpicklingError("makes an array of another type than numpy's ndarray")
        return np.ndarray((0,), np.uint8)

    def _frombuffer(self, buffer, dtype, shape, order) -> np.ndarray:
        """numpy's protocol-5 ``_frombuffer``: an array over bytes the file holds (numpy checks the size)."""
        self._count()
        if not isinstance(buffer, bytes | bytearray) or not isinstance(dtype, np.dtype) or dtype.hasobject:
            raise pickle.UnpicklingError("makes an array of something other than the file's bytes")
        return np.frombuffer(buffer, dtype).reshape(shape, order=order)

    def _encode(self, text, encoding: str = "utf-8") -> bytes:
        if not isinstance(text, str) or encoding != "latin1":
            raise pickle.UnpicklingError("encodes something other than a latin-1 string, as numpy's pickles never do")
        self.bytes_left -= len(text)
        if self.bytes_left < 0:
            raise pickle.UnpicklingError("builds more bytes than the file holds (a string encoded again and again)")
        return text.encode("latin1")


#: The most opcodes a batch may hold: CIFAR-100's training file has about 250,000 (a label and a
#: file name an image); the bound keeps the scan below and the objects the load makes bounded.
MAX_OPCODES = 2_000_000


def _scan(data: bytes) -> None:
    """UnpicklingError if ``data`` claims a string longer than the rest of it or holds more than
    :data:`MAX_OPCODES` opcodes, before anything is loaded: the unpickler allocates a claimed
    length before reading it (8 bytes asked for 8 GiB)."""
    import pickletools

    try:
        for count, _ in enumerate(pickletools.genops(io.BytesIO(data))):
            if count >= MAX_OPCODES:
                raise pickle.UnpicklingError(f"holds more than {MAX_OPCODES:,} opcodes; a CIFAR batch holds about 250,000")
    except ValueError as err:  # a length past the end, an unknown opcode
        raise pickle.UnpicklingError(str(err)) from None


def _no_bytes(*args) -> bytes:
    """``bytes()``, as a protocol-2 pickle of an empty array calls it; ``bytes(n)`` would allocate n."""
    if args:
        raise pickle.UnpicklingError("calls bytes() with arguments (it would allocate them); numpy's pickles call it with none")
    return b""


def _labels(value, path: Path, key: str) -> np.ndarray:
    """A batch's labels as int64: an integer array, or a list (or tuple) of Python ints (CIFAR's);
    anything else (nested or shared lists that would expand without bound) refused naming ``key``."""
    if isinstance(value, np.ndarray) and value.ndim == 1 and np.issubdtype(value.dtype, np.integer):
        return value.astype(np.int64)
    if isinstance(value, list | tuple) and all(type(v) is int for v in value):
        try:
            return np.asarray(value, dtype=np.int64).reshape(len(value))
        except OverflowError:
            pass
    kind = f"{value.dtype} {list(value.shape)}" if isinstance(value, np.ndarray) else type(value).__name__
    raise DataError(f"{path}: '{key}' holds {kind}; each image needs one integer label (a list of ints)")


def _existing(path: Path) -> Path | None:
    """``path``, or its ``.gz`` for an IDX file, if it exists."""
    if path.is_file():
        return path
    gz = path.with_name(path.name + ".gz")
    return gz if "idx" in path.name and gz.is_file() else None


def found(root: Path, name: str, emnist_split: str = "balanced") -> list[list[Path]]:
    """The splits whose files are all there (as they exist: an IDX file maybe gzipped); a
    :class:`LayoutError` naming the files expected when none is complete."""
    splits = split_files(root, name, emnist_split)
    complete = [[_existing(f) for f in files] for files in splits]
    for files, there in zip(splits, complete):
        if any(there) and not all(there):
            missing = ", ".join(str(f.relative_to(root)) for f, t in zip(files, there) if t is None)
            raise LayoutError(f"{name} under {root}: a split has some of its files but not {missing}; place them, or remove the split's other files")
    complete = [files for files in complete if all(files)]
    if not complete:
        expected = "; ".join(" + ".join(str(f.relative_to(root)) for f in files) for files in splits)
        raise LayoutError(f"no {name} files in torchvision's layout under {root}: expected {expected} (IDX files may end in .gz)")
    return complete  # type: ignore[return-value]


def _idx(files: list[Path], transpose: bool) -> tuple[np.ndarray, np.ndarray]:
    x, y = read_idx(files[0]), read_idx(files[1])
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
        raise DataError(f"{files[0].name} ({x.shape}) and {files[1].name} ({y.shape}) do not match")
    return (x.transpose(0, 2, 1) if transpose else x)[:, None], y.astype(np.int64)


def _svhn(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path))
    except Exception as err:  # noqa: BLE001 - scipy's MatReadError and whatever a damaged file raises
        raise DataError(f"cannot read SVHN's {path}: {err}") from None
    if "X" not in mat or "y" not in mat:
        raise LayoutError(f"{path} has no 'X' and 'y' arrays (SVHN's .mat format)")
    x, labels = np.asarray(mat["X"]), np.asarray(mat["y"])
    if x.dtype != np.uint8:
        raise DataError(f"{path}: 'X' holds {x.dtype} values; SVHN's images are uint8")
    numeric = labels.dtype.kind in "iuf" and np.isfinite(labels).all() and (labels == np.round(labels)).all()
    if not numeric or sum(d > 1 for d in labels.shape) > 1:
        raise DataError(f"{path}: 'y' is {labels.dtype} {list(labels.shape)}; SVHN's labels are one column of whole numbers")
    y = labels.astype(np.int64).reshape(-1)
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != len(y):
        raise DataError(f"{path}: 'X' is {list(x.shape)} and 'y' has {len(y)} labels; SVHN's hold [32, 32, 3, n] images and n labels")
    y[y == 10] = 0
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), y


def _cifar(files: list[Path], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for path in files:
        try:
            raw = path.read_bytes()
            _scan(raw)
            entry = _BatchUnpickler(io.BytesIO(raw), len(raw)).load()
        except Exception as err:  # noqa: BLE001 - a damaged pickle raises nearly anything (IndexError, KeyError, MemoryError, ...)
            raise DataError(f"cannot read {path} as a CIFAR batch (a pickle): {err!r}") from None
        if not isinstance(entry, dict) or "data" not in entry or label_key not in entry:
            raise LayoutError(f"{path} has no 'data' and '{label_key}' (CIFAR's pickled batches)")
        data = entry["data"]
        if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.dtype != np.uint8:
            kind = f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray) else type(data).__name__
            raise DataError(f"{path}: 'data' is {kind}; CIFAR's batches hold uint8 rows of 3072 values [n, 3072] (3x32x32) in a numpy array")
        labels = _labels(entry[label_key], path, label_key)
        if len(labels) != len(data):
            raise DataError(f"{path}: {len(data)} images but '{label_key}' holds {len(labels)} labels; each image needs one integer label")
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(labels)
    return np.concatenate(xs), np.concatenate(ys)


_USPS_INDICES = [str(j) for j in range(1, 257)]


def _usps(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Rows 'label 1:v 2:v ... 256:v', labels 1-10 and values in [-1, 1]; a row otherwise (a value
    missing, out of order or past the range, a label not a class) is refused naming its line."""
    with bz2.open(path) as f:
        rows = [(n, line.decode().split()) for n, line in enumerate(f, 1) if line.strip()]
    if not rows:
        raise DataError(f"{path} holds no rows; USPS's are 'label 1:v 2:v ... 256:v'")
    values, labels = np.empty((len(rows), 256), dtype=np.float32), np.empty(len(rows))
    for i, (n, row) in enumerate(rows):
        pairs = [v.partition(":") for v in row[1:]]
        try:
            if [j for j, _, _ in pairs] != _USPS_INDICES:
                raise ValueError("not 256 values numbered 1 to 256")
            values[i] = np.asarray([v for _, _, v in pairs], dtype=np.float32)
            labels[i] = float(row[0])
        except ValueError:
            raise DataError(f"{path}, line {n}: not 'label 1:v 2:v ... 256:v' (a label and 256 values numbered in order)") from None
    bad = ~(np.isfinite(values).all(axis=1) & (np.abs(values).max(axis=1) <= 1) & np.isin(labels, np.arange(1, 11)))
    if bad.any():
        i = int(np.argmax(bad))
        n, row = rows[i]
        raise DataError(f"{path}, line {n}: label {row[0]}, values from {values[i].min()} to {values[i].max()}; USPS's labels are 1-10, its values in [-1, 1]")
    return ((values.reshape(-1, 1, 16, 16) + 1) / 2 * 255).astype(np.uint8), labels.astype(np.int64) - 1


def load(root: Path, name: str, emnist_split: str = "balanced") -> tuple[np.ndarray, np.ndarray]:
    """Every split of ``name`` under ``root``: images uint8 [n, C, H, W] and labels 0..classes-1."""
    xs, ys = [], []
    shape, classes = info(name, emnist_split)
    first = 1 if name == "EMNIST" and emnist_split == "letters" else 0  # letters are numbered from 1
    for files in (splits := found(root, name, emnist_split)):
        try:
            if name in IDX_FAMILY:
                x, y = _idx(files, transpose=name == "EMNIST")
            elif name == "SVHN":
                x, y = _svhn(files[0])
            elif name.startswith("CIFAR"):
                x, y = _cifar(files, "labels" if name == "CIFAR10" else "fine_labels")
            else:
                x, y = _usps(files[0])
        except DataError:
            raise
        except (OSError, EOFError, ValueError) as err:
            raise DataError(f"cannot read {name} from {files[0]}: {err}") from None
        named = f"{', '.join(str(f.relative_to(root)) for f in files)} under {root}"
        if x.shape[1:] != shape:
            raise DataError(f"{name}'s {named} hold images {x.shape[1:]}, torchvision's are {shape}")
        y = y - first
        if len(y) and (y.min() < 0 or y.max() >= classes):
            raise DataError(f"{name}'s {named} hold labels {int(y.min()) + first}..{int(y.max()) + first}, outside {first}..{classes - 1 + first}")
        xs.append(x)
        ys.append(y)
    if not sum(map(len, ys)):
        raise DataError(f"{name} under {root} has no images: {', '.join(f.name for files in splits for f in files)} hold none")
    return np.concatenate(xs), np.concatenate(ys)


def load_torchvision(root: Path, name: str, emnist_split: str = "balanced") -> Pool:
    """The pool of a torchvision data set from its files under ``root``, standardized per channel."""
    x, y = load(root, name, emnist_split)
    return Pool(_normalize(_unit(x)), torch.from_numpy(y), info(name, emnist_split)[1])
