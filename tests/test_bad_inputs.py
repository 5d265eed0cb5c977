"""Inputs that used to end in a traceback (issue 43, item 11) end in one line naming the key or
the file: a model too large for the images, a state-dir that is a file, a damaged image cache, a
truncated client state on resume, download=true without a network."""

import socket

import numpy as np
import pytest
import torch
from conftest import run_config
from flwr.app import ArrayRecord, RecordDict
from PIL import Image

from pflower.client_app.store import StateError, StateStore
from pflower.config import ConfigError, load_settings
from pflower.datasets import folder as F
from pflower.datasets.sources import DataError, load_cifar


def _tree(root, size=8):
    for c in ("a", "b"):
        (root / "train" / c).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (size, size), (40 * i, 20, 30)).save(root / "train" / c / f"{i}.png")
    return root


@pytest.mark.parametrize("model", ["auto", "cnn", "cnn-bn"])
def test_a_cnn_on_images_smaller_than_it_can_pool_is_refused(tmp_path, monkeypatch, model):
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    cfg = run_config(dataset="imagefolder", data_dir=str(_tree(tmp_path / "t")), image_size=3, model=model, classes_per_client=2)
    with pytest.raises(ConfigError, match=f"run config key 'model' = '{model}' is not allowed: needs images of at least 4x4"):
        load_settings(cfg)
    assert load_settings({**cfg, "image-size": 4}).image_shape == (3, 4, 4)


def test_a_state_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="run config key 'state-dir' = .* is not allowed: is a file; name a folder"):
        load_settings(run_config(state_dir=str(tmp_path / "f")))


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 not a zip", b"garbage"])
def test_a_damaged_image_cache_is_decoded_again(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    root = _tree(tmp_path / "t")
    x, y, classes = F.load_folder(root)
    (cached,) = (tmp_path / "cache").glob("folder-*.npz")
    cached.write_bytes(damage)
    x2, y2, classes2 = F.load_folder(root)
    assert np.array_equal(x, x2) and np.array_equal(y, y2) and classes == classes2
    assert np.load(cached)["x"].shape == x.shape  # replaced by a whole one


def test_a_truncated_client_state_is_named_not_loaded(tmp_path):
    store = StateStore(0, tmp_path / "primary", tmp_path / "old")
    StateStore(0, tmp_path / "old").save("lin", 3, RecordDict({"p": ArrayRecord({"w": torch.ones(50, 50)})}))
    (path,) = (tmp_path / "old").rglob("round-*.state")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(StateError, match=f"the saved client state {path} cannot be read .*it is damaged"):
        store.load("lin", 5)
    assert not list((tmp_path / "primary").rglob("round-*.state"))  # the damage is not copied on


def test_download_without_a_network_is_one_line_naming_download(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("network is unreachable (test)")

    monkeypatch.setattr(socket, "create_connection", offline)
    monkeypatch.setattr(socket.socket, "connect", offline)
    with pytest.raises(DataError, match="download=true: cifar10 could not be fetched into .*; offline, put torchvision's files there and set download=false"):
        load_cifar("cifar10", tmp_path, download=True)


def test_an_image_size_whose_decoded_folder_exceeds_the_machine_is_refused(tmp_path, monkeypatch):
    """6 files of 3x1024x1024 take 90 MiB decoded: refused on a machine of 64 MiB, naming the need."""
    from pflower import config

    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    cfg = run_config(dataset="imagefolder", data_dir=str(_tree(tmp_path / "t")), image_size=1024, classes_per_client=2)
    monkeypatch.setattr(config, "machine_memory", lambda: 64 * 2**20)
    with pytest.raises(
        ConfigError,
        match="'image-size' = 1024 is not allowed: 90 MiB to hold the decoded images at this size, the machine has 64 MiB; choose a smaller image-size",
    ):
        load_settings(cfg)
    monkeypatch.setattr(config, "machine_memory", lambda: 2**30)
    assert load_settings(cfg).image_shape == (3, 1024, 1024)


def test_a_file_name_that_is_not_utf8_reads_like_any_other(tmp_path, monkeypatch):
    """Linux file names are bytes: one that is not UTF-8 is decoded and cached like the others."""
    import os

    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    root = _tree(tmp_path / "t")
    Image.new("RGB", (8, 8), (9, 2, 3)).save(os.fsdecode(bytes(root / "train" / "a") + b"/caf\xe9.png"))
    x, y, classes = F.load_folder(root)
    assert x.shape == (7, 3, 8, 8) and y.tolist() == [0, 0, 0, 0, 1, 1, 1] and F.load_folder(root)[0].shape == x.shape
