"""Data sets from disk in torchvision's and Hugging Face's formats (tiny files written here), read
without a network: what pflower pools equals the files (and torchvision's own reading of them),
clear errors for missing files, wrong layouts and unknown columns, and a run on each source."""

import json
import os
import socket

import numpy as np
import pytest
import torch
from conftest import in_process_rounds, run_config
from data_files import hf_dataset, write_cifar100, write_idx_family, write_svhn, write_usps

from pflower.config import ConfigError, load_settings
from pflower.datasets.federated import load_pool
from pflower.datasets.sources import DataError, Source, _normalize, _unit
from pflower.datasets.torchvision_files import load

#: torchvision's name -> writer of its files (the root torchvision is given): n images per split
#: with labels cycling through ``classes``.
WRITERS = {
    "FashionMNIST": lambda root, **kw: write_idx_family(root, "FashionMNIST", **kw),
    "KMNIST": lambda root, **kw: write_idx_family(root, "KMNIST", gz=True, **kw),
    "EMNIST": lambda root, **kw: write_idx_family(root, "EMNIST", **{"classes": 47, **kw}),
    "SVHN": write_svhn,
    "CIFAR100": write_cifar100,
    "USPS": write_usps,
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_torchvision_files_read_as_written_and_as_torchvision_reads_them(tmp_path, monkeypatch, name):
    """pflower's reader gives the files' images and labels, the same as torchvision's dataset
    class on the same files (its checksum test, which tiny files cannot pass, switched off)."""
    import torchvision.datasets as tv
    from torchvision.datasets import cifar, svhn

    x, y = WRITERS[name](tmp_path)
    got_x, got_y = load(tmp_path, name)
    assert np.array_equal(got_x, x) and np.array_equal(got_y, y)
    monkeypatch.setattr(svhn, "check_integrity", lambda *a, **k: True)
    monkeypatch.setattr(cifar, "check_integrity", lambda *a, **k: True)
    if name == "SVHN":
        theirs = tv.SVHN(str(tmp_path), split="test", download=False)
        data, targets = theirs.data, theirs.labels
    else:
        kwargs = {"split": "balanced"} if name == "EMNIST" else {}
        if name == "KMNIST":  # torchvision reads the raw files unzipped
            for gz in (tmp_path / "KMNIST" / "raw").glob("*.gz"):
                import gzip

                gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
        theirs = getattr(tv, name)(str(tmp_path), train=False, download=False, **kwargs)
        data, targets = np.asarray(theirs.data), np.asarray(theirs.targets)
        data = data.transpose(0, 3, 1, 2) if data.ndim == 4 else data[:, None]
        if name == "EMNIST":  # torchvision keeps EMNIST's stored (transposed) orientation
            data = data.transpose(0, 1, 3, 2)
    n = len(targets)
    assert np.array_equal(got_x[-n:], data) and np.array_equal(got_y[-n:], targets)


def test_emnist_letters_are_numbered_from_zero(tmp_path):
    x, y = write_idx_family(tmp_path, "EMNIST", classes=26, split="letters")
    pool = load_pool(Source("torchvision", str(tmp_path), torchvision_name="EMNIST", emnist_split="letters"))
    assert pool.num_classes == 26 and pool.y.tolist() == y.tolist() and min(y) == 0


def test_pool_is_standardized_like_the_other_sources(tmp_path):
    x, _ = write_usps(tmp_path)
    pool = load_pool(Source("torchvision", str(tmp_path), torchvision_name="USPS"))
    assert torch.equal(pool.x, _normalize(_unit(x)))


def test_missing_files_and_wrong_layout_name_what_torchvision_keeps_where(tmp_path):
    cfg = run_config(dataset="torchvision", torchvision_name="FashionMNIST", data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"'data-dir'.*FashionMNIST/raw/train-images-idx3-ubyte"):
        load_settings(cfg)
    write_idx_family(tmp_path / "flat", "FashionMNIST")  # the raw files straight in data-dir: not torchvision's layout
    for f in (tmp_path / "flat" / "FashionMNIST" / "raw").iterdir():
        f.rename(tmp_path / f.name)
    with pytest.raises(ConfigError, match="no FashionMNIST files in torchvision's layout"):
        load_settings(cfg)
    with pytest.raises(ConfigError, match="'emnist-split' = 'letters'.*only for dataset 'torchvision' with torchvision-name 'EMNIST'"):
        load_settings({**cfg, "emnist-split": "letters"})


def test_damaged_files_name_the_file(tmp_path):
    write_svhn(tmp_path)
    (tmp_path / "train_32x32.mat").write_bytes(b"not a mat file")
    with pytest.raises(DataError, match="train_32x32.mat"):
        load(tmp_path, "SVHN")
    write_idx_family(tmp_path, "KMNIST")
    path = tmp_path / "KMNIST" / "raw" / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte is truncated"):
        load(tmp_path, "KMNIST")


@pytest.fixture(scope="module")
def hf_files(tmp_path_factory):
    """One small data set saved by ``save_to_disk`` (as a DatasetDict of two splits) and as parquet."""
    import datasets

    root = tmp_path_factory.mktemp("hf")
    ds, x, y = hf_dataset(n=60)
    datasets.DatasetDict({"train": ds.select(range(40)), "test": ds.select(range(40, 60))}).save_to_disk(str(root / "disk"))
    (root / "parquet").mkdir()
    ds.select(range(40)).to_parquet(str(root / "parquet" / "part-0.parquet"))
    ds.select(range(40, 60)).to_parquet(str(root / "parquet" / "part-1.parquet"))
    return root, x, y, ds


@pytest.mark.parametrize("kind", ["disk", "parquet"])
def test_huggingface_on_disk_offline(hf_files, monkeypatch, kind):
    """Every split (parquet: every file, by name) pooled, in order; read with Hugging Face's offline mode on and every socket
    connection refused."""
    from pflower.datasets import huggingface

    root, x, y, _ = hf_files
    huggingface.open_dataset.cache_clear()

    def no_network(*args, **kwargs):
        raise OSError("network is unreachable (test)")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    path = root / kind if kind == "disk" else root / "parquet"
    pool = load_pool(Source("huggingface", str(path), id_column="writer"))
    assert os.environ["HF_DATASETS_OFFLINE"] == "1" and os.environ["HF_HUB_OFFLINE"] == "1"
    import datasets

    assert datasets.config.HF_DATASETS_OFFLINE and datasets.config.HF_HUB_OFFLINE
    assert torch.equal(pool.x, _normalize(_unit(x)))
    assert pool.y.tolist() == y.tolist() and pool.num_classes == 10
    assert pool.ids.tolist() == [f"w{i % 3}" for i in range(60)]


def test_huggingface_plain_labels_and_array_images(tmp_path):
    """Labels without a ClassLabel are numbered by their sorted values; images may be arrays."""
    import datasets

    images = np.random.default_rng(0).random((9, 6, 6, 3)).astype(np.float32)
    ds = datasets.Dataset.from_dict({"pixels": images.tolist(), "animal": ["dog", "cat", "emu"] * 3})
    ds.save_to_disk(str(tmp_path / "d"))
    s = load_settings(run_config(dataset="huggingface", data_dir=str(tmp_path / "d"), hf_image_column="pixels", hf_label_column="animal", partition="iid"))
    assert s.image_shape == (3, 6, 6) and s.num_classes == 3
    pool = load_pool(s.source)
    assert pool.y.tolist() == [1, 0, 2] * 3  # cat, dog, emu
    assert torch.allclose(pool.x, _normalize(images.transpose(0, 3, 1, 2).copy()))


@pytest.mark.parametrize("shape", [(3, 6, 6), (1, 6, 6), (4, 5, 7), (3, 8, 4), (1, 8, 3)])
def test_huggingface_channels_first_arrays_are_read_as_channels_first(tmp_path, shape):
    """Arrays kept as PyTorch keeps them, [C, H, W]: [3, 6, 6] was refused as [H, W, 6] images;
    each is read with its channels, pixel for pixel. A shape that reads both ways ([3, 8, 4],
    [1, 8, 3]) stays channels last, as it was read before (short channels-last images)."""
    import datasets

    if shape[-1] in (1, 3, 4):  # channels last: [H, W, C] (too small for a model: the reader alone)
        from pflower.datasets.huggingface import _images

        images = np.random.default_rng(1).random((6, *shape)).astype(np.float32)
        assert np.array_equal(_images(images, "pixels", 0), images[..., :3].transpose(0, 3, 1, 2))
        return
    images = np.random.default_rng(1).random((6, *shape)).astype(np.float32)
    datasets.Dataset.from_dict({"pixels": images.tolist(), "animal": [0, 1] * 3}).save_to_disk(str(tmp_path / "d"))
    s = load_settings(run_config(dataset="huggingface", data_dir=str(tmp_path / "d"), hf_image_column="pixels", hf_label_column="animal", partition="iid"))
    want = images[:, :3] if shape[0] == 4 else images  # RGBA: the alpha channel is dropped
    assert s.image_shape == want.shape[1:]
    assert torch.allclose(load_pool(s.source).x, _normalize(want.copy()))


def test_huggingface_errors_name_the_key(hf_files, tmp_path):
    root, *_ = hf_files
    cfg = run_config(dataset="huggingface", data_dir=str(root / "disk"), partition="iid")
    with pytest.raises(ConfigError, match="'hf-label-column' = 'digit'.*no column 'digit'; its columns: image, label, writer"):
        load_settings({**cfg, "hf-label-column": "digit"})
    with pytest.raises(ConfigError, match="'natural-id-column' = 'user'.*no column 'user'"):
        load_settings({**cfg, "partition": "natural-id", "natural-id-column": "user"})
    with pytest.raises(ConfigError, match="'data-dir'.*does not exist"):
        load_settings({**cfg, "data-dir": str(tmp_path / "nothing")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="neither a save_to_disk folder.*nor a .parquet file"):
        load_settings({**cfg, "data-dir": str(tmp_path / "empty")})
    with pytest.raises(ConfigError, match="'natural-id-column'.*needs the column"):
        load_settings({**cfg, "partition": "natural-id"})
    with pytest.raises(ConfigError, match="'hf-image-column' = 'img'.*only for dataset 'huggingface'"):
        load_settings(run_config(hf_image_column="img"))


def _source(tmp_path, name: str) -> dict:
    """Run-config keys of a small fixture of source ``name`` written under ``tmp_path``."""
    if name.startswith("hf-"):
        ds, *_ = hf_dataset(n=60)
        path = tmp_path / "hf"
        ds.save_to_disk(str(path)) if name == "hf-disk" else ds.to_parquet(str(path := tmp_path / "hf.parquet"))
        return {"dataset": "huggingface", "data-dir": str(path), "partition": "natural-id", "natural-id-column": "writer"}
    WRITERS[name](tmp_path, n=30, classes=3)  # 20 samples a client: 2 of each class to test on
    return {"dataset": "torchvision", "torchvision-name": name, "data-dir": str(tmp_path), "partition": "iid"}


@pytest.mark.parametrize("name", [*sorted(WRITERS), "hf-disk", "hf-parquet"])
def test_a_run_on_each_source(tmp_path, monkeypatch, name):
    """Two rounds of FedAvg, 3 clients in process, on each new source, with every socket
    connection refused: the server builds the model from the keys alone (torchvision) or the
    set's first image (Hugging Face)."""
    cfg = {**run_config(method="fedavg", num_server_rounds=2, local_epochs=1), **_source(tmp_path, name)}

    def no_network(*args, **kwargs):
        raise OSError("network is unreachable (test)")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    rows = in_process_rounds(cfg, tmp_path / "run")
    doc = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [1, 2] and all(0 <= r["accuracy"] <= 1 for r in rows)
    assert sum(sum(c) for c in doc["client-label-counts"].values()) == 60
    if name.startswith("hf-"):  # one writer per client: its domain
        assert doc["client-domains"] == {"0": "w0", "1": "w1", "2": "w2"}


class _Payload:
    """A pickle that runs a command when loaded (what a hostile data file holds)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_cifar_batch_that_would_run_code_is_refused_before_anything_runs(tmp_path):
    import pickle

    write_cifar100(tmp_path)
    marker = tmp_path / "ran"
    with open(tmp_path / "cifar-100-python" / "test", "wb") as f:
        pickle.dump({"data": np.zeros((2, 3072), np.uint8), "fine_labels": [0, 1], "x": _Payload(marker)}, f)
    with pytest.raises(DataError, match=r"cifar-100-python/test.*posix\.system.*never hold"):
        load(tmp_path, "CIFAR100")
    assert not marker.exists()


@pytest.mark.parametrize(
    "entry,message",
    [
        ({"data": np.zeros((4, 3072), np.uint8), "fine_labels": [1, 2, 3]}, r"4 images but 'fine_labels' holds 3 labels"),
        ({"data": np.zeros((4, 32, 32, 3), np.uint8), "fine_labels": [1, 2, 3, 4]}, r"'data' is uint8 \[4, 32, 32, 3\]; CIFAR's batches hold uint8 rows"),
        ({"data": np.zeros((4, 3072), np.float32), "fine_labels": [1, 2, 3, 4]}, r"'data' is float32"),
        (7, "has no 'data' and 'fine_labels'"),
    ],
)
def test_a_cifar_batch_whose_images_and_labels_disagree_is_refused(tmp_path, entry, message):
    """Labels that would shift against the images from the next batch on, and images stored in
    another layout that a reshape would scramble, are refused naming the file."""
    import pickle

    write_cifar100(tmp_path)
    with open(tmp_path / "cifar-100-python" / "train", "wb") as f:
        pickle.dump(entry, f)
    with pytest.raises(DataError, match=message):
        load(tmp_path, "CIFAR100")


def test_a_split_with_a_missing_file_is_an_error_not_dropped(tmp_path):
    """CIFAR-10 without data_batch_3: the training split is not silently left out."""
    import pickle

    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    for name in ("data_batch_1", "data_batch_2", "data_batch_4", "data_batch_5", "test_batch"):
        with open(base / name, "wb") as f:
            pickle.dump({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}, f)
    with pytest.raises(DataError, match="a split has some of its files but not cifar-10-batches-py/data_batch_3"):
        load(tmp_path, "CIFAR10")


def test_svhn_labels_shorter_than_its_images_are_refused(tmp_path):
    from scipy.io import loadmat, savemat

    write_svhn(tmp_path)
    mat = loadmat(str(tmp_path / "test_32x32.mat"))
    savemat(str(tmp_path / "test_32x32.mat"), {"X": mat["X"], "y": mat["y"][:-1]})
    with pytest.raises(DataError, match=r"test_32x32.mat: 'X' is \[32, 32, 3, 12\] and 'y' has 11 labels"):
        load(tmp_path, "SVHN")


def _hf_arrays(tmp_path, images, labels, dtype=None):
    """A save_to_disk set of ``images`` (stored as Array2D of ``dtype`` if given) and labels."""
    import datasets

    features = None
    if dtype is not None:
        features = datasets.Features({"pixels": datasets.Array2D(np.shape(images[0]), dtype), "animal": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"pixels": images, "animal": labels}, features=features)
    ds.save_to_disk(str(tmp_path / "d"))
    return Source("huggingface", str(tmp_path / "d"), image_column="pixels", label_column="animal")


@pytest.mark.parametrize("dtype,top", [("uint8", 255), ("int64", 255), ("uint16", 65535), ("float32", 1.0), ("float64", 1.0)])
def test_huggingface_image_scale_follows_the_column_type_not_its_values(tmp_path, dtype, top):
    """Over 2,048 rows (two batches): each image is its values over its type's top, whatever the
    other rows hold; one value over the top is refused naming its row."""
    from pflower.datasets import huggingface

    rng = np.random.default_rng(0)
    n = 2100
    images = (rng.random((n, 4, 4)) * top).astype(dtype)
    images[5] = 0  # a dark image in batch one, a bright one in batch two
    images[2050] = np.asarray(top, dtype=dtype)
    x, y, classes, _ = huggingface.load_hf(str(_hf_arrays(tmp_path, list(images), [i % 2 for i in range(n)], dtype).data_dir), "pixels", "animal")
    assert np.array_equal(x, (images.astype(np.float32) / np.float32(top))[:, None])
    assert classes == 2 and y.tolist() == [i % 2 for i in range(n)]
    if dtype in ("uint8", "uint16"):
        return  # their type holds no value over the top
    over = images.copy()
    over[2070, 1, 1] = 1.02 if top == 1.0 else 256
    huggingface.open_dataset.cache_clear()
    what = "float images are \\[0, 1\\]" if top == 1.0 else "integer images are 0-255"
    with pytest.raises(DataError, match=f"column 'pixels': row 2070 holds values from .* to .*; {what}"):
        huggingface.load_hf(str(_hf_arrays(tmp_path / "over", list(over), [i % 2 for i in range(n)], dtype).data_dir), "pixels", "animal")


@pytest.mark.parametrize("bad,message", [
    ("nan", "row 3 holds values from nan to nan; float images are"),
    ("negative", "row 3 holds values from -0.5 to .*; float images are"),
    ("strings", "holds <U|not arrays|not image pixels"),
])  # fmt: skip
def test_huggingface_images_that_are_not_pixels_are_refused_naming_the_row(tmp_path, bad, message):
    from pflower.datasets import huggingface

    images = np.full((6, 4, 4), 0.5, dtype=np.float32)
    rows = list(images)
    if bad == "nan":
        rows[3] = np.full((4, 4), np.nan, dtype=np.float32)
    elif bad == "negative":
        rows[3] = np.full((4, 4), -0.5, dtype=np.float32)
    else:
        rows = [[["x"] * 4] * 4] * 6
    with pytest.raises(DataError, match=message):
        huggingface.load_hf(str(_hf_arrays(tmp_path, rows, [0, 1] * 3).data_dir), "pixels", "animal")


def test_huggingface_labels_and_ids_that_are_not_one_per_row_are_refused(tmp_path):
    """A null label, a ClassLabel of -1 (no label) or past its classes, an id column that is the
    image column, holds arrays, or has nulls: each refused naming the column and the row, by
    load_settings (what pflower-check and the ServerApp run) where it sees them, else by the loader."""
    import datasets

    from pflower.datasets import huggingface

    images = [np.full((4, 4), 0.5, dtype=np.float32)] * 6
    cfg = run_config(dataset="huggingface", hf_image_column="pixels", hf_label_column="animal", partition="iid")

    def write(name, features=None, **columns):
        rows = {"pixels": images, **columns}
        datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / name))
        huggingface.open_dataset.cache_clear()
        huggingface.hf_info.cache_clear()
        return str(tmp_path / name)

    null = write("null", animal=["a", None, "b", "a", "b", "a"])
    with pytest.raises(ConfigError, match="column 'animal': row 1 has no label \\(null\\)"):
        load_settings({**cfg, "data-dir": null})
    label = datasets.ClassLabel(names=["a", "b"])
    feats = datasets.Features({"pixels": datasets.Array2D((4, 4), "float32"), "animal": label})
    minus = write("minus", feats, animal=[0, 1, -1, 0, 1, 0])
    with pytest.raises(DataError, match="column 'animal': row 2 has label -1, outside its ClassLabel's 2 classes \\(0-1; -1 means no label\\)"):
        huggingface.load_hf(minus, "pixels", "animal")
    ids = write("ids", animal=["a", "b"] * 3, user=["u1", None, "u2", "u1", "u2", "u1"], vec=[[1, 2]] * 6)
    nat = {**cfg, "data-dir": ids, "partition": "natural-id"}
    for column, message in [("pixels", "natural-id-column='pixels': is the image column"),
                            ("vec", "natural-id-column='vec': holds (Sequence|List) values"),
                            ("user", "natural-id-column='user': some rows have no id \\(null\\)")]:  # fmt: skip
        with pytest.raises(ConfigError, match=f"'natural-id-column' = '{column}' is not allowed: {message}"):
            load_settings({**nat, "natural-id-column": column})
        with pytest.raises(DataError, match=message):
            huggingface.load_hf(ids, "pixels", "animal", column)


def test_parquet_files_in_hidden_folders_are_not_read(hf_files, tmp_path):
    """A Hugging Face folder with a stale copy under .cache/ (and a hidden file): only the visible
    Parquet files are pooled (the hidden ones were read too: more samples than the data set has)."""
    import shutil

    from pflower.datasets import huggingface

    root, x, y, _ = hf_files
    folder = tmp_path / "parquet"
    shutil.copytree(root / "parquet", folder)
    (folder / ".cache").mkdir()
    shutil.copy(folder / "part-0.parquet", folder / ".cache" / "old.parquet")
    shutil.copy(folder / "part-1.parquet", folder / ".part-2.parquet")
    huggingface.open_dataset.cache_clear()
    assert load_pool(Source("huggingface", str(folder), id_column="writer")).y.tolist() == y.tolist()


@pytest.mark.parametrize(
    "labels, message",
    [
        ([0.0, 1.0, float("nan"), 1.0], r"column 'label': row 2 has label nan, not a class"),
        ([[0], [1], [0], [1]], r"column 'label': holds (List|Sequence) values"),
        ([{"a": 0}, {"a": 1}, {"a": 0}, {"a": 1}], r"column 'label': holds dict values"),
    ],
    ids=["nan", "lists", "structs"],
)
def test_label_columns_of_nan_lists_or_structs_are_refused_naming_the_column(tmp_path, labels, message):
    """A float label column with a NaN made a class 'nan'; a column of lists or structs raised
    Arrow's ArrowNotImplementedError (a traceback): each is refused naming the column."""
    import datasets
    from PIL import Image

    from pflower.datasets import huggingface

    rows = {"image": [Image.fromarray(np.full((8, 8), i * 40, dtype=np.uint8)) for i in range(4)], "label": labels}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds"))
    huggingface.open_dataset.cache_clear()
    with pytest.raises(DataError, match=message):
        load_pool(Source("huggingface", str(tmp_path / "ds")))
