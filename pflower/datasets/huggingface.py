"""Hugging Face data sets saved on disk, read with Hugging Face's offline mode forced.

``data-dir`` is a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``
(every split pooled), a ``.parquet`` file, or a folder of them (as on the Hub: every
``*.parquet`` below it, pooled). The image column holds images (``datasets.Image``, decoded
with PIL, each scaled by its own mode; a palette, CMYK or YCbCr image is read as RGB) or arrays
([H, W] or [H, W, C]; uint8 and integers 0-255, uint16 0-65535, floats in [0, 1]: the type sets
the scale, a value outside it is an error naming its row); the label column a
``ClassLabel`` (its classes, in its order) or plain values (their sorted distinct values are the
classes). One image size and channel count per data set.

Before ``datasets`` is imported here, ``HF_DATASETS_OFFLINE=1`` and ``HF_HUB_OFFLINE=1`` are set
(and, if another module imported it first, its config is set offline too): nothing reaches a
network, and a missing file is an error instead of a download.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pflower.datasets.folder import DEEP_TOP
from pflower.datasets.sources import DataError, Pool, Source, _normalize

#: The environment that keeps ``datasets`` and ``huggingface_hub`` off the network.
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def offline_datasets():
    """The ``datasets`` module with Hugging Face's offline mode on (set before its first import)."""
    os.environ.update(OFFLINE)
    import datasets
    import huggingface_hub.constants

    datasets.config.HF_DATASETS_OFFLINE = True  # if it was imported before the environment was set
    datasets.config.HF_HUB_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    return datasets


def _parquet_files(path: Path) -> list[Path]:
    """``path`` if it is a Parquet file, else the Parquet files below it, hidden ones (and those in
    hidden folders, a ``.cache``) left out."""
    if path.is_file() and path.suffix == ".parquet":
        return [path]
    if not path.is_dir():
        return []
    return sorted(p for p in path.rglob("*.parquet") if not any(part.startswith(".") for part in p.relative_to(path).parts))


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a ``save_to_disk`` folder (of a Dataset or a DatasetDict)."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def layout_problem(path: Path) -> str | None:
    """Why ``path`` is not a data set this module reads, or None."""
    if not path.exists():
        return f"{path} does not exist"
    if is_saved_dataset(path) or _parquet_files(path):
        return None
    return f"{path} is neither a save_to_disk folder (with dataset_info.json and state.json, or dataset_dict.json) nor a .parquet file or a folder of them"


@lru_cache(maxsize=4)
def open_dataset(path: str):
    """The data set at ``path`` as one ``datasets.Dataset`` (every split pooled, in their order)."""
    datasets = offline_datasets()
    root = Path(path)
    if problem := layout_problem(root):
        raise DataError(problem)
    try:
        if is_saved_dataset(root):
            ds = datasets.load_from_disk(str(root))
            parts = list(ds.values()) if isinstance(ds, datasets.DatasetDict) else [ds]
        else:
            import pyarrow.parquet as pq
            from datasets.table import InMemoryTable

            parts = [datasets.Dataset(InMemoryTable(pq.read_table(f))) for f in _parquet_files(root)]
        for part in parts:  # Arrow reads a damaged file's lengths as they are: refused here, never read past its end
            part.data.table.validate(full=True)
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    except Exception as err:  # noqa: BLE001 - datasets and pyarrow raise nearly anything on a damaged file (KeyError, IndexError, ArrowException, ...)
        if empty := _empty_splits(root):
            where = "" if empty == ["."] else f" in its split {', '.join(empty)} (datasets cannot read an empty saved split back; remove it)"
            raise DataError(f"the data set {root} has no rows{where}") from None
        raise DataError(f"cannot read the Hugging Face data set {root}: {err!r:.500}") from None


def _empty_splits(root: Path) -> list[str]:
    """The save_to_disk folders under ``root`` (itself, or its splits) whose state.json lists no data file."""
    empty = []
    for state in [root / "state.json", *sorted(root.glob("*/state.json"))]:
        try:
            if state.is_file() and json.loads(state.read_text()).get("_data_files") == []:
                empty.append(str(state.parent.relative_to(root)))
        except (OSError, ValueError, AttributeError):
            continue  # damaged: the error itself is reported
    return empty


@contextmanager
def _naming(path: str) -> Iterator[None]:
    """A DataError raised inside names the data set at ``path`` (the column errors name only the column and row)."""
    try:
        yield
    except DataError as err:
        if path in str(err):
            raise
        raise DataError(f"{err} (in the data set {path})") from None


def check_columns(ds, columns: dict[str, str]) -> None:
    """DataError naming the key of each column the data set lacks, with the columns it has."""
    for key, column in columns.items():
        if column not in ds.column_names:
            raise DataError(f"{key}={column!r}: the data set has no column {column!r}; its columns: {', '.join(ds.column_names)}")


def pixel_dtype(feature: Any) -> np.dtype | None:
    """The pixel type an image column declares (an array's or a list's values), or None for
    decoded images (``datasets.Image``: the decoded arrays' own type). Hugging Face's numpy
    format widens every integer to int64, so the declaration is the only place uint16 shows."""
    while hasattr(feature, "feature"):
        feature = feature.feature
    dtype = getattr(feature, "dtype", None)
    try:
        return np.dtype(dtype) if isinstance(dtype, str) else None
    except TypeError:
        return None


def _images(batch: Any, column: str, first: int, declared: np.dtype | None = None, decoded: bool = False) -> np.ndarray:
    """A batch of the image column as float32 [n, C, H, W] in [0, 1].

    Decoded images are [H, W, channels]. Arrays may also be channels first, as PyTorch keeps
    them: [C, H, W] with C 1, 3 or 4 and a last dimension that is no channel count ([3, 32, 32],
    [1, 28, 28]) is read so (it was refused as [H, W, 32] images). A shape both ways could
    read ([3, 8, 4], [1, 8, 3]) is read channels last, as Hugging Face's image arrays are.

    The scale follows the column's type (``declared``, else the batch's), never its values:
    uint8 and other integers are 0-255, uint16 is 0-65535, floats are [0, 1]. A value outside
    its type's range (or not finite) is an error naming its row: one odd pixel never rescales
    a whole batch.
    """
    try:
        a = np.asarray(batch) if not isinstance(batch, np.ndarray) or batch.dtype != object else np.stack(list(batch))
    except (ValueError, TypeError):
        raise DataError(f"column {column!r}: the images from row {first} on differ in size or channels, or are not arrays; one size per data set") from None
    if a.ndim == 3:
        a = a[:, :, :, None]
    if not decoded and a.ndim == 4 and a.shape[1] in (1, 3, 4) and a.shape[-1] not in (1, 3, 4):
        a = a.transpose(0, 2, 3, 1)  # channels first
    if a.ndim != 4 or a.shape[-1] not in (1, 3, 4):
        raise DataError(f"column {column!r}: rows from {first} on are {a.shape[1:]}, not images [H, W], [H, W, channels] or [channels, H, W]")
    a = a[..., :3] if a.shape[-1] == 4 else a  # RGBA: the alpha channel is dropped
    kind = declared if declared is not None else a.dtype
    if kind == np.bool_:
        top, what = 1.0, "boolean images are 0 and 1"
    elif kind == np.uint16:
        top, what = 65535.0, "uint16 images are 0-65535"
    elif np.issubdtype(kind, np.integer):
        top, what = 255.0, "integer images are 0-255 (uint8)"
    elif np.issubdtype(kind, np.floating):
        top, what = 1.0, "float images are [0, 1]"
    else:
        raise DataError(f"column {column!r}: rows from {first} on hold {kind} values, not image pixels (integers or floats)")
    flat = a.reshape(len(a), -1)
    bad = ~np.isfinite(flat).all(axis=1) | (flat.min(axis=1, initial=0) < 0) | (flat.max(axis=1, initial=0) > top) if len(a) else np.zeros(0, bool)
    if bad.any():
        row = int(np.argmax(bad))
        raise DataError(f"column {column!r}: row {first + row} holds values from {flat[row].min()} to {flat[row].max()}; {what}")
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2), dtype=np.float32) / np.float32(top)


#: The modes a decoded image keeps, with the value its type's top is (8-bit 255, 16-bit 65535,
#: float and bilevel 1, 32-bit integers 255 as their arrays read); every other mode is converted.
KEPT_MODES = {"1": 1.0, "L": 255.0, "RGB": 255.0, **DEEP_TOP}


def _decode_cell(cell: dict | None, column: str, row: int, mode: str | None) -> np.ndarray:
    """One cell of a ``datasets.Image`` column ({"bytes", "path"}) as float32 [H, W, C] in [0, 1].

    Decoded by PIL as Hugging Face does, converted to the feature's ``mode`` if it has one. Each
    image's own mode sets its scale (two images of one batch may differ); a palette, CMYK or YCbCr
    image is converted to RGB, since its array is not its pixels, and the alpha channel is dropped
    (RGBA to RGB, LA to L). A cell that is empty, not an image, or past its mode's range is an
    error naming the row.
    """
    from PIL import Image

    data, path = (cell or {}).get("bytes"), (cell or {}).get("path")
    if data is None and not path:
        raise DataError(f"column {column!r}: row {row} has no image (null)")
    try:
        with Image.open(io.BytesIO(data) if data is not None else path) as im:
            im.load()
            im = im.convert(mode) if mode and im.mode != mode else im
            im = im.convert("L" if im.mode == "LA" else "RGB") if im.mode not in KEPT_MODES else im
            a = np.asarray(im)
    except Exception as err:  # noqa: BLE001 - PIL raises nearly anything on a damaged image (OSError, SyntaxError, struct.error, ...)
        raise DataError(f"column {column!r}: row {row} is not an image PIL can read ({type(err).__name__}: {err})") from None
    top = KEPT_MODES[im.mode]
    if not np.isfinite(a).all() or a.min(initial=0) < 0 or a.max(initial=0) > top:
        raise DataError(f"column {column!r}: row {row} (mode {im.mode}) holds values from {a.min()} to {a.max()}; its mode is read as 0-{top:g}")
    return (a.astype(np.float32) / np.float32(top)).reshape(*a.shape[:2], -1)


def _batches(ds, column: str, size: int = 2048) -> Iterator[np.ndarray]:
    """The image column as float32 [n, C, H, W] in [0, 1], ``size`` rows at a time."""
    feature = ds.features[column]
    part = ds.select_columns([column])
    if type(feature).__name__ == "Image":  # decoded here: errors name the row, and modes are converted
        mode = getattr(feature, "mode", None)
        for start, batch in enumerate(part.with_format("arrow").iter(batch_size=size)):
            cells = [_decode_cell(cell, column, start * size + i, mode) for i, cell in enumerate(batch.column(column).to_pylist())]
            yield _images(cells, column, start * size, np.dtype(np.float32), decoded=True)
    else:
        for start, batch in enumerate(part.with_format("numpy").iter(batch_size=size)):
            yield _images(batch[column], column, start * size, pixel_dtype(feature))


def column_values(ds, column: str) -> list:
    """A column's values as a list, read through Arrow at once (``ds[column]`` is a lazy column in
    ``datasets`` 4, walked row by row: minutes for FEMNIST's 814,277 rows)."""
    return _arrow_column(ds, column).to_pylist()


def _arrow_column(ds, column: str):
    """A column as one Arrow array, in the data set's row order."""
    return ds.select_columns([column]).with_format("arrow")[:].column(column).combine_chunks()


def ids_of(ds, column: str) -> np.ndarray:
    """The natural-id column as strings (the same in every process, whatever its type)."""
    return np.asarray([str(v) for v in column_values(ds, column)])


def _char_table() -> np.ndarray:
    """Each byte's index in LEAF's vocabulary, -1 for a byte outside it."""
    from pflower.models.lstm import VOCABULARY

    table = np.full(256, -1, dtype=np.int16)
    table[[ord(c) for c in VOCABULARY]] = np.arange(len(VOCABULARY))
    return table


def encode_text(texts: list, column: str, first: int = 0) -> np.ndarray:
    """Strings of one length as uint8 [n, length], each character its index in LEAF's vocabulary
    (:data:`pflower.models.lstm.VOCABULARY`); a null, a string of another length or a character
    outside the vocabulary is an error naming its row (``first``: the row of ``texts[0]``)."""
    if (none := next((i for i, t in enumerate(texts) if t is None), None)) is not None:
        raise DataError(f"column {column!r}: row {first + none} has no text (null)")
    length = len(texts[0]) if texts else 0
    if (odd := next((i for i, t in enumerate(texts) if len(t) != length), None)) is not None:
        raise DataError(f"column {column!r}: row {first + odd} holds {len(texts[odd])} characters, row {first} {length}; one length per data set")
    table = _char_table()
    codes = np.full((len(texts), length), -1, dtype=np.int16)
    raw = "".join(texts).encode("utf-8", "replace")
    if len(raw) == codes.size:  # every character one byte: all of them at once
        codes = table[np.frombuffer(raw, np.uint8)].reshape(codes.shape)
    else:  # a character past ASCII somewhere: row by row, to name it
        for i, t in enumerate(texts):
            codes[i] = [table[ord(c)] if ord(c) < 256 else -1 for c in t]
    if (codes < 0).any():
        row, col = np.argwhere(codes < 0)[0]
        raise DataError(f"column {column!r}: row {first + int(row)} holds {texts[row][col]!r}, outside LEAF's 80-character vocabulary")
    return codes.astype(np.uint8)


def _text_column(ds, column: str) -> None:
    """DataError unless ``column`` holds strings."""
    dtype = str(getattr(ds.features[column], "dtype", ""))
    if dtype not in ("string", "large_string"):
        raise DataError(f"hf-text-column={column!r}: holds {type(ds.features[column]).__name__} values ({dtype or 'not scalars'}); text is strings")


def text_codes(ds, column: str) -> np.ndarray:
    """A column of strings as :func:`encode_text` gives it, from Arrow's buffers at once when every
    line is the same number of vocabulary characters (one byte each: 4.2 million lines of
    Shakespeare in seconds); otherwise through :func:`encode_text`, which names the row at fault."""
    import pyarrow as pa

    arr = _arrow_column(ds, column)
    if len(arr) and arr.null_count == 0:
        width = np.int64 if pa.types.is_large_string(arr.type) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset : arr.offset + len(arr) + 1]
        lengths = np.diff(offsets)
        if (lengths == lengths[0]).all():
            raw = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
            codes = np.where(_char_table() < 0, 255, _char_table()).astype(np.uint8)[raw]  # 255: outside the vocabulary
            if not (codes == 255).any():  # nor is any byte of a multi-byte character
                return codes.reshape(len(arr), int(lengths[0]))
    return encode_text(arr.to_pylist(), column)


def load_text(ds, text: str, label: str) -> tuple[np.ndarray, np.ndarray]:
    """(characters uint8 [n, length], next characters int64 [n]) of a text data set: the label
    column holds one character per row (Shakespeare's ``y``), its class its index in the vocabulary."""
    _text_column(ds, text)
    _text_column(ds, label)
    x = text_codes(ds, text)
    y = text_codes(ds, label)
    if y.shape[1] != 1:
        raise DataError(f"column {label!r}: row 0 holds {y.shape[1]} characters; the labels of a text data set are single characters (the next one)")
    return x, y[:, 0].astype(np.int64)


@dataclass(frozen=True)
class HFInfo:
    """What the server needs without decoding the whole set: image shape and class names."""

    shape: tuple[int, int, int]
    classes: tuple[str, ...]


def _classes(ds, label: str) -> tuple[tuple[str, ...], np.ndarray | None]:
    """The class names, and for plain values the sorted distinct values they number (None for a ClassLabel)."""
    feature = ds.features[label]
    class_label = hasattr(feature, "names") and hasattr(feature, "num_classes")
    dtype = str(getattr(feature, "dtype", ""))
    # Before any read of its values: Arrow cannot count lists and structs.
    if not class_label and (type(feature).__name__ != "Value" or dtype in ("binary", "large_binary", "null")):
        raise DataError(f"column {label!r}: holds {type(feature).__name__} values ({dtype or 'not scalars'}); labels are a ClassLabel, integers or strings")
    if None in ds.unique(label):
        row = column_values(ds, label).index(None)
        raise DataError(f"column {label!r}: row {row} has no label (null); every row needs one")
    if class_label:
        return tuple(feature.names), None
    values = np.unique(np.asarray(ds.unique(label)))
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        row = int(np.flatnonzero(~np.isfinite(np.asarray(column_values(ds, label), dtype=np.float64)))[0])
        raise DataError(f"column {label!r}: row {row} has label {column_values(ds, label)[row]}, not a class; labels are a ClassLabel, integers or strings")
    return tuple(str(v) for v in values), values


@lru_cache(maxsize=8)
def hf_info(path: str, image: str, label: str, text: str = "") -> HFInfo:
    """Image shape (the first row's) and classes of the data set at ``path``; with a ``text``
    column, its first row's length (shape ``(length,)``) and LEAF's vocabulary as the classes."""
    ds = open_dataset(path)
    with _naming(path):
        check_columns(ds, {"hf-text-column" if text else "hf-image-column": text or image, "hf-label-column": label})
        if len(ds) == 0:
            raise DataError(f"the data set {path} has no rows")
        if text:
            from pflower.models.lstm import VOCABULARY

            _text_column(ds, text)
            first = encode_text(column_values(ds.select([0]), text), text)
            return HFInfo((first.shape[1],), tuple(VOCABULARY))  # type: ignore[arg-type]
        first = next(_batches(ds.select([0]), image))
        return HFInfo(tuple(first.shape[1:]), _classes(ds, label)[0])  # type: ignore[arg-type]


def check_id_column(ds, column: str, image: str, label: str, kind: str = "image") -> None:
    """DataError unless ``column`` holds one client id per row: strings or integers, no nulls,
    neither the input (``kind``: image or text) nor the label column (an id must be the same in every process)."""
    if column in (image, label):
        raise DataError(
            f"natural-id-column={column!r}: is the {kind if column == image else 'label'} column; name a column of client ids (strings or integers)"
        )
    feature = ds.features[column]
    dtype = getattr(feature, "dtype", "")
    if not (hasattr(feature, "names") or dtype in ("string", "large_string") or dtype.startswith(("int", "uint"))):
        raise DataError(f"natural-id-column={column!r}: holds {type(feature).__name__} values ({dtype or 'not scalars'}); client ids are strings or integers")
    if None in ds.unique(column):
        raise DataError(f"natural-id-column={column!r}: some rows have no id (null); give every row its client's id")


def _labels(ds, label: str, names: tuple[str, ...], values: np.ndarray | None) -> np.ndarray:
    """The label column as class indices 0..len(names)-1 (:func:`_classes` refused nulls);
    DataError naming the first row of a ClassLabel outside its classes."""
    y = np.asarray(column_values(ds, label))
    if values is not None:
        return np.searchsorted(values, y).astype(np.int64)
    y = y.astype(np.int64)
    if len(y) and (bad := np.flatnonzero((y < 0) | (y >= len(names)))).size:
        raise DataError(
            f"column {label!r}: row {int(bad[0])} has label {int(y[bad[0]])}, outside its ClassLabel's {len(names)} classes (0-{len(names) - 1}; -1 means no label)"
        )
    return y


def load_hf(path: str, image: str, label: str, id_column: str = "", text: str = "") -> tuple[np.ndarray, np.ndarray, int, np.ndarray | None]:
    """(images float32 [n, C, H, W] in [0, 1], labels, number of classes, natural ids or None);
    with a ``text`` column, (characters uint8 [n, length], next characters, 80, natural ids or None)."""
    ds = open_dataset(path)
    columns = {"hf-text-column" if text else "hf-image-column": text or image, "hf-label-column": label}
    columns |= {"natural-id-column": id_column} if id_column else {}
    with _naming(path):
        check_columns(ds, columns)
        if len(ds) == 0:
            raise DataError(f"the data set {path} has no rows")
        if id_column:
            check_id_column(ds, id_column, text or image, label, "text" if text else "image")
        if text:
            from pflower.models.lstm import VOCABULARY

            x, y = load_text(ds, text, label)
            return x, y, len(VOCABULARY), ids_of(ds, id_column) if id_column else None
        names, values = _classes(ds, label)
        y = _labels(ds, label, names, values)
        xs = list(_batches(ds, image))
        if len({a.shape[1:] for a in xs}) > 1:
            raise DataError(f"column {image!r}: the images differ in size or channels ({sorted({a.shape[1:] for a in xs})}); one per data set")
    ids = ids_of(ds, id_column) if id_column else None
    return np.concatenate(xs), y, len(names), ids


def load_huggingface(source: Source) -> Pool:
    """The pool of the Hugging Face data set ``source`` names: images standardized per channel,
    text as its characters' indices (bytes)."""
    x, y, num_classes, ids = load_hf(source.data_dir, source.image_column, source.label_column, source.id_column, source.text_column)
    return Pool(torch.from_numpy(x) if source.text_column else _normalize(x), torch.from_numpy(y), num_classes, ids)
