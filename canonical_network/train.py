"""The single training entrypoint: ``python -m canonical_network.train experiment=<family>/<row> [overrides]``.

Composes ``configs/train.yaml``, instantiates the DataModule, the LightningModule, callbacks, loggers and
trainer, fits (resuming from ``<run dir>/checkpoints/last.ckpt`` when it exists), tests the best
checkpoint and writes ``<run dir>/results.json``. A multirun (``-m`` or ``sweep=<table>``) does this once
per job. Returns the best value of ``optimized_metric`` for sweepers.

Every checkpoint carries the run's resolved config (``canonical_network.utils.checkpoints.RUN_CONFIG_KEY``),
from which ``python -m canonical_network.evaluate ckpt_path=<file>`` rebuilds the model. What this command
shares with ``evaluate`` (process set-up, loggers, trainer, the record and its summary) lives in
``canonical_network/utils/runs.py``.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from canonical_network.records import (
    ATTEMPTS_DIR,
    COMPLETED,
    DIVERGED,
    FAILED,
    FINAL_WEIGHTS,
    RESULTS_FILE,
    RunResults,
    final_status,
    path_for_record,
    read_results,
    write_failure_record,
)
from canonical_network.utils.checks import ConfigError, check_bool, check_choice
from canonical_network.utils.compile import compiled_network
from canonical_network.utils.config import CONFIG_DIR
from canonical_network.utils.files import add_lock_note, exclusive_lock, new_timestamped_folder
from canonical_network.utils.loggers import ResumableCSVLogger
from canonical_network.utils.run_config import validate_run_config
from canonical_network.utils.runs import (
    HYDRA_RECORD_DIR,
    LOCK_FILE,
    SETUP_FILES,
    build_trainer,
    building_error,
    check_monitors,
    code_version,
    command_overrides,
    finish,
    fitted_in_workers,
    forward_sigterm_to_workers,
    instantiate_callbacks,
    instantiate_loggers,
    is_multirun,
    logged_test_metrics,
    no_test_metric,
    prepare_process,
    recover_fit_state,
    refuse,
    remove_unused_run_folder,
    run_record,
    save_hydra_record,
    to_float,
)
from canonical_network.utils.trust import build, check_buildable, granted

log = logging.getLogger("canonical_network.train")

TEST_CKPTS = ("best", "last")


def readable_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint: torch saves a zip archive, checked entry by entry (CRC)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def resume_checkpoint(cfg: DictConfig, output_dir: Path, announce: bool = True) -> str | None:
    """``<run dir>/checkpoints/last.ckpt`` when ``resume`` and it exists, else ``ckpt_path`` if given.

    The run folder's own progress comes first: ``ckpt_path`` is where a run *starts* (continuing another run
    into a new folder, ``hydra.run.dir=<new> ckpt_path=<old>/checkpoints/last.ckpt``), so the same command run
    again after an interruption, or requeued, resumes the new folder's run instead of going back to the old
    checkpoint (which would overwrite the folder's newer checkpoints and drop its later metric rows). To start
    the folder over from ``ckpt_path``, pass ``resume=false``: the folder's previous files are set aside.

    Lightning writes checkpoints atomically (a temporary file renamed into place), but a file can still be
    cut short afterwards (a full disk, an interrupted copy or sync). An unreadable ``last.ckpt`` then falls
    back to the newest readable checkpoint of the run, with a warning naming both; with none readable the
    run refuses to start over silently.
    """
    last = output_dir / "checkpoints" / "last.ckpt"
    if cfg.get("ckpt_path"):
        path = Path(cfg.ckpt_path)
        if not path.is_file():
            raise FileNotFoundError(f"ckpt_path={cfg.ckpt_path!r} does not exist")
        if not (cfg.get("resume", True) and last.is_file()) or path.resolve() == last.resolve():
            return str(path)
        if announce:
            log.info("ckpt_path=%s started this run; it resumes from its own progress, %s", path, last)
    elif not (cfg.get("resume", True) and last.is_file()):
        return None
    if readable_checkpoint(last):
        if announce:
            log.info("Resuming from %s", last)
        return str(last)
    others = sorted((p for p in last.parent.glob("*.ckpt") if p != last), key=lambda p: p.stat().st_mtime,
                    reverse=True)
    fallback = next((p for p in others if readable_checkpoint(p)), None)
    if fallback is None:
        raise RuntimeError(
            f"{last} is unreadable (truncated or corrupt) and no other checkpoint in {last.parent} is readable; "
            "remove the folder's checkpoints/ to start this run over, or give ckpt_path=<file>"
        )
    if announce:
        log.warning("%s is unreadable (truncated or corrupt); resuming from %s, the newest readable checkpoint",
                    last, fallback)
    return str(fallback)


def check_resumed_config(cfg: DictConfig, output_dir: Path) -> None:
    """When this run resumes the folder's own checkpoint, refuse a config that differs from the one the
    checkpoint was written with (:func:`~canonical_network.utils.checkpoints.check_resume_unchanged`; neutral
    keys: paths, epoch budget, early stopping, loggers, accelerator). ``resume_with_changes=true`` resumes
    anyway, with a warning naming each change. A ``ckpt_path`` in another folder starts a new run there, and
    may change anything the weights allow."""
    from canonical_network.utils.checkpoints import check_resume_unchanged

    if not cfg.get("resume", True):
        return
    path = resume_checkpoint(cfg, output_dir, announce=False)
    if path is None or output_dir.resolve() not in Path(path).resolve().parents:
        return
    allow = cfg.get("resume_with_changes", False)  # a bool: validate_run_config checked it
    changed = check_resume_unchanged(path, OmegaConf.to_container(cfg, resolve=True), allow=allow)
    for key, before, after in changed:
        log.warning("resume_with_changes=true: %s was %r when %s was written, %r now", key, before, Path(path).name,
                    after)


class RunFolderBusy(RuntimeError):
    """Another process is training in the same run folder."""


#: Seconds the other ranks of a multi-process job wait for rank 0 to take the run folder's lock.
RANK_ZERO_ADMISSION_S = 300.0


def job_identity() -> str | None:
    """The multi-process job this process belongs to, as the lock file names it: ``Slurm job 123 step 0 attempt
    0`` (the attempt is ``SLURM_RESTART_COUNT``: a requeued job is another attempt), ``torchrun <run id>``, or
    ``None`` outside such a job."""
    env = os.environ
    if env.get("SLURM_JOB_ID"):
        return (f"Slurm job {env['SLURM_JOB_ID']} step {env.get('SLURM_STEP_ID', '-')} "
                f"attempt {env.get('SLURM_RESTART_COUNT') or 0}")
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun {env['TORCHELASTIC_RUN_ID']}"
    return None


def wait_for_rank_zero(output_dir: Path, rank: int, timeout: float | None = None) -> None:
    """A rank other than 0 of a multi-process job (every rank of a multi-task Slurm job runs this command) trains
    only once rank 0 holds the folder's lock for the same job and has passed its admission checks (:func:`run` then
    writes the job into the lock file, which is emptied when the lock is released). Rank 0 alone checks that the folder is free; without this wait, a rank 0 refused by a busy
    folder left the other ranks blocked in the process group's set-up for its 30-minute timeout, holding the
    job's allocation. Raises :class:`RunFolderBusy` after ``timeout`` seconds (:data:`RANK_ZERO_ADMISSION_S`)."""
    identity = job_identity()
    if identity is None:
        return
    timeout = RANK_ZERO_ADMISSION_S if timeout is None else timeout
    lock, deadline, said = output_dir / LOCK_FILE, time.monotonic() + timeout, ""
    while True:
        said = lock.read_text().strip() if lock.is_file() else ""
        if said.endswith(f"({identity})"):
            return
        if time.monotonic() >= deadline:
            busy = RunFolderBusy(
                f"rank {rank} of {identity}: rank 0 did not take the lock of run folder {output_dir} within "
                f"{timeout:.0f} s (the lock file says: {said or 'nothing'}); rank 0 refused the run (a busy "
                "folder) or did not start: see its log")
            log.error("%s", busy)  # in this task's own log too: a multirun keeps the error in the job's result only
            raise busy
        time.sleep(0.5)


@contextmanager
def run_folder_lock(output_dir: Path):
    """Hold an exclusive lock on ``<run dir>/.run.lock`` while a run trains in the folder.

    A second run into the same folder (a reused ``hydra.run.dir``, two requeues racing) raises
    :class:`RunFolderBusy` naming the holder, instead of both writing checkpoints and results. The lock
    (``utils.files.exclusive_lock``) ends with its holder, however it ends: a killed run never leaves a stale one.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(output_dir / LOCK_FILE) as holder:
        if holder is not None:
            raise RunFolderBusy(
                f"run folder {output_dir} is in use by {holder}; wait for that run to end (rerunning then resumes "
                "it), or give this run another hydra.run.dir"
            )
        yield


def refuse_busy(output_dir: Path) -> None:
    """Raise :class:`RunFolderBusy` when another process holds the folder's run lock now (a look, not the lock:
    :func:`run_folder_lock` takes it once the run is admitted). Checked before the run's config is compared with
    the folder's checkpoint, so that a second run into a busy folder is told so rather than that its config
    differs from the first run's progress."""
    lock = output_dir / LOCK_FILE
    if not lock.is_file():
        return
    with exclusive_lock(lock) as holder:
        if holder is not None:
            raise RunFolderBusy(
                f"run folder {output_dir} is in use by {holder}; wait for that run to end (rerunning then resumes "
                "it), or give this run another hydra.run.dir")


class RunFolderFinished(RuntimeError):
    """The run folder holds a completed run, whose record is final."""


def refuse_finished(output_dir: Path) -> None:
    """Raise :class:`RunFolderFinished` when ``output_dir`` holds a finished run's ``results.json`` (completed,
    or diverged: a rerun would only repeat it)."""
    status = final_status(output_dir)
    if status is not None:
        raise RunFolderFinished(
            f"run folder {output_dir} holds a {status} run (its results.json), whose record is final: nothing "
            "was written. To train it further, start a new folder from its checkpoint: hydra.run.dir=<new folder> "
            f"ckpt_path={output_dir / 'checkpoints' / 'last.ckpt'}; to train the row again, leave hydra.run.dir "
            "to its default"
        )


#: What a run writes into its folder: each must be the folder's own (no symbolic link that leads elsewhere).
RUN_FOLDER_ENTRIES = (RESULTS_FILE, "checkpoints", "csv", HYDRA_RECORD_DIR, ATTEMPTS_DIR, "train.log", "canonicalized")


def refuse_linked_entries(output_dir: Path) -> None:
    """Raise :class:`ConfigError` when an entry a run writes into its folder (:data:`RUN_FOLDER_ENTRIES`) is a
    symbolic link, or resolves outside the folder: a linked ``checkpoints/`` made a resumed run write its
    checkpoints (and read its ``last.ckpt``) elsewhere. A run writes only inside its own folder."""
    from canonical_network.utils.trust import inside

    for name in RUN_FOLDER_ENTRIES:
        entry = output_dir / name
        if entry.is_symlink() or (entry.exists() and not inside(entry, output_dir)):
            raise ConfigError(
                f"run folder {output_dir}: {name} is a symbolic link to {entry.resolve()}; a run reads and writes "
                "only inside its own folder. Replace the link with the folder's own files (or start the run in a "
                "new folder)")


def set_aside_previous_run(output_dir: Path) -> Path | None:
    """``resume=false`` in a folder an unfinished run used: move its files (checkpoints, logs, figures, a failure
    record) to ``superseded/<UTC time>/`` so the new run starts clean and the old one's files stay readable;
    returns that folder (None when there was nothing to move). A failure record is renamed
    ``results.failed.json`` there, so that readers of ``results.json`` files never count it."""
    keep = SETUP_FILES | {HYDRA_RECORD_DIR, "superseded", ATTEMPTS_DIR}
    entries = [p for p in output_dir.iterdir() if p.name not in keep and not p.name.startswith(".")] \
        if output_dir.is_dir() else []
    if not entries:
        return None
    aside = new_timestamped_folder(output_dir / "superseded")
    for entry in entries:
        os.replace(entry, aside / ("results.failed.json" if entry.name == RESULTS_FILE else entry.name))
    log.warning("resume=false: the previous run's files in %s were moved to %s", output_dir, aside)
    return aside


def check_start_over(cfg: DictConfig, output_dir: Path) -> None:
    """``resume=false`` sets the folder's previous files aside; a ``ckpt_path`` among them cannot be started from
    (its checkpoint state names best checkpoints that would be moved away): refused, with what to do instead."""
    if cfg.get("resume", True) or not cfg.get("ckpt_path"):
        return
    path, folder = Path(cfg.ckpt_path).resolve(), output_dir.resolve()
    if folder in path.parents:
        raise ConfigError(
            f"resume=false with ckpt_path={cfg.ckpt_path!r}: that checkpoint lies in the run folder {output_dir}, "
            "whose previous files resume=false sets aside. Continue the folder's run with resume=true (the "
            "default), or start a new one from the checkpoint in another folder: hydra.run.dir=<new folder> "
            f"ckpt_path={cfg.ckpt_path}"
        )


def run(cfg: DictConfig) -> RunResults:
    """Fit, test and write results.json for one composed config; returns the record written.

    Every node of the config passes the trust boundary first (``utils/trust.py``: the package's components, the
    ``trusted_targets`` of the config and what the command line named), before any component is imported. A run
    is admitted before it writes anything into its folder: its config is valid, the folder holds no
    completed run (:class:`RunFolderFinished`) and no other process trains in it (the lock, held for the whole
    run by global rank 0 only: under Slurm every rank runs this). Then ``.hydra/`` is written, and with
    ``resume=false`` the files of an earlier unfinished run are set aside.
    """
    with granted(cfg.get("trusted_targets")):
        check_buildable(cfg, "the run config")
        return _admit(cfg)


def _admit(cfg: DictConfig) -> RunResults:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    validate_run_config(cfg)
    output_dir = Path(cfg.paths.output_dir)
    # a job Slurm requeued (SLURM_RESTART_COUNT >= 1) whose run had already finished -- the pre-timeout signal
    # can land after results.json is written, before the job ends -- returns that record instead of failing
    requeued = os.environ.get("SLURM_RESTART_COUNT", "0").strip() not in ("", "0")
    if (cfg.get("skip_finished", False) or requeued) and final_status(output_dir) is not None:
        log.info("%s: %s holds a finished run; its record is left as it is",
                 "skip_finished" if cfg.get("skip_finished", False) else "requeued by Slurm", output_dir)
        return read_results(output_dir / RESULTS_FILE)
    refuse_finished(output_dir)
    refuse_linked_entries(output_dir)
    if rank_zero_only.rank == 0:
        refuse_busy(output_dir)  # another run training here is the reason to refuse, whatever its config
    check_resumed_config(cfg, output_dir)
    if rank_zero_only.rank != 0:
        wait_for_rank_zero(output_dir, rank_zero_only.rank)
        return _run(cfg)
    with run_folder_lock(output_dir):
        refuse_finished(output_dir)  # finished while this one waited to start
        if not cfg.get("resume", True):
            check_start_over(cfg, output_dir)
            set_aside_previous_run(output_dir)
        save_hydra_record(cfg, output_dir)
        identity = job_identity()
        if identity is not None:  # admitted: the job's other ranks (wait_for_rank_zero) may start
            add_lock_note(output_dir / LOCK_FILE, f" ({identity})")
        return _run(cfg)


def _run(cfg: DictConfig) -> RunResults:
    from canonical_network.tasks.callbacks import DivergenceMonitor, RunCheckpoint

    start = time.time()
    test_ckpt = check_choice("test_ckpt", cfg.get("test_ckpt", "best"), TEST_CKPTS)
    compile_network = check_bool("compile", cfg.get("compile", False))
    output_dir = Path(cfg.paths.output_dir)
    prepare_process(cfg, output_dir)
    config = OmegaConf.to_container(cfg, resolve=True)

    try:  # building from the config: a failure here is a config error, found before any training
        datamodule = build(cfg.data, "data")
        model = build(cfg.model, "model")
        model.run_config = config  # stored in every checkpoint: `evaluate` rebuilds the model from it alone
        callbacks = instantiate_callbacks(cfg)
        check_monitors(model, callbacks)
        loggers = instantiate_loggers(cfg, output_dir)
        trainer = build_trainer(cfg, output_dir, callbacks, loggers)
    except Exception as error:
        raise ConfigError(building_error(error)) from error
    param_counts = model.parameter_counts() if hasattr(model, "parameter_counts") else {}
    for lg in loggers:  # the config, the parameter counts and which code ran (a W&B column each)
        lg.log_hyperparams({**config, "params": param_counts, "code_version": code_version()})
    log.info("Parameters: %s", param_counts)

    resumed_from = resume_checkpoint(cfg, output_dir)
    # Paths stored in a checkpoint stay inside the run reading it (RunCheckpoint), or inside the run an
    # explicit ckpt_path resumes from.
    allowed = [output_dir / "checkpoints"] + ([Path(cfg.ckpt_path).parent] if cfg.get("ckpt_path") else [])
    for callback in callbacks:
        if isinstance(callback, RunCheckpoint):
            callback.also_allowed = tuple(allowed[1:])
    # compile=true: compiled for fitting and testing, from a fresh cache inside the run folder (utils/compile.py)
    workers = fitted_in_workers(trainer)  # trainer=ddp_cpu: fit and test run in forked processes
    signals = forward_sigterm_to_workers(trainer) if workers else nullcontext()
    with compiled_network(model.network, output_dir, compile_network), signals:
        # weights only: resuming runs no code from the file (the checkpoints train writes need none)
        trainer.fit(model, datamodule=datamodule, ckpt_path=resumed_from, weights_only=True)
        epochs = trainer.current_epoch
        if workers:  # what rank 0's callbacks and loop know, from the last.ckpt it wrote after its last epoch
            epochs = recover_fit_state(trainer, output_dir) or epochs
        if trainer.global_step == 0 and not workers:
            raise EmptyResult("no training step ran: the training split gave no batch (an empty training split, or "
                              "trainer.limit_train_batches=0); an untrained model's test is not a result")

        best_path = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if test_ckpt == "last":
            best_path = ""  # the model holds the final weights: test them as they are
        if best_path and not any(Path(best_path).resolve().parent == folder.resolve() for folder in allowed):
            raise RuntimeError(f"the best checkpoint path {best_path!r} lies outside the run folder {output_dir}: refused")
        # Read what fitting left in the callbacks before testing: trainer.test(ckpt_path=...) restores every
        # callback's state from the tested checkpoint, which turns the fit clock and the divergence monitor back
        # to the best epoch (a run that diverged after it would look sound; its fitting time would be the best
        # epoch's).
        clock = next((cb for cb in callbacks if type(cb).__name__ == "FitClock"), None)
        fit_time_s = round(clock.total_s, 2) if clock is not None else None
        monitor = next((cb for cb in callbacks if isinstance(cb, DivergenceMonitor)), None)
        divergence = monitor.verdict(None, {}) if monitor is not None else None
        test_metrics: dict[str, float] = {}
        if cfg.get("test", True):
            for logger in trainer.loggers:  # fit's rows may come from other processes (DDP): append after them
                if isinstance(logger, ResumableCSVLogger):
                    logger.reload()
            trainer.test(model, datamodule=datamodule, ckpt_path=best_path or None, weights_only=True)
            test_metrics = logged_test_metrics(trainer)
            if not test_metrics:
                raise EmptyResult(no_test_metric(trainer))

        best_score = trainer.checkpoint_callback.best_model_score if trainer.checkpoint_callback else None
        divergence = divergence or DivergenceMonitor.test_verdict(test_metrics)
        if divergence:
            log.warning("The run diverged (%s): recorded as diverged, not as a result", divergence)
        results = run_record(
            cfg, config, status=DIVERGED if divergence else COMPLETED, metrics=test_metrics, params=param_counts,
            checkpoint=best_path or FINAL_WEIGHTS, trainer=trainer, started=start, output_dir=output_dir,
            best_val={cfg.optimized_metric: to_float(best_score)} if best_score is not None else {},
            epochs=epochs,
            resumed_from=path_for_record(resumed_from, output_dir) if resumed_from else None,
            fit_time_s=fit_time_s,
            **({"divergence": divergence} if divergence else {}),
        )
        finish(results, output_dir, trainer, loggers, log)
        return results


class EmptyResult(RuntimeError):
    """A run that ran but measured nothing (an empty split): recorded as failed, with the reason, never as a
    completed run without metrics."""


def is_divergence(error: BaseException) -> bool:
    """A non-finite training loss: the task's ``FloatingPointError``, raised here or, under ``trainer=ddp_cpu``,
    in a worker process (it reaches this one as torch's ``ProcessRaisedException``, holding the worker's
    traceback as text)."""
    from torch.multiprocessing import ProcessRaisedException

    if isinstance(error, FloatingPointError):
        return True
    return isinstance(error, ProcessRaisedException) and "\nFloatingPointError: " in str(error)


#: Characters of an error's text a failure record keeps.
ERROR_TEXT_CHARS = 2000


def _error_text(error: BaseException) -> str:
    """``"<type>: <message>"`` for a failure record; a longer one (a worker's whole traceback, as torch's
    ``ProcessRaisedException`` carries it) keeps its first and last lines, where the cause is."""
    text = f"{type(error).__name__}: {error}"
    if len(text) <= ERROR_TEXT_CHARS:
        return text
    half = ERROR_TEXT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"


def write_failure(cfg: DictConfig, error: BaseException) -> None:
    """Keep the record of a failed attempt (``attempts/``; ``"status": "diverged"`` for a non-finite training
    loss, else ``"failed"``), and as the folder's results.json unless that holds a completed run (:func:`~canonical_network.records.write_failure_record`): a sweep's table shows the
    reason in an empty cell, and a failed rerun never replaces a finished run's record. Written by global rank 0
    only, as every record (under Slurm every rank of a job runs this command)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if rank_zero_only.rank != 0:
        return
    try:
        output_dir = Path(cfg.paths.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        # A non-finite training loss (the task's check raises FloatingPointError) is the run's own outcome, not
        # an accident of the machine: a rerun of the same seed repeats it, so its record is final ("diverged",
        # listed by the report, never pooled) and a stage does not start it again.
        diverged = is_divergence(error)
        record: RunResults = {
            "experiment": cfg.get("experiment_name"),
            "status": DIVERGED if diverged else FAILED,
            "error": _error_text(error),
            "seed": cfg.get("seed"),
            "overrides": command_overrides(),
            "metrics": {},
            "config": OmegaConf.to_container(cfg, resolve=False),
            "code_version": code_version(),
        }
        if diverged:  # the worker's own message, not its whole traceback
            reason = str(error) if isinstance(error, FloatingPointError) else str(error).strip().splitlines()[-1]
            record["divergence"] = reason.removeprefix("FloatingPointError: ")[:2000]
        # A job refused before it took the folder's lock (a changed config, a Slurm task) must not write into a
        # folder another run is training in: the record is then only logged. A run's own lock is released by now.
        with exclusive_lock(output_dir / LOCK_FILE) as holder:
            if holder is not None:
                log.error("not recording this failure in %s, which %s is using: %s", output_dir, holder,
                          record["error"])
                return
            write_failure_record(output_dir, record)
    except Exception:  # never hide the original error behind a reporting one
        log.exception("could not write the failure record")


def main() -> float | None:
    """The command line (console script ``cn-train``): experiment names are checked before Hydra composes."""
    import sys

    from canonical_network.utils.config import (
        check_experiment_names,
        check_output_writable,
        check_override_keys,
    )

    check_experiment_names(sys.argv[1:])
    check_override_keys(sys.argv[1:])
    check_output_writable(sys.argv[1:], "canonical_network.train")
    return _main()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def _main(cfg: DictConfig) -> float | None:
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from canonical_network.data.errors import DataFilesError

    try:
        results = run(cfg)
    except (RunFolderBusy, RunFolderFinished) as error:
        # the folder belongs to another run, or to a finished one: write nothing into it
        if is_multirun():
            raise
        refuse("canonical_network.train", error)
    except ConfigError as error:
        # Found before training. A single run leaves no folder behind (a typo should not) and says why on one
        # line; a multirun job keeps its failure record, so the sweep's table shows why its cell is empty.
        if is_multirun():
            write_failure(cfg, error)
            raise
        remove_unused_run_folder(Path(cfg.paths.output_dir))
        refuse("canonical_network.train", error)
    except DataFilesError as error:
        # the run was admitted and could not read its data: its record says why; the command says it in one line
        write_failure(cfg, error)
        if is_multirun():
            raise
        refuse("canonical_network.train", error)
    except SIGTERMException:
        # Lightning exits with status 0 on SIGTERM; a stopped run is not a finished one. No failure record:
        # rerunning the job in the same folder resumes from last.ckpt.
        log.warning("Stopped by SIGTERM; rerun in %s to resume from its last checkpoint", cfg.paths.output_dir)
        raise SystemExit(128 + 15) from None
    except Exception as error:
        write_failure(cfg, error)
        raise
    if results.get("best_val"):
        return next(iter(results["best_val"].values()))
    return None


if __name__ == "__main__":
    main()
