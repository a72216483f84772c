"""Carry an unfinished run to another machine: what it needs to resume, copied into a folder to commit, and put back.

A 10,000-epoch N-body row takes longer on one CPU core than a working session lasts, and the next session may be
on another machine whose ``outputs/`` is empty. :func:`park` copies what such a run needs to resume -- its
``last.ckpt``, the best-validation checkpoint that ``last.ckpt`` names (the one the run will test), its CSV
metrics and its Hydra record -- into a folder kept in the repository (``scripts/collect_runs.py --unfinished``);
:func:`restore` puts it back into an empty run folder (``scripts/run_protocol.py --unfinished``), so that the
run resumes from ``last.ckpt`` as it would have on the first machine.

A checkpoint's ``ModelCheckpoint`` state names its files by absolute path; Lightning drops the best score when
the run folder's path differs from the one it was saved in, and the resumed run would then test the best epoch
*after* the move instead of the best of the whole run. :func:`restore` therefore rewrites those paths to the new
folder. Checkpoints are read with ``weights_only=True`` (no code runs) and only tensors and plain values are
written back.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NamedTuple

from canonical_network.records import ATTEMPTS_DIR, final_status
from canonical_network.utils.files import exclusive_lock, new_timestamped_folder
from canonical_network.utils.runs import LOCK_FILE

#: the files of a run folder, besides its checkpoints, that a resumed run continues (its metrics and records)
CARRIED = ("csv/metrics.csv", "csv/hparams.yaml", "train.log", ".hydra/config.yaml", ".hydra/hydra.yaml",
           ".hydra/overrides.yaml")
LAST = Path("checkpoints") / "last.ckpt"
_SET_ASIDE = {"superseded", ATTEMPTS_DIR}
_PATH_KEYS = ("dirpath", "best_model_path", "kth_best_model_path", "last_model_path")


def _load(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def _model_checkpoint_states(checkpoint: dict) -> list[dict]:
    return [state for key, state in (checkpoint.get("callbacks") or {}).items()
            if str(key).startswith("ModelCheckpoint") and isinstance(state, dict)]


def _named_checkpoints(checkpoint: dict) -> set[str]:
    """File names of the checkpoints that ``checkpoint``'s ModelCheckpoint state keeps in its own folder (its
    best ones; a path into another folder, such as the run a fine-tuning started from, is not the run's)."""
    names = set()
    for state in _model_checkpoint_states(checkpoint):
        for value in [state.get(k) for k in _PATH_KEYS[1:]] + list(state.get("best_k_models") or {}):
            if value and state.get("dirpath") and Path(value).parent == Path(state["dirpath"]):
                names.add(Path(value).name)
    return names


def unfinished_runs(source: Path) -> list[Path]:
    """Run folders below ``source`` with a ``last.ckpt`` and no final record (completed or diverged).

    The ``superseded/`` and ``attempts/`` folders inside a run folder (files a ``resume=false`` rerun set aside,
    failed attempts) are not runs of their own."""
    runs = []
    for last in sorted(Path(source).rglob(str(LAST))):
        run = last.parent.parent
        if _SET_ASIDE.isdisjoint(run.relative_to(source).parts) and final_status(run) is None:
            runs.append(run)
    return runs


def progress(checkpoint: Path) -> tuple[int, int]:
    """How far the run that wrote ``checkpoint`` got: ``(global_step, epoch)`` (-1 where absent)."""
    state = _load(checkpoint)
    return int(state.get("global_step", -1)), int(state.get("epoch", -1))


def check_apart(source: Path, dest: Path, what: str = "the folder of parked copies") -> None:
    """Refuse (ValueError naming both) when ``dest`` is ``source`` or one lies inside the other: parking into
    the runs' own folder would take every finished run for a copy "finished since" and delete it, and a folder
    inside the other would park the copies as runs again on the next call."""
    a, b = Path(source).resolve(), Path(dest).resolve()
    if a == b or a in b.parents or b in a.parents:
        raise ValueError(f"{what} {dest} and {source} must be apart (neither the same folder nor one inside the "
                         "other): e.g. outputs/reproduction, docs/reproduction/runs and docs/reproduction/unfinished")


class Parked(NamedTuple):
    """What :func:`park` did: the copies it wrote, the copies it removed (their runs have finished) and the runs
    it left alone because the copy already parked is further along (``(run, copy)`` pairs)."""

    parked: list[Path]
    removed: list[Path]
    behind: list[tuple[Path, Path]]


def park(source: Path, dest: Path, attempts: int = 5) -> Parked:
    """Copy every unfinished run below ``source`` into ``dest`` (same relative path), replacing an older copy,
    and delete the copies in ``dest`` of runs that have since finished in ``source``.

    A run may be training while it is copied: ``last.ckpt`` is copied first and the best checkpoint it names
    after it; should that file be gone by then (a better epoch replaced it), the copy is taken again.
    A copy already in ``dest`` whose ``last.ckpt`` is further along (:func:`progress`) than the run's is kept,
    never replaced by the less advanced run (say a run that started over here because its parked copy could
    not be put back): that run is listed in ``behind``.
    Returns :class:`Parked` (parked run folders, removed copies, runs behind their copies)."""
    source, dest = Path(source), Path(dest)
    check_apart(source, dest)
    parked, behind = [], []
    for run in unfinished_runs(source):
        target = dest / run.relative_to(source)
        staging = target.with_name(target.name + ".partial")
        for _ in range(attempts):
            shutil.rmtree(staging, ignore_errors=True)
            (staging / LAST).parent.mkdir(parents=True)
            shutil.copy2(run / LAST, staging / LAST)
            names = _named_checkpoints(_load(staging / LAST))
            try:
                for name in sorted(names - {LAST.name}):
                    shutil.copy2(run / "checkpoints" / name, staging / "checkpoints" / name)
            except FileNotFoundError:
                continue  # the run saved a newer best between the two copies: take both again
            break
        else:
            shutil.rmtree(staging, ignore_errors=True)
            raise RuntimeError(f"{run} kept replacing its checkpoints while being copied ({attempts} tries); "
                               "pause it (or wait for it to end) and park again")
        if (target / LAST).is_file() and progress(target / LAST) > progress(staging / LAST):
            shutil.rmtree(staging)
            behind.append((run, target))
            continue
        for name in CARRIED:
            if (run / name).is_file():
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(run / name, staging / name)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        parked.append(target)
    removed = []
    for last in sorted(dest.rglob(str(LAST))) if dest.is_dir() else []:
        copy = last.parent.parent
        if final_status(source / copy.relative_to(dest)) is not None:
            shutil.rmtree(copy)
            removed.append(copy)
    return Parked(parked, removed, behind)


def relocate(checkpoint: Path, old_dir: str, new_dir: Path) -> bool:
    """Rewrite the ModelCheckpoint paths in ``checkpoint`` from the folder ``old_dir`` to ``new_dir``
    (both checkpoint folders); returns whether anything changed."""
    import torch

    data = _load(checkpoint)
    changed = False

    def moved(value):
        nonlocal changed
        if isinstance(value, str) and value and Path(value).parent == Path(old_dir):
            changed = True
            return str(new_dir / Path(value).name)
        return value

    for state in _model_checkpoint_states(data):
        for key in _PATH_KEYS:
            if key == "dirpath":
                if state.get(key) and Path(state[key]) == Path(old_dir):
                    state[key], changed = str(new_dir), True
            else:
                state[key] = moved(state.get(key))
        if state.get("best_k_models"):
            state["best_k_models"] = {moved(k): v for k, v in state["best_k_models"].items()}
    if changed:
        partial = checkpoint.with_suffix(".ckpt.partial")
        torch.save(data, partial)
        partial.replace(checkpoint)
    return changed


def restore(parked: Path, run_dir: Path, replace_behind: bool = False) -> bool:
    """Put the parked run ``parked`` into ``run_dir`` unless a run has checkpointed there (``last.ckpt``) or
    finished there, with its checkpoint paths moved to ``run_dir``; returns whether it did. With
    ``replace_behind``, a run there whose ``last.ckpt`` is behind the parked one (:func:`progress`: an old start
    on this machine, the parked copy carried on elsewhere) is replaced too, its files set aside as below.

    All or nothing: the checkpoints are staged in ``checkpoints.partial/`` beside ``checkpoints/`` and renamed into
    place last, so an interrupted restore leaves no ``last.ckpt`` and is simply done again by the next one. What
    a run folder without ``last.ckpt`` already holds -- the set-up files of a run that never reached its first
    checkpoint, a restore that was interrupted -- is moved to ``superseded/<UTC time>/`` where it differs from
    the parked files (the parked run's history is the one that resumes), never deleted. Done under the run
    folder's lock: never while a run trains there."""
    parked, run_dir = Path(parked), Path(run_dir)

    def taken() -> bool:  # a run here that the parked copy must not replace
        if not (run_dir / LAST).is_file():
            return False
        return not replace_behind or progress(run_dir / LAST) >= progress(parked / LAST)

    if not (parked / LAST).is_file() or final_status(run_dir) is not None or taken():
        return False
    run_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(run_dir / LOCK_FILE) as holder:  # the lock a run holds while it trains in the folder
        if holder is not None or final_status(run_dir) is not None or taken():
            return False
        _restore_into(parked, run_dir)
    return True


def _restore_into(parked: Path, run_dir: Path) -> None:
    import filecmp

    staging = run_dir / "checkpoints.partial"
    shutil.rmtree(staging, ignore_errors=True)  # only ever written here, by an interrupted restore
    aside = None

    def set_aside(path: Path) -> None:
        nonlocal aside
        aside = aside or new_timestamped_folder(run_dir / "superseded")
        moved = aside / path.relative_to(run_dir)
        moved.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, moved)

    if (run_dir / "checkpoints").exists():  # a first epoch cut short, or a run behind the parked one
        set_aside(run_dir / "checkpoints")
    for path in sorted(p for p in parked.rglob("*") if p.is_file()):
        relative = path.relative_to(parked)
        if relative.parts[0] == "checkpoints":
            continue
        target = run_dir / relative
        if target.is_file() and not filecmp.cmp(path, target, shallow=False):
            set_aside(target)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    # checkpoints last: last.ckpt after the best checkpoints it names, all in staging until complete
    staging.mkdir(parents=True)
    checkpoints = sorted((parked / "checkpoints").glob("*"), key=lambda p: (p.name == LAST.name, p.name))
    for path in checkpoints:
        shutil.copy2(path, staging / path.name)
    new_dir = (run_dir / "checkpoints").resolve()
    for state in _model_checkpoint_states(_load(staging / LAST.name)):
        if state.get("dirpath") and Path(state["dirpath"]) != new_dir:
            for ckpt in sorted(staging.glob("*.ckpt"), key=lambda p: p.name == LAST.name):
                relocate(ckpt, state["dirpath"], new_dir)
            break
    staging.rename(run_dir / "checkpoints")
