"""``python -m canonical_network.data.download`` and ``data.download=true``, against a real HTTP server.

The server (``http.server`` in a thread, on 127.0.0.1 and an ephemeral port, started and stopped by a fixture)
serves tiny archives built here in each dataset's real layout. Its routes serve normally without Range
support, honour Range, drop the connection half way once, or answer 404; a closed port stands for a server
that is down. The real registry entries are never fetched: each test passes (or patches in) a
:class:`DatasetSource` whose URLs point at the server and whose checksum is the tiny archive's own.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import socket
import threading
import urllib.parse
import zipfile
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml

from canonical_network.data import download as dl
from canonical_network.data.modelnet import ModelNet40DataModule
from canonical_network.data.rotated_mnist import AMAT_TEST, AMAT_TRAIN, RotatedMNISTDataModule
from canonical_network.data.shapenet import (
    SHAPENET_CATEGORIES,
    SHAPENET_CATEGORY_PARTS,
    SHAPENET_ZIP_FOLDER,
    ShapeNetPartDataModule,
)
from canonical_network.data.sources import SOURCES, Checksum, DatasetSource
from canonical_network.utils.config import CONFIG_DIR


# ---------------------------------------------------------------------------------------------------------
# The HTTP server
# ---------------------------------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    """Routes ``/<behaviour>/<name>``: ``plain`` (200, ignores Range), ``range`` (honours Range),
    ``drop`` (the first request announces the whole file and closes after half of it; later ones honour
    Range), ``missing`` (404)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def do_GET(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        server.requests.append((self.path, self.headers.get("Range")))
        behaviour, _, name = self.path.lstrip("/").partition("/")
        name = urllib.parse.unquote(name)
        body = server.files.get(name)
        if behaviour == "missing" or body is None:
            self.send_error(404)
            return
        if behaviour == "drop" and self.path not in server.dropped:
            server.dropped.add(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True  # the server closes the socket: the body is cut short
            return
        wanted = self.headers.get("Range")
        if behaviour in ("range", "drop") and wanted and wanted.startswith("bytes="):
            start = int(wanted[len("bytes=") :].split("-")[0])
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            self.wfile.write(body[start:])
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.dropped: set[str] = set()

    def url(self, behaviour: str, name: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{behaviour}/{urllib.parse.quote(name)}"

    def gets(self, name: str) -> list[tuple[str, str | None]]:
        """(path, Range header) of every request for ``name``."""
        return [(p, r) for p, r in self.requests if urllib.parse.unquote(p).endswith("/" + name)]


@pytest.fixture
def server():
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on: bound, then released."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(autouse=True)
def local_only(monkeypatch):
    """Nothing here may reach another host: every URL opened by the downloader is checked."""
    real = dl.urlopen

    def guarded(request, *args, **kwargs):
        parts = urllib.parse.urlsplit(request.full_url)
        assert parts.scheme == "file" or parts.hostname == "127.0.0.1", request.full_url
        return real(request, *args, **kwargs)

    monkeypatch.setattr(dl, "urlopen", guarded)


# ---------------------------------------------------------------------------------------------------------
# Tiny archives in the real layouts
# ---------------------------------------------------------------------------------------------------------
class TinyMNISTRot(RotatedMNISTDataModule):
    """The MNIST-rot reader on tiny files: 12 train_valid rows and 5 test rows stand for 12,000 and 50,000."""

    EXPECTED_ROWS = {AMAT_TRAIN: 12, AMAT_TEST: 5}


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _amat(rows: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    table = np.concatenate([rng.random((rows, 784)), rng.integers(0, 10, (rows, 1))], axis=1)
    out = io.StringIO()
    np.savetxt(out, table, fmt="%.6f")
    return out.getvalue().encode()


def _h5(points: np.ndarray, labels: np.ndarray, tmp: Path) -> bytes:
    with h5py.File(tmp, "w") as f:
        f.create_dataset("data", data=points.astype(np.float32))
        f.create_dataset("label", data=labels.reshape(-1, 1).astype(np.uint8))
    return tmp.read_bytes()


def mnist_archive(seed: int = 0) -> bytes:
    """``mnist_rotation_new.zip``: the two .amat files at the top level, as in the original."""
    return _zip({AMAT_TRAIN: _amat(12, seed), AMAT_TEST: _amat(5, seed + 1)})


def modelnet_archive(tmp: Path, seed: int = 0) -> bytes:
    """``modelnet40_ply_hdf5_2048.zip``: everything in its ``modelnet40_ply_hdf5_2048/`` folder."""
    rng = np.random.default_rng(seed)
    folder = "modelnet40_ply_hdf5_2048/"
    members = {}
    for name, n in (("ply_data_train0.h5", 3), ("ply_data_test0.h5", 2)):
        points = rng.normal(size=(n, 2048, 3)) * 0.3
        members[folder + name] = _h5(points, rng.integers(0, 40, n), tmp / name)
    members[folder + "train_files.txt"] = f"data/{folder}ply_data_train0.h5\n".encode()
    members[folder + "test_files.txt"] = f"data/{folder}ply_data_test0.h5\n".encode()
    members[folder + "shape_names.txt"] = b"airplane\nbathtub\n"
    return _zip(members)


SHAPES = [("Airplane", "02691156", "a1", "train"), ("Airplane", "02691156", "a2", "train"),
          ("Mug", "03797390", "m1", "val"), ("Airplane", "02691156", "a3", "test"),
          ("Mug", "03797390", "m2", "test")]  # fmt: skip


def shapenet_archive(seed: int = 0) -> bytes:
    """``shapenetcore_partanno_segmentation_benchmark_v0_normal.zip``: one folder with the category file,
    the split lists and ``<synset>/<token>.txt`` rows ``x y z nx ny nz part``."""
    rng = np.random.default_rng(seed)
    folder = SHAPENET_ZIP_FOLDER + "/"
    members = {folder + "synsetoffset2category.txt": b"Airplane\t02691156\nMug\t03797390\n"}
    lists: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for category, synset, token, split in SHAPES:
        parts = SHAPENET_CATEGORY_PARTS[SHAPENET_CATEGORIES.index(category)]
        table = np.concatenate(
            [rng.normal(size=(60, 3)), rng.normal(size=(60, 3)), rng.choice(parts, size=(60, 1))], axis=1
        )
        out = io.StringIO()
        np.savetxt(out, table, fmt="%.6f")
        members[f"{folder}{synset}/{token}.txt"] = out.getvalue().encode()
        lists[split].append(f"shape_data/{synset}/{token}")
    for split, entries in lists.items():
        members[f"{folder}train_test_split/shuffled_{split}_file_list.json"] = json.dumps(entries).encode()
    return _zip(members)


LOADERS = {
    "rotated_mnist": "tests.test_download:TinyMNISTRot",
    "modelnet40": "canonical_network.data.modelnet:ModelNet40DataModule",
    "shapenet_part": "canonical_network.data.shapenet:ShapeNetPartDataModule",
}


def tiny_source(name: str, data: bytes, urls: list[str], **changes) -> DatasetSource:
    """The registry entry ``name`` with the server's URLs, the tiny archive's SHA-256 and a loader for tiny
    files: the real entry's archive name and folder, never its real checksum."""
    real = SOURCES[name]
    checksum = Checksum("sha256", hashlib.sha256(data).hexdigest(), "this test's archive")
    fields = dict(
        urls=tuple(urls), checksum=checksum, why=None, size=None, size_source=None, loader=LOADERS[name]
    )
    fields.update(changes)
    return replace(real, **fields)


def archive_for(name: str, tmp: Path, seed: int = 0) -> bytes:
    if name == "rotated_mnist":
        return mnist_archive(seed)
    if name == "modelnet40":
        return modelnet_archive(tmp, seed)
    return shapenet_archive(seed)


def read_with_loader(name: str, target: Path):
    """The dataset's DataModule ``setup`` on the downloaded folder: split sizes."""
    if name == "rotated_mnist":
        dm = TinyMNISTRot(data_dir=str(target), num_train=10)
    elif name == "modelnet40":
        dm = ModelNet40DataModule(data_dir=str(target), rotation="none/none")
    else:
        dm = ShapeNetPartDataModule(data_dir=str(target), num_points=32, rotation="none/none")
    dm.setup()
    return dm, {split: len(ds) for split, ds in dm.splits.items()}


def leftovers(root: Path) -> list[str]:
    """What the download left in the root besides the dataset folders and the lock files."""
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock") and not p.is_dir()) + sorted(
        p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(".")
    )


# ---------------------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------------------
def test_registry_entries_name_their_sources_and_loaders():
    assert {s.archive for s in SOURCES.values()} == {
        "mnist_rotation_new.zip",
        "modelnet40_ply_hdf5_2048.zip",
        "shapenetcore_partanno_segmentation_benchmark_v0_normal.zip",
    }
    for name, spec in SOURCES.items():
        assert spec.folder == name
        assert all(url.endswith("/" + spec.archive) for url in spec.urls), spec.urls
        assert spec.checksum is not None and spec.checksum.source  # every value says where it was published
        assert spec.loader_class().SOURCE == name
    assert SOURCES["rotated_mnist"].urls[0].startswith("http://www.iro.umontreal.ca/~lisa/")
    assert SOURCES["modelnet40"].urls[0].startswith("https://shapenet.cs.stanford.edu/media/")
    assert SOURCES["shapenet_part"].urls[0].startswith("https://shapenet.cs.stanford.edu/media/")
    # An entry without a checksum must say why; a size must say where it comes from.
    with pytest.raises(ValueError, match="why"):
        replace(SOURCES["modelnet40"], checksum=None)
    with pytest.raises(ValueError, match="size"):
        replace(SOURCES["modelnet40"], size_source=None)
    with pytest.raises(ValueError, match="hex"):
        Checksum("sha256", "not-hex", "nowhere")


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_real_data_configs_have_a_download_switch_off_by_default(name):
    config = yaml.safe_load((CONFIG_DIR / "data" / f"{name}.yaml").read_text())
    assert config["data"]["download"] is False
    assert config["data"]["data_dir"].endswith("/" + SOURCES[name].folder)


# ---------------------------------------------------------------------------------------------------------
# End to end: command line → files → DataModule
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_command_downloads_unpacks_and_the_loader_reads_it(name, server, tmp_path, monkeypatch, capsys):
    data = archive_for(name, tmp_path)
    archive = SOURCES[name].archive
    server.files[archive] = data
    monkeypatch.setitem(SOURCES, name, tiny_source(name, data, [server.url("range", archive)]))
    root = tmp_path / "data"
    assert dl.main([name, "--root", str(root), "--quiet"]) == 0
    target = root / SOURCES[name].folder
    _, sizes = read_with_loader(name, target)
    expected = {
        "rotated_mnist": {"train": 10, "val": 2, "test": 5},
        "modelnet40": {"train": 3, "val": 2, "test": 2},
        "shapenet_part": {"train": 3, "val": 2, "test": 2},
    }[name]
    assert sizes == expected
    # The loader's caches were built before the folder was moved into place.
    if name == "rotated_mnist":
        assert {p.name for p in target.glob("*.npz")} == {
            Path(AMAT_TRAIN).stem + ".npz",
            Path(AMAT_TEST).stem + ".npz",
        }
    if name == "shapenet_part":
        assert len(list((target / SHAPENET_ZIP_FOLDER).glob("parsed_*.npz"))) == 3
    assert leftovers(root) == []  # no .part, no archive, no temporary folder
    # A second run finds the data and fetches nothing.
    count = len(server.requests)
    assert dl.main([name, "--root", str(root), "--quiet"]) == 0
    assert len(server.requests) == count


def test_all_downloads_every_dataset(server, tmp_path, monkeypatch):
    for name in SOURCES:
        data = archive_for(name, tmp_path)
        server.files[SOURCES[name].archive] = data
        monkeypatch.setitem(
            SOURCES, name, tiny_source(name, data, [server.url("range", SOURCES[name].archive)])
        )
    root = tmp_path / "data"
    assert dl.main(["all", "--root", str(root), "--quiet"]) == 0
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(SOURCES)


# ---------------------------------------------------------------------------------------------------------
# Failures: one clear message, exit status 1, nothing where the loader looks
# ---------------------------------------------------------------------------------------------------------
def test_checksum_mismatch_exits_non_zero_and_leaves_nothing(server, tmp_path, monkeypatch, capsys):
    good = modelnet_archive(tmp_path)
    archive = SOURCES["modelnet40"].archive
    server.files[archive] = modelnet_archive(tmp_path, seed=1)  # a valid zip, but not the published one
    url = server.url("range", archive)
    spec = tiny_source("modelnet40", good, [url])
    monkeypatch.setitem(SOURCES, "modelnet40", spec)
    root = tmp_path / "data"
    assert dl.main(["modelnet40", "--root", str(root), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and spec.checksum.value in err and url in err
    assert hashlib.sha256(server.files[archive]).hexdigest() in err  # what arrived, for the user to compare
    assert "Manual route (data/README.md)" in err and "--mirror" in err
    assert not (root / "modelnet40").exists()  # nothing under the target folder
    assert leftovers(root) == []  # the wrong bytes are not kept for resuming


def test_a_failed_forced_download_keeps_the_data_in_place(server, tmp_path, monkeypatch):
    data = mnist_archive()
    archive = SOURCES["rotated_mnist"].archive
    server.files[archive] = data
    spec = tiny_source("rotated_mnist", data, [server.url("range", archive)])
    root = tmp_path / "data"
    dl.download_dataset(spec, root / "rotated_mnist", progress=False)
    before = (root / "rotated_mnist" / AMAT_TRAIN).read_bytes()
    server.files[archive] = mnist_archive(seed=5)  # the server now serves something else
    with pytest.raises(dl.DownloadError, match="checksum mismatch"):
        dl.download_dataset(spec, root / "rotated_mnist", force=True, progress=False)
    assert (root / "rotated_mnist" / AMAT_TRAIN).read_bytes() == before
    read_with_loader("rotated_mnist", root / "rotated_mnist")


def test_server_down_gives_one_clear_message(closed_port, tmp_path, monkeypatch, capsys):
    url = f"http://127.0.0.1:{closed_port}/range/{SOURCES['shapenet_part'].archive}"
    monkeypatch.setitem(SOURCES, "shapenet_part", tiny_source("shapenet_part", b"x", [url]))
    root = tmp_path / "data"
    assert dl.main(["shapenet_part", "--root", str(root), "--quiet", "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert url in err and "connection refused" in err
    assert "Manual route (data/README.md)" in err and "Nothing was written to" in err
    assert err.count("could not download") == 1
    assert not (root / "shapenet_part").exists()


def test_404_then_the_next_mirror(server, tmp_path, caplog):
    data = mnist_archive()
    archive = SOURCES["rotated_mnist"].archive
    server.files[archive] = data
    missing, good = server.url("missing", archive), server.url("range", archive)
    spec = tiny_source("rotated_mnist", data, [missing, good])
    with caplog.at_level(logging.INFO, logger=dl.__name__):
        dl.download_dataset(spec, tmp_path / "rotated_mnist", progress=False)
    assert [p for p, _ in server.gets(archive)] == [urllib.parse.urlsplit(u).path for u in (missing, good)]
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "HTTP 404" in warning and missing in warning and f"trying next: {good}" in warning
    read_with_loader("rotated_mnist", tmp_path / "rotated_mnist")


def test_every_mirror_failing_names_each_url_and_reason(server, closed_port, tmp_path):
    data = mnist_archive()
    archive = SOURCES["rotated_mnist"].archive
    server.files[archive] = mnist_archive(seed=3)
    urls = [
        server.url("missing", archive),
        f"http://127.0.0.1:{closed_port}/x/{archive}",
        server.url("plain", archive),
    ]
    spec = tiny_source("rotated_mnist", data, urls)
    with pytest.raises(dl.DownloadError) as info:
        dl.download_dataset(spec, tmp_path / "rotated_mnist", progress=False, timeout=5)
    message = str(info.value)
    assert f"1. {urls[0]}: HTTP 404" in message
    assert f"-> next tried: {urls[1]}" in message and f"2. {urls[1]}: connection refused" in message
    assert f"-> next tried: {urls[2]}" in message and f"3. {urls[2]}: checksum mismatch" in message
    assert not (tmp_path / "rotated_mnist").exists()


# ---------------------------------------------------------------------------------------------------------
# Resuming
# ---------------------------------------------------------------------------------------------------------
def test_dropped_connection_is_resumed_with_a_range_request(server, tmp_path, caplog):
    data = shapenet_archive()
    archive = SOURCES["shapenet_part"].archive
    server.files[archive] = data
    spec = tiny_source("shapenet_part", data, [server.url("drop", archive)])
    with caplog.at_level(logging.WARNING, logger=dl.__name__):
        dl.download_dataset(spec, tmp_path / "shapenet_part", progress=False)
    ranges = [r for _, r in server.gets(archive)]
    assert ranges == [None, f"bytes={len(data) // 2}-"]  # the second request resumed where the first stopped
    assert any("stopped at" in r.getMessage() and "resuming" in r.getMessage() for r in caplog.records)
    read_with_loader("shapenet_part", tmp_path / "shapenet_part")


@pytest.mark.parametrize("handler", ["range", "plain"])
def test_partial_file_of_an_earlier_run_is_resumed_or_restarted(server, tmp_path, handler):
    """A leftover .part is resumed where the server honours Range ("range"); a server that ignores it
    ("plain") sends the whole file, which replaces the .part. Either way one request asks from byte 1000."""
    data = modelnet_archive(tmp_path)
    archive = SOURCES["modelnet40"].archive
    server.files[archive] = data
    spec = tiny_source("modelnet40", data, [server.url(handler, archive)])
    (tmp_path / f"{archive}.part").write_bytes(data[:1000])
    dl.download_dataset(spec, tmp_path / "modelnet40", progress=False)
    assert [r for _, r in server.gets(archive)] == ["bytes=1000-"]
    read_with_loader("modelnet40", tmp_path / "modelnet40")


def test_partial_file_longer_than_the_archive_restarts(server, tmp_path):
    data = mnist_archive()
    archive = SOURCES["rotated_mnist"].archive
    server.files[archive] = data
    spec = tiny_source("rotated_mnist", data, [server.url("range", archive)])
    (tmp_path / f"{archive}.part").write_bytes(b"\0" * (len(data) + 10))
    dl.download_dataset(spec, tmp_path / "rotated_mnist", progress=False)
    assert [r for _, r in server.gets(archive)] == [f"bytes={len(data) + 10}-", None]  # 416, then afresh


# ---------------------------------------------------------------------------------------------------------
# Options and the DataModule side
# ---------------------------------------------------------------------------------------------------------
def test_mirror_fetches_the_archive_name_under_another_url(server, tmp_path, monkeypatch):
    data = mnist_archive()
    archive = SOURCES["rotated_mnist"].archive
    server.files[archive] = data
    monkeypatch.setitem(
        SOURCES, "rotated_mnist", tiny_source("rotated_mnist", data, [server.url("missing", archive)])
    )
    mirror = f"http://127.0.0.1:{server.server_address[1]}/range/"
    assert dl.main(["rotated_mnist", "--root", str(tmp_path), "--mirror", mirror, "--quiet"]) == 0
    assert [p for p, _ in server.requests] == [f"/range/{archive}"]  # only the mirror was asked


def local_archive_folder(tmp_path, monkeypatch):
    """A folder holding the (tiny) Rotated MNIST archive, whose registered URL is unreachable: a file mirror."""
    data = mnist_archive()
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / SOURCES["rotated_mnist"].archive).write_bytes(data)
    monkeypatch.setitem(
        SOURCES, "rotated_mnist", tiny_source("rotated_mnist", data, ["http://127.0.0.1:9/x"])
    )
    return downloads


def test_file_mirror_is_the_manual_route(tmp_path, monkeypatch):
    downloads = local_archive_folder(tmp_path, monkeypatch)
    root = tmp_path / "data"
    assert dl.main(["rotated_mnist", "--root", str(root), "--mirror", downloads.as_uri(), "--quiet"]) == 0
    read_with_loader("rotated_mnist", root / "rotated_mnist")
    assert (downloads / SOURCES["rotated_mnist"].archive).exists()  # the user's copy is left alone


def test_force_downloads_again_and_keeps_unrelated_files(server, tmp_path):
    data = mnist_archive()
    archive = SOURCES["rotated_mnist"].archive
    server.files[archive] = data
    spec = tiny_source("rotated_mnist", data, [server.url("range", archive)])
    target = tmp_path / "rotated_mnist"
    target.mkdir()
    (target / "notes.txt").write_text("mine")  # a non-empty folder: entries are moved in one by one
    dl.download_dataset(spec, target, progress=False)
    dl.download_dataset(spec, target, progress=False)
    assert len(server.gets(archive)) == 1
    dl.download_dataset(spec, target, force=True, progress=False)
    assert len(server.gets(archive)) == 2
    assert (target / "notes.txt").read_text() == "mine"
    assert leftovers(tmp_path) == []
    read_with_loader("rotated_mnist", target)


def test_no_published_checksum_checks_the_zip_members(server, tmp_path):
    data = shapenet_archive()
    archive = SOURCES["shapenet_part"].archive
    damaged = bytearray(data)
    damaged[len(data) // 3] ^= 0xFF  # one flipped byte inside a compressed member
    server.files[archive] = bytes(damaged)
    spec = tiny_source(
        "shapenet_part", data, [server.url("range", archive)], checksum=None, why="none is published (test)"
    )
    with pytest.raises(dl.DownloadError, match=r"damaged|not a readable zip|Error -3") as info:
        dl.download_dataset(spec, tmp_path / "shapenet_part", progress=False)
    assert "check that `unzip -t` reports no errors" in str(info.value)
    server.files[archive] = data
    dl.download_dataset(spec, tmp_path / "shapenet_part", progress=False)
    read_with_loader("shapenet_part", tmp_path / "shapenet_part")


def test_published_size_is_checked(server, tmp_path):
    data = mnist_archive()
    archive = SOURCES["rotated_mnist"].archive
    server.files[archive] = data
    spec = tiny_source(
        "rotated_mnist", data, [server.url("range", archive)], size=len(data) + 1, size_source="a test"
    )
    with pytest.raises(
        dl.DownloadError, match=rf"size mismatch: {len(data):,} bytes, expected {len(data) + 1:,}"
    ):
        dl.download_dataset(spec, tmp_path / "rotated_mnist", progress=False)


def test_archive_the_loader_cannot_read_is_not_placed(server, tmp_path):
    data = _zip({"README": b"not the dataset"})
    archive = SOURCES["modelnet40"].archive
    server.files[archive] = data
    spec = tiny_source("modelnet40", data, [server.url("range", archive)])
    with pytest.raises(dl.DownloadError, match="not what ModelNet40DataModule reads"):
        dl.download_dataset(spec, tmp_path / "modelnet40", progress=False)
    assert not (tmp_path / "modelnet40").exists() and leftovers(tmp_path) == []


def test_data_download_true_makes_prepare_data_download(server, tmp_path, monkeypatch):
    data = mnist_archive()
    archive = SOURCES["rotated_mnist"].archive
    server.files[archive] = data
    monkeypatch.setitem(
        SOURCES, "rotated_mnist", tiny_source("rotated_mnist", data, [server.url("range", archive)])
    )
    target = tmp_path / "data" / "rotated_mnist"
    off = TinyMNISTRot(data_dir=str(target), num_train=10)
    off.prepare_data()  # download=false: nothing is fetched ...
    assert server.requests == [] and not target.exists()
    with pytest.raises(FileNotFoundError) as info:  # ... and the error names the command
        off.setup()
    assert f"python -m canonical_network.data.download rotated_mnist --root {target.parent}" in str(
        info.value
    )
    assert "data.download=true" in str(info.value)
    on = TinyMNISTRot(data_dir=str(target), num_train=10, download=True)
    on.prepare_data()
    on.setup()
    assert len(on.splits["test"]) == 5 and len(server.gets(archive)) == 1
    # without a Trainer, setup downloads on its own
    other = tmp_path / "other" / "rotated_mnist"
    TinyMNISTRot(data_dir=str(other), num_train=10, download=True).setup()
    assert len(server.gets(archive)) == 2


def test_two_jobs_on_one_node_download_once(server, tmp_path):
    data = shapenet_archive()
    archive = SOURCES["shapenet_part"].archive
    server.files[archive] = data
    spec = tiny_source("shapenet_part", data, [server.url("range", archive)])
    target = tmp_path / "shapenet_part"
    errors = []

    def job():
        try:
            dl.download_dataset(spec, target, progress=False)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=job) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(server.gets(archive)) == 1  # the second waited for the lock, then found the data
    read_with_loader("shapenet_part", target)


def test_leftovers_of_a_killed_run_are_removed(server, tmp_path):
    data = mnist_archive()
    archive = SOURCES["rotated_mnist"].archive
    server.files[archive] = data
    spec = tiny_source("rotated_mnist", data, [server.url("range", archive)])
    stale = tmp_path / ".rotated_mnist.tmp-1-deadbeef" / "staged"
    stale.mkdir(parents=True)
    (stale / AMAT_TRAIN).write_text("half")
    dl.download_dataset(spec, tmp_path / "rotated_mnist", progress=False)
    assert leftovers(tmp_path) == []
    assert torch.equal(
        read_with_loader("rotated_mnist", tmp_path / "rotated_mnist")[0].splits["test"].tensors[1],
        torch.from_numpy(np.loadtxt(io.BytesIO(_amat(5, 1)))[:, -1].astype(np.int64)),
    )


def test_unpacking_never_writes_outside_its_folder(tmp_path):
    """An archive whose members name ``../`` or absolute paths (a tampered mirror) is unpacked inside the staging
    folder only: nothing read from an archive may write outside data/."""
    archive = tmp_path / "mirror" / SOURCES["rotated_mnist"].archive
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("../escaped.txt", "outside")
        handle.writestr(str(tmp_path / "absolute.txt"), "outside")
        handle.writestr("inside/ok.txt", "inside")
    staged = tmp_path / "data" / "staged"
    staged.parent.mkdir()
    dl._unpack(SOURCES["rotated_mnist"], archive, staged, tmp_path / "data" / "target")
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.txt"))
    assert written and all(name.startswith("data/staged/") for name in written), written


def test_a_mirror_may_be_a_local_folder_and_the_root_defaults_to_the_projects_data(tmp_path, monkeypatch, capsys):
    """--mirror <folder> is that folder's file:// URL (it was an 'unknown url type' traceback); a mirror that is
    neither a URL nor a folder is one argument error; without --root the data goes where training reads it,
    the project's data/, not the working directory's."""
    import canonical_network.utils.config as config

    downloads = local_archive_folder(tmp_path, monkeypatch)
    project = tmp_path / "project"
    monkeypatch.setattr(config, "PROJECT_ROOT", project)
    monkeypatch.chdir(tmp_path)
    assert dl.main(["rotated_mnist", "--mirror", str(downloads), "--quiet"]) == 0
    read_with_loader("rotated_mnist", project / "data" / "rotated_mnist")
    assert not (tmp_path / "data").exists()
    with pytest.raises(SystemExit) as refused:
        dl.main(["rotated_mnist", "--mirror", str(tmp_path / "nowhere"), "--quiet"])
    assert refused.value.code == 2
    assert "neither an http(s):// or file:// URL nor an existing folder" in capsys.readouterr().err
