"""A run whose data is wrong never starts: pflower-check (and pflower-sim, and the ServerApp at
start) open the data as every client will and refuse what the clients would find, naming
data-dir or partition and the problem."""

import numpy as np
import pytest
from conftest import ROOT, run_config
from data_files import idx_bytes
from PIL import Image

from pflower.check import check


def _mnist(root, labels=None, size=28, n=20):
    """MNIST IDX files (train, t10k) of ``n`` images each in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for stem in ("train", "t10k"):
        y = np.arange(n) % 10 if labels is None else np.asarray(labels)
        (root / f"{stem}-images-idx3-ubyte").write_bytes(idx_bytes(rng.integers(0, 256, (n, size, size), dtype=np.uint8)))
        (root / f"{stem}-labels-idx1-ubyte").write_bytes(idx_bytes(y))
    return root


def _tree(root, classes, per_class=4, empty=()):
    for c in classes:
        (root / "train" / c).mkdir(parents=True, exist_ok=True)
        for i in range(0 if c in empty else per_class):
            Image.new("RGB", (8, 8), (10 * i, 20, 30)).save(root / "train" / c / f"{i}.png")
    return root


def _overrides(**keys) -> str:
    return " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in keys.items())


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))


def test_label_255_in_mnist_is_refused_naming_data_dir(tmp_path):
    d = _mnist(tmp_path / "m", labels=[*range(10)] * 1 + [255] + list(range(9)))
    why = check(ROOT, _overrides(dataset="mnist", **{"data-dir": str(d), "results-dir": str(tmp_path / "r")}))
    want = f"run config key 'data-dir' = '{d}' is not allowed: {d / 't10k-labels-idx1-ubyte'} holds label 255: mnist's labels are 0..9"
    assert why is not None and want in why


def test_mnist_with_every_3_made_255_is_refused_not_renumbered(tmp_path):
    """Ten distinct labels, one of them 255 (every 3 rewritten): refused; renumbered, 255 was
    class 9 and the digits 4-9 moved down one."""
    d = _mnist(tmp_path / "m", labels=[255 if v == 3 else v for v in [*range(10)] * 2])
    why = check(ROOT, _overrides(dataset="mnist", **{"data-dir": str(d), "results-dir": str(tmp_path / "r")}))
    assert why is not None and "holds label 255: mnist's labels are 0..9" in why


def test_a_truncated_idx_file_is_refused_naming_the_file(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "t10k-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + (10).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + b"\x00" * 100)
    (d / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01" + (10).to_bytes(4, "big") + b"\x01" * 10)
    why = check(ROOT, _overrides(dataset="mnist", **{"data-dir": str(d), "results-dir": str(tmp_path / "r")}))
    assert why is not None and "'data-dir'" in why and "t10k-images-idx3-ubyte is truncated or corrupt" in why


def test_mnist_of_another_image_size_is_refused(tmp_path):
    d = _mnist(tmp_path / "m", size=32)
    why = check(ROOT, _overrides(dataset="mnist", **{"data-dir": str(d), "results-dir": str(tmp_path / "r")}))
    assert why is not None and "the images are (1, 32, 32) (channels, height, width), its first image says (1, 28, 28)" in why


def test_an_empty_class_folder_is_refused_naming_the_class(tmp_path):
    d = _tree(tmp_path / "t", ["a", "b", "c"], empty=("b",))
    why = check(ROOT, _overrides(dataset="imagefolder", **{"data-dir": str(d), "results-dir": str(tmp_path / "r"), "classes-per-client": 2}))
    assert why is not None and f"'data-dir' = '{d}' is not allowed: class folder {d / 'train' / 'b'} holds no image files" in why


def test_a_partition_the_clients_cannot_fill_is_refused_naming_partition_when_the_size_is_known(tmp_path):
    keys = {"results-dir": str(tmp_path / "r"), "partition": "shards", "shards-per-client": 1000}
    assert check(ROOT, _overrides(**keys)) is None  # without the federation's size, the pool only
    why = check(ROOT, _overrides(**keys), num_clients=10)
    assert "run config key 'partition' = 'shards' is not allowed: shards-per-client=1000: 10 clients x 1000 shards" in why
    assert "give at most 89" in why


def test_the_serverapp_refuses_wrong_data_before_any_message(tmp_path, grid_factory):
    from flwr.app import Context, RecordDict

    from pflower.config import ConfigError
    from pflower.server_app import app

    d = _mnist(tmp_path / "m", labels=[*range(10)] + [255] + list(range(9)))
    cfg = run_config(dataset="mnist", data_dir=str(d), results_dir=str(tmp_path / "r"))
    grid = grid_factory(cfg, 2)
    with pytest.raises(ConfigError, match="'data-dir'.*holds label 255: mnist's labels are 0..9"):
        app._main(grid, Context(1, 0, {}, RecordDict(), cfg))
    assert grid.sent == []


def test_an_empty_results_dir_is_refused():
    from pflower.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match="run config key 'results-dir' = ' ' is not allowed: .*must name a folder \\('.' for the current one\\)"):
        load_settings(run_config(results_dir=" "))
