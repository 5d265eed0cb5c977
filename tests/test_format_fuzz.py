"""Every data format pflower reads, fed damaged and adversarial files (hypothesis): cut short,
headers and bodies overwritten, compressed bodies corrupted, counts that disagree, other dtypes,
shapes and modes, empty files and sets. Each either loads exactly what it holds or is refused
with a DataError or FolderError that names it: no other exception, no hang, no data read wrong.

Each test starts from small valid files (tests/data_files.py) and damages one of them in one of
two ways. Byte damage: the loaded data must equal what an independent reading of the damaged
file holds, or be refused. Content damage (a well-formed file holding other values): loaded
exactly when the format's rules admit it and refused otherwise, so valid files are never refused.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import math
import pickle
import signal
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from data_files import idx_bytes, write_cifar100, write_idx_family, write_svhn, write_usps
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

from pflower.datasets import folder as F
from pflower.datasets.sources import DataError, _normalize, load_idx_family, read_idx
from pflower.datasets.torchvision_files import load

#: Few examples a format (the file runs in the default suite), the same ones on every run.
FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def fresh(tmp_path: Path) -> Path:
    """A new folder for one example (hypothesis runs every example in the test's one tmp_path)."""
    return Path(tempfile.mkdtemp(dir=tmp_path))


@contextmanager
def time_limit(seconds: float = 20):
    """A hang fails the example instead of stalling the suite."""

    def stop(*_):
        raise TimeoutError(f"no answer in {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def outcome(call: Callable, named: str):
    """``call()``'s result, or None when it is refused by an error naming ``named``; any other
    exception, or a refusal that does not name it, fails the test."""
    with time_limit():
        try:
            return call()
        except (DataError, F.FolderError) as err:
            assert named in str(err), f"the error does not name {named}: {err}"
            return None


def arrays_equal(got, expected) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


def check(got, expected, strict: bool, same: Callable = arrays_equal) -> None:
    """Loaded data equals what the files hold; with ``strict`` (the damage left well-formed files)
    it is also refused only where the format's rules refuse it."""
    if got is not None:
        assert expected is not None, "loaded a data set out of files that hold none"
        assert same(got, expected), "loaded data differs from what the files hold"
    elif strict:
        assert expected is None, "refused files that hold a valid data set"


#: One damage to a file's bytes: cut at a fraction of its length, bytes overwritten at a fraction
#: of it or in its first 32 bytes (the header), garbage appended, or emptied.
BYTE_DAMAGE = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("overwrite"), st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("header"), st.integers(0, 31), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("empty")),
)


def damage(data: bytes, how: tuple) -> bytes:
    """``data`` with one :data:`BYTE_DAMAGE`."""
    kind = how[0]
    if kind == "truncate":
        return data[: int(how[1] * len(data))]
    if kind in ("overwrite", "header"):
        at = int(how[1] * len(data)) if kind == "overwrite" else min(how[1], len(data))
        return data[:at] + how[2] + data[at + len(how[2]) :]
    if kind == "append":
        return data + how[1]
    return b""


def damage_file(path: Path, how: tuple) -> None:
    path.write_bytes(damage(path.read_bytes(), how))


# IDX files: torchvision's layout (KMNIST) and MNIST's flat folder (load_idx_family)


def idx_holds(path: Path) -> np.ndarray | None:
    """The array an IDX file holds (unsigned bytes after a header of 4 + 4 x ndim bytes whose
    dims multiply to the rest), or None."""
    try:
        raw = gzip.open(io.BytesIO(path.read_bytes())).read() if path.suffix == ".gz" else path.read_bytes()
    except Exception:  # noqa: BLE001 - any unreadable gzip
        return None
    if len(raw) < 4 or raw[:3] != b"\0\0\x08" or len(raw) < 4 + 4 * raw[3]:
        return None
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3])]
    if len(raw) != 4 + 4 * raw[3] + math.prod(dims) or math.prod(d for d in dims if d) >= 2**63:  # no array has those dims
        return None
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * raw[3]).reshape(dims)


def write_idx_split(folder: Path, stem: str, gz: bool, n: int) -> None:
    """A split's two IDX files holding ``n`` images and labels (well-formed)."""
    rng = np.random.default_rng(n)
    for kind, arr in (("images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28))), ("labels-idx1-ubyte", np.arange(n) % 10)):
        content = idx_bytes(arr)
        (folder / f"{stem}-{kind}{'.gz' if gz else ''}").write_bytes(gzip.compress(content) if gz else content)


IDX_FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
IDX_DIMS = [0, 1, 4, 11, 13, 27, 28, 29, 255, 2**31, 2**32 - 1]
#: The damages of an IDX file: its bytes, its gzip body, one header dim set to a value, the file
#: replaced by a header of other dims and as many bytes as their product modulo 2**64 (what
#: int64 arithmetic would expect), or every split rewritten well-formed with 0 to 12 images.
IDX_DAMAGE = st.one_of(
    st.tuples(st.just("bytes"), BYTE_DAMAGE),
    st.tuples(st.just("compressed"), BYTE_DAMAGE),
    st.tuples(st.just("dim"), st.integers(0, 2), st.sampled_from(IDX_DIMS)),
    st.tuples(st.just("claim"), st.lists(st.sampled_from(IDX_DIMS), min_size=1, max_size=4).map(tuple)),
    st.tuples(st.just("count"), st.integers(0, 12), st.integers(0, 12)),
)


@FUZZ
@given(layout=st.sampled_from(["torchvision", "flat"]), gz=st.booleans(), target=st.sampled_from(IDX_FILES), how=IDX_DAMAGE)
@example(layout="flat", gz=True, target="train-images-idx3-ubyte", how=("compressed", ("header", 10, b"\xff")))  # a corrupt gzip body (zlib.error)
@example(layout="torchvision", gz=False, target="t10k-images-idx3-ubyte", how=("dim", 0, 0))  # a header saying 0 images
@example(layout="flat", gz=False, target="t10k-labels-idx1-ubyte", how=("dim", 0, 2**31))  # 2**31 labels claimed
@example(layout="flat", gz=True, target="train-images-idx3-ubyte", how=("claim", (2**31, 2**31, 4)))  # dims whose product wraps to 0 in int64
@example(layout="flat", gz=False, target="t10k-images-idx3-ubyte", how=("claim", (0, 2**32 - 1, 2**32 - 1)))  # no data, dims no array can have
@example(layout="flat", gz=False, target="train-images-idx3-ubyte", how=("count", 0, 0))  # no images in any split
@example(layout="flat", gz=False, target="t10k-images-idx3-ubyte", how=("claim", (12, 27, 28)))  # splits of two image sizes
@example(layout="torchvision", gz=True, target="t10k-images-idx3-ubyte", how=("claim", (12, 28, 27)))
def test_idx_files(tmp_path, layout, gz, target, how):
    root = fresh(tmp_path)
    write_idx_family(root, "KMNIST", gz=gz)
    folder = root / "KMNIST" / "raw"
    if layout == "flat":
        for f in list(folder.iterdir()):
            f.rename(root / f.name)
        folder = root
    path = folder / (target + (".gz" if gz else ""))
    raw = gzip.decompress(path.read_bytes()) if gz else path.read_bytes()
    kind = how[0] if gz or how[0] != "compressed" else "bytes"
    if kind == "count":
        write_idx_split(folder, "train", gz, how[1])
        write_idx_split(folder, "t10k", gz, how[2])
    elif kind == "compressed":
        damage_file(path, how[1])
    elif kind in ("bytes", "claim"):
        wrapped = math.prod(how[1]) % 2**64 if kind == "claim" else 0
        content = (
            damage(raw, how[1])
            if kind == "bytes"
            else bytes([0, 0, 8, len(how[1])]) + b"".join(d.to_bytes(4, "big") for d in how[1]) + bytes(min(wrapped, 10**5))
        )
        path.write_bytes(gzip.compress(content) if gz else content)
    else:
        i = min(how[1], raw[3] - 1)  # a dim the file has (a label file has one)
        content = raw[: 4 + 4 * i] + how[2].to_bytes(4, "big") + raw[8 + 4 * i :]
        path.write_bytes(gzip.compress(content) if gz else content)
    splits = []
    for stem in ("train", "t10k") if layout == "torchvision" else ("t10k", "train"):  # the flat folder's files by name
        x, y = (idx_holds(folder / f"{stem}-{k}{'.gz' if gz else ''}") for k in ("images-idx3-ubyte", "labels-idx1-ubyte"))
        splits.append((x, y) if x is not None and y is not None and x.ndim == 3 and y.ndim == 1 and len(x) == len(y) else None)
    valid = all(splits) and sum(len(s[1]) for s in splits) > 0
    strict, named = kind in ("dim", "claim", "count"), path.name if kind != "count" else "train-images-idx3-ubyte"
    if layout == "torchvision":
        valid = valid and all(s[0].shape[1:] == (28, 28) and (s[1] < 10).all() for s in splits)
        expected = (np.concatenate([s[0] for s in splits])[:, None], np.concatenate([s[1] for s in splits]).astype(np.int64)) if valid else None
        check(outcome(lambda: load(root, "KMNIST"), named), expected, strict)
        return
    expected = None
    if valid and len({s[0].shape[1:] for s in splits}) == 1 and all((s[1] < 10).all() for s in splits):  # labels as the files hold them, MNIST's 0..9
        x = np.concatenate([s[0] for s in splits]).astype(np.float32)[:, None] / 255.0
        expected = (_normalize(x), torch.from_numpy(np.concatenate([s[1] for s in splits]).astype(np.int64)))
    got = outcome(lambda: load_idx_family("mnist", folder), named)
    check(got, expected, strict, lambda pool, want: torch.allclose(pool.x, want[0], atol=1e-6) and torch.equal(pool.y, want[1]))


@pytest.mark.parametrize("gz", [False, True])
def test_an_idx_header_claiming_2_31_images_is_refused_at_once_without_allocating_them(tmp_path, gz):
    content = bytes([0, 0, 8, 3]) + (2**31).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + bytes(784)
    path = tmp_path / ("train-images-idx3-ubyte" + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(content) if gz else content)
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(DataError, match=f"{path.name} is truncated or corrupt: header says {2**31 * 784} bytes of data, file has 784"):
            read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - start < 1 and peak < 2**20


def test_an_idx_gzip_inflating_past_its_header_is_refused_without_holding_the_rest(tmp_path):
    """A gzip bomb: a header for 10 images and 256 MiB of zeros after them (256 KiB compressed)."""
    head = bytes([0, 0, 8, 3]) + (10).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
    path = tmp_path / "train-images-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(head + bytes(7840))
        for _ in range(256):
            f.write(bytes(2**20))
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=f"{path.name} is truncated or corrupt: header says 7840 bytes of data, file has more than 7840"):
            read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


# SVHN: .mat files (scipy)


def svhn_holds(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """A split's images [n, 3, 32, 32] and labels as SVHN's .mat holds them: 'X' uint8
    [32, 32, 3, n], 'y' one column or row of n whole numbers, 10 meaning digit 0; or None."""
    from scipy.io import loadmat

    try:
        mat = loadmat(str(path))
        x, y = np.asarray(mat["X"]), np.asarray(mat["y"])
    except Exception:  # noqa: BLE001 - unreadable, or no X or y
        return None
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3) or y.dtype.kind not in "iuf" or sum(d > 1 for d in y.shape) > 1:
        return None
    y = y.reshape(-1)
    if len(y) != x.shape[3] or not np.isfinite(y).all() or (y != np.round(y)).any():
        return None
    y = np.where(y == 10, 0, y).astype(np.int64)
    return (x.transpose(3, 2, 0, 1), y) if not len(y) or (y.min() >= 0 and y.max() <= 9) else None


#: Well-formed .mat files holding other arrays: name -> (X, y) of the written split -> the arrays saved.
SVHN_CHANGES: dict[str, Callable[[np.ndarray, np.ndarray], dict]] = {
    "y shorter": lambda x, y: {"X": x, "y": y[:-1]},
    "y longer": lambda x, y: {"X": x, "y": np.vstack([y, y[:1]])},
    "y a matrix": lambda x, y: {"X": x, "y": y.reshape(-1, 2)},
    "y a row": lambda x, y: {"X": x, "y": y.reshape(1, -1)},
    "y whole floats": lambda x, y: {"X": x, "y": y.astype(np.float64)},
    "y fractions": lambda x, y: {"X": x, "y": y + 0.5},
    "y strings": lambda x, y: {"X": x, "y": np.asarray([f"{v:02d}" for v in y.ravel()])},
    "y 11": lambda x, y: {"X": x, "y": np.vstack([y[:-1], [[11]]])},
    "y 0": lambda x, y: {"X": x, "y": np.vstack([y[:-1], [[0]]])},
    "X float": lambda x, y: {"X": x.astype(np.float64), "y": y},
    "X int16": lambda x, y: {"X": x.astype(np.int16) * 3, "y": y},
    "X one channel": lambda x, y: {"X": x[:, :, :1], "y": y},
    "X 28x28": lambda x, y: {"X": x[:28, :28], "y": y},
    "X 3-D": lambda x, y: {"X": x[..., 0], "y": y},
    "no y": lambda x, y: {"X": x},
    "no X": lambda x, y: {"y": y},
    "empty": lambda x, y: {"X": x[..., :0], "y": y[:0]},
    "another key": lambda x, y: {"X": x, "y": y, "extra": np.arange(3)},
}


@FUZZ
@given(
    target=st.sampled_from(["train_32x32.mat", "test_32x32.mat"]),
    how=st.one_of(st.tuples(st.just("bytes"), BYTE_DAMAGE), st.tuples(st.just("content"), st.sampled_from(sorted(SVHN_CHANGES)))),
)
@example(target="test_32x32.mat", how=("content", "y shorter"))  # an SVHN y shorter than X
@example(target="train_32x32.mat", how=("content", "y fractions"))
@example(target="train_32x32.mat", how=("content", "y a matrix"))
@example(target="test_32x32.mat", how=("content", "X float"))
def test_svhn_files(tmp_path, target, how):
    from scipy.io import loadmat, savemat

    root = fresh(tmp_path)
    write_svhn(root)
    path = root / target
    if how[0] == "bytes":
        damage_file(path, how[1])
    else:
        mat = loadmat(str(path))
        savemat(str(path), SVHN_CHANGES[how[1]](mat["X"], mat["y"]))
    splits = [svhn_holds(root / f) for f in ("train_32x32.mat", "test_32x32.mat")]
    valid = all(s is not None for s in splits) and sum(len(s[1]) for s in splits) > 0
    expected = (np.concatenate([s[0] for s in splits]), np.concatenate([s[1] for s in splits])) if valid else None
    check(outcome(lambda: load(root, "SVHN"), target), expected, how[0] == "content")


# CIFAR: pickled batches


class _Arrays(pickle.Unpickler):
    """Unpickles numpy arrays and builtins only (the files are damaged copies of ones written here)."""

    def find_class(self, module, name):
        if (module.split(".")[0], name) in {("numpy", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def cifar_holds(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """A batch's images [n, 3, 32, 32] and labels as CIFAR-100 keeps them: a dict whose 'data' is
    uint8 [n, 3072] and 'fine_labels' n integers 0-99; or None."""
    try:
        with open(path, "rb") as f:
            entry = _Arrays(f, encoding="latin1").load()
        data, labels = np.asarray(entry["data"]), np.asarray(entry["fine_labels"])
    except Exception:  # noqa: BLE001 - unreadable, not a dict, keys missing, ragged
        return None
    labels = labels.astype(np.int64) if labels.size == 0 else labels
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or labels.ndim != 1 or len(labels) != len(data):
        return None
    if labels.dtype.kind not in "iu" or (len(labels) and (labels.min() < 0 or labels.max() > 99)):
        return None
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


#: Pickles of other values: name -> the written batch (a dict) -> what is pickled instead.
CIFAR_CHANGES: dict[str, Callable[[dict], object]] = {
    "a pickled int": lambda d: 7,
    "a list": lambda d: [d["data"], d["fine_labels"]],
    "fewer labels": lambda d: {**d, "fine_labels": d["fine_labels"][:-1]},
    "more labels": lambda d: {**d, "fine_labels": d["fine_labels"] + [0]},
    "float labels": lambda d: {**d, "fine_labels": [float(v) for v in d["fine_labels"]]},
    "string labels": lambda d: {**d, "fine_labels": [str(v) for v in d["fine_labels"]]},
    "int8 label array": lambda d: {**d, "fine_labels": np.asarray(d["fine_labels"], np.int8)},
    "bool labels": lambda d: {**d, "fine_labels": [bool(v % 2) for v in d["fine_labels"]]},
    "label 100": lambda d: {**d, "fine_labels": d["fine_labels"][:-1] + [100]},
    "label -1": lambda d: {**d, "fine_labels": [-1] + d["fine_labels"][1:]},
    "ragged labels": lambda d: {**d, "fine_labels": [[1, 2], [3]] + d["fine_labels"][2:]},
    "label tuple": lambda d: {**d, "fine_labels": tuple(d["fine_labels"])},
    "no data": lambda d: {"fine_labels": d["fine_labels"]},
    "no labels": lambda d: {"data": d["data"]},
    "float data": lambda d: {**d, "data": d["data"].astype(np.float32)},
    "data [n, 32, 32, 3]": lambda d: {**d, "data": d["data"].reshape(-1, 32, 32, 3)},
    "data [n, 3071]": lambda d: {**d, "data": d["data"][:, :-1]},
    "data a list": lambda d: {**d, "data": d["data"].tolist()},
    "data bytes": lambda d: {**d, "data": d["data"].tobytes()},
    "empty": lambda d: {"data": d["data"][:0], "fine_labels": []},
    "bytes keys": lambda d: {k.encode(): v for k, v in d.items()},
}


@FUZZ
@given(
    target=st.sampled_from(["train", "test"]),
    how=st.one_of(st.tuples(st.just("bytes"), BYTE_DAMAGE), st.tuples(st.just("content"), st.sampled_from(sorted(CIFAR_CHANGES)))),
)
@example(target="train", how=("content", "a pickled int"))  # a CIFAR batch that is a pickled int
@example(target="test", how=("content", "fewer labels"))  # fewer labels than images
@example(target="train", how=("content", "empty"))
@example(target="test", how=("content", "label -1"))  # refused naming the batch, not only the root
@example(target="train", how=("bytes", ("header", 2, b"\x8e\xff\xff\xff\xff\xff\x00\x00\x00")))  # 2**40 bytes claimed
def test_cifar_batches(tmp_path, target, how):
    root = fresh(tmp_path)
    write_cifar100(root)
    path = root / "cifar-100-python" / target
    if how[0] == "bytes":
        damage_file(path, how[1])
    else:
        with open(path, "rb") as f:
            entry = pickle.load(f)
        path.write_bytes(pickle.dumps(CIFAR_CHANGES[how[1]](entry)))
    splits = [cifar_holds(root / "cifar-100-python" / s) for s in ("train", "test")]
    valid = all(s is not None for s in splits) and sum(len(s[1]) for s in splits) > 0
    expected = (np.concatenate([s[0] for s in splits]), np.concatenate([s[1] for s in splits])) if valid else None
    check(outcome(lambda: load(root, "CIFAR100"), str(path.relative_to(root))), expected, how[0] == "content")


# USPS: bz2 libsvm text


def usps_holds(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """A file's images [n, 1, 16, 16] and labels 0-9 as USPS's libsvm text holds them: lines
    'label 1:v 2:v ... 256:v', labels 1-10, values in [-1, 1] mapped to 0-255 as torchvision does
    (blank lines skipped); or None, also for a file of no rows."""
    try:
        text = bz2.open(io.BytesIO(path.read_bytes())).read().decode()
    except Exception:  # noqa: BLE001 - not bz2, not UTF-8
        return None
    rows = [line.split() for line in text.split("\n") if line.strip()]
    values, labels = [], []
    for row in rows:
        if [t.split(":")[0] for t in row[1:]] != [str(j) for j in range(1, 257)] or any(t.count(":") != 1 for t in row[1:]):
            return None
        try:
            v, label = np.asarray([t.split(":")[1] for t in row[1:]], dtype=np.float32), float(row[0])
        except ValueError:
            return None
        if not (np.isfinite(v).all() and np.abs(v).max() <= 1 and label in range(1, 11)):
            return None
        values.append(v)
        labels.append(int(label) - 1)
    if not rows:
        return None
    return ((np.asarray(values).reshape(-1, 1, 16, 16) + 1) / 2 * 255).astype(np.uint8), np.asarray(labels, dtype=np.int64)


#: A change to one line of a USPS file: (kind, line, token, new text).
USPS_CHANGE = st.tuples(
    st.sampled_from(["value", "label", "drop", "swap", "drop line", "blank lines", "crlf", "empty", "latin-1"]),
    st.integers(0, 11),
    st.integers(1, 256),
    st.sampled_from(["1", "-1", "0.5", "1.0000001", "1.01", "-2", "nan", "inf", "x", "", "0", "10", "11", "3.0", "1.5", "1e308", "1:2"]),
)


@FUZZ
@given(target=st.sampled_from(["usps.bz2", "usps.t.bz2"]), how=st.one_of(st.tuples(st.just("bytes"), BYTE_DAMAGE), st.tuples(st.just("content"), USPS_CHANGE)))
@example(target="usps.bz2", how=("content", ("value", 3, 17, "1.01")))  # past [-1, 1]: would wrap around in uint8
@example(target="usps.bz2", how=("content", ("label", 0, 1, "inf")))
@example(target="usps.t.bz2", how=("content", ("swap", 5, 100, "")))
@example(target="usps.t.bz2", how=("content", ("empty", 0, 1, "")))
def test_usps_files(tmp_path, target, how):
    root = fresh(tmp_path)
    write_usps(root)
    path = root / target
    if how[0] == "bytes":
        damage_file(path, how[1])
    else:
        kind, i, j, text = how[1]
        lines = bz2.decompress(path.read_bytes()).decode().split("\n")
        row = lines[i].split()
        if kind == "value":
            row[j] = f"{j}:{text}"
        elif kind == "label":
            row[0] = text
        elif kind == "drop":
            del row[j]
        elif kind == "swap":
            row[j], row[j % 256 + 1] = row[j % 256 + 1], row[j]
        lines[i] = " ".join(row)
        content = "\n".join(lines[:i] + lines[i + 1 :] if kind == "drop line" else lines).encode()
        content = {"blank lines": content.replace(b"\n", b"\n\n \n"), "crlf": content.replace(b"\n", b"\r\n"), "empty": b""}.get(kind, content)
        if kind == "latin-1":
            content = content.replace(b"1:", "1:\xe9".encode("latin-1"), 1)
        path.write_bytes(bz2.compress(content))
    splits = [usps_holds(root / f) for f in ("usps.bz2", "usps.t.bz2")]
    valid = all(s is not None for s in splits)
    expected = (np.concatenate([s[0] for s in splits]), np.concatenate([s[1] for s in splits])) if valid else None
    check(outcome(lambda: load(root, "USPS"), target), expected, how[0] == "content")


# Image folders (PIL)


def eight_bits(im: Image.Image) -> np.ndarray | None:
    """An image's pixels as image folders read them, uint8 [C, H, W]: L and RGB as they are,
    bilevel and gray with alpha as L, 16-bit and 32-bit integer gray over 0-65535 and float gray
    over [0, 1] scaled to 0-255, every other mode converted to RGB; None past those ranges."""
    if im.mode in ("I;16", "I", "F"):
        a, top = np.asarray(im, dtype=np.float64), 1.0 if im.mode == "F" else 65535.0
        if not np.isfinite(a).all() or a.min() < 0 or a.max() > top:
            return None
        a = np.rint(a * 255 / top).astype(np.uint8)
    else:
        a = np.asarray(im.convert("L" if im.mode in ("1", "L", "LA") else "RGB"))
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def decoded(path: Path) -> np.ndarray | None:
    try:
        with Image.open(path) as im:
            im.load()
            return eight_bits(im)
    except Exception:  # noqa: BLE001 - not an image PIL decodes
        return None


def folder_holds(root: Path) -> tuple[tuple[np.ndarray, np.ndarray] | None, list[Path]]:
    """(images, labels) of an image tree as its files hold them, or None (a file that is no image,
    sizes or channels that differ, a class folder with no image); and its files in pooled order
    (train/<class>/, then test/<class>/, by name)."""
    classes = sorted({p.name for s in ("train", "test") if (root / s).is_dir() for p in (root / s).iterdir() if p.is_dir()})
    files = []
    for split in ("train", "test"):
        for label, name in enumerate(classes):
            if (root / split / name).is_dir():
                files += [(label, p) for p in sorted((root / split / name).iterdir()) if p.is_file() and p.name not in F.SKIP and not p.name.startswith(".")]
    images = [decoded(p) for _, p in files]
    if len({lab for lab, _ in files}) < len(classes) or any(a is None or a.shape != images[0].shape for a in images):
        return None, [p for _, p in files]
    return (np.stack(images), np.asarray([lab for lab, _ in files], dtype=np.int64)), [p for _, p in files]


def ramp(mode: str) -> Image.Image:
    """An 8x8 image of ``mode`` whose values span the mode's range (a ramp, not black and white)."""
    top = {"I;16": 65535, "I": 65535, "F": 1.0}[mode]
    return Image.fromarray(np.linspace(0, top, 64).reshape(8, 8).astype({"I;16": np.uint16, "I": np.int32, "F": np.float32}[mode]))


def image_of(mode: str, value: int) -> Image.Image:
    """An 8x8 image of ``mode`` (some not 8-bit L or RGB), ``value`` setting its content."""
    if mode in ("I;16", "I", "F"):
        return ramp(mode)
    rng = np.random.default_rng(value)
    if mode == "P":
        im = Image.fromarray(rng.integers(0, 4, (8, 8), dtype=np.uint8), "P")
        im.putpalette([255, 0, 0, 0, 0, 255, 9, 200, 30, value, value, value] + [0] * 756)
        return im
    rgba = Image.fromarray(rng.integers(0, 256, (8, 8, 4), dtype=np.uint8), "RGBA")
    return rgba.convert(mode) if mode != "RGBA" else rgba


#: Changes to an image tree: replace one image by another of a mode and file format; add an empty
#: class folder, a file that is no image, a hidden or README file, an image of another size; empty a class.
FOLDER_CHANGE = st.one_of(
    st.tuples(st.just("mode"), st.sampled_from(["L", "RGB", "P", "RGBA", "LA", "1", "CMYK", "I;16", "I", "F"]), st.sampled_from(["png", "tiff", "bmp"])),
    st.tuples(st.sampled_from(["empty class", "not an image", "hidden", "readme", "bigger", "empty a class", "no test split"])),
)
#: The modes each file format holds (PIL saves the others in another mode or not at all).
SAVES = {
    "png": {"L", "RGB", "P", "RGBA", "LA", "1", "I;16"},
    "bmp": {"L", "RGB", "P", "1"},
    "tiff": {"L", "RGB", "P", "RGBA", "LA", "1", "CMYK", "I;16", "I", "F"},
}


@FUZZ
@given(
    base=st.sampled_from(["L", "RGB"]),
    fmt=st.sampled_from(["png", "bmp", "tiff", "gif", "jpeg", "webp"]),
    target=st.integers(0, 5),
    how=st.one_of(st.tuples(st.just("bytes"), BYTE_DAMAGE), st.tuples(st.just("change"), FOLDER_CHANGE)),
)
@example(base="L", fmt="png", target=2, how=("change", ("mode", "I;16", "png")))  # a 16-bit grayscale PNG: a ramp, not black and white
@example(base="RGB", fmt="png", target=0, how=("change", ("mode", "P", "png")))  # a palette image reads as its colors
@example(base="L", fmt="png", target=3, how=("change", ("empty class",)))  # an empty class folder
@example(base="RGB", fmt="png", target=4, how=("change", ("not an image",)))  # a file that is no image in a class folder
@example(base="L", fmt="png", target=1, how=("bytes", ("truncate", 0.6)))
def test_image_folders(tmp_path, monkeypatch, base, fmt, target, how):
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    root = fresh(tmp_path)
    places = [("train", "apple", 0), ("train", "apple", 1), ("train", "zebra", 0), ("train", "zebra", 1), ("test", "apple", 0), ("test", "zebra", 0)]
    paths = [root / split / name / f"{i}.{fmt}" for split, name, i in places]
    for k, p in enumerate(paths):
        p.parent.mkdir(parents=True, exist_ok=True)
        image_of(base, k).save(p)
    path, truth = paths[target], None
    named = path.name
    if how[0] == "bytes":
        damage_file(path, how[1])
    elif how[1][0] == "mode":
        _, mode, kind = how[1]
        im = image_of(mode, target)
        path.unlink()
        path = path.with_suffix(f".{kind if mode in SAVES[kind] else 'tiff'}")
        im.save(path)
        named, truth = path.name, eight_bits(im)
    elif how[1][0] == "empty class":
        (root / "train" / "moth").mkdir()
        named = "moth"
    elif how[1][0] == "not an image":
        (path.parent / "notes.txt").write_text("not an image")
        named = "notes.txt"
    elif how[1][0] in ("hidden", "readme"):
        (path.parent / (".DS_Store" if how[1][0] == "hidden" else "README.md")).write_bytes(b"\0\1 folder metadata")
    elif how[1][0] == "bigger":
        image_of(base, target).resize((9, 8)).save(path)
    elif how[1][0] == "empty a class":
        for p in paths:
            if p.parent.name == path.parent.name:
                p.unlink()
        named = path.parent.name
    else:  # no test split
        for p in paths[4:]:
            p.unlink()
        (root / "test").rename(root / "unused")
    expected, files = folder_holds(root)
    if truth is not None and expected is not None:  # the replaced image holds its pixels: a deep ramp stays a ramp
        assert np.array_equal(expected[0][files.index(path)], truth)
        assert how[1][1] not in ("I;16", "I", "F") or len(np.unique(truth)) == 64
    for _ in range(2):  # decoded, then from the cache
        check(outcome(lambda: F.load_folder(root)[:2], named), expected, how[0] == "change")


# Hugging Face: save_to_disk folders and parquet files (datasets, pyarrow)

#: A decoded image's mode -> its pixels' top (Hugging Face's arrays of it); every other mode is read as RGB, gray with alpha as L.
HF_TOPS = {"1": 1.0, "L": 255.0, "RGB": 255.0, "I;16": 65535.0, "I;16B": 65535.0, "I": 255.0, "F": 1.0}


def hf_pixels(cell: dict | None) -> np.ndarray | None:
    """One image cell as float32 [C, H, W] in [0, 1] (an alpha channel dropped), or None."""
    try:
        with Image.open(io.BytesIO(cell["bytes"])) as im:
            im.load()
            im = im if im.mode in HF_TOPS else im.convert("L" if im.mode == "LA" else "RGB")
            a, top = np.asarray(im), HF_TOPS[im.mode]
    except Exception:  # noqa: BLE001 - null, not an image
        return None
    a = a[..., None] if a.ndim == 2 else a
    if not np.isfinite(a).all() or a.min() < 0 or a.max() > top:
        return None
    return (a.astype(np.float32) / np.float32(top)).transpose(2, 0, 1)


def hf_holds(root: Path, layout: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(images, labels) of a Hugging Face data set as pyarrow reads its files: every split's or
    parquet file's rows, in order; labels a ClassLabel's indices; None where a file is unreadable,
    there are no rows, or a row's image or label is not one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if layout == "parquet":
            tables = [pq.read_table(f) for f in sorted(root.glob("*.parquet"))]
            names = [json.loads(t.schema.metadata[b"huggingface"])["info"]["features"]["label"]["names"] for t in tables]
        else:
            tables, names = [], []
            for split in [root] if layout == "disk" else [root / s for s in json.loads((root / "dataset_dict.json").read_text())["splits"]]:
                state = json.loads((split / "state.json").read_text())
                files = [pa.ipc.open_stream(pa.memory_map(str(split / f["filename"]))).read_all() for f in state["_data_files"]]
                tables.append(pa.concat_tables(files))
                names.append(json.loads((split / "dataset_info.json").read_text())["features"]["label"]["names"])
        for t in tables:
            t.validate(full=True)
        cells = [c for t in tables for c in t.column("image").to_pylist()]
        labels = [v for t in tables for v in t.column("label").to_pylist()]
    except Exception:  # noqa: BLE001 - damaged files
        return None
    images = [hf_pixels(c) for c in cells]
    if not cells or any(a is None or a.shape != images[0].shape for a in images) or any(v not in range(len(names[0])) for v in labels):
        return None
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def png(im: Image.Image, fmt: str = "png") -> bytes:
    buffer = io.BytesIO()
    im.save(buffer, fmt)
    return buffer.getvalue()


#: Changes to one row of a Hugging Face data set (its image, or its label), or to all of it.
HF_CHANGE = st.one_of(
    st.tuples(st.just("mode"), st.sampled_from(["L", "RGB", "P", "RGBA", "LA", "1", "CMYK", "I;16", "F"])),
    st.tuples(st.sampled_from(["not an image", "no image", "bigger", "label -1", "no label", "empty"])),
)


@FUZZ
@given(
    layout=st.sampled_from(["disk", "dict", "parquet"]),
    base=st.sampled_from(["L", "RGB"]),
    row=st.integers(0, 5),
    how=st.one_of(
        st.tuples(st.just("bytes"), BYTE_DAMAGE), st.tuples(st.just("json"), st.floats(0, 1, exclude_max=True)), st.tuples(st.just("change"), HF_CHANGE)
    ),
)
@example(layout="disk", base="L", row=2, how=("change", ("not an image",)))  # an image column with non-image bytes
@example(layout="dict", base="L", row=0, how=("change", ("empty",)))  # an empty save_to_disk set
@example(layout="disk", base="RGB", row=1, how=("change", ("mode", "P")))  # a palette image reads as its colors
@example(layout="parquet", base="RGB", row=3, how=("change", ("mode", "CMYK")))
@example(layout="disk", base="L", row=4, how=("bytes", ("overwrite", 0.44, b"\xff\xff\xff\x7f")))  # an offset past the file: Arrow read out of bounds (SIGBUS)
def test_huggingface_sets(tmp_path, layout, base, row, how):
    import datasets

    from pflower.datasets import huggingface

    datasets.disable_progress_bars()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["ant", "bee", "cat"])})
    cells = [{"bytes": png(image_of(base, k)), "path": None} for k in range(6)]
    labels: list = [k % 3 for k in range(6)]
    kind = how[1][0] if how[0] == "change" else how[0]
    if kind == "mode":
        im = image_of(how[1][1], row)
        cells[row] = {"bytes": png(im, "tiff" if how[1][1] in ("CMYK", "F") else "png"), "path": None}
    elif kind in ("not an image", "no image", "bigger"):
        cells[row] = {
            "not an image": {"bytes": b"not an image", "path": None},
            "no image": None,
            "bigger": {"bytes": png(image_of(base, row).resize((8, 9))), "path": None},
        }[kind]
    elif kind in ("label -1", "no label"):
        labels[row] = -1 if kind == "label -1" else None
    elif kind == "empty":  # datasets saves no empty set of images: one of arrays
        cells, labels = [], []
        features = datasets.Features({"image": datasets.Array2D((8, 8), "uint8"), "label": features["label"]})
    ds = datasets.Dataset.from_dict({"image": cells, "label": labels}, features=features)
    root = fresh(tmp_path) / ("set.parquet" if layout == "parquet" and kind == "empty" else "set")
    halves = [ds.select(range(4)), ds.select(range(4, 6))] if len(ds) else [ds]
    if layout == "disk":
        ds.save_to_disk(str(root))
        data = root / "data-00000-of-00001.arrow"
    elif layout == "dict":
        datasets.DatasetDict({"train": halves[0], "test": halves[-1]}).save_to_disk(str(root))
        data = root / "train" / "data-00000-of-00001.arrow"
    elif kind == "empty":
        ds.to_parquet(str(root))
        data = root
    else:
        root.mkdir()
        for k, half in enumerate(halves):
            half.to_parquet(str(root / f"part-{k}.parquet"))
        data = root / "part-0.parquet"
    if how[0] == "bytes" and data.exists():
        damage_file(data, how[1])
    elif how[0] == "json" and layout != "parquet":  # cut short: never JSON
        state = data.parent / "state.json"
        state.write_bytes(state.read_bytes()[: int(how[1] * state.stat().st_size)])
    huggingface.open_dataset.cache_clear()
    expected = hf_holds(root, layout) if root.is_dir() or layout != "parquet" else hf_holds(root.parent, layout)
    got = outcome(lambda: huggingface.load_hf(str(root), "image", "label")[:2], str(root))
    check(got, expected, how[0] == "change")
