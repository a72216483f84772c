"""Caches of parsed arrays beside their source files, keyed on the sources' content.

A cache is one ``.npz`` holding the parsed arrays plus a record of what they were made from: the
caller's ``key`` (format version, parameters the arrays depend on) and, for every source file, its path
relative to the cache, its size and its SHA-256. It is used only when the key is the same and every source
still has that content, so replacing a source with different data, whatever its date, rebuilds the cache
(an ``unzip`` leaves the archive's dates on its files, often years old).

Hashing every source at every load would read every byte of them each time, so the record also keeps each
source's ``(mtime_ns, ctime_ns, inode)``. While those and the size are unchanged the file has not been
rewritten: the kernel sets ``ctime`` to the current time on every write, rename or ``utime``, and nothing
can set it back (``unzip``, ``cp -p`` and ``rsync -a`` restore ``mtime`` only). Only a source whose stat
changed is hashed; if its content is the same (a copied or re-extracted identical file) the cache is kept
and its record refreshed. File times have the resolution of a kernel tick, so a source modified within the
last two seconds is recorded without its stat and hashed again at the next load.

``build`` parses *and validates*; it raises on bad data, and nothing is written then. The cache is written
to a uniquely named temporary file in the same folder and moved into place with ``os.replace``, so a reader
(or a concurrent job) sees either the old cache or the complete new one, never a partial file.

A source that no longer exists cannot contradict the cache: the cache stands in for it (e.g. ShapeNet's
thousands of text files may be deleted once parsed); callers decide whether missing sources are an error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from canonical_network.utils.files import file_sha256, temporary_path

log = logging.getLogger(__name__)

# Version of the record layout below; a cache with another version is rebuilt.
RECORD_VERSION = 1
# A file changed less than this long ago may change again without changing its stat (see _fingerprint).
_RACY_NS = 2 * 10**9
_RECORD = "__cache_record__"


def _stat_key(stat: os.stat_result) -> list[int]:
    return [stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def _canonical(key: Mapping[str, object] | None) -> str:
    return json.dumps(key or {}, sort_keys=True, default=str)


class SourceCache:
    """The cache ``path`` of arrays parsed from ``sources`` (files; their content is the cache's key).

    Args:
        path: the ``.npz`` file.
        sources: files the arrays are made from, in a fixed order.
        key: JSON-serialisable parameters the arrays depend on besides the sources (a format version,
            expected sizes); a cache written under another key is rebuilt.
        what: a name for log messages (``"MNIST-rot test file"``).
    """

    def __init__(
        self,
        path: Path,
        sources: Sequence[Path],
        key: Mapping[str, object] | None = None,
        what: str = "parsed data",
    ) -> None:
        self.path = Path(path)
        self.sources = [Path(s) for s in sources]
        self._names = {s: self._name(s) for s in self.sources}
        self.key = _canonical(key)
        self.what = what
        # path -> (size, stat key, sha256, racy) of each source hashed by this object: each is hashed once.
        self._hashed: dict[Path, tuple[int, list[int], str, bool]] = {}

    # ------------------------------------------------------------------ fingerprints
    def _name(self, source: Path) -> str:
        try:
            return source.relative_to(self.path.parent).as_posix()
        except ValueError:
            return str(source)

    def _fingerprint(self, source: Path) -> dict[str, object]:
        """Size, stat key and SHA-256 of ``source`` as it is now (hashing it unless already hashed as is)."""
        stat = source.stat()
        known = self._hashed.get(source)
        if known is None or known[0] != stat.st_size or known[1] != _stat_key(stat):
            # File times come from a coarse clock (one kernel tick): a file written this recently could be
            # rewritten with the same size and stat. Its stat is not recorded, so it is hashed next time.
            racy = time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) < _RACY_NS
            known = (stat.st_size, _stat_key(stat), file_sha256(source), racy)
            self._hashed[source] = known
        stat_key = None if known[3] else known[1]
        return {"path": self._names[source], "size": known[0], "stat": stat_key, "sha256": known[2]}

    def _record(self) -> dict[str, object]:
        return {
            "version": RECORD_VERSION,
            "key": self.key,
            "sources": [self._fingerprint(s) for s in self.sources],
        }

    # ------------------------------------------------------------------ reading
    def _read_record(self) -> dict | None:
        with np.load(self.path) as cache:  # an .npz reads each member only when it is accessed
            if _RECORD not in cache.files:
                return None
            return json.loads(cache[_RECORD].tobytes().decode())

    def _stale_reason(self, record: dict | None) -> tuple[str | None, bool]:
        """Why the cache does not match the sources (None if it does), and whether its record needs
        refreshing (same content, new stat)."""
        if record is None or record.get("version") != RECORD_VERSION:
            return "it has no source record of this version", False
        if record.get("key") != self.key:
            return f"it was made with other settings ({record.get('key')} instead of {self.key})", False
        stored = record.get("sources", [])
        if [s.get("path") for s in stored] != [self._names[s] for s in self.sources]:
            return "it was made from other files", False
        refresh = False
        for source, entry in zip(self.sources, stored, strict=True):
            try:
                stat = source.stat()
            except FileNotFoundError:
                continue  # nothing left to contradict the cache: it stands in for the removed file
            if stat.st_size != entry["size"]:
                return f"{source} changed since (size {stat.st_size:,} bytes, was {entry['size']:,})", False
            if _stat_key(stat) == entry["stat"]:
                continue
            if self._fingerprint(source)["sha256"] != entry["sha256"]:
                return f"{source} changed since (different content, same size)", False
            refresh = True
        return None, refresh

    def is_current(self) -> bool:
        """Whether the cache exists and matches the sources and key (reads its record, not its arrays)."""
        if not self.path.is_file():
            return False
        try:
            return self._stale_reason(self._read_record())[0] is None
        except Exception:  # noqa: BLE001 - an unreadable cache is simply rebuilt
            return False

    def load(self) -> dict[str, np.ndarray] | None:
        """The cached arrays if the cache exists and matches the sources and key; otherwise None."""
        if not self.path.is_file():
            return None
        try:
            reason, refresh = self._stale_reason(self._read_record())
            if reason is None:
                with np.load(self.path) as cache:
                    arrays = {name: cache[name] for name in cache.files if name != _RECORD}
        except Exception as e:  # noqa: BLE001 - an unreadable cache is simply rebuilt
            log.warning("ignoring unreadable cache %s (%s: %s); re-parsing", self.path, type(e).__name__, e)
            return None
        if reason is not None:
            log.info("not using the cache %s of %s: %s; re-parsing", self.path, self.what, reason)
            return None
        if refresh and all(s.exists() for s in self.sources):
            self.save(arrays)  # same content under a new stat (copied, re-extracted): no hashing next time
        return arrays

    # ------------------------------------------------------------------ writing
    def save(self, arrays: Mapping[str, np.ndarray]) -> bool:
        """Write ``arrays`` with the sources' fingerprint, atomically; False (and a warning) if the folder
        cannot be written or a source is missing. The fingerprint must describe the bytes that were parsed:
        call :meth:`fingerprint_sources` before parsing, as :meth:`load_or_build` does."""
        if _RECORD in arrays:
            raise ValueError(f"{_RECORD!r} is reserved for the cache's record")
        try:
            record = self._record()
        except FileNotFoundError as e:
            log.warning("not caching %s: source %s is missing", self.what, e.filename)
            return False
        tmp = temporary_path(self.path)
        try:
            with open(tmp, "xb") as f:
                record_bytes = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
                np.savez(f, **arrays, **{_RECORD: record_bytes})
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if isinstance(e, OSError):  # e.g. a read-only data folder or a full disk: parse again next time
                log.warning("could not write the cache %s of %s (%s)", self.path, self.what, e)
                return False
            raise
        return True

    def fingerprint_sources(self) -> list[dict[str, object]] | None:
        """Hash every existing source now (kept for :meth:`save`); None if a source is missing."""
        try:
            return [self._fingerprint(s) for s in self.sources]
        except FileNotFoundError:
            return None

    def _unchanged_since_hashed(self) -> bool:
        for source in self.sources:
            try:
                stat = source.stat()
            except FileNotFoundError:
                return False
            known = self._hashed.get(source)
            if known is None or (known[0], known[1]) != (stat.st_size, _stat_key(stat)):
                return False
            if known[3] and file_sha256(source) != known[2]:  # racy: only the content can tell
                return False
        return True

    def build(self, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """``build()`` (which parses, validates and raises on bad data: then nothing is cached), saved
        atomically with the fingerprint of the sources it read."""
        before = self.fingerprint_sources()  # hash before parsing: the record then describes parsed bytes
        arrays = build()
        if before is None:
            return arrays  # a source is missing: build() normally raised already
        if not self._unchanged_since_hashed():
            log.warning("not caching %s: its source files changed while they were read", self.what)
            return arrays
        self.save(arrays)
        return arrays

    def load_or_build(self, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The cached arrays if they match the sources and key, else :meth:`build`."""
        arrays = self.load()
        return arrays if arrays is not None else self.build(build)
