"""Read an offline W&B run back: what a later ``wandb sync`` would upload.

    python -m canonical_network.utils.wandb_offline outputs/runs/<date>/<time>_<row>/wandb/offline-run-*

prints each run's group, job type, name and tags, its config and summary sizes, and whether every media file its
summary names is there (exit status 1 when one is missing, or when the run has no end record: it was cut short,
and ``wandb sync`` would upload a run marked as crashed).

wandb 0.31 writes an offline run as one transaction log, ``<run folder>/run-<id>.wandb`` (LevelDB's log format:
32 KiB blocks of records, each a 7-byte header -- CRC, length, type -- and a chunk; a record is one or more
chunks), whose records are ``wandb_internal_pb2.Record`` messages, plus its media files under ``files/media``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _chunks(data: bytes):
    if data[:4] != b":W&B":
        raise ValueError("not a W&B transaction log (no :W&B header)")
    position, pending = 7, b""
    while position + 7 <= len(data):
        left = BLOCK - position % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if length == 0 and kind == 0:
            position += left
            continue
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


@dataclass
class OfflineRun:
    folder: Path
    run: Any = None
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history_keys: set[str] = field(default_factory=set)
    kinds: dict[str, int] = field(default_factory=dict)

    def media(self, key: str) -> list[Path]:
        """The files the summary's last value of ``key`` names (an image's PNG)."""
        value = self.summary.get(key) or {}
        return [self.folder / "files" / name for name in value.get("filenames", [])]


def read_offline_run(folder: Path | str) -> OfflineRun:
    """The run, config, summary (the last value of every nested key, as the dashboard shows it) and the names
    logged in the history of the offline run in ``folder`` (``.../wandb/offline-run-<time>-<id>``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    folder = Path(folder)
    (log,) = folder.glob("run-*.wandb")
    result = OfflineRun(folder)
    for raw in _chunks(log.read_bytes()):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        result.kinds[kind] = result.kinds.get(kind, 0) + 1
        if kind == "run":
            result.run = record.run
            for item in record.run.config.update:
                result.config[item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                result.config[item.key] = json.loads(item.value_json)
        elif kind == "history":
            result.history_keys |= {item.key or ".".join(item.nested_key) for item in record.history.item}
        elif kind == "summary":
            for item in record.summary.update:
                keys = [item.key] if item.key else list(item.nested_key)
                node = result.summary
                for part in keys[:-1]:
                    node = node.setdefault(part, {})
                node[keys[-1]] = json.loads(item.value_json)
    return result


def problems(run: OfflineRun) -> list[str]:
    """What a later ``wandb sync`` would miss: no run, config or summary record, no end (``exit``) record, a media
    file named by the summary that is not there."""
    missing = [f"no {kind} record" for kind in ("run", "config", "summary", "exit") if kind not in run.kinds]

    def media(node: Any) -> list[str]:
        if isinstance(node, dict):
            found = [str(name) for name in node.get("filenames", [])] if "_type" in node else []
            return found + [name for value in node.values() for name in media(value)]
        return []

    missing += [f"media file {name} is missing" for name in media(run.summary)
                if not (run.folder / "files" / name).is_file()]
    return missing


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="offline run folders (wandb/offline-run-*)")
    args = parser.parse_args(argv)
    failed = 0
    for folder in args.folders:
        try:
            run = read_offline_run(folder)
        except (OSError, ValueError) as error:
            print(f"{folder}: unreadable: {error}")
            failed += 1
            continue
        info = run.run
        print(f"{folder}: group {info.run_group!r}, job type {info.job_type!r}, name {info.display_name!r}, tags "
              f"{list(info.tags)}; {len(run.config)} config keys, {len(run.summary)} summary keys")
        for problem in problems(run):
            print(f"  {problem}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
