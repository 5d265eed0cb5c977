"""IDX reading (gzipped and raw), MNIST from the shared folder, and clear errors for bad files."""

import gzip

import numpy as np
import pytest
import torch
from conftest import MNIST_DIR, NO_MNIST

from pflower.datasets.sources import DataError, load_digits, load_idx_family, read_idx


def _idx_bytes(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def _write_mnist_like(root, n=20, gz=True, name="train"):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = np.arange(n, dtype=np.uint8) % 10
    for stem, arr in ((f"{name}-images-idx3-ubyte", imgs), (f"{name}-labels-idx1-ubyte", labels)):
        data = _idx_bytes(arr)
        if gz:
            (root / f"{stem}.gz").write_bytes(gzip.compress(data))
        else:
            (root / stem).write_bytes(data)
    return imgs, labels


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_roundtrip(tmp_path, gz):
    imgs, labels = _write_mnist_like(tmp_path, gz=gz)
    suffix = ".gz" if gz else ""
    assert np.array_equal(read_idx(tmp_path / f"train-images-idx3-ubyte{suffix}"), imgs)
    assert np.array_equal(read_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}"), labels)


def test_pool_concatenates_splits(tmp_path):
    _write_mnist_like(tmp_path, n=20, name="train")
    _write_mnist_like(tmp_path, n=10, name="t10k", gz=False)
    pool = load_idx_family("mnist", tmp_path)
    assert pool.x.shape == (30, 1, 28, 28) and pool.y.shape == (30,)
    assert pool.num_classes == 10
    assert abs(float(pool.x.mean())) < 1e-4  # standardized


def test_missing_files_name_the_folder(tmp_path):
    with pytest.raises(DataError, match=str(tmp_path)):
        load_idx_family("mnist", tmp_path)


def test_missing_labels_file(tmp_path):
    _write_mnist_like(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz"):
        load_idx_family("mnist", tmp_path)


def test_truncated_file(tmp_path):
    _write_mnist_like(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="truncated or corrupt"):
        load_idx_family("mnist", tmp_path)


def test_corrupt_gzip(tmp_path):
    _write_mnist_like(tmp_path)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot read IDX file"):
        load_idx_family("mnist", tmp_path)


def test_digits_is_embedded_and_equals_sklearns_loader():
    from sklearn.datasets import load_digits as sk_digits

    from pflower.datasets.sources import _normalize

    pool, d = load_digits(), sk_digits()
    assert pool.x.shape == (1797, 1, 8, 8) and pool.num_classes == 10
    assert torch.equal(pool.x, _normalize(d.images.astype(np.float32)[:, None] / 16.0))
    assert pool.y.tolist() == d.target.tolist()


@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason=NO_MNIST)
def test_shared_mnist_folder_loads():
    pool = load_idx_family("mnist", MNIST_DIR)
    assert pool.x.shape == (10000, 1, 28, 28)
    assert np.bincount(pool.y.numpy()).tolist()[0] == 980  # MNIST t10k has 980 zeros


def test_idx_files_kept_both_raw_and_gzipped_are_read_once(tmp_path):
    """torchvision's MNIST/raw holds every IDX file twice (unzipped and .gz): one pool of 20."""
    import gzip

    _write_mnist_like(tmp_path, n=20, name="train")
    for gz in list(tmp_path.glob("*.gz")):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
    assert len(load_idx_family("mnist", tmp_path).y) == 20


@pytest.mark.parametrize("copy", ["train-images-idx3-ubyte.gz.bak", "train-images-idx3-ubyte.orig", "._train-images-idx3-ubyte.gz"])
def test_copies_and_hidden_files_beside_the_idx_files_are_not_read(tmp_path, copy):
    """A backup copy or macOS's '._' file named like an IDX file is neither pooled (the glob took
    '.bak' copies: twice the images) nor read as IDX (a '._' file is 'bad magic number')."""
    _write_mnist_like(tmp_path, n=20)
    (tmp_path / copy).write_bytes(b"\0\5\26\7" + b"junk")
    (tmp_path / copy.replace("images-idx3", "labels-idx1")).write_bytes(b"junk")
    assert len(load_idx_family("mnist", tmp_path).y) == 20


@pytest.mark.parametrize("which", ["images", "labels"])
def test_a_fifo_named_like_an_idx_file_is_refused_not_waited_on(tmp_path, which):
    """A FIFO where an IDX file belongs: refused naming it (opening it blocked forever)."""
    import os

    _write_mnist_like(tmp_path, n=20, gz=False)
    fifo = tmp_path / ("train-images-idx3-ubyte" if which == "images" else "train-labels-idx1-ubyte")
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=f"{fifo} is not a regular file"):
        load_idx_family("mnist", tmp_path)


def test_mnist_labels_outside_0_to_9_are_refused_naming_the_file(tmp_path):
    """A label 255 in MNIST's labels file: refused (it was renumbered into class 9, shifting the
    others), as torchvision's reader refuses it."""
    _write_mnist_like(tmp_path, n=20, gz=False)
    labels = tmp_path / "train-labels-idx1-ubyte"
    data = bytearray(labels.read_bytes())
    data[-1] = 255
    labels.write_bytes(bytes(data))
    with pytest.raises(DataError, match=f"{labels} holds label 255: mnist's labels are 0..9"):
        load_idx_family("mnist", tmp_path)


@pytest.mark.parametrize("gzipped", ["images", "labels"])
def test_gzipped_images_with_raw_labels_and_the_other_way_round_are_read(tmp_path, gzipped):
    """One file of a pair gzipped, the other not: read as the pair it is (it was refused for a
    missing labels file)."""
    imgs, labels = _write_mnist_like(tmp_path, n=20, gz=True)
    keep = "images" if gzipped == "images" else "labels"
    other = next(tmp_path.glob("*-labels-*" if keep == "images" else "*-images-*"))
    other.with_suffix("").write_bytes(gzip.decompress(other.read_bytes()))
    other.unlink()
    pool = load_idx_family("mnist", tmp_path)
    assert pool.y.tolist() == labels.tolist() and len(pool.x) == 20
