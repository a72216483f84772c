"""Caches of parsed data: keyed on the sources' content (not their dates), written atomically, never holding
data that failed its checks. The shared helper, then the MNIST-rot reader on top of it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from canonical_network.data import cache as cache_module
from canonical_network.data.cache import SourceCache
from canonical_network.data.rotated_mnist import AMAT_TEST, AMAT_TRAIN, RotatedMNISTDataModule

# 2007-06-01, the date unzip gives the files of mnist_rotation_new.zip.
DATE_2007_NS = 1_180_656_000 * 10**9


def _date_2007(*paths: Path) -> None:
    for path in paths:
        os.utime(path, ns=(DATE_2007_NS, DATE_2007_NS))


def _replace(path: Path, text: str) -> None:
    """Replace a file as unzip does: a new file, dated 2007."""
    path.unlink()
    path.write_text(text)
    _date_2007(path)


class Parser:
    """A build function that reads the numbers in its sources and counts its calls."""

    def __init__(self, *sources: Path) -> None:
        self.sources, self.calls = sources, 0

    def __call__(self) -> dict[str, np.ndarray]:
        self.calls += 1
        values = [float(v) for s in self.sources for v in s.read_text().split()]
        if any(v < 0 for v in values):
            raise ValueError("negative value")
        return {"values": np.array(values)}


@pytest.fixture
def hashes(monkeypatch) -> list[Path]:
    """Every file the cache hashes, in order."""
    seen: list[Path] = []
    real = cache_module.file_sha256

    def counting(path):
        seen.append(Path(path))
        return real(path)

    monkeypatch.setattr(cache_module, "file_sha256", counting)
    return seen


# ---------------------------------------------------------------------------------------------------------
# The helper
# ---------------------------------------------------------------------------------------------------------
def test_older_dated_different_content_of_the_same_size_rebuilds(tmp_path):
    source = tmp_path / "a.txt"
    source.write_text("1 2 3")
    parse = Parser(source)
    first = SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)
    assert first["values"].tolist() == [1, 2, 3] and parse.calls == 1
    assert SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)["values"].tolist() == [1, 2, 3]
    assert parse.calls == 1  # cached
    _replace(source, "4 5 6")  # same size, older than the cache
    assert SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)["values"].tolist() == [4, 5, 6]
    assert parse.calls == 2


@pytest.fixture
def settled(monkeypatch) -> None:
    """Files count as written long ago (no racy window), as a dataset unzipped earlier is."""
    monkeypatch.setattr(cache_module, "_RACY_NS", 0)


def test_unchanged_sources_are_not_hashed_and_identical_copies_not_reparsed(tmp_path, hashes, settled):
    source = tmp_path / "a.txt"
    source.write_text("1 2 3")
    parse = Parser(source)
    SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)
    assert hashes == [source]  # once, before parsing
    hashes.clear()
    SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)
    assert hashes == [] and parse.calls == 1  # same size, mtime, ctime and inode: not even hashed
    _replace(source, "1 2 3")  # re-extracted, identical: hashed once, not parsed, recorded again
    SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)
    assert hashes == [source] and parse.calls == 1
    hashes.clear()
    SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)
    assert hashes == [] and parse.calls == 1


def test_a_file_rewritten_within_one_clock_tick_is_still_noticed(tmp_path, hashes, monkeypatch):
    """File times have the kernel tick's resolution: rewritten within it, with the same size, a file keeps
    its stat (simulated here by ignoring ctime and inode). A source this recent is recorded without its
    stat, so the next load hashes it."""
    monkeypatch.setattr(cache_module, "_stat_key", lambda stat: [stat.st_mtime_ns])
    source = tmp_path / "a.txt"
    source.write_text("1 2 3")
    written = source.stat().st_mtime_ns
    parse = Parser(source)
    SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)
    source.write_text("4 5 6")
    os.utime(source, ns=(written, written))
    assert SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)["values"].tolist() == [4, 5, 6]
    assert parse.calls == 2

    def parse_then_rewrite_in_the_same_tick():
        arrays = Parser(source)()
        source.write_text("7 8 9")
        os.utime(source, ns=(written, written))
        return arrays

    cache = tmp_path / "b.npz"
    SourceCache(cache, [source]).load_or_build(parse_then_rewrite_in_the_same_tick)
    assert not cache.exists()  # what was parsed is no longer the file: not cached


def test_other_key_other_sources_legacy_and_corrupt_caches_rebuild(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("1")
    b.write_text("2")
    path = tmp_path / "c.npz"
    parse = Parser(a)
    SourceCache(path, [a], key={"format": 1}).load_or_build(parse)
    SourceCache(path, [a], key={"format": 2}).load_or_build(parse)
    assert parse.calls == 2
    assert SourceCache(path, [b], key={"format": 2}).load_or_build(Parser(b))["values"].tolist() == [2]
    np.savez(path, values=np.array([9.0]))  # a cache without a record (older code wrote these)
    assert SourceCache(path, [b], key={"format": 2}).load_or_build(Parser(b))["values"].tolist() == [2]
    path.write_bytes(path.read_bytes()[:50])  # cut short
    assert SourceCache(path, [b], key={"format": 2}).load_or_build(Parser(b))["values"].tolist() == [2]
    assert SourceCache(path, [b], key={"format": 2}).is_current()


def test_failed_checks_leave_no_cache(tmp_path):
    source = tmp_path / "a.txt"
    source.write_text("1 -2")
    with pytest.raises(ValueError, match="negative"):
        SourceCache(tmp_path / "a.npz", [source]).load_or_build(Parser(source))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_source_rewritten_while_parsing_is_not_cached(tmp_path):
    source = tmp_path / "a.txt"
    source.write_text("1")

    def parse_then_rewrite():
        arrays = Parser(source)()
        source.write_text("2")
        return arrays

    SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse_then_rewrite)
    assert not (tmp_path / "a.npz").exists()


def _torn_save(file, *args, **kwargs):
    """np.save / np.savez that write part of the file, then fail as a full disk does."""
    if hasattr(file, "write"):
        file.write(b"PK\x03\x04 partial")
    else:
        Path(file).write_bytes(b"\x93NUMPY partial")
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_write_leaves_neither_cache_nor_temporary_file(tmp_path, monkeypatch):
    source = tmp_path / "a.txt"
    source.write_text("1 2")
    with monkeypatch.context() as patch:
        patch.setattr(np, "savez", _torn_save)
        assert SourceCache(tmp_path / "a.npz", [source]).load_or_build(Parser(source))["values"].size == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]

    def interrupted(file, *args, **kwargs):
        file.write(b"PK partial")
        raise KeyboardInterrupt

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(np, "savez", interrupted)
        SourceCache(tmp_path / "a.npz", [source]).load_or_build(Parser(source))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    parse = Parser(source)
    SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz", "a.txt"] and parse.calls == 1
    SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)
    assert parse.calls == 1


def test_a_removed_source_is_stood_in_for_by_the_cache(tmp_path):
    source = tmp_path / "a.txt"
    source.write_text("7")
    parse = Parser(source)
    SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)
    source.unlink()
    assert SourceCache(tmp_path / "a.npz", [source]).load_or_build(parse)["values"].tolist() == [7]
    assert parse.calls == 1


# ---------------------------------------------------------------------------------------------------------
# MNIST-rot
# ---------------------------------------------------------------------------------------------------------
def _amat_text(rows: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    table = np.concatenate([rng.random((rows, 784)), rng.integers(0, 10, (rows, 1))], axis=1)
    return "".join(" ".join(f"{v:.6f}" for v in row) + "\n" for row in table)


class TinyMNISTRot(RotatedMNISTDataModule):
    EXPECTED_ROWS = None  # tiny files of any length


def _mnist(root: Path, num_train: int) -> TinyMNISTRot:
    dm = TinyMNISTRot(data_dir=str(root), num_train=num_train)
    dm.setup()
    return dm


def test_mnist_rot_replaced_by_older_files_is_parsed_again(tmp_path):
    """The report: correct .amat files dated 2007 (as unzip leaves them) replaced wrong ones; the old
    cache, being newer, was used (test: 20 rows instead of 25)."""
    (tmp_path / AMAT_TRAIN).write_text(_amat_text(12, seed=0))
    (tmp_path / AMAT_TEST).write_text(_amat_text(20, seed=1))
    old = _mnist(tmp_path, num_train=10)
    assert len(old.splits["test"]) == 20
    _replace(tmp_path / AMAT_TRAIN, _amat_text(12, seed=2))  # same size, other digits
    _replace(tmp_path / AMAT_TEST, _amat_text(25, seed=3))
    new = _mnist(tmp_path, num_train=10)
    assert len(new.splits["test"]) == 25
    assert not torch.equal(new.splits["train"].tensors[0], old.splits["train"].tensors[0])
    fresh = np.loadtxt(tmp_path / AMAT_TRAIN, dtype=np.float32)
    np.testing.assert_array_equal(new.splits["train"].tensors[0].view(10, -1).numpy(), fresh[:10, :784])


def test_mnist_rot_cache_write_is_atomic(tmp_path, monkeypatch, caplog):
    (tmp_path / AMAT_TRAIN).write_text(_amat_text(12, seed=0))
    (tmp_path / AMAT_TEST).write_text(_amat_text(5, seed=1))
    with monkeypatch.context() as patch:
        patch.setattr(np, "save", _torn_save)
        patch.setattr(np, "savez", _torn_save)
        dm = _mnist(tmp_path, num_train=10)  # the data is still used; the cache is left for next time
    assert len(dm.splits["test"]) == 5 and "No space left on device" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([AMAT_TEST, AMAT_TRAIN])
    again = _mnist(tmp_path, num_train=10)
    assert torch.equal(again.splits["val"].tensors[0], dm.splits["val"].tensors[0])
    assert {p.suffix for p in tmp_path.iterdir()} == {".amat", ".npz"}
