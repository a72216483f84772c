"""The single training entrypoint: ``python -m canonical_network.train experiment=<family>/<row> [overrides]``.

Composes ``configs/train.yaml``, instantiates the DataModule, the LightningModule, callbacks, loggers and
trainer, fits (resuming from ``<run dir>/checkpoints/last.ckpt`` when it exists), tests the best
checkpoint and writes ``<run dir>/results.json``. A multirun (``-m`` or ``sweep=<table>``) does this once
per job. Returns the best value of ``optimized_metric`` for sweepers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from canonical_network.records import RunResults, write_results
from canonical_network.utils.checks import ConfigError, check_choice, validate_run_config
from canonical_network.utils.config import CONFIG_DIR, PROJECT_ROOT

log = logging.getLogger("canonical_network.train")

TEST_CKPTS = ("best", "last")


def _set_local_dirs(output_dir: Path) -> None:
    """Keep W&B's and matplotlib's files inside outputs/: nothing is written elsewhere on the machine."""
    scratch = PROJECT_ROOT / "outputs" / ".cache"
    os.environ.setdefault("WANDB_DIR", str(output_dir))
    os.environ.setdefault("WANDB_CACHE_DIR", str(scratch / "wandb"))
    os.environ.setdefault("WANDB_CONFIG_DIR", str(scratch / "wandb-config"))
    os.environ.setdefault("WANDB_DATA_DIR", str(scratch / "wandb-data"))
    os.environ.setdefault("MPLCONFIGDIR", str(scratch / "matplotlib"))


def stable_run_id(output_dir: Path) -> str:
    """A W&B run id derived from the run folder, so a requeued or resumed job continues the same W&B run."""
    return hashlib.sha1(str(output_dir.resolve()).encode()).hexdigest()[:16]


def instantiate_loggers(cfg: DictConfig, output_dir: Path) -> list:
    loggers = []
    for name, logger_cfg in (cfg.get("logger") or {}).items():
        if not logger_cfg or "_target_" not in logger_cfg:
            continue
        extra = {"id": stable_run_id(output_dir)} if name == "wandb" else {}
        loggers.append(hydra.utils.instantiate(logger_cfg, **extra))
    return loggers


def instantiate_callbacks(cfg: DictConfig) -> list:
    return [
        hydra.utils.instantiate(cb) for cb in (cfg.get("callbacks") or {}).values() if cb and "_target_" in cb
    ]


def readable_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint: torch saves a zip archive, checked entry by entry (CRC)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def resume_checkpoint(cfg: DictConfig, output_dir: Path) -> str | None:
    """``ckpt_path`` if given, else ``<run dir>/checkpoints/last.ckpt`` when ``resume`` and it exists.

    Lightning writes checkpoints atomically (a temporary file renamed into place), but a file can still be
    cut short afterwards (a full disk, an interrupted copy or sync). An unreadable ``last.ckpt`` then falls
    back to the newest readable checkpoint of the run, with a warning naming both; with none readable the
    run refuses to start over silently.
    """
    if cfg.get("ckpt_path"):
        path = Path(cfg.ckpt_path)
        if not path.is_file():
            raise FileNotFoundError(f"ckpt_path={cfg.ckpt_path!r} does not exist")
        return str(path)
    last = output_dir / "checkpoints" / "last.ckpt"
    if not (cfg.get("resume", True) and last.is_file()):
        return None
    if readable_checkpoint(last):
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
    log.warning("%s is unreadable (truncated or corrupt); resuming from %s, the newest readable checkpoint",
                last, fallback)
    return str(fallback)


def _trainer_plugins() -> list:
    """Checkpoints written atomically; under Slurm, requeueing left to submitit (configs/hydra/launcher/
    slurm.yaml), so Lightning's own is switched off."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from canonical_network.utils.checkpoints import AtomicCheckpointIO

    plugins: list = [AtomicCheckpointIO()]
    if SLURMEnvironment.detect():
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return plugins


def environment(trainer=None) -> dict[str, Any]:
    """Where a run ran, for the report: CPU model and cores, accelerator, threads and library versions."""
    import platform

    import lightning
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    device = "CPU"
    root = getattr(getattr(trainer, "strategy", None), "root_device", None)
    if root is not None and root.type == "cuda":
        device = torch.cuda.get_device_name(root)
    return {
        "machine": f"{cpu}, {os.cpu_count()} cores, {device}",
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
    }


class _DropTips(logging.Filter):
    """Lightning's advertisement for its cloud logger is not information about the run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


def quiet_library_output() -> None:
    """One copy of every line: Lightning's loggers go through Hydra's handlers (console and train.log)
    instead of also through their own; no litlogger tip; no torch.jit deprecation warning from escnn."""
    import warnings

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropTips) for f in rank_zero.filters):
        rank_zero.addFilter(_DropTips())
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated", category=FutureWarning)


def _to_float(value: Any) -> float:
    return float(value.item() if hasattr(value, "item") else value)


class RunFolderBusy(RuntimeError):
    """Another process is training in the same run folder."""


LOCK_FILE = ".run.lock"


@contextmanager
def run_folder_lock(output_dir: Path):
    """Hold an exclusive lock on ``<run dir>/.run.lock`` while a run trains in the folder.

    A second run into the same folder (a reused ``hydra.run.dir``, two requeues racing) raises
    :class:`RunFolderBusy` naming the holder, instead of both writing checkpoints and results. POSIX record
    locks (``lockf``) are released by the kernel when the holder dies, however it dies, so a killed run never
    leaves a stale lock; they also work on NFS with a lock manager, as on most Slurm clusters.
    """
    import fcntl
    import socket

    output_dir.mkdir(parents=True, exist_ok=True)
    handle = open(output_dir / LOCK_FILE, "a+")
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunFolderBusy(
            f"run folder {output_dir} is in use by {holder}; wait for that run to end (rerunning then resumes "
            "it), or give this run another hydra.run.dir"
        ) from None
    handle.truncate(0)
    handle.write(f"process {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    try:
        yield
    finally:
        fcntl.lockf(handle, fcntl.LOCK_UN)
        handle.close()


def run(cfg: DictConfig) -> RunResults:
    """Fit, test and write results.json for one composed config; returns the record written.

    The run folder is locked for the whole run (by global rank 0 only: under Slurm every rank runs this).
    """
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    validate_run_config(cfg)
    output_dir = Path(cfg.paths.output_dir)
    with run_folder_lock(output_dir) if rank_zero_only.rank == 0 else nullcontext():
        return _run(cfg)


def _run(cfg: DictConfig) -> RunResults:
    import lightning as L
    import torch

    quiet_library_output()
    start = time.time()
    test_ckpt = check_choice("test_ckpt", cfg.get("test_ckpt", "best"), TEST_CKPTS)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _set_local_dirs(output_dir)
    L.seed_everything(cfg.seed, workers=True)
    if cfg.get("matmul_precision"):
        torch.set_float32_matmul_precision(cfg.matmul_precision)

    try:  # building from the config: a failure here is a config error, found before any training
        datamodule = hydra.utils.instantiate(cfg.data)
        model = hydra.utils.instantiate(cfg.model)
        callbacks = instantiate_callbacks(cfg)
        loggers = instantiate_loggers(cfg, output_dir)
        trainer = hydra.utils.instantiate(
            cfg.trainer, callbacks=callbacks, logger=loggers or False, default_root_dir=str(output_dir),
            plugins=_trainer_plugins(),
        )
    except Exception as error:
        raise ConfigError(str(error)) from error
    param_counts = model.parameter_counts() if hasattr(model, "parameter_counts") else {}
    for lg in loggers:
        lg.log_hyperparams({**OmegaConf.to_container(cfg, resolve=True), "params": param_counts})
    log.info("Parameters: %s", param_counts)

    resumed_from = resume_checkpoint(cfg, output_dir)
    trainer.fit(model, datamodule=datamodule, ckpt_path=resumed_from)

    best_path = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if test_ckpt == "last":
        best_path = ""  # the model holds the final weights: test them as they are
    tested_on = best_path or "final weights"
    test_metrics: dict[str, float] = {}
    if cfg.get("test", True):
        trainer.test(model, datamodule=datamodule, ckpt_path=best_path or None, weights_only=False)
        test_metrics = {k: _to_float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}

    best_score = trainer.checkpoint_callback.best_model_score if trainer.checkpoint_callback else None
    clock = next((cb for cb in callbacks if type(cb).__name__ == "FitClock"), None)
    results: RunResults = {
        "experiment": cfg.get("experiment_name"),
        "status": "completed",
        "seed": cfg.seed,
        "overrides": _overrides(),
        "metrics": test_metrics,
        "best_val": {cfg.optimized_metric: _to_float(best_score)} if best_score is not None else {},
        "params": param_counts,
        "epochs": trainer.current_epoch,
        "checkpoint": tested_on,
        "resumed_from": resumed_from,
        "wall_time_s": round(time.time() - start, 2),
        "fit_time_s": round(clock.total_s, 2) if clock is not None else None,
        "environment": environment(trainer),
        "tags": list(cfg.get("tags") or []),
        "run_dir": str(output_dir),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    if trainer.is_global_zero:
        write_results(output_dir, results)
        _print_summary(results, output_dir, loggers)
    return results


def _overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except ValueError:  # composed outside @hydra.main (tests, notebooks)
        return []


def _print_summary(results: RunResults, output_dir: Path, loggers: list) -> None:
    from lightning.pytorch.loggers import WandbLogger

    lines = [f"Run folder: {output_dir}", f"Checkpoint tested: {results['checkpoint']}"]
    lines += [f"{k} = {v:.4f}" for k, v in sorted(results["metrics"].items())]
    for lg in loggers:
        if isinstance(lg, WandbLogger):
            run_dir = Path(lg.experiment.dir).parent
            offline = getattr(lg.experiment.settings, "mode", "") == "offline" or "offline" in run_dir.name
            lines.append(f"W&B run: {run_dir}" + (f"  (offline; upload with: wandb sync {run_dir})" if offline else ""))
    # Through the logging set-up of Hydra: on the console and in <run dir>/train.log alike.
    log.info("Summary\n%s", "\n".join(lines))


def write_failure(cfg: DictConfig, error: BaseException) -> None:
    """Leave a results.json saying why a job failed, so a sweep's table shows the reason in its cell."""
    try:
        output_dir = Path(cfg.paths.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        record: RunResults = {
            "experiment": cfg.get("experiment_name"),
            "status": "failed",
            "error": f"{type(error).__name__}: {error}"[:2000],
            "seed": cfg.get("seed"),
            "overrides": _overrides(),
            "metrics": {},
            "config": OmegaConf.to_container(cfg, resolve=False),
        }
        write_results(output_dir, record)
    except Exception:  # never hide the original error behind a reporting one
        log.exception("could not write the failure record")


#: What Hydra and the lock put in a run folder before training: a folder holding only these was never used.
SETUP_FILES = {".hydra", "train.log", LOCK_FILE}


def remove_unused_run_folder(output_dir: Path) -> bool:
    """Delete ``output_dir`` if it holds nothing but Hydra's set-up files (a run that never trained)."""
    import shutil

    if output_dir.is_dir() and {p.name for p in output_dir.iterdir()} <= SETUP_FILES:
        shutil.rmtree(output_dir, ignore_errors=True)
        return True
    return False


def _multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        results = run(cfg)
    except RunFolderBusy:
        raise  # the folder belongs to another run: write nothing into it
    except ConfigError as error:
        # Found before training. A single run leaves no folder behind (a typo should not); a multirun job
        # keeps its failure record, so the sweep's table shows why its cell is empty.
        if _multirun():
            write_failure(cfg, error)
        else:
            remove_unused_run_folder(Path(cfg.paths.output_dir))
        raise
    except SIGTERMException:
        # Lightning exits with status 0 on SIGTERM; a stopped run is not a finished one. No failure record:
        # rerunning the job in the same folder resumes from last.ckpt.
        log.warning("Stopped by SIGTERM; rerun in %s to resume from its last checkpoint", cfg.paths.output_dir)
        raise SystemExit(128 + 15) from None
    except Exception as error:
        write_failure(cfg, error)
        raise
    if results["best_val"]:
        return next(iter(results["best_val"].values()))
    return None


if __name__ == "__main__":
    main()
