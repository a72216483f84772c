"""Download, verify and unpack the real datasets: ``python -m canonical_network.data.download <name>|all``.

::

    python -m canonical_network.data.download rotated_mnist            # into data/rotated_mnist/
    python -m canonical_network.data.download all --root /scratch/data
    python -m canonical_network.data.download modelnet40 --mirror https://my.host/datasets   # URL/<archive>
    python -m canonical_network.data.download shapenet_part --force    # download and unpack again

The archives, their URLs (original first, then mirrors) and their published checksums are listed in
:mod:`canonical_network.data.sources`. For one dataset, under an exclusive file lock in the data root (two jobs
on one node never download twice; the second waits and then finds the data in place):

1. If the DataModule finds its files complete in the target folder (``check_files``), nothing is done
   (``--force`` downloads again).
2. Each URL is tried in turn. The bytes go to ``<root>/<archive>.part`` with a progress bar (size, speed); a
   partial file, left by a dropped connection or an earlier run, is resumed with an HTTP ``Range`` request
   where the server honours it, and restarted where it does not.
3. The archive is checked against its published checksum (md5 through ``torchvision.datasets.utils``,
   SHA-256 through :func:`canonical_network.data.cache.file_sha256`), and against its published size; an
   archive with no published checksum has every member's CRC read instead (``zipfile.testzip``). A mismatch
   deletes the file and moves on to the next URL.
4. The archive is unpacked (``torchvision.datasets.utils.extract_archive``) into a temporary folder beside the
   target, the DataModule checks the files there and builds its parsed caches (``prepare_files``: the
   ``.amat`` → ``.npz`` caches of MNIST-rot, ShapeNet-part's ``parsed_*.npz``), and only then is the folder
   renamed into place (one atomic rename; into an existing non-empty folder, one rename per top-level entry).
   An interrupted or failed run never leaves a partial dataset where the loader looks.

When every URL fails, :class:`DownloadError` gives one message: each URL tried and why it failed (HTTP status,
connection refused, no network, checksum mismatch) and the manual route (data/README.md). The command then
exits with status 1.

``data.download=true`` on a real-data config makes the DataModule's ``prepare_data`` (rank 0 of each node, as
Lightning calls it) run the same steps into ``data.data_dir``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import http.client
import logging
import os
import shutil
import socket
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar
from urllib.error import HTTPError, URLError
from urllib.parse import quote
from urllib.request import Request, urlopen

from canonical_network.data.sources import SOURCES, DatasetSource, data_readme, get_source

log = logging.getLogger(__name__)

USER_AGENT = "canonical_network-download/1 (Python urllib)"
#: Seconds a connection or a read may stall before the URL counts as failed.
TIMEOUT_S = 60.0
#: Transfers of one URL (the first plus resumptions) before moving on to the next URL.
MAX_ATTEMPTS_PER_URL = 4
_CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A dataset could not be downloaded or unpacked. The message names every URL tried, why each failed,
    and the manual steps."""


class _URLFailed(Exception):
    """One URL failed; the message is the reason shown to the user."""


# ---------------------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------------------
def download_dataset(
    source: DatasetSource | str,
    target: str | os.PathLike,
    *,
    mirror: str | None = None,
    force: bool = False,
    loader: type | None = None,
    progress: bool = True,
    timeout: float = TIMEOUT_S,
) -> Path:
    """Make ``target`` hold the unpacked, checked dataset ``source`` (a registry key or entry); returns it.

    Args:
        source: ``"modelnet40"`` or a :class:`DatasetSource` (tests pass their own, with their own checksum).
        target: the folder the DataModule reads (``data/modelnet40``); the ``.part`` file, the lock and the
            temporary folder live beside it, in its parent.
        mirror: fetch ``<mirror>/<archive>`` instead of the known URLs (``http(s)://`` or ``file://``).
        force: download and unpack even when the DataModule finds the files complete.
        loader: the DataModule class that checks the folder and builds its caches (default: the entry's).
        progress: show a progress bar.
        timeout: seconds a connection or read may stall.

    Raises:
        DownloadError: no URL gave the right archive, or its files are not what the DataModule reads.
    """
    spec = get_source(source) if isinstance(source, str) else source
    target = Path(target).absolute()
    loader = loader or spec.loader_class()
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / f".{target.name}.lock"):
        if not force:
            problem = _incomplete(loader, target)
            if problem is None:
                log.info("%s: already in %s (use --force to download it again)", spec.name, target)
                return target
            if target.exists():
                log.info("%s: %s is incomplete (%s); downloading", spec.name, target, problem)
        _remove_leftovers(root, target.name)
        part = root / f"{spec.archive}.part"
        if force:
            part.unlink(missing_ok=True)
        urls = mirror_urls(spec, mirror) if mirror else list(spec.urls)
        work = root / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            work.mkdir()
            archive = work / spec.archive
            _fetch_verified(spec, urls, part, archive, target, progress=progress, timeout=timeout)
            staged = work / "staged"
            _unpack(spec, archive, staged, target)
            _check_and_prepare(spec, loader, staged, target)
            _place(staged, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        problem = _incomplete(loader, target)
        if problem is not None:
            raise DownloadError(
                f"{spec.name}: the archive was unpacked into {target}, but the DataModule still finds it "
                f"incomplete: {problem}. Files already in {target} may shadow the unpacked ones; remove them "
                f"and run again. " + manual_steps(spec, target)
            )
        log.info("%s: ready in %s", spec.name, target)
    return target


def mirror_urls(spec: DatasetSource, mirror: str) -> list[str]:
    """``[<mirror>/<archive>]``: the same archive file name under another base URL."""
    return [f"{mirror.rstrip('/')}/{quote(spec.archive)}"]


def download_command(name: str, target: str | os.PathLike) -> str:
    """The command that downloads dataset ``name`` into ``target`` (its parent as ``--root`` when ``target``
    has the registry's folder name), for error messages."""
    spec = get_source(name)
    target = Path(target)
    if target.name == spec.folder:
        return f"python -m canonical_network.data.download {name} --root {target.parent}"
    return f"python -m canonical_network.data.download {name} (it unpacks into <root>/{spec.folder})"


def manual_steps(spec: DatasetSource, target: Path) -> str:
    """The manual route for ``spec``, as one paragraph."""
    if spec.checksum is not None:
        check = f"check that its {spec.checksum.algorithm} is {spec.checksum.value}"
    else:
        check = "check that `unzip -t` reports no errors"
    return (
        f"Manual route ({data_readme()}): on a machine with internet access, download {spec.archive} from one of "
        f"{', '.join(spec.urls)}; {check}; then either put it in a folder and run "
        f"`python -m canonical_network.data.download {spec.name} --root {target.parent} "
        f"--mirror file:///<that folder>` (an HTTP(S) URL of a folder holding it works too), or unzip it into "
        f"{target}/ yourself."
    )


# ---------------------------------------------------------------------------------------------------------
# Locking and leftovers
# ---------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if needed, never removed: removing it would let a waiting
    process and a new one lock different files)."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is downloading into %s (lock %s); waiting for it", path.parent, path)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_leftovers(root: Path, name: str) -> None:
    """Temporary folders of runs that were killed (safe: the lock is held, no other run is using them)."""
    for pattern in (f".{name}.tmp-*", f".{name}.old-*"):
        for leftover in root.glob(pattern):
            log.info("removing %s, left by an interrupted run", leftover)
            shutil.rmtree(leftover, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# Transfer
# ---------------------------------------------------------------------------------------------------------
def _fetch_verified(
    spec: DatasetSource,
    urls: list[str],
    part: Path,
    archive: Path,
    target: Path,
    *,
    progress: bool,
    timeout: float,
) -> None:
    """Try ``urls`` in turn until one gives an archive that passes :func:`_verify`; move it to ``archive``."""
    if part.exists() and spec.checksum is not None and _verify(spec, part) is None:
        log.info("%s: %s is already complete and verified", spec.name, part)
        os.replace(part, archive)
        return
    failures: list[tuple[str, str]] = []
    for index, url in enumerate(urls):
        log.info("%s: downloading %s", spec.name, url)
        try:
            _transfer(url, part, spec, progress=progress, timeout=timeout)
            problem = _verify(spec, part)
            if problem is not None:
                part.unlink(missing_ok=True)  # resuming wrong bytes would only repeat the mismatch
                raise _URLFailed(problem)
        except _URLFailed as failure:
            failures.append((url, str(failure)))
            following = urls[index + 1] if index + 1 < len(urls) else None
            log.warning(
                "%s: %s failed: %s%s",
                spec.name,
                url,
                failure,
                f"; trying next: {following}" if following else "",
            )
            continue
        os.replace(part, archive)
        log.info("%s: %s verified", spec.name, spec.archive)
        return
    raise DownloadError(_failure_message(spec, target, failures, part))


def _failure_message(spec: DatasetSource, target: Path, failures: list[tuple[str, str]], part: Path) -> str:
    lines = [f"could not download {spec.name} ({spec.archive}); every URL failed:"]
    for index, (url, reason) in enumerate(failures):
        lines.append(f"  {index + 1}. {url}: {reason}")
        if index + 1 < len(failures):
            lines.append(f"     -> next tried: {failures[index + 1][0]}")
    kept = f" The partial download {part} is kept; the next run resumes it." if part.exists() else ""
    lines.append(f"Nothing was written to {target}.{kept}")
    lines.append(manual_steps(spec, target))
    return "\n".join(lines)


def _transfer(url: str, part: Path, spec: DatasetSource, *, progress: bool, timeout: float) -> None:
    """Download ``url`` into ``part``, resuming what ``part`` already holds where the server allows a Range
    request. Raises :class:`_URLFailed` with the reason when the URL cannot give the whole file."""
    last_size = -1
    for attempt in range(1, MAX_ATTEMPTS_PER_URL + 1):
        offset = part.stat().st_size if part.exists() else 0
        request = Request(url, headers={"User-Agent": USER_AGENT})
        if offset:
            request.add_header("Range", f"bytes={offset}-")
        try:
            response = urlopen(request, timeout=timeout)
        except HTTPError as error:
            error.close()
            if error.code == 416 and offset:  # the partial file does not fit this URL's file: start again
                log.info("%s refused to resume at byte %d; starting again", url, offset)
                part.unlink()
                continue
            raise _URLFailed(f"HTTP {error.code} {error.reason}") from None
        except (URLError, OSError, http.client.HTTPException) as error:
            raise _URLFailed(_connection_problem(error, timeout)) from None
        with response:
            start = _resume_start(response, offset)
            if offset and start != offset:
                log.info("%s does not resume (no Range support); starting again from byte 0", url)
            announced = response.headers.get("Content-Length")
            total = start + int(announced) if announced and announced.isdigit() else spec.size
            stopped = _copy_body(response, part, start, total, spec.archive, progress)
        size = part.stat().st_size
        if total is not None and size == total:
            return  # every announced byte arrived (an untidy close after the last one does not matter)
        if total is not None and size > total:
            part.unlink()
            raise _URLFailed(f"the server sent {size:,} bytes but announced {total:,}")
        if total is None and stopped is None:
            return  # no announced length: the end of the body is the end of the file; the checks decide
        # http.client ends a body cut short without an error: the byte count is what tells.
        reason = f"the transfer stopped at {size:,} of {total:,} bytes" if total else "the transfer stopped"
        if stopped is not None:
            reason += f" ({stopped})"
        if size <= last_size or attempt == MAX_ATTEMPTS_PER_URL:
            raise _URLFailed(reason)
        last_size = size
        log.warning("%s: %s; resuming", url, reason)
    raise _URLFailed(f"gave up after {MAX_ATTEMPTS_PER_URL} attempts")


def _resume_start(response, offset: int) -> int:
    """The byte at which ``response``'s body starts in the file: ``offset`` for a 206 whose Content-Range
    starts there, else 0 (a full body: the server ignored the Range header)."""
    if not offset or getattr(response, "status", None) != 206:
        return 0
    content_range = response.headers.get("Content-Range", "")  # "bytes 1000-1999/2000"
    try:
        first = int(content_range.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return 0
    return first if first == offset else 0


def _copy_body(response, part: Path, start: int, total: int | None, label: str, progress: bool) -> str | None:
    """Append the body to ``part`` (truncated to ``start`` bytes first); None, or why it stopped early."""
    from tqdm.auto import tqdm

    with (
        open(part, "r+b" if part.exists() else "wb") as out,
        tqdm(
            total=total,
            initial=start,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=label,
            disable=not progress,
            file=sys.stderr,
            dynamic_ncols=True,
        ) as bar,
    ):
        out.seek(start)
        out.truncate()
        try:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                bar.update(len(chunk))
        except (OSError, http.client.HTTPException) as error:  # reset, timeout, IncompleteRead
            return f"{type(error).__name__}: {error}"
        finally:
            out.flush()
            os.fsync(out.fileno())
    return None


def _connection_problem(error: BaseException, timeout: float) -> str:
    """A sentence for a failure to connect or read, naming the likely cause."""
    reason = error.reason if isinstance(error, URLError) else error
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return f"no answer within {timeout:g} s (server down or network too slow)"
    if isinstance(reason, socket.gaierror):
        return f"could not resolve the host name (no network or no DNS?): {reason}"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (the server is down or nothing listens on that port)"
    if isinstance(reason, OSError) and reason.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return f"network unreachable (no network?): {reason}"
    if isinstance(reason, FileNotFoundError):
        return f"no such file: {reason.filename}"
    return f"{type(reason).__name__}: {reason}"


# ---------------------------------------------------------------------------------------------------------
# Verification, unpacking, placing
# ---------------------------------------------------------------------------------------------------------
def _verify(spec: DatasetSource, path: Path) -> str | None:
    """Why ``path`` is not the archive of ``spec`` (size, checksum, or a damaged zip member), or None."""
    size = path.stat().st_size
    if spec.size is not None and size != spec.size:
        return f"size mismatch: {size:,} bytes, expected {spec.size:,} (published in {spec.size_source})"
    if spec.checksum is not None:
        digest = _digest(path, spec.checksum.algorithm)
        if digest != spec.checksum.value:
            return (
                f"checksum mismatch: {spec.checksum.algorithm} {digest}, expected {spec.checksum.value} "
                f"(published in {spec.checksum.source})"
            )
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"not a readable zip archive ({error}); no checksum is published for it ({spec.why})"
    if damaged is not None:
        return f"member {damaged} of the zip archive is damaged (CRC mismatch)"
    return None


def _digest(path: Path, algorithm: str) -> str:
    if algorithm == "md5":
        from torchvision.datasets.utils import calculate_md5

        return calculate_md5(path)
    from canonical_network.data.cache import file_sha256

    return file_sha256(path)


def _unpack(spec: DatasetSource, archive: Path, staged: Path, target: Path) -> None:
    from torchvision.datasets.utils import extract_archive

    staged.mkdir()
    try:
        extract_archive(archive, staged)
    except (zipfile.BadZipFile, OSError, RuntimeError) as error:
        raise DownloadError(
            f"{spec.name}: could not unpack {spec.archive} ({type(error).__name__}: {error}). Nothing was "
            f"written to {target}. " + manual_steps(spec, target)
        ) from error
    finally:
        archive.unlink(missing_ok=True)  # verified and unpacked (or useless): free the space now


def _check_and_prepare(spec: DatasetSource, loader: type, staged: Path, target: Path) -> None:
    """The DataModule checks the unpacked files and builds its caches, before anything is moved into place."""
    log.info("%s: checking the files and building the caches (%s.prepare_files)", spec.name, loader.__name__)
    try:
        loader(data_dir=str(staged)).prepare_files()
    except (OSError, ValueError) as error:  # FileNotFoundError, PointCloudDataError, bad .amat rows
        raise DownloadError(
            f"{spec.name}: the archive {spec.archive} passed its checks but its files are not what "
            f"{loader.__name__} reads: {error}. Nothing was written to {target}."
        ) from error


def _place(staged: Path, target: Path) -> None:
    """Move the prepared folder into place: one rename when ``target`` is absent or empty; otherwise one
    rename per top-level entry (caches first), entries already there moved aside and then deleted."""
    if target.exists() and not target.is_dir():
        raise DownloadError(f"{target} exists and is not a folder")
    if not target.exists() or not any(target.iterdir()):
        os.replace(staged, target)  # rename(2) replaces an empty folder atomically
        return
    aside = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    aside.mkdir()
    for entry in sorted(staged.iterdir(), key=lambda p: (p.suffix != ".npz", p.name)):
        destination = target / entry.name
        if destination.exists() or destination.is_symlink():
            os.replace(destination, aside / entry.name)
        os.replace(entry, destination)
    shutil.rmtree(aside, ignore_errors=True)


def _incomplete(loader: type, target: Path) -> str | None:
    """Why the DataModule does not find ``target`` complete (its ``check_files``), or None."""
    if not target.is_dir():
        return f"{target} does not exist"
    try:
        loader(data_dir=str(target)).check_files()
    except (OSError, ValueError) as error:
        return str(error).split(". ")[0]
    return None


# ---------------------------------------------------------------------------------------------------------
# DataModule side: data.download
# ---------------------------------------------------------------------------------------------------------
class DownloadableDataModule:
    """Mixin for DataModules whose files come from an archive in :data:`~canonical_network.data.sources.SOURCES`.

    With ``self.download`` true (``data.download=true``), :meth:`prepare_data` downloads and unpacks the archive
    into ``self.data_dir`` when the files are missing (Lightning calls it on local rank 0 of each node; the
    lock in :func:`download_dataset` keeps two jobs on one node from downloading twice). With it false,
    nothing is fetched and ``setup`` raises the module's "files not found" error, which names the command.
    Subclasses set :attr:`SOURCE` and call :meth:`prepare_data` at the start of ``setup`` (idempotent), so that
    the module also works without a Trainer.
    """

    SOURCE: ClassVar[str]
    download: bool
    data_dir: Path

    def prepare_data(self) -> None:
        if self.download:
            download_dataset(get_source(self.SOURCE), self.data_dir, loader=type(self))

    def download_hint(self) -> str:
        """The sentence the "files not found" errors end with."""
        return f"Download it with `{download_command(self.SOURCE, self.data_dir)}` or set data.download=true"


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------
def _mirror(text: str) -> str:
    """``--mirror``: an http(s):// or file:// URL as given; a local folder becomes its file:// URL."""
    from urllib.parse import urlparse

    if urlparse(text).scheme in ("http", "https", "file"):
        return text
    folder = Path(text).expanduser()
    if folder.is_dir():
        return folder.resolve().as_uri()
    raise argparse.ArgumentTypeError(f"{text!r} is neither an http(s):// or file:// URL nor an existing folder")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m canonical_network.data.download",
        description="Download, verify and unpack a dataset where its DataModule reads it "
        f"(sources and checksums: canonical_network/data/sources.py, {data_readme()}).",
    )
    parser.add_argument("name", choices=[*SOURCES, "all"], help="dataset (the data config's name), or all")
    parser.add_argument("--root", default=None, type=Path,
                        help="data root; <root>/<name> is created (default: where training reads data, the "
                        "project's data/)")
    parser.add_argument(
        "--mirror", type=_mirror,
        help="fetch URL/<archive> instead of the known URLs (http(s):// or file://, or a local folder)",
    )
    parser.add_argument("--force", action="store_true", help="download and unpack even if the data is there")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds a connection may stall")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.root is None:  # the data root training reads by default: paths.data_dir = <project root>/data
        from canonical_network.utils.config import PROJECT_ROOT

        args.root = PROJECT_ROOT / "data"
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    log.setLevel(logging.INFO)
    names = list(SOURCES) if args.name == "all" else [args.name]
    failed = []
    for name in names:
        spec = SOURCES[name]
        try:
            download_dataset(
                spec,
                args.root / spec.folder,
                mirror=args.mirror,
                force=args.force,
                progress=not args.quiet,
                timeout=args.timeout,
            )
        except DownloadError as error:
            print(f"error: {error}", file=sys.stderr)
            failed.append(name)
        except KeyboardInterrupt:
            print(
                f"interrupted: nothing was placed in {args.root / spec.folder}; a partial download is kept as "
                f"{args.root / (spec.archive + '.part')} and resumed next time",
                file=sys.stderr,
            )
            return 130
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
