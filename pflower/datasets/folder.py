"""Image folders: ``train/<class>/*`` (and optionally ``test/<class>/*``), torchvision's
ImageFolder layout, decoded once and cached.

Classes are the sorted folder names (of both splits); images are decoded with PIL (any format
it reads) to 8 bits a channel, their channels and size taken from the files: one channel count
and one size per data set, or ``image_size`` > 0 to resize every image to that square. 16-bit
grayscale (PIL modes ``I;16*``) is scaled from 0-65535, 32-bit integer grayscale (``I``) from
0-255 (:data:`DEEP_TOP`, which Hugging Face sets share), float
grayscale (``F``) from [0, 1]; a value outside that range, a file that cannot be decoded, a
size that differs without ``image_size``, or mixed channels stop with an error naming the file,
a class folder without images (a class nothing teaches) one naming the folder.

The decoded pool (uint8) is kept in a cache file outside the data folder, which may be
read-only: ``$PFLOWER_CACHE`` or ``~/.cache/pflower``, one file per folder and image size. Its
name holds a key of every file's path, size and modification time: a file added, removed or
changed gives another key, so the folder is decoded again (the stale file is removed).
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPLITS = ("train", "test")
#: Bumped when decoding changes, so a cache decoded the old way is not read again.
DECODER = 2
#: File names that are not images (a folder's own metadata).
SKIP = (".DS_Store", "README", "README.md", "LICENSE", "Thumbs.db", "desktop.ini")
#: Folders that are no class: hidden ones (``.ipynb_checkpoints``) and macOS archives' metadata.
NOT_CLASSES = ("__MACOSX",)


def _class_folder(p: Path) -> bool:
    return p.is_dir() and not p.name.startswith(".") and p.name not in NOT_CLASSES


class FolderError(ValueError):
    """A folder that is not a readable image tree; the message names the folder or the file."""


@dataclass(frozen=True)
class FolderIndex:
    """The files of an image tree: (split, class index, path) in a fixed order, and the classes."""

    root: Path
    classes: tuple[str, ...]
    files: tuple[tuple[str, int, Path], ...]

    def key(self, image_size: int) -> str:
        """A digest of every file's relative path, size and modification time, and the image size."""
        h = hashlib.sha256(f"{image_size}\n{DECODER}\n".encode())
        for _split, label, path in self.files:
            st = path.stat()
            h.update(os.fsencode(path.relative_to(self.root)) + f"\t{label}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())  # a name's bytes, UTF-8 or not
        return h.hexdigest()[:24]


def is_image_folder(root: Path) -> bool:
    """Whether ``root`` has a ``train/`` of class folders."""
    train = root / "train"
    return train.is_dir() and any(_class_folder(p) for p in train.iterdir())


def index_folder(root: Path) -> FolderIndex:
    """The classes and files of the tree under ``root`` (see the module docstring)."""
    if not is_image_folder(root):
        raise FolderError(f"{root} is not an image folder: expected {root / 'train'}/<class>/<images> (and optionally test/<class>/...)")
    classes = sorted({p.name for split in SPLITS if (root / split).is_dir() for p in (root / split).iterdir() if _class_folder(p)})
    files = []
    for split in SPLITS:
        for label, name in enumerate(classes):
            folder = root / split / name
            if folder.is_dir():
                files += [(split, label, p) for p in sorted(folder.iterdir()) if p.is_file() and p.name not in SKIP and not p.name.startswith(".")]
    if not files:
        raise FolderError(f"{root} has class folders but no image files")
    if empty := [name for label, name in enumerate(classes) if label not in {label for _, label, _ in files}]:
        folders = " and ".join(str(root / split / empty[0]) for split in SPLITS if (root / split / empty[0]).is_dir())
        raise FolderError(f"class folder {folders} holds no image files (a class needs images to be learned); add its images or remove it")
    return FolderIndex(root, tuple(classes), tuple(files))


#: The value that is white in each grayscale mode deeper than 8 bits. 32-bit integers carry no
#: bit depth, so they read as 8-bit values (as before) and a larger value is refused, not guessed.
DEEP_TOP = {"I;16": 65535.0, "I;16B": 65535.0, "I;16L": 65535.0, "I": 255.0, "F": 1.0}


def _eight_bits(im, path: Path):
    """``im`` as an 8-bit image of mode L or RGB; deep grayscale scaled, not clipped."""
    from PIL import Image

    if im.mode in ("L", "RGB"):
        return im
    if im.mode in ("1", "LA"):
        return im.convert("L")
    if im.mode in DEEP_TOP:
        a = np.asarray(im, dtype=np.float64)
        top = DEEP_TOP[im.mode]
        if not np.isfinite(a).all() or a.min(initial=0) < 0 or a.max(initial=0) > top:
            raise FolderError(f"image {path} (mode {im.mode}) holds values from {a.min()} to {a.max()}; deep grayscale is read as 0-{top:g}")
        return Image.fromarray(np.rint(a * (255.0 / top)).astype(np.uint8))
    return im.convert("RGB")


def _decode(path: Path, image_size: int) -> np.ndarray:
    """One image as uint8 [C, H, W] (C 1 or 3), resized to image_size if > 0."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            im = _eight_bits(im, path)
            if image_size:
                im = im.resize((image_size, image_size), Image.BILINEAR)
            a = np.asarray(im, dtype=np.uint8)
    except FolderError:
        raise
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
        raise FolderError(f"cannot decode image {path}: {err}") from None
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def decode_folder(index: FolderIndex, image_size: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """All images (uint8 [n, C, H, W]) and labels of ``index``; errors name the file."""
    first = _decode(index.files[0][2], image_size)
    x = np.empty((len(index.files), *first.shape), dtype=np.uint8)
    for i, (_, _, path) in enumerate(index.files):
        a = first if i == 0 else _decode(path, image_size)
        if a.shape != first.shape:
            what = "channels" if a.shape[0] != first.shape[0] else "size"
            raise FolderError(
                f"image {path} is {tuple(a.shape)} (channels, height, width), {index.files[0][2]} is {tuple(first.shape)}: "
                f"one {what} per data set" + ("" if what == "channels" else "; set image-size to resize them")
            )
        x[i] = a
    return x, np.array([label for _, label, _ in index.files], dtype=np.int64)


def cache_dir() -> Path:
    return Path(os.environ.get("PFLOWER_CACHE") or Path.home() / ".cache" / "pflower").expanduser()


def load_folder(root: Path, image_size: int = 0) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(images uint8 [n, C, H, W], labels, classes) of the tree under ``root``, from the cache
    when its files are unchanged, else decoded and cached; the ``train/`` files come first, then
    the ``test/`` ones (:func:`split_sizes`)."""
    index = index_folder(root)
    name = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    key = index.key(image_size)
    directory = cache_dir()
    path = directory / f"folder-{name}-{key}.npz"
    if path.is_file():
        try:
            with np.load(path) as cached:
                x, y = cached["x"], cached["y"]
            if len(x) == len(y) == len(index.files):
                return x, y, index.classes
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass  # a damaged cache file: decoded again and replaced below
    x, y = decode_folder(index, image_size)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(f"folder-{name}-*.npz"):
        stale.unlink(missing_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, x=x, y=y)
    os.replace(tmp, path)  # atomic: processes decoding at once never read half a file
    return x, y, index.classes


def split_sizes(root: Path) -> tuple[int, int]:
    """How many files the tree's ``train/`` and ``test/`` hold (in :func:`load_folder`'s order)."""
    files = index_folder(root).files
    n_train = sum(1 for split, _, _ in files if split == "train")
    return n_train, len(files) - n_train


def folder_shape(root: Path, image_size: int = 0) -> tuple[tuple[int, int, int], int]:
    """(channels, height, width) and number of classes, from the tree's first image and its folders
    (what the server needs to build the model, without decoding the whole tree)."""
    index = index_folder(root)
    c, h, w = _decode(index.files[0][2], image_size).shape
    return (c, h, w), len(index.classes)
