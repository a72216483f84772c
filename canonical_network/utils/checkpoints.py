"""Checkpoints written atomically: a checkpoint file is either the old one or the complete new one.

Lightning's own writer stages the file in the system's temporary folder and then moves it into place; when
that folder is on another file system (a tmpfs ``/tmp``, a node-local disk on a cluster) the move is a copy,
and a process killed during the copy leaves a truncated ``last.ckpt``. :class:`AtomicCheckpointIO` writes
the new file beside the old one and renames it over it (``os.replace``, atomic within a file system), after
``fsync``, so an interruption at any moment leaves a readable checkpoint.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)``, but through a temporary file in the same folder renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(obj, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` with :func:`atomic_torch_save` for local paths."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote: Lightning's own
        atomic_torch_save(checkpoint, path)
