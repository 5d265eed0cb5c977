"""Image folders (dataset='imagefolder', CIFAR as a tree): layout, class order, the cache and its
invalidation, and the errors, on small trees the tests write."""

import time

import numpy as np
import pytest
from conftest import run_config
from PIL import Image

from pflower.config import ConfigError, load_settings
from pflower.datasets import folder as F


def _write(path, value, size=(8, 8), mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode == "L" else (value, 255 - value, 7)).save(path)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "data"
    for c, value in (("zebra", 10), ("apple", 100), ("moon", 200)):
        for i in range(4):
            _write(root / "train" / c / f"{i}.png", value + i)
        _write(root / "test" / c / "t.png", value)
    return root


def test_classes_are_the_sorted_folder_names_and_every_split_is_pooled(tree):
    x, y, classes = F.load_folder(tree)
    assert classes == ("apple", "moon", "zebra")
    assert x.shape == (15, 3, 8, 8) and x.dtype == np.uint8 and np.bincount(y).tolist() == [5, 5, 5]
    assert x[y == 0][:, 0].max() == 103 and x[y == 2][:, 0].min() == 10  # apple is 100.., zebra 10..


def test_a_second_load_reads_the_cache_and_a_changed_file_decodes_again(tree, monkeypatch):
    F.load_folder(tree)
    calls = []
    real = F._decode
    monkeypatch.setattr(F, "_decode", lambda p, s: calls.append(p) or real(p, s))
    x, _, _ = F.load_folder(tree)
    assert calls == []  # from the cache
    time.sleep(0.01)
    _write(tree / "train" / "apple" / "0.png", 50)  # changed content and mtime
    x2, y2, _ = F.load_folder(tree)
    assert len(calls) == 15 and x2[y2 == 0][:, 0].min() == 50
    assert len(list((tree.parent / "cache").glob("folder-*.npz"))) == 1  # the stale cache went


def test_a_corrupt_file_is_named(tree):
    bad = tree / "train" / "moon" / "broken.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(F.FolderError, match=r"cannot decode image .*moon/broken.png"):
        F.load_folder(tree)


def test_one_size_per_data_set_or_image_size(tree):
    _write(tree / "train" / "apple" / "big.png", 30, size=(12, 10))
    with pytest.raises(F.FolderError, match=r"big.png is \(3, 10, 12\) .* one size per data set; set image-size"):
        F.load_folder(tree)
    x, _, _ = F.load_folder(tree, image_size=6)
    assert x.shape[1:] == (3, 6, 6)


def test_grayscale_trees_have_one_channel_and_mixed_channels_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "gray"
    for c in ("0", "1"):
        for i in range(3):
            _write(root / "train" / c / f"{i}.png", 40 * i, mode="L")
    assert F.load_folder(root)[0].shape == (6, 1, 8, 8)
    _write(root / "train" / "1" / "rgb.png", 5)
    with pytest.raises(F.FolderError, match="rgb.png .* one channels per data set"):
        F.load_folder(root)


def test_settings_read_the_shape_and_classes_from_the_tree(tree):
    s = load_settings(run_config(dataset="imagefolder", data_dir=str(tree), classes_per_client=2))
    assert s.image_shape == (3, 8, 8) and s.num_classes == 3
    with pytest.raises(ConfigError, match="'image-size' = 16 .* only for image folders"):
        load_settings(run_config(image_size=16))
    with pytest.raises(ConfigError, match=r"'data-dir' .* is not an image folder: expected .*/train/<class>"):
        load_settings(run_config(dataset="imagefolder", data_dir=str(tree / "train")))


def test_a_federation_trains_on_an_image_folder(tree, grid_factory, tmp_path):
    from pflower.build import build_strategy

    cfg = run_config(method="fedavg", dataset="imagefolder", data_dir=str(tree), partition="iid", num_server_rounds=2,
                     local_epochs=1, model="cnn", results_dir=str(tmp_path / "out"))  # fmt: skip
    result = build_strategy(load_settings(cfg)).start(grid=grid_factory(cfg, 3))
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]


@pytest.mark.parametrize("kind", ["I;16 png", "I tiff", "F tiff"])
def test_deep_grayscale_is_scaled_to_eight_bits_not_clipped(tmp_path, monkeypatch, kind):
    """A 16-bit PNG (PIL mode I;16), a 32-bit integer TIFF (I) and a float TIFF (F) read as their
    values over their mode's white (65535, 255 and 1: F.DEEP_TOP) times 255, rounded; a value
    past that range is refused naming the file. A cache decoded by an older decoder is not read again."""
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    mode, ext = kind.split()
    top = F.DEEP_TOP[mode]
    ramp = np.linspace(0, top, 64).reshape(8, 8)
    a = ramp.astype(np.float32 if mode == "F" else np.uint16 if mode == "I;16" else np.int32)
    root = tmp_path / "deep"
    for c in ("0", "1"):
        (root / "train" / c).mkdir(parents=True)
        Image.fromarray(a).save(root / "train" / c / f"x.{ext}")
    assert Image.open(root / "train" / "0" / f"x.{ext}").mode == mode
    x, _, _ = F.load_folder(root)
    assert np.array_equal(x[0, 0], np.rint(a.astype(np.float64) * 255 / top).astype(np.uint8))
    assert len(np.unique(x[0])) > 50  # a ramp, not black and white
    key = F.index_folder(root).key(0)
    monkeypatch.setattr(F, "DECODER", F.DECODER - 1)
    assert F.index_folder(root).key(0) != key
    over = a.copy()
    over[0, 0] = 1.5 if mode == "F" else 256 if mode == "I" else 0
    if mode == "I;16":
        return  # its type holds nothing outside 0-65535
    Image.fromarray(over).save(root / "train" / "1" / f"x.{ext}")
    with pytest.raises(F.FolderError, match=f"image .*1/x.{ext} \\(mode {mode}\\) holds values from .*; deep grayscale is read as 0-{top:g}"):
        F.decode_folder(F.index_folder(root))


@pytest.mark.parametrize("stray", ["train/__MACOSX/apple/._0.png", "train/.ipynb_checkpoints/x.png", "train/apple/Thumbs.db", "test/moon/desktop.ini"])
def test_archive_metadata_hidden_folders_and_shell_files_are_not_classes_or_images(tree, stray):
    """A macOS archive's __MACOSX folder or a hidden folder is no class (one was counted, then the
    run stopped with a traceback); Windows' Thumbs.db and desktop.ini are no images (one stopped
    the run): the tree reads as without them."""
    (tree / stray).parent.mkdir(parents=True, exist_ok=True)
    (tree / stray).write_bytes(b"\0junk")
    x, y, classes = F.load_folder(tree)
    assert classes == ("apple", "moon", "zebra") and x.shape == (15, 3, 8, 8)


def test_a_model_too_large_for_the_machine_is_refused_before_it_is_built(tree, monkeypatch):
    """model='leaf-cnn' image-size=1024: its dense layer alone has billions of parameters (a
    32 GiB model, asked for at the first message): refused naming image-size, counted on
    PyTorch's meta device without allocating it; at image-size=28 it passes."""
    from pflower import build

    monkeypatch.setattr(build, "machine_memory", lambda: 8 * 2**30)
    cfg = run_config(dataset="imagefolder", data_dir=str(tree), model="leaf-cnn", image_size=1024, classes_per_client=2)
    with pytest.raises(
        ConfigError, match=r"'image-size' = 1024 is not allowed: model 'leaf-cnn' on inputs \(3, 1024, 1024\) has [\d,]+ parameters: .* GiB for a client"
    ):
        build.check_model(load_settings(cfg))
    build.check_model(load_settings({**cfg, "image-size": 28}))


@pytest.mark.parametrize("dataset", ["imagefolder", "cifar10"])
def test_an_undecodable_first_image_is_refused_naming_data_dir_and_the_file_not_a_traceback(tmp_path, dataset):
    """The first image of the tree sets the model's input shape: a zero-byte file there raised
    FolderError out of load_settings (a later one was already refused in one line)."""
    for cls in ["a", "b"] if dataset == "imagefolder" else [f"c{i}" for i in range(10)]:
        for i in range(2):
            path = tmp_path / "train" / cls / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(path)
    first = tmp_path / "train" / ("a" if dataset == "imagefolder" else "c0") / "0.png"
    first.write_bytes(b"")
    with pytest.raises(ConfigError, match=f"data-dir.*cannot decode image {first}") as err:
        load_settings(run_config(dataset=dataset, data_dir=str(tmp_path)))
    assert "\n" not in str(err.value)
