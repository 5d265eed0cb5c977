"""pflower-data (pflower/fetch.py) against a loopback HTTP server that serves tiny files in each
upstream format: MNIST's gzipped IDX files, CIFAR's python tarball, EMNIST's zip, GitHub's
archive of an image tree and a Hugging Face Hub (its file-listing API, answered to
``huggingface_hub``'s own client, and its files). torchvision's md5s are those of the real files:
the tests replace them, in torchvision's classes, with the fixtures' (the command reads them from
there). Nothing leaves 127.0.0.1."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import pickle
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import zipfile
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import huggingface_hub.constants  # imported before HF_ENDPOINT is set: the command reads it when it runs
import numpy as np
import pytest
from conftest import MNIST_DIR, NO_MNIST, ROOT
from data_files import idx_bytes
from torchvision import datasets as tv

from pflower import fetch
from pflower.datasets import torchvision_files as tvf
from pflower.datasets.federated import load_pool
from pflower.datasets.sources import Source


# ------------------------------------------------------------------------ a loopback server
class Server:
    """Serves ``files`` (path -> bytes); ``cut[path] = n`` sends the full Content-Length but only n
    bytes; ``status[path]`` answers with that code; ``moved[path]`` redirects (302) to another
    path, as the Hub's and GitHub's download URLs do. ``requests`` lists every path asked for."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.cut: dict[str, int] = {}
        self.status: dict[str, int] = {}
        self.moved: dict[str, str] = {}
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                server.requests.append(path)
                if path in server.status:
                    self.send_error(server.status[path])
                    return
                if path in server.moved:
                    self.send_response(302)
                    self.send_header("Location", server.url + server.moved[path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if path not in server.files:
                    self.send_error(404)
                    return
                body = server.files[path]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Type", "application/json" if path.startswith("/api/") else "application/octet-stream")
                self.end_headers()
                self.wfile.write(body[: server.cut.get(path, len(body))])

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def dead_url() -> str:
    """A loopback port nothing listens on: connection refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/files"


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def run(root: Path, *args: str, capsys) -> tuple[int, str, str]:
    try:
        rc = fetch.main([*args, "--root", str(root)])
    except SystemExit as exit:
        rc = exit.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def leftovers(root: Path) -> list[str]:
    """Anything under ``root`` a failed fetch must not leave: partial folders and files."""
    return [str(p.relative_to(root)) for p in root.rglob("*") if ".partial-" in p.name or p.name.endswith(".part") or ".scratch-" in p.name]


# ------------------------------------------------------------------------ fixtures in upstream formats
def mnist_files(n_train: int = 30, n_test: int = 200) -> dict[str, bytes]:
    """MNIST's four gzipped IDX files, as torchvision's mirrors serve them."""
    rng = np.random.default_rng(0)
    files = {}
    for stem, n in (("train", n_train), ("t10k", n_test)):
        files[f"{stem}-images-idx3-ubyte.gz"] = gzip.compress(idx_bytes(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)))
        files[f"{stem}-labels-idx1-ubyte.gz"] = gzip.compress(idx_bytes((np.arange(n) % 10).astype(np.uint8)))
    return files


@pytest.fixture
def mnist(server, monkeypatch):
    """The fixture's files at SERVER/mnist/, and their md5s where pflower declares torchvision's."""
    files = mnist_files()
    for name, data in files.items():
        server.files[f"/mnist/{name}"] = data
    _declare(monkeypatch, "mnist", [(name, md5(data)) for name, data in files.items()])
    return files


def cifar10_tarball(n: int = 6) -> tuple[bytes, dict[str, str]]:
    """CIFAR-10's python tarball (cifar-10-batches-py/: five data batches, a test batch, the meta
    file) and each file's md5."""
    rng = np.random.default_rng(1)
    members = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        members[name] = pickle.dumps({"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": [i % 10 for i in range(n)]})
    members["batches.meta"] = pickle.dumps({"label_names": [f"c{i}" for i in range(10)]})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), {name: md5(data) for name, data in members.items()}


@pytest.fixture
def cifar10(server, monkeypatch):
    tarball, md5s = cifar10_tarball()
    server.files["/cifar/cifar-10-python.tar.gz"] = tarball
    _declare(monkeypatch, "cifar10", [("cifar-10-python.tar.gz", md5(tarball))])
    monkeypatch.setattr(tv.CIFAR10, "train_list", [[f"data_batch_{i}", md5s[f"data_batch_{i}"]] for i in range(1, 6)])
    monkeypatch.setattr(tv.CIFAR10, "test_list", [["test_batch", md5s["test_batch"]]])
    monkeypatch.setattr(tv.CIFAR10, "meta", {**tv.CIFAR10.meta, "md5": md5s["batches.meta"]})
    return tarball


# ------------------------------------------------------------------------ the torchvision data sets
def _declare(monkeypatch, name: str, files: list[tuple[str, str]]) -> None:
    """The files (and md5s) pflower fetches for ``name``, as a test's server has them."""
    monkeypatch.setitem(fetch._TV_FILES, name, (fetch._TV_FILES[name][0], tuple(files)))


def test_the_files_pflower_fetches_are_the_ones_torchvision_declares():
    """pflower writes torchvision's URLs and md5s out (so that finding them imports neither
    torchvision nor torch): they are the ones its classes declare."""
    tv_files = {
        "mnist": (tv.MNIST.mirrors, tv.MNIST.resources),
        "fashion-mnist": (tv.FashionMNIST.mirrors, tv.FashionMNIST.resources),
        "emnist": ([tv.EMNIST.url.rsplit("/", 1)[0] + "/"], [(tv.EMNIST.url.rsplit("/", 1)[1], tv.EMNIST.md5)]),
        "cifar10": ([tv.CIFAR10.url.rsplit("/", 1)[0] + "/"], [(tv.CIFAR10.filename, tv.CIFAR10.tgz_md5)]),
        "cifar100": ([tv.CIFAR100.url.rsplit("/", 1)[0] + "/"], [(tv.CIFAR100.filename, tv.CIFAR100.tgz_md5)]),
    }
    assert {n: (list(m), [tuple(f) for f in r]) for n, (m, r) in tv_files.items()} == {n: (list(m), list(r)) for n, (m, r) in fetch._TV_FILES.items()}


def test_finding_the_files_to_fetch_imports_no_torch():
    """``pflower-data NAME`` without a network fails in seconds: nothing before the first network
    attempt imports torch or torchvision (importing them took 75 s on a loaded machine)."""
    code = "import sys; from pflower import fetch; [fetch.torchvision_remotes(n) for n in fetch._TV_FILES]; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_list_names_each_data_set_its_size_and_where_it_lands(tmp_path, capsys):
    rc, out, _ = run(tmp_path, "--list", capsys=capsys)
    assert rc == 0
    for ds in fetch.DATASETS.values():
        assert f"\n{ds.name}\n" in out and ds.size in out
        assert all(str(tmp_path / t) in out for t in ds.targets)
    assert f"lands in: {tmp_path / 'torchvision' / 'MNIST'}, {tmp_path / 'mnist'}" in out
    assert not any(tmp_path.iterdir())  # --list fetches nothing


def test_mnist_lands_in_torchvisions_layout_and_the_suites_folder_and_reads_back(server, mnist, tmp_path, capsys):
    rc, out, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert rc == 0, err
    assert out.strip() == f"mnist: fetched into {tmp_path / 'torchvision' / 'MNIST'}, {tmp_path / 'mnist'}, verified"
    assert sorted(server.requests) == sorted(f"/mnist/{n}" for n in mnist)
    raw = tmp_path / "torchvision" / "MNIST" / "raw"
    # torchvision's layout: each .gz and the file it holds; torchvision's own class reads it as downloaded
    assert sorted(p.name for p in raw.iterdir()) == sorted([*mnist, *(n.removesuffix(".gz") for n in mnist)])
    train = tv.MNIST(str(tmp_path / "torchvision"), train=True, download=False)
    assert len(train) == 30 and len(tv.MNIST(str(tmp_path / "torchvision"), train=False, download=False)) == 200
    # pflower's reader of torchvision's files: every split pooled, the bytes as served
    x, y = tvf.load(tmp_path / "torchvision", "MNIST")
    images = np.concatenate([np.frombuffer(gzip.decompress(mnist[f"{s}-images-idx3-ubyte.gz"])[16:], np.uint8) for s in ("train", "t10k")])
    assert np.array_equal(x.reshape(-1), images) and len(y) == 230
    pool = load_pool(Source("torchvision", str(tmp_path / "torchvision"), torchvision_name="MNIST"))
    assert tuple(pool.x.shape) == (230, 1, 28, 28) and pool.num_classes == 10
    # the MNIST suites' folder: the test split alone, as the suites' tables were run on
    assert sorted(p.name for p in (tmp_path / "mnist").iterdir()) == sorted([fetch.MANIFEST, "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"])
    assert len(load_pool(Source("mnist", str(tmp_path / "mnist"))).y) == 200
    assert not (tmp_path / fetch.STAGING).exists() and leftovers(tmp_path) == []
    assert "Traceback" not in err


def test_after_pflower_data_mnist_the_mnist_suites_find_and_accept_their_data(server, mnist, tmp_path, capsys, monkeypatch):
    from pflower.bench import load_suite, run_config_string
    from pflower.check import check

    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    assert run(tmp_path / "data", "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)[0] == 0
    for suite in ("small", "pfedla", "baselines", "full"):
        _, runs = load_suite(ROOT / "bench" / "suites.toml", suite, tmp_path / "data")
        assert {r.config["data-dir"] for r in runs} == {str(tmp_path / "data" / "mnist")}
    first = load_suite(ROOT / "bench" / "suites.toml", "small", tmp_path / "data")[1][0]
    config = {**first.config, "results-dir": str(tmp_path / "results")}
    assert check(ROOT, run_config_string(config), first.clients) is None


@pytest.mark.e2e
def test_pflower_bench_small_runs_on_what_pflower_data_fetched_records_it_and_writes_its_table(server, mnist, tmp_path, capsys, monkeypatch):
    """A user's path on a fresh clone with a loopback mirror for the internet: `pflower-data mnist
    --root DIR`, then `pflower-bench small --data-root DIR` (the console script, as the docs write
    it) runs the suite on Flower with progress and records its first run (the data's digest, no
    model state); stopped there (SIGTERM, as `kill` or a supervisor stops it: its SuperLink and Ray
    end with it), `--status` counts that run done, and `--report-only` writes its table from the
    records alone."""
    import time

    from pflower.bench import load_suite, main

    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    data, results, records = tmp_path / "data", tmp_path / "results", tmp_path / "records"
    assert run(data, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)[0] == 0
    first = load_suite(ROOT / "bench" / "suites.toml", "small", data)[1][0]
    record_file = first.record(records, "small")
    where = ["--data-root", str(data), "--results", str(results), "--records", str(records)]
    with open(tmp_path / "bench.log", "w") as log:  # --allow-modified: the test runs the working tree, committed or not
        bench = subprocess.Popen(
            [str(Path(sys.executable).parent / "pflower-bench"), "small", *where, "--allow-modified"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
        try:
            deadline = time.monotonic() + 300
            while not record_file.exists() and bench.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            bench.terminate()  # not SIGINT: a test run in a background job inherits SIGINT ignored
            bench.wait(120)
    out = (tmp_path / "bench.log").read_text()
    assert record_file.exists(), out[-3000:]
    assert "0 of 14 runs already finished; running 14; time left unknown" in out and "\n    round 10/10, " in out, out[-3000:]
    doc = json.loads(record_file.read_text())
    assert doc["config"]["method"] == "local" and doc["config"]["data-dir"] == str(data / "mnist") and len(doc["rounds"]) == 10
    # the digest as a fresh process takes it, with torch's default threads as the bench's: a tiny
    # pool's standardization (a parallel mean and std) differs in its last bits with the threads
    fresh = f"from pflower.bench import data_fingerprint; print(data_fingerprint({dict(first.config)!r}))"
    digest = subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    assert doc["bench"]["data"] == digest and doc["bench"]["clients"] == 10
    assert not [p for p in records.rglob("*") if p.suffix in (".pt", ".state", ".tmp")]
    assert main(["small", *where, "--status"]) == 0
    assert "suite 'small': 1 of 14 runs finished, 13 left" in capsys.readouterr().out
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- bench:small:start -->\nold\n<!-- bench:small:end -->\nafter\n")
    assert main(["small", *where, "--report-only", "--page", str(page)]) == 0
    table = page.read_text()
    assert f"| local | {doc['final']['accuracy']:.4f} |" in table and "old" not in table and table.endswith("<!-- bench:small:end -->\nafter\n")


def test_a_suite_without_its_data_names_the_command_that_fetches_it(tmp_path):
    from pflower.bench import main

    with pytest.raises(SystemExit, match=re.escape(f"`pflower-data mnist --root {tmp_path}` fetches it, or put the data there")):
        main(["small", "--data-root", str(tmp_path)])


def test_a_suite_reading_torchvisions_root_names_its_datasets_folder_and_command(tmp_path):
    """CIFAR-100's suites read ROOT/torchvision, which may hold other data sets: the folder
    checked is cifar-100-python inside it, and the command fetches CIFAR-100."""
    from pflower.bench import main

    (tmp_path / "torchvision" / "MNIST").mkdir(parents=True)
    want = f"reads {tmp_path / 'torchvision' / 'cifar-100-python'}, which is not there: `pflower-data cifar100 --root {tmp_path}` fetches it"
    for suite in ("cifar100-pfedla", "cifar100-federico"):
        with pytest.raises(SystemExit, match=re.escape(want)):
            main([suite, "--data-root", str(tmp_path)])


def test_present_verified_data_is_not_downloaded_again(server, mnist, tmp_path, capsys):
    assert run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)[0] == 0
    asked = len(server.requests)
    rc, out, _ = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert rc == 0 and len(server.requests) == asked
    assert out.strip() == f"mnist: present at {tmp_path / 'torchvision' / 'MNIST'}, {tmp_path / 'mnist'}, verified (10 files)"
    # one of the two folders gone: only it is written again, the other left as it is
    shutil.rmtree(tmp_path / "mnist")
    kept = (tmp_path / "torchvision" / "MNIST" / fetch.MANIFEST).stat().st_mtime_ns
    assert run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)[0] == 0
    assert (tmp_path / "mnist" / fetch.MANIFEST).is_file() and (tmp_path / "torchvision" / "MNIST" / fetch.MANIFEST).stat().st_mtime_ns == kept


def test_a_changed_file_in_a_fetched_folder_is_named_and_nothing_is_downloaded(server, mnist, tmp_path, capsys):
    assert run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)[0] == 0
    damaged = tmp_path / "torchvision" / "MNIST" / "raw" / "train-labels-idx1-ubyte"
    data = damaged.read_bytes()
    damaged.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    asked = len(server.requests)
    rc, _, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert rc == 1 and len(server.requests) == asked
    assert f"{damaged}: sha256 " in err and "was " in err and f"remove {tmp_path / 'torchvision' / 'MNIST'} and run again" in err


def test_a_folder_pflower_data_did_not_write_is_left_alone(server, mnist, tmp_path, capsys):
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz").write_bytes(b"mine")
    rc, _, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert rc == 1 and server.requests == []
    assert f"{tmp_path / 'mnist'} is there, but pflower-data did not write it" in err
    assert (tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz").read_bytes() == b"mine" and not (tmp_path / "torchvision" / "MNIST").exists()


def test_a_truncated_download_is_named_and_nothing_of_the_data_set_is_kept(server, mnist, tmp_path, capsys):
    path = "/mnist/t10k-images-idx3-ubyte.gz"
    server.cut[path] = len(mnist["t10k-images-idx3-ubyte.gz"]) // 2
    rc, out, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    total = len(mnist["t10k-images-idx3-ubyte.gz"])
    assert rc == 1 and out == ""
    assert f"pflower-data: mnist: t10k-images-idx3-ubyte.gz from {server.url}{path}: truncated: the server sent {total // 2} of the {total} bytes" in err
    assert not (tmp_path / "torchvision" / "MNIST").exists() and not (tmp_path / "mnist").exists()
    assert leftovers(tmp_path) == [] and "Traceback" not in err
    # the files verified before it wait in the staging folder; the next run fetches the rest only
    assert f"the files verified so far wait in {tmp_path / fetch.STAGING / 'mnist'} for the next run" in err
    del server.cut[path]
    server.requests.clear()
    assert run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)[0] == 0
    assert server.requests == [path, "/mnist/t10k-labels-idx1-ubyte.gz"]


def test_a_checksum_mismatch_names_the_file_both_digests_and_keeps_nothing(server, mnist, tmp_path, capsys):
    good = mnist["train-labels-idx1-ubyte.gz"]
    server.files["/mnist/train-labels-idx1-ubyte.gz"] = bad = good[:-1] + bytes([good[-1] ^ 1])
    rc, _, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert rc == 1
    assert f"train-labels-idx1-ubyte.gz from {server.url}/mnist/train-labels-idx1-ubyte.gz: checksum mismatch: md5 expected {md5(good)}, got {md5(bad)}" in err
    assert not (tmp_path / "torchvision" / "MNIST").exists() and not (tmp_path / "mnist").exists() and leftovers(tmp_path) == []
    assert not (tmp_path / fetch.STAGING / "mnist" / "train-labels-idx1-ubyte.gz").exists()


def test_a_redirect_is_followed(server, mnist, tmp_path, capsys):
    for name in mnist:
        server.files[f"/cdn/{name}"] = server.files.pop(f"/mnist/{name}")
        server.moved[f"/mnist/{name}"] = f"/cdn/{name}"
    rc, _, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert rc == 0, err
    assert server.requests == [p for name in mnist for p in (f"/mnist/{name}", f"/cdn/{name}")]


def test_an_http_error_is_named(server, mnist, tmp_path, capsys):
    server.status["/mnist/train-images-idx3-ubyte.gz"] = 403
    rc, _, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert rc == 1 and f"train-images-idx3-ubyte.gz from {server.url}/mnist/train-images-idx3-ubyte.gz: HTTP 403 Forbidden" in err
    assert leftovers(tmp_path) == []


def test_offline_the_command_lists_each_file_and_where_to_put_it_and_uses_what_is_put_there(server, mnist, tmp_path, capsys):
    dead = dead_url()
    rc, out, err = run(tmp_path, "mnist", "--mirror", dead, capsys=capsys)
    assert rc == 1 and out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert lines[0].startswith(f"pflower-data: mnist: cannot reach 127.0.0.1:{dead.split(':')[2].split('/')[0]}: connection refused.")
    staging = tmp_path / fetch.STAGING / "mnist"
    assert lines[1:] == [f"  {dead}/{name} -> {staging / name} (md5 {md5(data)})" for name, data in mnist.items()]
    assert not (tmp_path / "torchvision").exists() and not (tmp_path / "mnist").exists()
    # the files put where the message says: checked, used, no download
    staging.mkdir(parents=True)
    for name, data in mnist.items():
        (staging / name).write_bytes(data)
    rc, out, err = run(tmp_path, "mnist", "--mirror", dead, capsys=capsys)
    assert rc == 0, err
    assert out.startswith("mnist: fetched") and server.requests == []
    # a wrong file put there is named, not used
    shutil.rmtree(tmp_path / "mnist")
    staging.mkdir(parents=True)
    (staging / "train-images-idx3-ubyte.gz").write_bytes(b"not it")
    rc, _, err = run(tmp_path, "mnist", "--mirror", dead, capsys=capsys)
    assert rc == 1 and f"{staging / 'train-images-idx3-ubyte.gz'}: checksum mismatch: md5 expected" in err


def test_offline_as_a_user_runs_it_one_line_per_file_no_traceback(tmp_path):
    dead = dead_url()
    out = subprocess.run(
        [sys.executable, "-m", "pflower.fetch", "mnist", "cifar10", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PFLOWER_DATA_MIRROR": dead, "HOME": str(tmp_path)},
        timeout=120,
    )
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
    files = [line for line in out.stderr.splitlines() if line.startswith("  ")]
    assert [f.split()[0] for f in files] == [f"{dead}/{n}" for n, _ in tv.MNIST.resources] + [f"{dead}/cifar-10-python.tar.gz"]
    assert files[-1].split()[2] == str(tmp_path / fetch.STAGING / "cifar10" / "cifar-10-python.tar.gz")


def test_progress_goes_to_stderr_in_mib(server, mnist, tmp_path, capsys, monkeypatch):
    big = b"\0" * (3 * fetch.MiB)
    _declare(monkeypatch, "mnist", [("train-images-idx3-ubyte.gz", md5(big))])
    server.files["/mnist/train-images-idx3-ubyte.gz"] = big
    rc, _, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert rc == 1  # not a gzip file: the unpacking step names it
    assert "  train-images-idx3-ubyte.gz: 3.0 / 3.0 MiB" in err and "train-images-idx3-ubyte.gz: not a whole gzip file" in err
    assert leftovers(tmp_path) == [] and not (tmp_path / "torchvision" / "MNIST").exists()


def test_unknown_names_are_refused_naming_the_allowed_ones_in_one_line(tmp_path, capsys):
    rc, _, err = run(tmp_path, "mnist", "cifar", capsys=capsys)
    assert rc == 2 and err.strip() == f"pflower-data: unknown data set 'cifar'; the names are: {', '.join(fetch.DATASETS)}"
    rc, _, err = run(tmp_path, capsys=capsys)
    assert rc == 2 and "name one or more data sets" in err


def test_the_root_is_pflower_benchs_data_root(tmp_path, monkeypatch):
    from pflower import bench

    assert bench.data_root is fetch.data_root
    monkeypatch.setenv(fetch.DATA_ENV, str(tmp_path / "env"))
    assert fetch.data_root() == tmp_path / "env"
    monkeypatch.delenv(fetch.DATA_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert fetch.data_root() == tmp_path / "pflower-data"


def test_cifar10_tarball_is_unpacked_checked_and_read_by_torchvision_and_pflower(server, cifar10, tmp_path, capsys):
    rc, out, err = run(tmp_path, "cifar10", "--mirror", f"{server.url}/cifar", capsys=capsys)
    assert rc == 0, err
    base = tmp_path / "torchvision" / "cifar-10-batches-py"
    assert out.strip() == f"cifar10: fetched into {base}, verified"
    assert sorted(p.name for p in base.iterdir()) == sorted([fetch.MANIFEST, "batches.meta", "test_batch", *(f"data_batch_{i}" for i in range(1, 6))])
    assert len(tv.CIFAR10(str(tmp_path / "torchvision"), train=True, download=False)) == 30
    assert len(load_pool(Source("cifar10", str(tmp_path / "torchvision"))).y) == 36
    assert tuple(load_pool(Source("torchvision", str(tmp_path / "torchvision"), torchvision_name="CIFAR10")).x.shape) == (36, 3, 32, 32)
    assert not (tmp_path / fetch.STAGING).exists() and leftovers(tmp_path) == []


def test_a_cifar_batch_whose_md5_is_not_torchvisions_is_named_and_nothing_is_kept(server, cifar10, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tv.CIFAR10, "test_list", [["test_batch", "0" * 32]])
    rc, _, err = run(tmp_path, "cifar10", "--mirror", f"{server.url}/cifar", capsys=capsys)
    assert (
        rc == 1 and "cifar-10-batches-py/test_batch from cifar-10-python.tar.gz: checksum mismatch: md5 expected 00000000000000000000000000000000, got" in err
    )
    assert not (tmp_path / "torchvision" / "cifar-10-batches-py").exists() and leftovers(tmp_path) == []


def test_a_cut_tarball_is_named(server, cifar10, tmp_path, capsys):
    server.cut["/cifar/cifar-10-python.tar.gz"] = 100
    rc, _, err = run(tmp_path, "cifar10", "--mirror", f"{server.url}/cifar", capsys=capsys)
    assert (
        rc == 1 and f"cifar-10-python.tar.gz from {server.url}/cifar/cifar-10-python.tar.gz: truncated: the server sent 100 of the {len(cifar10)} bytes" in err
    )
    assert not (tmp_path / "torchvision").exists() or not any((tmp_path / "torchvision").iterdir())
    assert leftovers(tmp_path) == []


def test_emnist_zip_unpacks_every_split_into_torchvisions_layout(server, tmp_path, capsys, monkeypatch):
    buf, rng = io.BytesIO(), np.random.default_rng(2)
    with zipfile.ZipFile(buf, "w") as zf:
        for split in tv.EMNIST.splits:
            for part in ("train", "test"):
                n, top = 5, 26 if split == "letters" else 10
                zf.writestr(f"gzip/emnist-{split}-{part}-images-idx3-ubyte.gz", gzip.compress(idx_bytes(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))))
                zf.writestr(
                    f"gzip/emnist-{split}-{part}-labels-idx1-ubyte.gz", gzip.compress(idx_bytes((np.arange(n) % top + (split == "letters")).astype(np.uint8)))
                )
        zf.writestr("gzip/emnist-balanced-mapping.txt", "0 48\n")
    server.files["/emnist/gzip.zip"] = buf.getvalue()
    _declare(monkeypatch, "emnist", [("gzip.zip", md5(buf.getvalue()))])
    rc, out, err = run(tmp_path, "emnist", "--mirror", f"{server.url}/emnist", capsys=capsys)
    assert rc == 0, err
    raw = tmp_path / "torchvision" / "EMNIST" / "raw"
    assert len([p for p in raw.iterdir()]) == 24  # 6 splits x train/test x images/labels, unzipped, as torchvision leaves them
    assert len(tv.EMNIST(str(tmp_path / "torchvision"), split="letters", download=False)) == 5
    x, y = tvf.load(tmp_path / "torchvision", "EMNIST", "balanced")
    assert x.shape == (10, 1, 28, 28) and y.max() <= 9


# ------------------------------------------------------------------------ cifar10-jpg: an image tree from GitHub
def git_tree(folder: Path) -> str:
    """``folder``'s tree id as git itself computes it."""
    repo = folder.parent / "git"
    shutil.copytree(folder, repo / folder.name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    tree = subprocess.run([*git, "write-tree"], check=True, capture_output=True, text=True).stdout.strip()
    out = subprocess.run([*git, "ls-tree", tree, folder.name], check=True, capture_output=True, text=True).stdout
    shutil.rmtree(repo)
    return out.split()[2]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_cifar10_jpg_is_verified_by_its_git_tree_ids_and_reads_as_the_suites_read_it(server, tmp_path, capsys, monkeypatch):
    from PIL import Image

    spec = replace(fetch.CIFAR10_JPG, repo="someone/CIFAR-10-images", commit="c" * 40)
    src = tmp_path / "src"
    for split, n in (("train", 3), ("test", 1)):
        for c in ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"):
            (src / split / c).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (32, 32), (i * 40, len(c) * 20, 90)).save(src / split / c / f"{i:04d}.jpg")
    trees = {split: git_tree(src / split) for split in ("train", "test")}
    assert trees == {split: fetch.git_tree_id(src / split) for split in ("train", "test")}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(spec.top, "")
        zf.writestr(spec.top + "README.md", "images\n")
        for p in sorted(src.rglob("*.jpg")):
            zf.write(p, spec.top + str(p.relative_to(src)))
    server.files[f"/gh/{spec.commit}.zip"] = buf.getvalue()
    monkeypatch.setattr(fetch, "CIFAR10_JPG", replace(spec, trees=trees))
    root = tmp_path / "root"
    rc, out, err = run(root, "cifar10-jpg", "--mirror", f"{server.url}/gh", capsys=capsys)
    assert rc == 0, err
    assert sorted(p.name for p in (root / "cifar10-jpg").iterdir()) == [fetch.MANIFEST, "test", "train"]
    monkeypatch.setenv("PFLOWER_CACHE", str(tmp_path / "cache"))
    assert tuple(load_pool(Source("cifar10", str(root / "cifar10-jpg"))).x.shape) == (40, 3, 32, 32)
    # another tree than the commit's: named with both ids, nothing kept
    shutil.rmtree(root)
    monkeypatch.setattr(fetch, "CIFAR10_JPG", replace(spec, trees={**trees, "test": "0" * 40}))
    rc, _, err = run(root, "cifar10-jpg", "--mirror", f"{server.url}/gh", capsys=capsys)
    assert rc == 1 and f"test/ from {spec.commit}.zip: git tree {trees['test']}, expected {'0' * 40}" in err
    assert not (root / "cifar10-jpg").exists() and leftovers(root) == []


@pytest.mark.skipif(
    not (MNIST_DIR.parent / "cifar10-jpg" / "train").is_dir(),
    reason=f"no CIFAR-10 JPEG tree in {MNIST_DIR.parent / 'cifar10-jpg'}: `pflower-data cifar10-jpg --root {MNIST_DIR.parent}` fetches it",
)
def test_the_cifar10_jpg_tree_ids_are_those_of_the_tree_the_suites_ran_on():
    assert {split: fetch.git_tree_id(MNIST_DIR.parent / "cifar10-jpg" / split) for split in ("train", "test")} == fetch.CIFAR10_JPG.trees


@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason=NO_MNIST)
def test_the_mnist_suites_folder_holds_what_the_suites_ran_on():
    """The suites' MNIST folder holds MNIST's two test files, torchvision's md5s: what pflower-data mnist writes there."""
    files = sorted(p.name for p in MNIST_DIR.iterdir())
    assert files == ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    assert {f: fetch._file_digest(MNIST_DIR / f, "md5") for f in files} == {f: m for f, m in tv.MNIST.resources if f in files}


# ------------------------------------------------------------------------ the Hugging Face Hub
def femnist_parquet(n: int = 24) -> bytes:
    """A tiny FEMNIST-like parquet file: 28x28 grey images, writer_id, hsf_id and a 62-class character."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(3)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "writer_id": datasets.Value("string"),
            "hsf_id": datasets.Value("int64"),
            "character": datasets.ClassLabel(names=[str(i) for i in range(62)]),
        }
    )
    rows = {
        "image": [Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)) for _ in range(n)],
        "writer_id": [f"f{i % 3:04d}_14" for i in range(n)],
        "hsf_id": [i % 8 for i in range(n)],
        "character": [i % 62 for i in range(n)],
    }
    buf = io.BytesIO()
    datasets.Dataset.from_dict(rows, features=features).to_parquet(buf)
    return buf.getvalue()


@pytest.fixture
def hub(server, monkeypatch):
    """A Hub at SERVER (HF_ENDPOINT, set after huggingface_hub was imported) with flwrlabs/femnist:
    one parquet shard, listed with its size and LFS sha256 as the Hub's tree API lists them."""
    data = femnist_parquet()
    path = "data/train-00000-of-00001.parquet"
    listing = [
        {"type": "file", "oid": "a" * 40, "size": 2310, "path": ".gitattributes"},
        {"type": "directory", "oid": "b" * 40, "size": 0, "path": "data"},
        {
            "type": "file",
            "oid": "c" * 40,
            "size": len(data),
            "path": path,
            "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 135},
        },
        {"type": "file", "oid": "d" * 40, "size": 6094, "path": "README.md"},
    ]
    server.files["/api/datasets/flwrlabs/femnist/tree/main"] = json.dumps(listing).encode()
    server.files[f"/datasets/flwrlabs/femnist/resolve/main/{path}"] = data
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # another test's reader may have turned it on
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setitem(fetch.HUB, "femnist", replace(fetch.HUB["femnist"], rows=24))
    return data


def read_with_pflower(folder: Path, monkeypatch):
    """pflower's Hugging Face reader (it turns the Hub's offline mode on; put back after the test)."""
    import datasets

    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(key, "1")
    for module, key in ((datasets.config, "HF_DATASETS_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE"), (huggingface_hub.constants, "HF_HUB_OFFLINE")):
        monkeypatch.setattr(module, key, getattr(module, key))
    return load_pool(Source("huggingface", str(folder), label_column="character", id_column="writer_id"))


def test_femnist_from_the_hub_is_checked_saved_to_disk_and_read_by_pflower(server, hub, tmp_path, capsys, monkeypatch):
    rc, out, err = run(tmp_path, "femnist", capsys=capsys)
    assert rc == 0, err
    assert out.strip() == f"femnist: fetched into {tmp_path / 'femnist'}, verified"
    # huggingface_hub's client listed the files at $HF_ENDPOINT, set after its import; the file came from there too
    assert server.requests == ["/api/datasets/flwrlabs/femnist/tree/main", "/datasets/flwrlabs/femnist/resolve/main/data/train-00000-of-00001.parquet"]
    assert (tmp_path / "femnist" / "dataset_dict.json").is_file()
    pool = read_with_pflower(tmp_path / "femnist", monkeypatch)
    assert tuple(pool.x.shape) == (24, 1, 28, 28) and pool.num_classes == 62 and len(set(pool.ids)) == 3
    assert not (tmp_path / fetch.STAGING).exists() and leftovers(tmp_path) == []
    asked = len(server.requests)
    rc, out, _ = run(tmp_path, "femnist", capsys=capsys)
    assert rc == 0 and out.startswith(f"femnist: present at {tmp_path / 'femnist'}, verified") and len(server.requests) == asked


def test_a_hub_file_whose_sha256_differs_from_the_listing_is_named(server, hub, tmp_path, capsys):
    path = "/datasets/flwrlabs/femnist/resolve/main/data/train-00000-of-00001.parquet"
    server.files[path] = bad = hub[:-1] + b"X"
    rc, _, err = run(tmp_path, "femnist", capsys=capsys)
    want, got = hashlib.sha256(hub).hexdigest(), hashlib.sha256(bad).hexdigest()
    assert rc == 1 and f"data/train-00000-of-00001.parquet from {server.url}{path}: checksum mismatch: sha256 expected {want}, got {got}" in err
    assert not (tmp_path / "femnist").exists() and leftovers(tmp_path) == []


def test_hub_rows_or_columns_other_than_expected_are_refused(server, hub, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(fetch.HUB, "femnist", replace(fetch.HUB["femnist"], rows=814_277))
    rc, _, err = run(tmp_path, "femnist", capsys=capsys)
    assert rc == 1 and "flwrlabs/femnist: 24 rows, expected 814277" in err
    monkeypatch.setitem(fetch.HUB, "femnist", replace(fetch.HUB["femnist"], rows=24, columns=("image", "label")))
    rc, _, err = run(tmp_path, "femnist", capsys=capsys)
    assert rc == 1 and "split 'train' has no column label (its columns: image, writer_id, hsf_id, character)" in err
    assert not (tmp_path / "femnist").exists() and leftovers(tmp_path) == []


def test_a_missing_hub_repo_is_named(server, hub, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(fetch.HUB, "femnist", replace(fetch.HUB["femnist"], repo="flwrlabs/nothing"))
    rc, _, err = run(tmp_path, "femnist", capsys=capsys)
    assert rc == 1 and f"flwrlabs/nothing at {server.url}: Client error '404 Not Found'" in err and "Traceback" not in err


def test_the_hub_offline_lists_its_files_and_uses_the_ones_put_there(server, hub, tmp_path, capsys, monkeypatch):
    dead = dead_url().removesuffix("/files")
    monkeypatch.setenv("HF_ENDPOINT", dead)
    rc, out, err = run(tmp_path, "femnist", capsys=capsys)
    staging = tmp_path / fetch.STAGING / "femnist"
    assert rc == 1 and out == "" and "Traceback" not in err
    assert err.splitlines()[0].startswith(f"pflower-data: femnist: cannot reach {dead.removeprefix('http://')}: connection refused.")
    assert err.splitlines()[1:] == [
        f"  {dead}/datasets/flwrlabs/femnist/resolve/main/data/*.parquet (every such file {dead}/datasets/flwrlabs/femnist/tree/main lists)"
        f" -> {staging / 'data'}/"
    ]
    (staging / "data").mkdir(parents=True)
    (staging / "data" / "train-00000-of-00001.parquet").write_bytes(hub)
    rc, out, err = run(tmp_path, "femnist", capsys=capsys)
    assert rc == 0 and "checked by what they hold alone (columns, rows, line lengths)" in err and (tmp_path / "femnist" / "dataset_dict.json").is_file()
    assert server.requests == []


def test_shakespeare_csv_from_the_hub_keeps_its_text_as_written(server, tmp_path, capsys, monkeypatch):
    import datasets

    rows = [("ROMEO_AND_JULIET_ROMEO", "x" * 79 + ",", "1"), ("ROMEO_AND_JULIET_ROMEO", 'But soft, what "light"' + "." * 59, "N"), ("HAMLET_HAMLET", "NA", "")]
    buf = io.StringIO()
    csv.writer(buf).writerows([("character_id", "x", "y"), *rows])
    data = buf.getvalue().encode()
    listing = [
        {
            "type": "file",
            "oid": "e" * 40,
            "size": len(data),
            "path": "shakespeare.csv",
            "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134},
        }
    ]
    server.files["/api/datasets/flwrlabs/shakespeare/tree/main"] = json.dumps(listing).encode()
    server.files["/datasets/flwrlabs/shakespeare/resolve/main/shakespeare.csv"] = data
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setitem(fetch.HUB, "shakespeare", replace(fetch.HUB["shakespeare"], rows=3, lengths=()))  # odd rows, to keep as written
    rc, out, err = run(tmp_path, "shakespeare", capsys=capsys)
    assert rc == 0, err
    saved = datasets.load_from_disk(str(tmp_path / "shakespeare"))
    assert [tuple(r.values()) for r in saved["train"]] == rows


def shakespeare_csv(lines: int) -> bytes:
    buf = io.StringIO()
    csv.writer(buf).writerows([("character_id", "x", "y"), *((f"PLAY_ROLE{i % 3}", f"{i:080d}", "abc"[i % 3]) for i in range(lines))])
    return buf.getvalue().encode()


@pytest.mark.parametrize("cut", ["between rows", "inside the last row's y", "inside the last row's x"])
def test_a_shakespeare_csv_placed_by_hand_cut_short_is_refused(tmp_path, capsys, monkeypatch, cut):
    """Offline, a file put in the staging folder has no Hub listing to be checked against: the
    row count and every line's 80 characters and next one catch a copy cut anywhere."""
    data = shakespeare_csv(10)
    end = {"between rows": data.rindex(b"\n", 0, len(data) - 1) + 1, "inside the last row's y": len(data) - 3, "inside the last row's x": len(data) - 40}[cut]
    monkeypatch.setenv("HF_ENDPOINT", dead_url().removesuffix("/files"))
    monkeypatch.setitem(fetch.HUB, "shakespeare", replace(fetch.HUB["shakespeare"], rows=10))
    staging = tmp_path / fetch.STAGING / "shakespeare"
    staging.mkdir(parents=True)
    (staging / "shakespeare.csv").write_bytes(data[:end])
    rc, out, err = run(tmp_path, "shakespeare", capsys=capsys)
    assert rc == 1 and out == "" and not (tmp_path / "shakespeare").exists() and "Traceback" not in err
    assert re.search(
        r"flwrlabs/shakespeare: (9 rows, expected 10|split 'train': 1 values of column '[xy]' are not (80|1) characters long \(the first in row 9\))", err
    ), err
    (staging / "shakespeare.csv").write_bytes(data)
    (staging / ".DS_Store").write_bytes(b"a file manager's")  # hidden files are not the data
    rc, out, err = run(tmp_path, "shakespeare", capsys=capsys)
    assert rc == 0 and out.startswith("shakespeare: fetched"), err


def test_a_stray_file_among_the_hub_files_placed_by_hand_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", dead_url().removesuffix("/files"))
    staging = tmp_path / fetch.STAGING / "shakespeare"
    staging.mkdir(parents=True)
    (staging / "shakespeare.csv").write_bytes(shakespeare_csv(3))
    (staging / "shakespeare (1).csv").write_bytes(shakespeare_csv(3))
    rc, _, err = run(tmp_path, "shakespeare", capsys=capsys)
    assert rc == 1 and f"{staging / 'shakespeare (1).csv'} is none of flwrlabs/shakespeare's files (shakespeare.csv): remove it" in err


def test_a_file_added_to_a_fetched_folder_is_named_not_verified(server, mnist, tmp_path, capsys):
    """A folder holds what its manifest lists and nothing else a reader would read: MNIST's
    training files copied into the suites' test-set folder would be pooled with it."""
    assert run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)[0] == 0
    for f in (tmp_path / "torchvision" / "MNIST" / "raw").glob("train-*.gz"):
        shutil.copy(f, tmp_path / "mnist")
    (tmp_path / "mnist" / ".DS_Store").write_bytes(b"hidden: no reader reads it")
    rc, _, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert rc == 1 and f"{tmp_path / 'mnist' / 'train-images-idx3-ubyte.gz'} (and 1 more) is not one of the files pflower-data verified there" in err
    assert "run again" not in err  # remove that file, not the verified folder


def test_one_pflower_data_at_a_time_fetches_into_a_root(server, mnist, tmp_path, capsys):
    """Two at once on one root would write the same staged files: the second stops, saying so,
    and writes nothing."""
    from pflower.run_folder import claimed

    with claimed(tmp_path):  # another pflower-data holds the root
        rc, out, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert (
        rc == 1 and out == "" and err.strip() == f"pflower-data: {tmp_path} is being fetched into by another pflower-data now: run this again when it has ended"
    )
    assert server.requests == [] and sorted(p.name for p in tmp_path.iterdir()) == []
    assert run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)[0] == 0


def test_a_root_that_is_a_file_is_named_in_one_line(tmp_path, capsys):
    (tmp_path / "root").write_text("not a folder")
    rc, out, err = run(tmp_path / "root", "mnist", capsys=capsys)
    assert (rc, out, err) == (1, "", f"pflower-data: --root {tmp_path / 'root'}: is a file, not a folder\n")


def test_the_offline_rerun_command_quotes_a_root_with_spaces(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", dead_url().removesuffix("/files"))
    root = tmp_path / "my data"
    rc, _, err = run(root, "shakespeare", capsys=capsys)
    assert rc == 1 and f"run `pflower-data shakespeare --root '{root}'` again" in err


def test_present_data_answers_on_a_read_only_root_and_while_another_fetch_holds_it(server, mnist, tmp_path, capsys, monkeypatch):
    """Checking what is there writes nothing: a root this user may not write, or one another
    pflower-data is fetching into, still says its verified names are present."""
    from pflower.run_folder import claimed

    assert run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)[0] == 0
    monkeypatch.setattr(fetch, "root_problem", lambda root: "is not writable by this user")
    with claimed(tmp_path):
        rc, out, err = run(tmp_path, "mnist", "--mirror", f"{server.url}/mnist", capsys=capsys)
    assert (rc, err) == (0, "") and out.startswith("mnist: present at ")
    rc, _, err = run(tmp_path, "mnist", "cifar10", capsys=capsys)
    assert rc == 1 and f"pflower-data: --root {tmp_path}: is not writable by this user" in err
