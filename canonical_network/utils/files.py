"""One home for the file helpers several modules need: content hashes and atomic writes.

An atomic write goes to a uniquely named temporary file in the target's folder, which is renamed over the
target (``os.replace``, atomic within a file system): a reader sees the old file or the new one, never half a
file, and an interrupted writer leaves no plausible-looking partial file (its temporary file is removed).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def temporary_path(path: Path) -> Path:
    """A unique hidden name beside ``path`` for writing it atomically."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object], *, fsync: bool = False) -> Path:
    """``write(stream)`` into ``path`` atomically (see the module docstring); ``fsync`` also flushes the bytes
    to disk before the rename. Returns ``path``."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "xb") as stream:
            write(stream)
            if fsync:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """``Path(path).write_text(text)`` (UTF-8), atomically."""
    return atomic_write(path, lambda stream: stream.write(text.encode("utf-8")))


#: The files this process holds a lock on (:func:`exclusive_lock`), by resolved path: their open handles. A POSIX
#: lock belongs to the process and is released when *any* descriptor of the file is closed, so a note is added
#: through the holding handle (:func:`add_lock_note`), never by opening the file again.
_HELD: dict[str, Any] = {}


@contextmanager
def exclusive_lock(path: Path | str) -> Iterator[str | None]:
    """Try to hold an exclusive POSIX lock on ``path`` (created if missing) for the ``with`` block.

    Yields ``None`` while this process holds it (the file then names the holder: process, host, since when),
    or, without waiting, what the file says of the process that holds it. POSIX record locks (``lockf``) are
    released by the kernel when the holder ends, however it ends, so a killed holder never leaves a stale lock;
    they work on NFS with a lock manager, as on most Slurm clusters. The file is emptied when the block ends, so
    that what it says never outlives the lock (a killed holder's line stays: it names a process that is gone)."""
    import fcntl
    import socket
    import time

    with open(path, "a+") as handle:
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except OSError:
            held = False
        if not held:
            handle.seek(0)
            yield handle.read().strip() or "another process"
            return
        handle.truncate(0)
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        handle.write(f"process {os.getpid()} on {socket.gethostname()}, since {since}\n")
        handle.flush()
        key = str(Path(path).resolve())
        _HELD[key] = handle
        try:
            yield None
        finally:
            _HELD.pop(key, None)
            handle.truncate(0)
            handle.flush()
            fcntl.lockf(handle, fcntl.LOCK_UN)


def add_lock_note(path: Path | str, note: str) -> None:
    """Append ``note`` to what the lock file ``path``, which this process holds (:func:`exclusive_lock`), says of
    its holder (``train`` adds the job whose other ranks may then start)."""
    handle = _HELD.get(str(Path(path).resolve()))
    if handle is None:
        raise RuntimeError(f"{path} is not locked by this process")
    handle.seek(0)
    line = handle.read().rstrip("\n")
    handle.truncate(0)
    handle.write(f"{line}{note}\n")
    handle.flush()


def new_timestamped_folder(parent: Path | str) -> Path:
    """A new, empty folder ``<parent>/<UTC time>`` (``2026-11-30T08-40-12Z``), suffixed ``-2``, ``-3``... when a
    folder of that second exists: two set-asides in the same second never write into one folder."""
    import time

    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
    for number in range(1, 10_000):
        folder = parent / (stamp if number == 1 else f"{stamp}-{number}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"no free folder name for {stamp} in {parent}")
