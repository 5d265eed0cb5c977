"""A SuperNode's own data (``dataset='node'``): its node config names it; nothing is partitioned.

Node config: ``data-dir`` (required) and ``format``: ``imagefolder`` (the default: ``train/<class>/``
is all its training data, ``test/<class>/`` its test split) or ``mnist``, ``fashion-mnist``,
``emnist`` (the IDX files those sources read); ``image-size`` resizes an image tree. Without test
files (and for IDX files, whose splits are pooled) a stratified ``test-fraction`` (the run
config's) of it is held out. Images are standardized per channel over the node's own data.

A node's classes are its folder names (IDX: its label values, as text). The server collects every
node's names and sends their union (:func:`class_union`) with every message under
``CLASS_NAMES``; a node maps its labels to the union's indices, so every node agrees on what
output unit a class is.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pflower.datasets.federated import Split
from pflower.datasets.partition import train_test_split
from pflower.datasets.sources import DataError, _normalize, _unit

#: The config key of the federation's class names, sent with every message (both sides use it).
CLASS_NAMES = "class-names"
#: The identity reply's record of a node's own data: its ``CLASS_NAMES`` and input ``shape``.
IDENTITY = "identity"
FORMATS = ("imagefolder", "mnist", "fashion-mnist", "emnist")


@dataclass(frozen=True)
class NodeData:
    """A node's data: images, labels as indices into ``names``, and which samples are its test split."""

    x: torch.Tensor
    y: torch.Tensor
    test: torch.Tensor  # bool [n]
    names: tuple[str, ...]

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.x.shape[1:])  # type: ignore[return-value]

    @property
    def num_train(self) -> int:
        return int((~self.test).sum())

    def splits(self, union: Sequence[str]) -> tuple[Split, Split]:
        """(train, test) with labels numbered by ``union`` (the federation's class names)."""
        missing = [n for n in self.names if n not in union]
        if missing:
            raise ValueError(f"the federation's classes {list(union)[:10]} lack this node's {missing[:5]}")
        index = torch.tensor([list(union).index(n) for n in self.names])
        y = index[self.y]
        return Split(self.x[~self.test], y[~self.test]), Split(self.x[self.test], y[self.test])


def _whole(text: str) -> bool:
    """Whether ``text`` is a whole number in ASCII digits (``'²'.isdigit()`` is true, ``int('²')`` fails)."""
    return text.isascii() and text.isdigit()


def class_union(names: Iterable[Sequence[str]]) -> list[str]:
    """Every node's class names once, sorted (as numbers when all are whole numbers)."""
    union = {str(n) for node in names for n in node}
    return sorted(union, key=int) if all(_whole(n.removeprefix("-")) for n in union) else sorted(union)


@lru_cache(maxsize=4)
def _load(data_dir: str, fmt: str, image_size: int, test_fraction: float, seed: int) -> NodeData:
    root = Path(data_dir).expanduser()
    if fmt == "imagefolder":
        from pflower.datasets.folder import FolderError, load_folder, split_sizes

        try:
            raw, labels, names = load_folder(root, image_size)
            n_train, n_test = split_sizes(root)
        except FolderError as err:
            raise DataError(str(err)) from None
        x = _normalize(_unit(raw))
        y = torch.from_numpy(labels)
        test = torch.arange(len(y)) >= n_train if n_test else None
    else:
        from pflower.datasets.sources import load_idx_family

        pool = load_idx_family(fmt, root)
        values, local = np.unique(pool.y.numpy(), return_inverse=True)
        x, y, names, test = pool.x, torch.from_numpy(local), tuple(str(v) for v in values), None
    if test is None:  # no test files: a stratified share of its data
        idx = np.arange(len(y))
        _, te = train_test_split(idx, y.numpy(), test_fraction, seed)
        test = torch.zeros(len(y), dtype=torch.bool)
        test[torch.from_numpy(te)] = True
    return NodeData(x, y, test, tuple(names))


def load_node_data(node_config: Mapping[str, Any], test_fraction: float, seed: int) -> NodeData:
    """The data a node's config names (see the module docstring); ValueError naming the key."""
    data_dir = str(node_config.get("data-dir", ""))
    if not data_dir:
        raise ValueError("dataset='node': this node's config needs 'data-dir' (its own data)")
    fmt = str(node_config.get("format", "imagefolder"))
    if fmt not in FORMATS:
        raise ValueError(f"node config 'format' = {fmt!r}: must be one of {', '.join(FORMATS)}")
    return _load(str(Path(data_dir).expanduser().resolve()), fmt, int(node_config.get("image-size", 0)), test_fraction, seed)


#: The most classes a node's group may name (a range included): more than any data set pflower reads has.
MAX_GROUP = 10_000


def parse_groups(text: str) -> list[list[str]]:
    """``"0-3/4-6/7-9"`` or ``"cat,dog/ship"``: one class group per node, ``a-b`` a range of whole numbers."""
    groups = []
    for part in text.split("/"):
        names: list[str] = []
        for item in filter(None, (s.strip() for s in part.split(","))):
            lo, _, hi = item.partition("-")
            if _whole(lo) and _whole(hi) and int(hi) - int(lo) >= MAX_GROUP:
                raise ValueError(f"class groups {text!r}: range {item} names more than {MAX_GROUP} classes")
            names += [str(v) for v in range(int(lo), int(hi) + 1)] if _whole(lo) and _whole(hi) else [item]
        if not names:
            raise ValueError(f"class groups {text!r}: group {len(groups)} is empty")
        groups.append(names)
    return groups


def write_node_folders(source: Path, out: Path, groups: Sequence[Sequence[str]], per_class: int = 200,
                       test_every: int = 4, image_size: int = 0) -> list[Path]:  # fmt: skip
    """Write one image tree per node (``out/node<i>/{train,test}/<class>/*.png``, every
    ``test_every``-th image of a class in ``test/``) holding ``per_class`` images of each class
    in ``groups[i]``, taken from a pooled source: IDX files (MNIST-like, classes named by label
    value) or an image tree (class folder names). For demos and tests of ``dataset='node'``.

    ``out`` is written whole or not at all: the folders are written beside it and moved in; an
    ``out`` of an earlier node-data (only ``node<i>`` folders) is replaced, any other non-empty
    folder refused."""
    if per_class < 1:
        raise ValueError(f"--per-class {per_class}: must be at least 1 image of each class per node")
    from pflower.datasets.folder import FolderError, is_image_folder, load_folder
    from pflower.datasets.sources import _idx_pairs, read_idx

    if pairs := _idx_pairs(source, "mnist") or _idx_pairs(source, "emnist"):
        x = np.concatenate([read_idx(img) for img, _ in pairs])[:, None]
        labels = np.concatenate([read_idx(lbl) for _, lbl in pairs])
        values = np.unique(labels)
        y, names = np.searchsorted(values, labels), [str(v) for v in values]
    elif is_image_folder(source):
        try:
            x, y, names = load_folder(source)
        except FolderError as err:
            raise DataError(str(err)) from None
    else:
        raise DataError(f"{source} has neither IDX files (train-images-idx3-ubyte...) nor train/<class>/ image folders")
    if unknown := sorted({c for g in groups for c in g} - set(names)):
        raise DataError(f"{source} has no class {unknown[:5]}; its classes: {', '.join(list(names)[:20])}")
    out = Path(out)
    if out.exists() and (others := sorted(p.name for p in out.iterdir() if not re.fullmatch(r"node\d+", p.name))):
        raise DataError(f"{out} holds {', '.join(others[:5])}, which node-data did not write: give --out an empty or new folder")
    new = Path(tempfile.mkdtemp(prefix=".node-data-", dir=out.parent if out.parent.exists() else None))
    try:
        _write_nodes(new, x, y, names, groups, per_class, test_every, image_size)
        if out.exists():  # an earlier node-data's folders: replaced whole, none of theirs kept
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        new.rename(out)
    finally:
        shutil.rmtree(new, ignore_errors=True)
    return [out / f"node{i}" for i in range(len(groups))]


def _write_nodes(out: Path, x, y, names, groups, per_class: int, test_every: int, image_size: int) -> None:
    from PIL import Image

    for i, group in enumerate(groups):
        node = out / f"node{i}"
        node.mkdir(parents=True)
        for c in group:
            for j, k in enumerate(np.flatnonzero(y == list(names).index(c))[:per_class]):
                folder = node / ("test" if j % test_every == 0 else "train") / c
                folder.mkdir(parents=True, exist_ok=True)
                img = Image.fromarray(x[k].transpose(1, 2, 0).squeeze(-1) if x.shape[1] == 1 else x[k].transpose(1, 2, 0))
                (img.resize((image_size, image_size)) if image_size else img).save(folder / f"{j}.png")
