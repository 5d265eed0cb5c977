"""Generated inputs of every kind a user hands pflower, beside the damaged files of
tests/test_format_fuzz.py: label files with any byte as a label, folder trees with hidden, special
and stray entries, pickles built to expand, and ``-c`` strings as people type them.

Each property: the data is read exactly once and as declared (every image once, with the label its
file or folder gives it, nothing from a stray file), or it is refused with one line that names the
file or the key, in under 10 s and well within 4 GB (Python's and numpy's allocations traced).
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import tempfile
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from data_files import idx_bytes
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

from pflower.datasets import folder as F
from pflower.datasets.sources import IDX_CLASSES, DataError, load_idx_family
from pflower.datasets.torchvision_files import LayoutError, load

GENERATED = settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
#: What one refusal may take: seconds, and bytes traced at the peak (the acceptance allows 4 GB;
#: these inputs are a few KB, so anything near that is an expansion).
SECONDS, PEAK = 10, 256 * 2**20


def fresh(tmp_path: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=tmp_path))


@contextmanager
def bounded():
    """Fails the example past :data:`SECONDS` or :data:`PEAK`."""

    def stop(*_):
        raise TimeoutError(f"no answer in {SECONDS} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, SECONDS)
    tracemalloc.start()
    start = time.monotonic()
    try:
        yield
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < SECONDS
    assert peak < PEAK, f"{peak / 2**20:.0f} MiB traced"


def refused(call, named: str, errors=(DataError, LayoutError, F.FolderError)) -> str:
    """The one-line message with which ``call()`` refuses, naming ``named``."""
    with bounded(), pytest.raises(errors) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and named in message, message
    return message


# ------------------------------------------------------------------------ IDX label files
#: Files a user leaves beside MNIST's: copies, macOS's '._', hidden, another family's names.
IDX_STRAYS = ["train-images-idx3-ubyte.bak", "old-train-images-idx3-ubyte", "._train-images-idx3-ubyte", ".train-images-idx3-ubyte",
              "emnist-balanced-train-images-idx3-ubyte", "train-images-idx3-ubyte (1)", "mnist-train-images-idx3-ubyte.gz"]  # fmt: skip


@GENERATED
@given(
    family=st.sampled_from(sorted(IDX_CLASSES)),
    labels=st.lists(st.one_of(st.integers(0, 46), st.integers(0, 255)), min_size=1, max_size=24),
    gz=st.booleans(),
    strays=st.sets(st.sampled_from(IDX_STRAYS)),
)
@example(family="mnist", labels=[0, 1, 2, 4, 5, 6, 7, 8, 9], gz=False, strays=set())  # no digit 3: 4 stays 4 (it was renumbered 3)
@example(family="mnist", labels=[3, 255], gz=True, strays={"old-train-images-idx3-ubyte"})  # 255 was renumbered into the last class
def test_idx_labels_are_read_as_the_files_hold_them_or_refused_naming_the_file(tmp_path, family, labels, gz, strays):
    root = fresh(tmp_path)
    stem = "emnist-balanced-train" if family == "emnist" else "train"
    images = np.random.default_rng(len(labels)).integers(0, 256, (len(labels), 28, 28), dtype=np.uint8)
    y = np.asarray(labels, dtype=np.uint8)
    suffix = ".gz" if gz else ""
    for kind, arr in (("images-idx3-ubyte", images), ("labels-idx1-ubyte", y)):
        data = idx_bytes(arr)
        (root / f"{stem}-{kind}{suffix}").write_bytes(__import__("gzip").compress(data) if gz else data)
    for name in strays:  # a well-formed IDX pair of other images: pooled, they would change the count
        name = "train-images-idx3-ubyte" if name == f"{stem}-images-idx3-ubyte" else name  # EMNIST's stray: MNIST's files
        junk = idx_bytes(np.full((5, 28, 28), 7, np.uint8))
        (root / name).write_bytes(junk)
        (root / name.replace("images-idx3", "labels-idx1")).write_bytes(idx_bytes(np.zeros(5, np.uint8)))
    if max(labels) < IDX_CLASSES[family]:
        with bounded():
            pool = load_idx_family(family, root)
        assert pool.y.tolist() == labels and pool.num_classes == IDX_CLASSES[family]
        assert len(pool.x) == len(labels)  # read once, nothing from a stray file
    else:
        refused(lambda: load_idx_family(family, root), f"{stem}-labels-idx1-ubyte{suffix}")


# ------------------------------------------------------------------------ image folder trees
#: Entries a tree gathers beside its images (copied from a Mac, opened in Jupyter or Windows
#: Explorer, half cleaned up): each is ignored, or (a file that is no image) refused naming it.
TREE_STRAYS = {
    "ds_store": ("train/{c}/.DS_Store", "ignored"),
    "appledouble": ("train/{c}/._0.png", "ignored"),
    "hidden image": ("train/{c}/.5.png", "ignored"),
    "thumbs": ("train/{c}/Thumbs.db", "ignored"),
    "desktop.ini": ("test/{c}/desktop.ini", "ignored"),
    "readme": ("train/README.md", "ignored"),
    "macosx": ("train/__MACOSX/{c}/0.png", "ignored"),
    "checkpoints": ("train/.ipynb_checkpoints/0.png", "ignored"),
    "hidden class": ("test/.trash/0.png", "ignored"),
    "nested folder": ("train/{c}/sub/0.png", "ignored"),
    "fifo": ("train/{c}/pipe.png", "ignored"),
    "notes": ("train/{c}/notes.txt", "refused"),
    "empty class": ("train/zz-empty/", "refused"),
}


def _write_stray(root: Path, what: str, cls: str) -> str:
    """Add one :data:`TREE_STRAYS` entry; the name a refusal must give."""
    path = root / TREE_STRAYS[what][0].format(c=cls)
    path.parent.mkdir(parents=True, exist_ok=True)
    if what == "empty class":
        path.mkdir(exist_ok=True)
        return "zz-empty"
    if what == "fifo":
        os.mkfifo(path)
    elif path.suffix == ".png":
        Image.fromarray(np.full((6, 6), 200, np.uint8)).save(path)
    else:
        path.write_bytes(b"\0\x05\x16\x07 not an image")
    return path.name


@GENERATED
@given(
    classes=st.lists(st.sampled_from(["cat", "dog", "0", "10", "2", "Zebra", "ä", "two words", "²"]), min_size=1, max_size=4, unique=True),
    counts=st.lists(st.integers(1, 3), min_size=4, max_size=4),
    with_test=st.booleans(),
    strays=st.sets(st.sampled_from(sorted(TREE_STRAYS)), max_size=4),
)
@example(classes=["b", "a"], counts=[1, 2, 1, 1], with_test=True, strays={"macosx", "checkpoints", "fifo", "appledouble"})
@example(classes=["a"], counts=[2, 1, 1, 1], with_test=False, strays={"notes"})
def test_folder_trees_pool_each_image_once_with_its_folders_label_or_are_refused_naming_the_entry(tmp_path, monkeypatch, classes, counts, with_test, strays):
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    root = fresh(tmp_path)
    ordered = sorted(classes)
    expected_x, expected_y = [], []
    for split in ("train", "test") if with_test else ("train",):
        for label, cls in enumerate(ordered):
            for i in range(counts[label] if split == "train" else 1):
                pixels = np.full((6, 6), 10 * label + i + (50 if split == "test" else 0), np.uint8)
                path = root / split / cls / f"{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels).save(path)
                expected_x.append(pixels[None])
                expected_y.append(label)
    names = {what: _write_stray(root, what, ordered[0]) for what in sorted(strays)}
    refusals = [names[w] for w in sorted(strays) if TREE_STRAYS[w][1] == "refused"]
    if refusals:
        message = refused(lambda: F.load_folder(root), refusals[0] if len(refusals) == 1 else "")
        assert any(name in message for name in refusals), message
        return
    for _ in range(2):  # decoded, then from the cache
        with bounded():
            x, y, got_classes = F.load_folder(root)
        assert got_classes == tuple(ordered)
        assert np.array_equal(x, np.stack(expected_x)) and y.tolist() == expected_y


# ------------------------------------------------------------------------ pickles built to expand
def _op_str(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _encode_bomb(size: int, calls: int) -> bytes:
    """A batch whose 'filenames' encode one memoized string of ``size`` characters ``calls``
    times: a few bytes of pickle per call, ``size`` bytes of memory each."""
    body = b"c_codecs\nencode\nq\x00" + _op_str("x" * size) + b"q\x01"
    call = b"h\x00h\x01" + _op_str("latin1") + b"\x86R"
    return b"\x80\x02" + body + b"00}(" + _op_str("filenames") + b"](" + call * calls + b"eu."


def _nested(depth: int) -> list:
    """A list of depth ``depth`` whose two entries are one shared list: a few bytes of pickle
    a level, 2**depth leaves once expanded."""
    value: list = [0]
    for _ in range(depth):
        value = [value, value]
    return value


def _reduce_ndarray(shape: tuple[int, ...]) -> bytes:
    """``numpy.ndarray(shape)`` called by the pickle: an array of any size from a few bytes."""
    dims = b"(" + b"".join(b"J" + struct.pack("<i", d) for d in shape) + b"t"
    return b"\x80\x02}(" + _op_str("data") + b"cnumpy\nndarray\n(" + dims + b"tR" + _op_str("labels") + b"]u."


GOOD = {"data": np.zeros((2, 3072), np.uint8), "fine_labels": [0, 1]}
BOMBS = {
    "encode again and again": lambda n: _encode_bomb(4096, 200 + 40 * n),
    "nested shared labels": lambda n: pickle.dumps({**GOOD, "fine_labels": _nested(20 + n)}, protocol=2),
    "nested shared data": lambda n: pickle.dumps({**GOOD, "data": _nested(20 + n)}, protocol=2),
    "ndarray called": lambda n: _reduce_ndarray((2**15 + n, 2**15)),
    "many arrays": lambda n: pickle.dumps({**GOOD, **{f"a{i}": np.zeros(8, np.uint8) for i in range(16 + n)}}, protocol=2),
    "object data": lambda n: pickle.dumps({**GOOD, "data": np.array([[object()] * 0] * 2, dtype=object).reshape(2, 0)}, protocol=2),
    "bytes claimed": lambda n: b"\x80\x04\x8e" + struct.pack("<Q", 2**33 + n) + b"abc",
    "label past int64": lambda n: pickle.dumps({**GOOD, "fine_labels": [0, 2**70 + n]}, protocol=2),
    "bytes(n) called": lambda n: b"\x80\x02}(" + _op_str("data") + b"c__builtin__\nbytes\nJ" + struct.pack("<i", 2**30 + n) + b"\x85Ru.",
}


@GENERATED
@given(bomb=st.sampled_from(sorted(BOMBS)), n=st.integers(0, 30), target=st.sampled_from(["train", "test"]))
def test_pickles_that_expand_are_refused_in_bounded_time_and_memory_naming_the_batch(tmp_path, bomb, n, target):
    from data_files import write_cifar100

    root = fresh(tmp_path)
    write_cifar100(root, n=4)
    path = root / "cifar-100-python" / target
    path.write_bytes(BOMBS[bomb](n))
    message = refused(lambda: load(root, "CIFAR100"), str(path))
    assert bomb != "encode again and again" or "more bytes than the file holds" in message, message


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("fields", ["lists", "arrays", "empty test"])
def test_the_batch_unpickler_still_reads_what_numpy_writes_in_every_protocol(tmp_path, protocol, fields):
    """The guards admit numpy's own pickles: protocols 2 to 5 (5 is pickle.dump's default from
    Python 3.14), every field as an array (a cut-down copy made with numpy: five arrays, refused
    at a bound of 4), an empty split (protocol 2 calls bytes() for its empty data)."""
    from data_files import write_cifar100

    root = fresh(tmp_path)
    x, y = write_cifar100(root, n=6)
    for split, part in (("train", slice(0, 6)), ("test", slice(6, 6 if fields == "empty test" else 12))):
        n = part.stop - part.start
        entry = {"data": x[part].reshape(n, 3072), "fine_labels": y[part].tolist(), "coarse_labels": (y[part] // 5).tolist(),
                 "filenames": [f"{i}.png".encode() for i in range(n)], "batch_label": f"{split} batch"}  # fmt: skip
        if fields == "arrays":
            entry = {k: np.asarray(v) for k, v in entry.items()}
        (root / "cifar-100-python" / split).write_bytes(pickle.dumps(entry, protocol=protocol))
    got_x, got_y = load(root, "CIFAR100")[:2]
    keep = 6 if fields == "empty test" else 12
    assert np.array_equal(got_x, x[:keep]) and got_y.tolist() == y[:keep].tolist()


# ------------------------------------------------------------------------ -c strings
#: Keys and values a user types, each as TOML renders it.
VALUES = {
    "num-server-rounds": st.integers(1, 50),
    "seed": st.integers(0, 2**31 - 1),
    "lr": st.floats(1e-6, 1.0, allow_nan=False),
    "fraction-train": st.floats(0.05, 1.0, allow_nan=False),
    "dataset": st.sampled_from(["digits", "mnist"]),
    "method": st.sampled_from(["fedavg", "local", "pfedla", "fedper", "ditto"]),
    "partition": st.sampled_from(["iid", "dirichlet", "pathological"]),
}
#: How a typed pair goes wrong: spaces around '=', a string without quotes, a quote left open,
#: a float without a leading digit, a key given twice; None: typed right.
MISTAKES = [None, None, "spaces", "bare string", "open quote", "leading dot", "twice"]


def _typed(key: str, value, quote: str) -> str:
    if isinstance(value, str):
        return f"{key}={quote}{value}{quote}"
    return f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}"


@GENERATED
@given(
    pairs=st.dictionaries(st.sampled_from(sorted(VALUES)), st.none(), min_size=1, max_size=5).flatmap(
        lambda d: st.fixed_dictionaries({k: VALUES[k] for k in d})
    ),
    quote=st.sampled_from(["'", '"']),
    gaps=st.lists(st.sampled_from([" ", "  ", "\t", " \t "]), min_size=5, max_size=5),
    mistake=st.sampled_from(MISTAKES),
)
@example(pairs={"dataset": "mnist", "lr": 0.2}, quote="'", gaps=[" "] * 5, mistake="spaces")  # 'dataset = mnist': Flower dropped it and the defaults ran
def test_c_strings_run_exactly_what_was_typed_or_are_refused_naming_the_pair(pairs, quote, gaps, mistake):
    from flwr.common.config import parse_config_args

    from pflower.check import unparsable, unread

    typed = [_typed(k, v, quote) for k, v in pairs.items()]
    key = next(iter(pairs))
    value = pairs[key]
    if mistake == "spaces":
        typed[0] = typed[0].replace("=", " = ", 1)
    elif mistake == "bare string" and isinstance(value, str):
        typed[0] = f"{key}={value}"
    elif mistake == "open quote" and isinstance(value, str):
        typed[0] = f"{key}={quote}{value}"
    elif mistake == "leading dot" and isinstance(value, float) and repr(value).startswith("0."):
        typed[0] = f"{key}={repr(value)[1:]}"
    elif mistake == "twice":
        typed.append(typed[0])
    else:
        mistake = None
    text = "".join(g + t for g, t in zip(gaps, typed)) + "".join(t for t in typed[len(gaps) :])
    problem = unread(text) or unparsable(text)
    if mistake is None:
        assert problem is None, problem
        assert parse_config_args([text]) == pairs  # what Flower runs is what was typed
    else:
        assert problem is not None and "\n" not in problem and key in problem, (text, problem)


@pytest.mark.parametrize("text", ["fedprox={mu=0.1,}", 'results-dir="r\\e"', "seed=1_000 lr=+0.5 x.y.z=1 \"k\".v=true dataset='a=b c'"])
def test_c_strings_flower_reads_are_never_refused(text):
    """Flower parses -c with tomli (TOML 1.1: trailing commas in inline tables, \\e); the check
    read each pair with the standard library's TOML 1.0 and refused what flwr run accepts."""
    from flwr.common.config import parse_config_args

    from pflower.check import unparsable, unread

    parse_config_args([text])
    assert unread(text) is None and unparsable(text) is None
