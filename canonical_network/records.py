"""Run records: the ``results.json`` that ``train`` and ``evaluate`` write, and what ``tables`` and ``report``
read from it.

The one home of the record: its fields (:class:`RunResults`), its file name (:data:`RESULTS_FILE`), writing
it (:func:`write_results`) and reading it back (:func:`read_results`, :func:`find_results`).

For ``tables`` and ``report`` there is one record per run folder, flattened for matching: ``experiment``,
``status``, ``seed``, ``epochs``, ``metrics`` (a dict of ``test/*`` values, and the ``diagnose/*`` continuity
figures of the run's own diagnosis where it has one: :func:`diagnosed_metrics`), ``overrides`` (the command line),
``config.<dotted key>``, ``environment.<key>`` (where it ran) and ``code_version.<key>`` (``commit``, ``dirty``,
``package``: which code ran it). Besides loading, this module says what a run *was*: its data set
(:func:`dataset_of`), its budget (:func:`budget_of`), the overrides that make it an ablation of its row
(:func:`variant_of`), and what each logged metric means (:data:`METRICS`), so that no reader compares runs
that are not comparable.

Evaluations are not training runs: ``evaluate`` re-tests the checkpoint of a run (possibly on other data, or
with other evaluation options) and writes a record with ``"status": "evaluated"`` (:data:`EVALUATED`) in its
own folder. :func:`load_runs` leaves those out unless asked (``include_evaluated=True``), so a table or a
report never counts an evaluation as one more seed of the row whose checkpoint it read.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from canonical_network.data.catalog import data_facts
from canonical_network.utils.config import PROJECT_ROOT
from canonical_network.utils.files import atomic_write_text

RESULTS_FILE = "results.json"
#: ``status`` of a record: a training run that finished, one that failed, an evaluation of a checkpoint
COMPLETED, FAILED, EVALUATED = "completed", "failed", "evaluated"
#: ``status`` of a training run that ran to its end but diverged (``tasks.callbacks.DivergenceMonitor``):
#: final like a completed one, never read as a result (tables and the report take ``completed`` runs only)
DIVERGED = "diverged"
#: the statuses of a run whose record is final: a rerun in its folder is refused, a failure never replaces it
FINAL_STATUSES = (COMPLETED, DIVERGED)
#: The hyperparameter under which ``evaluate`` logs the checkpoint it read to its loggers (W&B): how a logged
#: run is told to be an evaluation where there is no ``results.json``.
EVALUATED_CHECKPOINT_KEY = "evaluated_checkpoint"


class _RecordedByEveryRun(TypedDict):
    experiment: str | None  # the experiment's name (``experiment_name`` in the config)
    status: str  # COMPLETED | DIVERGED | FAILED (train) | EVALUATED (evaluate)
    seed: int | None
    overrides: list[str]  # the command line's Hydra overrides
    metrics: dict[str, float]  # every ``test/*`` metric
    config: dict[str, Any]  # the composed config (resolved, unless the run failed)


class RunResults(_RecordedByEveryRun, total=False):
    """What ``train`` and ``evaluate`` write to ``<run dir>/results.json`` (the on-disk schema; JSON,
    ``indent=2``).

    A finished training run has every field but ``error``; a job that failed (``"status": "failed"``) has the
    fields of every run and ``error`` only. An evaluation (``"status": "evaluated"``) has the fields of every
    run and ``params``, ``checkpoint`` (the file it read), ``wall_time_s``, ``environment``, ``tags`` and
    ``run_dir`` (its own folder); not the fields of fitting (``best_val``, ``epochs``, ``resumed_from``,
    ``fit_time_s``). Every record (failed ones too) has ``code_version``.

    Paths: a file inside the run's own folder (``checkpoint``, ``resumed_from``: ``checkpoints/epoch_007.ckpt``)
    is stored relative to that folder; ``run_dir``, and a file outside the run folder (the checkpoint an
    evaluation read), relative to the project root (:data:`~canonical_network.utils.config.PROJECT_ROOT`: the
    checkout, or for an installed wheel the working directory the command ran in, the folder holding its
    ``outputs/``) when below it, else absolute (:func:`path_for_record`).
    A reader resolves a relative path against the record's folder when it names a file there, else against the
    project root, never the working directory of a checkout (:func:`path_from_record`). So a record means the
    same files on every clone of the repository and wherever its folder is copied; an installed wheel's records
    are read from the folder they were written in (``cn-train`` and ``tables`` run from the same directory).
    ``checkpoint`` may also be :data:`FINAL_WEIGHTS`, which is not a path.

    ``code_version`` is which code wrote the record (:func:`canonical_network.utils.runs.code_version`, read
    once per process, when it starts): ``{"commit": <git HEAD sha>, "dirty": <bool: tracked files differ from
    it>, "package": <the installed canonical_network version>}``; ``commit`` and ``dirty`` are ``null`` where
    git cannot tell (an installed wheel, no git, not the package's own repository).
    """

    error: str  # "<ExceptionType>: <message>" of a failed run, at most 2000 characters
    divergence: str  # why a "diverged" run was judged so (DivergenceMonitor.verdict)
    best_val: dict[str, float]  # {optimized_metric: best value}; empty without a checkpoint callback
    params: dict[str, int]  # parameter counts (``parameter_counts()`` of the LightningModule)
    epochs: int
    checkpoint: str  # the checkpoint tested (for an evaluation: the file it read), or "final weights"
    resumed_from: str | None
    wall_time_s: float  # this process only
    fit_time_s: float | None  # every process that fitted this run (``tasks.callbacks.FitClock``)
    environment: dict[str, Any]  # where it ran (``train.environment``)
    tags: list[str]
    run_dir: str  # the run's folder (a path as above)
    code_version: dict[str, Any]  # {"commit": str | None, "dirty": bool | None, "package": str | None}


#: ``checkpoint`` of a run tested on the weights it ended with (``test_ckpt=last``, or no checkpoint callback)
FINAL_WEIGHTS = "final weights"


def path_for_record(path: Path | str, run_dir: Path | str | None = None) -> str:
    """``path`` as a record stores it: relative to ``run_dir`` when it lies inside that run folder, else relative
    to the project root (POSIX separators) when below it, else absolute. The inverse is :func:`path_from_record`."""
    absolute = Path(os.path.abspath(path))
    bases = ([Path(os.path.abspath(run_dir))] if run_dir is not None else []) + [PROJECT_ROOT]
    for base in bases:
        for candidate, root in ((absolute, base), (absolute.resolve(), base.resolve())):
            try:  # also through a symlink (a run folder reached through one)
                return candidate.relative_to(root).as_posix()
            except ValueError:
                continue
    return str(absolute)


def path_from_record(value: str, record_dir: Path | str | None = None) -> Path:
    """The file or folder a record's path names: a relative one lies in the record's folder ``record_dir`` when
    it names something there, else below the project root (whatever the working directory); an absolute one is
    taken as it is."""
    path = Path(value)
    if path.is_absolute():
        return path
    if record_dir is not None and (Path(record_dir) / path).exists():
        return Path(record_dir) / path
    return PROJECT_ROOT / path


def record_path(results: dict, key: str) -> Path | None:
    """The file a record's path field ``key`` (``checkpoint``, ``resumed_from``, ``run_dir``) names, resolved as
    :func:`path_from_record` says (None when the field is empty or is :data:`FINAL_WEIGHTS`)."""
    value = results.get(key)
    if not value or value == FINAL_WEIGHTS:
        return None
    run_dir = path_from_record(results["run_dir"]) if results.get("run_dir") else None
    return path_from_record(value, run_dir) if key != "run_dir" else run_dir


def write_results(run_dir: Path | str, results: RunResults) -> Path:
    """Write ``<run_dir>/results.json`` atomically (a reader never sees half a file); returns its path."""
    return atomic_write_text(Path(run_dir) / RESULTS_FILE, json.dumps(results, indent=2))


#: Sub-folder of a run folder holding the record of every failed attempt (``<UTC time>_failed.json``): a failure
#: never replaces a completed ``results.json``, and each attempt's reason is kept.
ATTEMPTS_DIR = "attempts"


def final_status(run_dir: Path | str) -> str | None:
    """The status of ``run_dir``'s record when it is final (:data:`FINAL_STATUSES`), else ``None``."""
    try:
        record = read_results(run_dir)
    except (OSError, ValueError):
        return None
    status = record.get("status") if isinstance(record, dict) else None
    return status if status in FINAL_STATUSES else None


def write_failure_record(run_dir: Path | str, record: RunResults) -> Path:
    """Keep a failed attempt's record: always under ``attempts/``, and as ``results.json`` too unless that
    holds a completed run, whose record a later failure never replaces. Returns the attempt's file."""
    import time

    run_dir = Path(run_dir)
    attempts = run_dir / ATTEMPTS_DIR
    attempts.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime()) + f".{time.time_ns() % 10**9:09d}Z"
    path = attempts / f"{stamp}_failed.json"
    path.write_text(json.dumps(record, indent=2))
    if final_status(run_dir) is None:
        write_results(run_dir, record)
    return path


def read_results(path: Path | str) -> RunResults:
    """The record in ``path``: a ``results.json`` file, or a run folder holding one.

    Raises ``OSError`` when it is missing and ``json.JSONDecodeError`` when it is not JSON.
    """
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    return json.loads(path.read_text())


def find_results(folder: Path | str) -> Iterator[Path]:
    """Every ``results.json`` below ``folder`` (recursively), in sorted order, that is a file of its own folder: a
    record that is a symbolic link, or lies in a folder reached through one, names a run elsewhere (its copy or
    link would count it twice, or count a run that is not here), so it is left out with a warning."""
    folder = Path(folder)
    for path in sorted(folder.rglob(RESULTS_FILE)):
        linked = next((p for p in [path, *path.parents] if p.is_symlink()
                       and (p == path or p.is_relative_to(folder) and p != folder)), None)
        if linked is not None:
            print(f"warning: skipping {path}: {linked} is a symbolic link (to {linked.resolve()}); a record is read "
                  "in the run folder that holds it", file=sys.stderr)
            continue
        yield path


def tested_checkpoint(run_dir: Path | str, record: dict) -> Path | None:
    """The checkpoint a completed run in ``run_dir`` was tested with, when that file is there; None otherwise (not
    completed, tested on its final weights, or the file gone)."""
    if record.get("status") != "completed" or not record.get("checkpoint") or record["checkpoint"] == FINAL_WEIGHTS:
        return None
    checkpoint = path_from_record(record["checkpoint"], run_dir)
    try:
        outside = not checkpoint.resolve().is_relative_to(Path(run_dir).resolve())
    except OSError:
        outside = True
    if outside:  # a record names a file of its own run; one elsewhere is another run's, or planted
        print(f"warning: {run_dir}: its record's checkpoint {record['checkpoint']!r} resolves outside the run folder "
              f"(to {checkpoint.resolve()}): not read", file=sys.stderr)
        return None
    return checkpoint if checkpoint.is_file() else None


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def check_record_shape(results: Any) -> None:
    """Raise ``ValueError`` saying what is wrong when ``results`` is valid JSON but not a run record."""
    if not isinstance(results, dict):
        raise ValueError(f"not a run record: a JSON {type(results).__name__}, expected an object with "
                         "'experiment', 'status' and 'metrics'")
    metrics = results.get("metrics", {})
    if not isinstance(metrics, dict):
        raise ValueError(f"not a run record: 'metrics' is a {type(metrics).__name__}, expected an object")
    bad = sorted(k for k, v in metrics.items() if isinstance(v, bool) or not isinstance(v, (int, float)))
    if bad:
        raise ValueError(f"not a run record: metric(s) {', '.join(bad)} are not numbers")
    for key in ("experiment", "status"):
        if results.get(key) is not None and not isinstance(results[key], str):
            raise ValueError(f"not a run record: {key!r} is a {type(results[key]).__name__}, expected a string")
    if not isinstance(results.get("overrides", []), list):
        raise ValueError("not a run record: 'overrides' is not a list")


def record_from_results(results: dict) -> dict[str, Any]:
    """One flat record per run: ``experiment``, ``status``, ``metrics.<name>`` and ``config.<dotted key>``.
    Raises ``ValueError`` (:func:`check_record_shape`) for JSON that is not a run record."""
    check_record_shape(results)
    record: dict[str, Any] = {}
    _flatten("", {k: v for k, v in results.items() if k != "metrics"}, record)
    record["metrics"] = dict(results.get("metrics") or {})
    record.setdefault("status", COMPLETED)
    return record


def load_runs(folder: Path, include_evaluated: bool = False) -> list[dict[str, Any]]:
    """Every ``results.json`` below ``folder`` as a flat record (with its ``path``); unreadable ones skipped.

    Evaluations (``"status": "evaluated"``) are training runs' checkpoints tested again, not runs of their
    own: they are skipped unless ``include_evaluated``, so that tables and reports built from a folder count
    each training run once.

    A record is counted once: a second record of the same run (:func:`run_identity`: a copied folder, the same
    experiment, seed and config run again) keeps its place in the accounting with ``"status": "duplicate"`` and
    an ``error`` naming the first, so that no table pools it as another seed.
    """
    runs = []
    first: dict[str, str] = {}
    for path in find_results(folder):
        try:
            record = record_from_results(read_results(path))
        except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError, as is a malformed record
            print(f"warning: skipping unreadable {path}: {err}", file=sys.stderr)
            continue
        if record["status"] == EVALUATED and not include_evaluated:
            continue
        record["path"] = str(path)
        record["metrics"].update(diagnosed_metrics(path.parent))
        # a final record (completed, diverged) is a run's result: a second one of the same run is counted once;
        # a failed attempt, or an evaluation of the run's checkpoint, is not a result and never a duplicate
        identity = run_identity(record) if record["status"] in FINAL_STATUSES else None
        if identity is not None and identity in first:
            record["recorded_status"] = record["status"]
            record["status"] = DUPLICATE
            record["error"] = (f"a second record of the run in {first[identity]} (the same experiment, seed and "
                               "config): counted once")
        elif identity is not None:
            first[identity] = str(path.parent)
        runs.append(record)
    return runs


#: ``status`` :func:`load_runs` gives a second record of one run (never a result)
DUPLICATE = "duplicate"
#: Config keys that say where and how a run executed, not what it was (:func:`run_identity` leaves them out): its
#: folders and logging, the loader's workers and whether data may be fetched, the accelerator and compilation, the
#: command's own switches, the checkpoint a CN(pretrained) row read (a path of its machine). Shell-style patterns.
EXECUTION_KEYS = (
    "paths.*", "logger", "logger.*", "callbacks.rich_progress_bar", "callbacks.rich_progress_bar.*", "hydra.*",
    "callbacks.pose_histogram", "callbacks.pose_histogram.*",
    "data.data_dir", "data.root", "data.num_workers", "data.download", "data.generate_if_missing",
    "trainer.accelerator", "trainer.enable_progress_bar", "trainer.log_every_n_steps", "compile", "matmul_precision",
    "ckpt_path", "resume", "resume_with_changes", "skip_finished", "tags", "trusted_targets",
    "canonicalization.checkpoint", "model.canonicalizer.checkpoint",
)


def run_identity(record: dict) -> str:
    """What makes two records the same run: the experiment, the seed, the overrides that make it a variant of its
    row (:func:`variant_of`) and the config (every ``config.*`` key of the flattened record but
    :data:`EXECUTION_KEYS`). A copy of a run folder, or the same command run twice, has the same identity; seeds
    are independent runs only when they differ."""
    import fnmatch

    config = {key: value for key, value in record.items() if key.startswith("config.")
              and not any(fnmatch.fnmatchcase(key.removeprefix("config."), p) for p in EXECUTION_KEYS)}
    return json.dumps([record.get("experiment"), record.get("seed"), list(variant_of(record)),
                       sorted(config.items(), key=lambda kv: kv[0])], default=str)


#: where ``scripts/diagnose_runs.py`` writes a run's (first) diagnosis, relative to its folder
DIAGNOSIS_DIR = "diagnose"
DIAGNOSIS_FILE = f"{DIAGNOSIS_DIR}/diagnostics.json"
#: the version of the figures a diagnosis holds (``format`` in ``diagnostics.json``; absent: 1). 2: the jump rate
#: split by whether the chosen element changed (``jump_with_element_change_rate``, ``jump_without_…``).
#: ``scripts/diagnose_runs.py --upgrade`` diagnoses again the runs whose newest diagnosis is older.
DIAGNOSIS_FORMAT = 2
#: the continuity figures of a diagnosis read as a run's metrics (``diagnose/<perturbation>/<figure>``)
DIAGNOSED_FIGURES = ("jump_rate", "element_change_rate", "jump_with_element_change_rate",
                     "jump_without_element_change_rate", "mean_rel", "max_rel")


def diagnosis_dir(number: int) -> str:
    """The folder of a run's ``number``-th diagnosis: ``diagnose``, then ``diagnose-2``, ``diagnose-3`` … (a
    later diagnosis goes into a folder of its own; the earlier ones are kept, as the run folder is a record)."""
    return DIAGNOSIS_DIR if number == 1 else f"{DIAGNOSIS_DIR}-{number}"


def diagnosis_files(run_dir: Path | str) -> list[Path]:
    """The run's diagnoses (``diagnostics.json`` of :func:`diagnosis_dir` 1, 2, …), oldest first."""
    found, number = [], 1
    while (Path(run_dir) / diagnosis_dir(number) / "diagnostics.json").is_file():
        found.append(Path(run_dir) / diagnosis_dir(number) / "diagnostics.json")
        number += 1
    return found


def diagnosed_metrics(run_dir: Path | str) -> dict[str, float]:
    """The continuity figures of a run's own newest diagnosis (:func:`diagnosis_files`, written by
    ``scripts/diagnose_runs.py``) as metrics ``diagnose/<perturbation>/<figure>`` (perturbation ``rotation``: a
    small rotation outside the discrete group, ``jitter``: noise on the points or pixels; figures
    :data:`DIAGNOSED_FIGURES`), and ``diagnose/equivariance_max_rel``; empty when the run has none or it is
    unreadable (a warning)."""
    files = diagnosis_files(run_dir)
    if not files:
        return {}
    path = files[-1]
    try:
        diagnosis = json.loads(path.read_text())
        metrics: dict[str, float] = {}
        for name, figures in ((diagnosis.get("continuity") or {}).get("by_perturbation") or {}).items():
            for figure in DIAGNOSED_FIGURES:
                value = figures.get(figure)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    metrics[f"diagnose/{name}/{figure}"] = float(value)
        exact = ((diagnosis.get("equivariance") or {}).get("exact") or {}).get("max_rel")
        if isinstance(exact, (int, float)) and not isinstance(exact, bool):
            metrics["diagnose/equivariance_max_rel"] = float(exact)
        return metrics
    except (OSError, ValueError, AttributeError) as err:
        print(f"warning: skipping unreadable {path}: {err}", file=sys.stderr)
        return {}


#: the synthetic shapes' difficulty settings: a run whose recorded value differs from today's default is on a data set
#: of its own (:func:`dataset_of`)
SHAPES_DIFFICULTY_KEYS = ("data.noise_std", "data.part_dropout", "data.sampling_bias", "data.scale_jitter")


#: the synthetic-shapes data modules (their class names) and the config that sets their defaults
_SHAPES_CONFIGS = {"SyntheticShapesDataModule": "synthetic_shapes.yaml",
                   "SyntheticShapes40DataModule": "synthetic_shapes40.yaml"}


@functools.cache
def _shapes_defaults(short: str) -> tuple[tuple[str, Any], ...]:
    import yaml

    from canonical_network.utils.config import CONFIG_DIR

    data = yaml.safe_load((CONFIG_DIR / "data" / _SHAPES_CONFIGS[short]).read_text())["data"]
    keys = [key.removeprefix("data.") for key in SHAPES_DIFFICULTY_KEYS]
    return tuple((key, data[key]) for key in keys if key in data)


def shapes_difficulty_defaults(short: str) -> dict[str, Any]:
    """Today's default difficulty of a synthetic-shapes data module (its class name, ``short``):
    ``{"noise_std": 0.03, ...}``, read from its ``configs/data`` file (the source of a run's recorded values;
    ``tests/test_synthetic_shapes40.py`` checks the class's own defaults agree). Plain YAML: no code runs."""
    return dict(_shapes_defaults(short))


def shapes_difficulty_changes(run: dict) -> list[tuple[str, Any, Any]]:
    """``(knob, today's default, recorded value)`` for each difficulty knob of a synthetic-shapes run (a flattened
    record) that it did not train at today's default. A knob its record lacks is taken at today's default (every
    committed record holds all of its module's knobs; a 40-class record older than ``scale_jitter``, 2026-11-28,
    would not). Empty for every other data module."""
    short = str(run.get("config.data._target_") or "").rsplit(".", 1)[-1]
    if short not in _SHAPES_CONFIGS:
        return []
    changes = []
    for key, default in _shapes_defaults(short):
        if f"config.data.{key}" not in run:
            continue
        recorded = run[f"config.data.{key}"]
        if isinstance(recorded, bool) or not isinstance(recorded, (int, float)) or float(recorded) != float(default):
            changes.append((key, default, recorded))
    return changes


#: Keys of a data config that do not change which data a run sees, or are named otherwise: where it is read from
#: and how it is loaded, the training augmentation (a row of its own: CNN (rotation aug.)), the rotation protocol
#: (a column of the point-cloud tables; upright digits are named by :func:`dataset_of`), and the facts the data
#: publishes (classes, channels, sizes of inputs).
NOT_DATA_SETTINGS = ("_target_", "data_dir", "root", "num_workers", "download", "generate_if_missing", "batch_size",
                     "augmentation", "rotation", "rotation_axis", "train_rotation", "test_rotation", "task",
                     "num_classes", "num_categories", "num_parts", "category_parts", "in_channels", "image_size")
#: Settings that move examples between the training, validation and test splits of one set of digits: a run with
#: one is a variant of its row (its override is never neutral), tested on another split, which the report
#: compares only with the same variant on the other side of a claim (``report.changes_split``); named there.
SPLIT_SETTINGS = ("train_per_class", "val_per_class")


@functools.cache
def _data_defaults() -> dict[str, tuple[tuple[str, Any], ...]]:
    """Data module class name -> ``(key, default)`` of its ``configs/data`` file's settings (plain YAML; a value
    that is an interpolation or missing is left out)."""
    import yaml

    from canonical_network.utils.config import CONFIG_DIR

    found: dict[str, tuple[tuple[str, Any], ...]] = {}
    for path in sorted((CONFIG_DIR / "data").glob("*.yaml")):
        data = (yaml.safe_load(path.read_text()) or {}).get("data")
        if not isinstance(data, dict) or not isinstance(data.get("_target_"), str):
            continue
        short = data["_target_"].rsplit(".", 1)[-1]
        found.setdefault(short, tuple((key, value) for key, value in data.items()
                                      if key not in NOT_DATA_SETTINGS and key not in SPLIT_SETTINGS
                                      and not (isinstance(value, str) and ("${" in value or value == "???"))))
    return found


def data_setting_changes(run: dict) -> list[tuple[str, Any, Any]]:
    """``(key, default, recorded)`` for each setting of the run's data (sizes, seeds, frames, ...: every key of its
    ``configs/data`` file but :data:`NOT_DATA_SETTINGS` and :data:`SPLIT_SETTINGS`) that its record holds at another value than the file's
    default. Such a run saw other data: :func:`dataset_of` names the setting, so it is never pooled with the
    default's runs, in any family."""
    short = str(run.get("config.data._target_") or "").rsplit(".", 1)[-1]
    changes = []
    for key, default in _data_defaults().get(short, ()):
        recorded = run.get(f"config.data.{key}", default)
        same = recorded == default or (isinstance(recorded, (int, float)) and isinstance(default, (int, float))
                                       and not isinstance(recorded, bool) and float(recorded) == float(default))
        if not same:
            changes.append((key, default, recorded))
    return changes


def _setting(key: str, value: Any) -> str:
    return f"{key} {value:,}" if isinstance(value, int) and not isinstance(value, bool) else \
        f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"


def dataset_of(run: dict) -> tuple[str, bool]:
    """``(name, comparable)``: the run's data set and whether the paper's numbers were measured on it.

    Every data setting away from its ``configs/data`` default (:func:`data_setting_changes`: a training-set size, a
    data seed, ...) is part of the name, so runs on other data are never pooled. A record without a data config
    (older or hand-made records) is "data not recorded" and compared.
    """
    target = str(run.get("config.data._target_") or "")
    if not target:
        return "data not recorded", True
    short = target.rsplit(".", 1)[-1]
    facts = data_facts(short)  # the data module's own display_name and paper_data (data/catalog.py)
    name, comparable = (facts.display_name, facts.paper_data) if facts else (short, False)
    if short in ("SyntheticShapesDataModule", "SyntheticShapes40DataModule"):  # its size is a setting: runs of
        # other sizes are another table
        sizes = [f"{value:,} {what}" for key, what in (("num_points", "points"), ("num_train", "training clouds"))
                 if isinstance(value := run.get(f"config.data.{key}"), int)]
        # a difficulty other than today's defaults is other data: named, so never pooled with the defaults' runs.
        # Read from the recorded config, not the command line, so that a run made before a default moved keeps
        # the difficulty it trained on
        knobs = [f"{key} {recorded:g}" if isinstance(recorded, (int, float)) else f"{key} {recorded}"
                 for key, _, recorded in shapes_difficulty_changes(run)]
        name = ", ".join([name, *sizes, *sorted(knobs)])
        named = {"num_points", "num_train", *(key.removeprefix("data.") for key in SHAPES_DIFFICULTY_KEYS)}
        others = [_setting(key, recorded) for key, _, recorded in data_setting_changes(run) if key not in named]
    else:
        others = [_setting(key, recorded) for key, _, recorded in data_setting_changes(run)]
    if others:
        name = ", ".join([name, *sorted(others)])
    # Upright training (adapt_mnist/*) or upright test digits: another protocol than the paper's rotated data
    upright = [what for key, what in (("train_rotation", "training"), ("test_rotation", "test"))
               if run.get(f"config.data.{key}") == "none"]
    if upright:
        return f"{name}, upright {' and '.join(upright)}", False
    return name, comparable


def no_early_stopping(run: dict) -> bool:
    """Whether the (flattened) run record trained without early stopping: ``callbacks.early_stopping=null``, or
    the callback removed (``~callbacks.early_stopping``: a callbacks config without the key)."""
    if "config.callbacks.early_stopping" in run and run["config.callbacks.early_stopping"] is None:
        return True
    keys = [k for k in run if k.startswith("config.callbacks.")]
    return bool(keys) and not any(k.startswith("config.callbacks.early_stopping") for k in keys)


def budget_of(run: dict) -> str:
    """The run's training budget: its epoch cap, and "no early stopping" when it had none (the best validation
    epoch of the whole budget is tested, as EGNN's N-body protocol does)."""
    cap = run.get("config.trainer.max_epochs")
    text = f"≤ {cap} epochs" if cap is not None else "budget not recorded"
    if no_early_stopping(run):
        text += ", no early stopping"
    return text


def budget_sort_key(run: dict) -> float:
    """Larger budgets first; unrecorded last."""
    cap = run.get("config.trainer.max_epochs")
    return -float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else math.inf


# Overrides that do not change what a row is: the seed, where and how it logs, the epoch cap (reported as
# the budget), the checkpoint a CN(pretrained) row reads (it is the row's input, not a variant), and how the
# same model is executed: `compile=` (torch.compile: the same weights and checkpoints, fused kernels that round
# differently, docs/measurements.md "Compiled N-body epochs") like `matmul_precision=`.
NEUTRAL_OVERRIDE_PREFIXES = (
    "experiment=", "seed=", "hydra.", "logger", "~callbacks.rich_progress_bar", "callbacks.rich_progress_bar",
    "trainer.max_epochs=", "trainer.enable_progress_bar=", "canonicalization.checkpoint=", "trainer=",
    "callbacks.early_stopping=null", "~callbacks.early_stopping",  # reported as the budget (budget_of)
    "data.num_workers=", "paths.", "sweep=", "matmul_precision=", "compile=",
    "data.rotation=",  # selects the column of a point-cloud table (matched through config.data.rotation)
    "data=",  # the data set: tables and reports give each data set its own table (records.dataset_of)
    "data.num_points=", "data.num_train=",  # a data set's size: named by dataset_of (every family), its own table
    *(f"{key}=" for key in SHAPES_DIFFICULTY_KEYS),  # and its difficulty, likewise
    "data.download=",  # whether the archive may be fetched, not what is read (the files are checked either way)
    "skip_finished=",  # what a resubmitted job does with its finished folder (scripts/reproduce.sh paper-slurm)
)


@dataclass(frozen=True)
class DefaultChange:
    """A default of a row's config that changed after runs were recorded: ``key`` went from ``old`` to ``new`` in
    ``experiments``. A run is placed by the value it ran with, not by its command line: a run that took the old
    default without an override is the variant ``key=old``; a run that set ``key=new`` by an override (an
    ablation before the change) is the row itself. So changing a default never pools runs of two configs."""

    experiments: tuple[str, ...]
    key: str
    old: Any
    new: Any
    why: str
    #: records made before the key existed ran with ``old`` (the key was introduced keeping the behaviour)
    absent_means_old: bool = False


#: the defaults changed after runs were recorded (see :class:`DefaultChange`), each with the evidence for it
DEFAULT_CHANGES: tuple[DefaultChange, ...] = ()
# (issue 33 once meant to switch nbody/cn_gnn's canonicalization.features to p, positions alone: dropped, an
# equivariant canonicalizer on positions alone is degenerate, docs/nbody.md)


def _override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def variant_of(run: dict, changes: tuple[DefaultChange, ...] | None = None) -> tuple[str, ...]:
    """The overrides that make a run differ from its experiment's own config (empty: the row itself), with the
    defaults changed since it ran (:data:`DEFAULT_CHANGES`) read from the values it ran with."""
    overrides = [o for o in run.get("overrides") or [] if not o.startswith(NEUTRAL_OVERRIDE_PREFIXES)]
    for change in DEFAULT_CHANGES if changes is None else changes:
        if run.get("experiment") not in change.experiments:
            continue
        section = "config." + change.key.rpartition(".")[0] + "."
        predates = change.absent_means_old and any(k.startswith(section) for k in run)  # its config, without the key
        value = run.get(f"config.{change.key}", change.old if predates else None)
        explicit = [o for o in overrides if _override_key(o) == change.key]
        if explicit and value == change.new:
            overrides = [o for o in overrides if o not in explicit]  # set then, the default now
        elif not explicit and value == change.old:
            overrides.append(f"{change.key}={change.old}")  # the default then, a variant now
    return tuple(sorted(overrides))


@dataclass(frozen=True)
class Metric:
    """What a logged number is: its unit ("%", "fraction" or "") and whether lower is better."""

    unit: str
    lower_is_better: bool

    def in_percent(self) -> float:
        """Factor that puts the metric in percent (the paper's unit for errors and accuracies)."""
        return 100.0 if self.unit == "fraction" else 1.0


METRICS = {
    "test/error": Metric("%", True),
    "test/acc": Metric("fraction", False),
    "test/class_acc": Metric("fraction", False),
    "test/instance_miou": Metric("fraction", False),
    "test/class_miou": Metric("fraction", False),
    "test/mse": Metric("", True),
    "test/loss": Metric("", True),
}


def metric_info(name: str) -> Metric | None:
    """The meaning of a logged metric, or None when unknown. Orbit figures are errors in %; a diagnosis's
    continuity figures (:func:`diagnosed_metrics`) are fractions or relative changes, lower is better."""
    if name in METRICS:
        return METRICS[name]
    if name.startswith("test/orbit/"):
        return Metric("%", True)
    if name.startswith("diagnose/"):
        return Metric("fraction" if name.endswith("_rate") else "", True)
    return None
