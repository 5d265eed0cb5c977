"""dataset='node': every node brings its own data (its node config's data-dir); the server
builds the model from what the nodes say, refuses a node whose images differ, and opens no file."""

import json

import numpy as np
import pytest
from conftest import InProcessGrid, run_config
from PIL import Image

from pflower.datasets.node import class_union, load_node_data, parse_groups, write_node_folders
from pflower.datasets.sources import DataError
from pflower.records import from_record


def node_folders(root, groups, size=8, test_split=True):
    """One image tree per node from scikit-learn's digits: node i has the classes groups[i]."""
    from pflower.datasets.sources import load_digits

    pool = load_digits()
    raw = ((pool.x[:, 0] - pool.x.min()) / (pool.x.max() - pool.x.min()) * 255).numpy().astype(np.uint8)
    dirs = []
    for i, classes in enumerate(groups):
        d = root / f"node{i}"
        for c in classes:
            for j, k in enumerate(np.flatnonzero(pool.y.numpy() == c)[:60]):
                split = "test" if test_split and j % 4 == 0 else "train"
                (d / split / str(c)).mkdir(parents=True, exist_ok=True)
                Image.fromarray(raw[k]).resize((size, size)).save(d / split / str(c) / f"{j}.png")
        dirs.append(d)
    return dirs


def test_class_union_sorts_numbers_as_numbers():
    assert class_union([["10", "2"], ["3", "2"]]) == ["2", "3", "10"]
    assert class_union([["2", "-1"]]) == ["-1", "2"]
    assert class_union([["2", "--1"]]) == ["--1", "2"]  # no number: sorted as text (int('--1') stopped the ServerApp)
    assert class_union([["1", "²"], ["٣"]]) == ["1", "²", "٣"]  # digits int() cannot read, or reads otherwise: names
    assert class_union([["cat", "ant"], ["bee"]]) == ["ant", "bee", "cat"]


def test_class_groups_parse_ranges_and_names():
    assert parse_groups("0-2/7,9") == [["0", "1", "2"], ["7", "9"]]
    assert parse_groups("cat,dog/t-shirt") == [["cat", "dog"], ["t-shirt"]]
    with pytest.raises(ValueError, match="group 1 is empty"):
        parse_groups("0-3//4")


def _idx(path, array):
    path.write_bytes(bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape) + array.tobytes())


def test_node_folders_are_written_from_idx_files_or_an_image_tree(tmp_path, monkeypatch):
    """IDX files name classes by label value; an image tree by folder; every 4th image of a class
    goes to test/, a node gets only its group, and a class the source lacks is named."""
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    idx = tmp_path / "idx"
    idx.mkdir()
    _idx(idx / "t10k-images-idx3-ubyte", rng.integers(0, 255, (60, 6, 6), dtype=np.uint8))
    _idx(idx / "t10k-labels-idx1-ubyte", np.repeat(np.arange(3, 6, dtype=np.uint8), 20))
    a, b = write_node_folders(idx, tmp_path / "from-idx", parse_groups("3-4/5"), per_class=8, image_size=12)
    data = load_node_data({"data-dir": str(a)}, 0.3, 0)
    assert data.names == ("3", "4") and data.shape == (1, 12, 12) and len(data.y) == 16 and int(data.test.sum()) == 4
    assert sorted(p.name for p in (b / "train").iterdir()) == ["5"]
    (tree,) = write_node_folders(a, tmp_path / "from-tree", [["4"]], per_class=3)
    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*.png")) == ["test/4/0.png", "train/4/1.png", "train/4/2.png"]
    with pytest.raises(DataError, match=r"has no class \['7'\]; its classes: 3, 4, 5"):
        write_node_folders(idx, tmp_path / "x", [["3", "7"]])


def test_a_node_reads_its_folder_and_numbers_its_labels_by_the_federations_classes(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    (d,) = node_folders(tmp_path, [[4, 6]])
    data = load_node_data({"data-dir": str(d)}, 0.3, 0)
    assert data.names == ("4", "6") and data.shape == (1, 8, 8) and int(data.test.sum()) == 30
    train, test = data.splits([str(c) for c in range(10)])
    assert set(train.y.tolist()) == {4, 6} and len(train) == 90 and len(test) == 30
    with pytest.raises(ValueError, match=r"lack this node's \['6'\]"):
        data.splits(["4"])
    with pytest.raises(ValueError, match="node config 'format' = 'jpeg'"):
        load_node_data({"data-dir": str(d), "format": "jpeg"}, 0.3, 0)
    with pytest.raises(ValueError, match="this node's config needs 'data-dir'"):
        load_node_data({}, 0.3, 0)


@pytest.mark.parametrize("method", ["fedavg", "pfedla"])
def test_nodes_with_their_own_data_train_and_a_node_of_another_size_is_refused(tmp_path, monkeypatch, caplog, method):
    """Three nodes, each with other classes; a fourth with 16x16 images is refused by name; the
    ServerApp builds a 10-class model from what the nodes say and the run finishes."""
    from flwr.app import Context, RecordDict

    from pflower.client_app.app import app as client_app
    from pflower.server_app import app as server_app

    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    dirs = node_folders(tmp_path, [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]) + node_folders(tmp_path / "odd", [[1, 2]], size=16)
    cfg = run_config(method=method, dataset="node", num_server_rounds=2, local_epochs=1, results_dir=str(tmp_path / "out"))
    grid = InProcessGrid(client_app, cfg, 4, node_configs={i: {"data-dir": str(d)} for i, d in enumerate(dirs)})
    server_app._main(grid, Context(1, 0, {}, RecordDict(), cfg))
    doc = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert sorted(doc["final"]["per-client-accuracy"]) == ["0", "1", "2"] and doc["num-clients"] == 3
    assert doc["client-classes"] == {"0": [0, 1, 2, 3], "1": [4, 5, 6], "2": [7, 8, 9]}
    counts = doc["client-label-counts"]  # each node's samples per class, in the union's numbering
    assert all(len(c) == 10 for c in counts.values()) and [i for i, c in enumerate(counts["1"]) if c] == [4, 5, 6]
    assert (tmp_path / "out" / "partition.png").is_file()
    assert "node 103 (client 3) is refused: its images are (1, 16, 16), the federation's (1, 8, 8)" in caplog.text
    trained = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert all(list(m.content["config"]["class-names"]) == [str(c) for c in range(10)] for m in trained)
    assert all(m.metadata.dst_node_id != 103 for m in grid.sent[4:])  # never asked again
    assert from_record(trained[0].content["arrays"])["head.bias"].shape == (10,)  # a 10-class model from the nodes' classes


def test_a_late_node_with_classes_the_federation_lacks_is_refused_on_arrival(tmp_path, monkeypatch, caplog):
    """A node that missed discovery joins in round 2 with classes 8 and 9, which the agreed
    classes (0-7, fixed at the start) lack: it was registered, sampled every round, and every
    message to it failed. It is refused on arrival, as a late node of another shape is."""
    from flwr.app import Context, RecordDict

    from pflower.client_app.app import app as client_app
    from pflower.server_app import app as server_app

    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    dirs = node_folders(tmp_path, [[0, 1, 2, 3], [4, 5], [6, 7], [8, 9]])
    started = []

    def late(msg, context):
        if msg.metadata.message_type == "train":
            started.append(1)
        if context.node_id == 103 and msg.metadata.message_type == "query" and not started:
            raise RuntimeError("not up yet")
        return client_app(msg, context)

    cfg = {**run_config(dataset="node", num_server_rounds=3, local_epochs=1, results_dir=str(tmp_path / "out")), "round-timeout": 2.0}
    grid = InProcessGrid(late, cfg, 4, node_configs={i: {"data-dir": str(d)} for i, d in enumerate(dirs)})
    server_app._main(grid, Context(1, 0, {}, RecordDict(), cfg))
    assert "node 103 (client 3) is refused: its classes ['8', '9'] are not the federation's" in caplog.text
    doc = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert all(row.get("client-error", 0) == 0 for row in doc["rounds"]), doc["rounds"]
    assert sorted(doc["final"]["per-client-accuracy"]) == ["0", "1", "2"]


def test_node_data_needs_local_test_mode():
    from pflower.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match="'test-mode' = 'both' .* must be 'local' with dataset='node'"):
        load_settings(run_config(dataset="node", test_mode="both"))


def test_node_data_into_a_used_folder_replaces_its_own_and_refuses_anything_else(tmp_path):
    """A second node-data into the same --out: the earlier nodes' folders replaced whole (node 0
    has classes 5 now, not 3, 4 and 5); into a folder with other files: refused, nothing
    touched; a per-class below 1 or a class range too large to be a data set's: refused."""
    rng = np.random.default_rng(0)
    idx = tmp_path / "idx"
    idx.mkdir()
    _idx(idx / "t10k-images-idx3-ubyte", rng.integers(0, 255, (60, 6, 6), dtype=np.uint8))
    _idx(idx / "t10k-labels-idx1-ubyte", np.repeat(np.arange(3, 6, dtype=np.uint8), 20))
    out = tmp_path / "nodes"
    write_node_folders(idx, out, parse_groups("3-4/5"), per_class=4)
    (node0,) = write_node_folders(idx, out, parse_groups("5"), per_class=4)
    assert sorted(p.name for p in out.iterdir()) == ["node0"] and sorted(p.name for p in (node0 / "train").iterdir()) == ["5"]
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"holds notes.txt, which node-data did not write"):
        write_node_folders(idx, out, parse_groups("3"), per_class=4)
    assert (out / "notes.txt").read_text() == "mine" and sorted(p.name for p in (node0 / "train").iterdir()) == ["5"]
    with pytest.raises(ValueError, match="--per-class 0: must be at least 1"):
        write_node_folders(idx, tmp_path / "other", parse_groups("3"), per_class=0)
    with pytest.raises(ValueError, match="range 0-99999999 names more than 10000 classes"):
        parse_groups("0-99999999")
    assert not list(tmp_path.glob(".node-data-*"))
