"""utils/files.py: content hashes and atomic writes (no partial file, no temporary file left behind)."""

from __future__ import annotations

import hashlib

import pytest

from canonical_network.utils.files import atomic_write, atomic_write_text, file_sha256


def test_file_sha256(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * (3 << 20) + b"tail")
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_atomic_write_replaces_or_keeps_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_text(path, "old")
    atomic_write_text(path, "néw")
    assert path.read_text(encoding="utf-8") == "néw"

    def fail(stream):
        stream.write(b"half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        atomic_write(path, fail, fsync=True)
    assert path.read_text(encoding="utf-8") == "néw"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
