"""What the commands that run a model (``train``, ``evaluate``) share: the process set-up, loggers, callbacks and
trainer built from the config, where a run ran, its ``results.json`` record and the summary it prints.

Each command keeps only what is its own (``train``: fit, resume, the folder lock; ``evaluate``: the model
rebuilt from a checkpoint); everything here is called by both, so a run folder, a W&B run and a record look
the same whichever command made them.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig

from canonical_network.records import (
    FINAL_WEIGHTS,
    RunResults,
    path_for_record,
    path_from_record,
    write_results,
)
from canonical_network.utils.checks import ConfigError
from canonical_network.utils.config import CHECKOUT_ROOT, PROJECT_ROOT
from canonical_network.utils.trust import build

#: The lock ``train`` holds on its run folder (``train.run_folder_lock``).
LOCK_FILE = ".run.lock"
#: What Hydra and the lock put in a run folder before a command runs (the log file is ``<job name>.log``,
#: configs/hydra/default.yaml and configs/evaluate.yaml): a folder holding only these was never used.
SETUP_FILES = {".hydra", "train.log", "evaluate.log", LOCK_FILE}


def set_local_dirs(output_dir: Path, log_dir: str | Path | None = None) -> None:
    """Keep W&B's and matplotlib's files inside outputs/ (``paths.log_dir``: where this run's outputs go, also
    with ``paths.root_dir=<elsewhere>``): nothing is written elsewhere on the machine."""
    scratch = Path(log_dir if log_dir else PROJECT_ROOT / "outputs") / ".cache"
    os.environ.setdefault("WANDB_DIR", str(output_dir))
    os.environ.setdefault("WANDB_CACHE_DIR", str(scratch / "wandb"))
    os.environ.setdefault("WANDB_CONFIG_DIR", str(scratch / "wandb-config"))
    os.environ.setdefault("WANDB_DATA_DIR", str(scratch / "wandb-data"))
    os.environ.setdefault("MPLCONFIGDIR", str(scratch / "matplotlib"))


class _DropTips(logging.Filter):
    """Lightning's advertisement for its cloud logger is not information about the run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


def quiet_library_output() -> None:
    """One copy of every line: Lightning's loggers go through Hydra's handlers (console and the run's log
    file) instead of also through their own; no litlogger tip; no torch.jit deprecation warning from escnn."""
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


#: Seconds one git command may take before the code version is given up as unknown (a hung network file system
#: must not hold a run)
GIT_TIMEOUT_S = 10


def _git(folder: Path, *arguments: str) -> str | None:
    """The output of ``git <arguments>`` in ``folder``, or None when git is missing, fails or hangs."""
    # GIT_DIR & co. (set inside git hooks) would point git at another repository than the package's own
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    try:
        done = subprocess.run(["git", *arguments], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _package_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("canonical_network")
    except metadata.PackageNotFoundError:
        import canonical_network

        return getattr(canonical_network, "__version__", None)


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """Which code this process runs, for its records (``RunResults.code_version``): ``commit`` (git HEAD),
    ``dirty`` (whether tracked files differ from it; untracked files are not code the run used unless
    imported, and outputs/ and data/ are untracked) and ``package`` (the installed version).

    Read once per process, and first when the process sets up (:func:`prepare_process`): a record says what
    the code was when its run started, even if files are edited while it trains. ``commit`` and ``dirty`` are
    None when git is missing or fails, when the code runs from an installed wheel (no checkout: the working
    directory may be someone else's repository, whose commit is not ours), or when the checkout is not the top
    of a git repository (an unpacked sdist inside another repository).
    """
    commit = dirty = None
    root = CHECKOUT_ROOT
    toplevel = _git(root, "rev-parse", "--show-toplevel") if root is not None else None
    if toplevel and Path(toplevel.strip()).resolve() == root:
        head = _git(root, "rev-parse", "--verify", "HEAD")
        # --no-optional-locks: never take the index lock, which a concurrent `git commit` needs
        status = _git(root, "--no-optional-locks", "status", "--porcelain", "--untracked-files=no")
        if head and status is not None:
            commit, dirty = head.strip(), bool(status.strip())
    return {"commit": commit, "dirty": dirty, "package": _package_version()}


def prepare_process(cfg: DictConfig, output_dir: Path) -> None:
    """Before anything is built: the code version (:func:`code_version`), quiet library output, the run folder
    and local caches, the seed, and the float32 matmul precision (``matmul_precision``)."""
    import lightning as L
    import torch

    code_version()
    quiet_library_output()
    output_dir.mkdir(parents=True, exist_ok=True)
    set_local_dirs(output_dir, (cfg.get("paths") or {}).get("log_dir"))
    L.seed_everything(cfg.seed, workers=True)
    if cfg.get("matmul_precision"):
        torch.set_float32_matmul_precision(cfg.matmul_precision)


def stable_run_id(output_dir: Path) -> str:
    """A W&B run id derived from the run folder, so a requeued or resumed job continues the same W&B run."""
    return hashlib.sha1(str(output_dir.resolve()).encode()).hexdigest()[:16]


def run_tags(cfg: DictConfig) -> list[str]:
    """The W&B tags of a run: the config's ``tags``, then its family (``family:rotmnist``) and budget
    (``epochs:100``, ``no-early-stopping``), so that a sweep's runs filter by what a table compares."""
    tags = [str(t) for t in (cfg.get("tags") or [])]
    experiment = str(cfg.get("experiment_name") or "")
    if "/" in experiment:
        tags.append(f"family:{experiment.split('/', 1)[0]}")
    epochs = (cfg.get("trainer") or {}).get("max_epochs")
    if epochs is not None:
        tags.append(f"epochs:{epochs}")
    callbacks = cfg.get("callbacks") or {}
    if callbacks and not callbacks.get("early_stopping"):
        tags.append("no-early-stopping")
    return list(dict.fromkeys(tag[:64] for tag in tags))


def finish_stale_wandb_run() -> None:
    """End a W&B run this process still has open from an earlier job (one that failed before it finished): Lightning's
    logger attaches to an open run, so the next job of an in-process multirun would log into it."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=1)


def multirun_group() -> str:
    """The W&B group of a multirun without a ``sweep_name`` (``-m experiment=a,b seed=0,1``): its sweep folder's
    name (``<time>_multirun``), the same for every job, so the jobs of one multirun share one group (a table's
    sweep has its ``sweep_name`` as its group)."""
    from hydra.core.hydra_config import HydraConfig

    return f"multirun/{Path(str(HydraConfig.get().sweep.dir)).name}"


def check_wandb_reachable(timeout_s: float = 5.0) -> None:
    """Raise :class:`ConfigError` in one line when W&B is asked to log online and its server cannot be reached:
    wandb itself retries for minutes before it gives up, which looks like a hung run."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    host, port = url.hostname or "api.wandb.ai", url.port or (443 if url.scheme != "http" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as error:
        raise ConfigError(
            f"logger=wandb logs online (WANDB_MODE=online or logger.wandb.offline=false) but the W&B server "
            f"{host}:{port} cannot be reached ({error}); log offline (unset WANDB_MODE: the default) and upload "
            "later with the printed `wandb sync` command, or use logger=csv") from None


def instantiate_loggers(cfg: DictConfig, output_dir: Path, **wandb_arguments: Any) -> list:
    """The loggers of ``cfg.logger`` (a dict keyed by name; entries without ``_target_`` are switched off).
    W&B gets the run folder's :func:`stable_run_id`, the run's tags (:func:`run_tags`) and ``wandb_arguments``
    (e.g. ``job_type``); an online W&B whose server cannot be reached fails in one line
    (:func:`check_wandb_reachable`)."""
    loggers = []
    for name, logger_cfg in (cfg.get("logger") or {}).items():
        if not logger_cfg or "_target_" not in logger_cfg:
            continue
        if name == "wandb":
            finish_stale_wandb_run()
        extra = {"id": stable_run_id(output_dir), "tags": run_tags(cfg), **wandb_arguments} if name == "wandb" else {}
        if name == "wandb" and not cfg.get("sweep_name") and is_multirun():
            extra.setdefault("group", multirun_group())
        if name == "wandb" and not logger_cfg.get("offline", True) and os.environ.get("WANDB_MODE") != "disabled":
            check_wandb_reachable()
        loggers.append(build(logger_cfg, f"logger.{name}", **extra))
    return loggers


def instantiate_callbacks(cfg: DictConfig) -> list:
    """The callbacks of ``cfg.callbacks`` (a dict keyed by name; entries without ``_target_`` are off).

    ``trainer.enable_progress_bar=false`` also leaves out the progress-bar callback (Lightning refuses the
    two together)."""
    no_bar = (cfg.get("trainer") or {}).get("enable_progress_bar") is False
    return [
        build(cb, f"callbacks.{name}") for name, cb in (cfg.get("callbacks") or {}).items()
        if cb and "_target_" in cb and not (no_bar and str(cb["_target_"]).endswith("ProgressBar"))
    ]


def check_monitors(model: Any, callbacks: list) -> None:
    """Refuse a callback that monitors a name the task never logs (a typo in ``optimized_metric``, or a metric
    of another task: ``val/acc`` for N-body). Lightning would not stop such a run: its checkpoint callback then
    keeps no best epoch, early stopping never triggers, and the run completes, tested on its final weights, as
    if nothing were wrong. Models without ``monitorable_metrics`` (not a task of this package) are not checked."""
    names = getattr(model, "monitorable_metrics", None)
    if names is None:
        return
    names = names()
    for callback in callbacks:
        monitor = getattr(callback, "monitor", None)
        if monitor is not None and monitor not in names:
            raise ConfigError(
                f"{type(callback).__name__} monitors {monitor!r} (optimized_metric, unless the callback's own "
                f"monitor was set), which {type(model).__name__} never logs; valid choices: {sorted(names)}")


def trainer_plugins() -> list:
    """Checkpoints written atomically; under Slurm, requeueing left to submitit (configs/hydra/launcher/
    slurm.yaml), so Lightning's own is switched off."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from canonical_network.utils.checkpoints import AtomicCheckpointIO

    plugins: list = [AtomicCheckpointIO()]
    if SLURMEnvironment.detect():
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return plugins


def build_trainer(cfg: DictConfig, output_dir: Path, callbacks: list, loggers: list):
    """The Lightning Trainer of ``cfg.trainer``, rooted in the run folder. Inside a Slurm job the trainer must
    match the job's tasks (:func:`~canonical_network.utils.slurm.check_trainer_for_slurm_tasks`); with several
    processes, SIGTERM stops every rank at the next training step (:func:`stop_ranks_together`)."""
    from canonical_network.utils.slurm import check_trainer_for_slurm_tasks

    check_trainer_for_slurm_tasks(cfg.trainer)
    trainer = build(
        cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False, default_root_dir=str(output_dir),
        plugins=trainer_plugins(),
    )
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    if trainer.world_size > 1 or (SLURMEnvironment.detect() and int(os.environ.get("SLURM_NTASKS", "1")) > 1):
        stop_ranks_together(trainer)  # several processes: a multi-task Slurm job, or DDP on one machine
    return trainer


def stop_ranks_together(trainer) -> None:
    """Lightning's SIGTERM handling for several processes, made to stop every rank at the same training step.

    Two changes to Lightning's (2.6). First, its handler (``_SignalConnector._sigterm_notifier_fn``) calls
    ``dist.broadcast`` from inside the signal handler. When the signal reaches rank 0 while another rank waits in
    a collective of its own (a gradient all-reduce, the barrier after a checkpoint), the two collectives do not
    match and the job hangs: a two-task Slurm job sent SIGTERM right after its first checkpoint hung until it was
    cancelled (tests/test_slurm.py). Second, its handler sets the trainer's ``received_sigterm`` flag, which the
    loops check on each rank alone (at the end of a training step, of a validation batch, of an epoch). A rank
    signalled during a step therefore stopped at the end of that step while a rank signalled a moment later
    trained on into a collective with no partner: under load, a Slurm job whose two tasks got SIGTERM 2 s apart
    ended with rank 1 crashed rather than stopped.

    Here the handler only notes the signal (:class:`_StopTogether`); each training step begins with an
    all-reduce of every rank's note (where Lightning broadcast rank 0's flag), and when any rank has one, all
    ranks set the flag and stop there, together (``SIGTERMException``, ``train`` exits 143, resumable). A signal
    that reaches rank 1 alone stops the run too, as one to rank 0 does.
    """
    stop = _StopTogether(trainer)
    # read by register_signal_handlers() when fitting starts (an instance attribute shadows the method)
    trainer._signal_connector._sigterm_notifier_fn = stop.notify
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = stop.at_step_start


class _StopTogether:
    """A SIGTERM noted by this rank's handler, acted on by all ranks at the start of the next training step
    (:func:`stop_ranks_together`). A class, not closures, so that a trainer holding it still pickles
    (``strategy=ddp_spawn`` pickles the trainer into its processes)."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.command = os.getpid()  # the command's own process; workers forked by trainer=ddp_cpu have other ids
        self.noted = False

    def notify(self, signum, frame) -> None:
        logging.getLogger("canonical_network.runs").info(
            "Received SIGTERM (%s): stopping every process at the next training step", signum)
        trainer = self.trainer
        if os.getpid() != self.command and fitted_in_workers(trainer):
            # A forked worker signalled alone (an OOM guard, a user's kill of one pid): the command stops the
            # whole run (forward_sigterm_to_workers), so the run ends as stopped (143, resumable), not as a
            # crash of the other worker. The command ignores the echo of a SIGTERM it forwarded itself.
            os.kill(self.command, signum)
        elif not self.noted and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)  # processes Lightning started itself, as its own handler does
        self.noted = True  # not trainer.received_sigterm, which would stop this rank alone (see above)

    def at_step_start(self) -> None:
        """Replaces ``_TrainingEpochLoop._broadcast_sigterm_tensor``, which every rank calls at the start of
        each training step when several processes train."""
        import torch
        import torch.distributed as dist
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        trainer = self.trainer
        flag = torch.tensor([int(self.noted)], device=trainer.strategy.root_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            trainer._signal_connector.received_sigterm = True
            dist.barrier()  # leave together: no rank is still inside a collective the others have left
            raise SIGTERMException


def fitted_in_workers(trainer) -> bool:
    """Whether ``trainer.fit`` runs in processes Lightning starts from this one (``trainer=ddp_cpu``: ddp_fork;
    ddp_spawn): this process then gets back only the best checkpoint's path, the weights and the logged metrics,
    not the callbacks' states nor the loop's progress."""
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    return isinstance(getattr(trainer.strategy, "launcher", None), _MultiProcessingLauncher)


def recover_fit_state(trainer, output_dir: Path) -> int | None:
    """After a fit in worker processes (:func:`fitted_in_workers`): the callbacks' states (fit clock, divergence
    monitor, best score) as rank 0 left them in ``<run dir>/checkpoints/last.ckpt``, written after the last
    epoch; returns the number of epochs fitted (``None`` without that file). Read with ``weights_only``."""
    import torch

    last = output_dir / "checkpoints" / "last.ckpt"
    if not last.is_file():
        return None
    checkpoint = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
    states = checkpoint.get("callbacks") or {}
    for callback in trainer.callbacks:
        if callback.state_key in states:
            callback.load_state_dict(states[callback.state_key])
    return int(checkpoint["epoch"]) + 1


def forward_sigterm_to_workers(trainer):
    """A context manager for ``fit``/``test`` in worker processes (:func:`fitted_in_workers`): SIGTERM to this
    process goes on to the workers (each stops at its next step, as Lightning's handler makes it), which are
    waited for, then raises Lightning's ``SIGTERMException`` here (``train`` exits 143, resumable).

    Without it this process, which Lightning gives no handler, died at once, and its workers, adopted by init,
    trained on in the run folder after its lock was gone: a rerun to resume would race them. A SIGTERM that
    reaches one worker alone is passed up to this process by the worker's handler, and ends the run the same way.
    """
    import signal
    from contextlib import contextmanager

    @contextmanager
    def forwarding():
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        this = os.getpid()
        previous = signal.getsignal(signal.SIGTERM)
        stopping = False

        def stop(signum, frame) -> None:
            nonlocal stopping
            if os.getpid() != this:  # a worker, which inherited this handler: Lightning's own handler acts there
                return
            if stopping:  # a worker's echo of the SIGTERM forwarded here (stop_ranks_together)
                return
            stopping = True
            launcher = trainer.strategy.launcher
            procs = list(getattr(launcher, "procs", []) or [])
            launcher.kill(signum)
            for proc in procs:
                proc.join(timeout=WORKER_STOP_S)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            raise SIGTERMException

        signal.signal(signal.SIGTERM, stop)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    return forwarding()


#: Seconds a worker gets to stop after SIGTERM (it stops at its next step) before it is killed.
WORKER_STOP_S = 60.0


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor or architecture."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return cpu


def environment(trainer=None) -> dict[str, Any]:
    """Where a run ran, for the report: CPU model and cores, accelerator, threads and library versions."""
    import platform

    import lightning
    import torch

    cpu = cpu_model()
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


def to_float(value: Any) -> float:
    """A logged value (tensor or number) as a Python float."""
    return float(value.item() if hasattr(value, "item") else value)


def logged_test_metrics(trainer) -> dict[str, float]:
    """Every ``test/*`` value the trainer's last ``test`` logged."""
    return {k: to_float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}


def command_overrides() -> list[str]:
    """The command line's Hydra overrides (empty when composed outside ``@hydra.main``: tests, notebooks)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


def building_error(error: BaseException) -> str:
    """The message of an error raised while building the run from its config: the component's own (the
    project's checks name the full key, ``canonicalization.num_rotations must be ...``) rather than Hydra's
    wrapper around it; other errors keep their type and get the config node that raised them."""
    import re

    from hydra.errors import InstantiationException

    node, inner = None, error
    while isinstance(inner, InstantiationException) and inner.__cause__ is not None:
        node = node or re.search(r"full_key: (\S+)", str(inner))
        inner = inner.__cause__
    if inner is error:
        return str(error)
    from canonical_network.utils.checks import ConfigError

    if isinstance(inner, (ValueError, ConfigError)):
        return str(inner)
    return f"{type(inner).__name__}: {inner}" + (f" (building {node.group(1)})" if node else "")


def refuse(command: str, error: BaseException) -> NoReturn:
    """End a single command refused before it ran (a config error, a busy or finished folder): its message on
    one line of stderr, ``<command>: error: <message>``, and exit status 2, as argparse's refusals. A
    ``SystemExit`` passes Hydra's error printer, which would print the traceback of an exception."""
    import sys

    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
    print(f"{command}: error: {message}", file=sys.stderr)
    raise SystemExit(2) from None


def no_test_metric(trainer) -> str:
    """Why a test produced no ``test/*`` metric (an empty test split), for a failure's message."""
    batches = getattr(trainer, "num_test_batches", None) or []
    return (f"the test produced no test/* metric ({sum(batches) if batches else 0} test batches ran: an empty test "
            "split, or trainer.limit_test_batches=0); a run without a test result is not a result (test=false "
            "skips the test on purpose)")


def is_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


def run_record(cfg: DictConfig, config: dict[str, Any], *, status: str, metrics: dict[str, float],
               params: dict[str, int], checkpoint: str, trainer, started: float, output_dir: Path,
               **fields: Any) -> RunResults:
    """The ``results.json`` record of a run that got to its test: the fields every command writes, then
    ``fields`` (the command's own, in the order given). ``config`` is the resolved composed config; the
    paths are stored as :func:`~canonical_network.records.path_for_record` says (``checkpoint`` relative to
    ``output_dir`` when inside it; ``output_dir`` relative to the project root when below it)."""
    record: RunResults = {
        "experiment": cfg.get("experiment_name"),
        "status": status,
        "seed": cfg.seed,
        "overrides": command_overrides(),
        "metrics": metrics,
        "params": params,
        "checkpoint": checkpoint if checkpoint == FINAL_WEIGHTS else path_for_record(checkpoint, output_dir),
    }
    record.update(fields)  # type: ignore[typeddict-item]
    record.update({
        "wall_time_s": round(time.time() - started, 2),
        "environment": environment(trainer),
        "tags": list(cfg.get("tags") or []),
        "run_dir": path_for_record(output_dir),
        "code_version": code_version(),
        "config": config,
    })
    return record


def print_summary(results: RunResults, output_dir: Path, loggers: list, log: logging.Logger) -> None:
    """The run folder, the checkpoint tested, the test metrics and the W&B run (with the command that
    uploads an offline one), through the logging set-up of Hydra: on the console and in the run's log."""
    from lightning.pytorch.loggers import WandbLogger

    checkpoint = results["checkpoint"]
    lines = [f"Run folder: {output_dir}",
             f"Checkpoint tested: {checkpoint if checkpoint == FINAL_WEIGHTS else path_from_record(checkpoint, output_dir)}"]
    lines += [f"{k} = {v:.4f}" for k, v in sorted(results["metrics"].items())]
    for lg in loggers:
        if isinstance(lg, WandbLogger):
            run_dir = Path(lg.experiment.dir).parent
            offline = getattr(lg.experiment.settings, "mode", "") == "offline" or "offline" in run_dir.name
            lines.append(f"W&B run: {run_dir}" + (f"  (offline; upload with: wandb sync {run_dir})" if offline else ""))
    log.info("Summary\n%s", "\n".join(lines))


def finish(results: RunResults, output_dir: Path, trainer, loggers: list, log: logging.Logger) -> None:
    """Write ``<run dir>/results.json`` and print the summary (global rank 0 only)."""
    if trainer.is_global_zero:
        write_results(output_dir, results)
        from lightning.pytorch.loggers import WandbLogger

        for lg in loggers:  # the record's status beside the metrics: a diverged run is "finished" to W&B too
            if isinstance(lg, WandbLogger):
                lg.experiment.summary["status"] = results.get("status")
        print_summary(results, output_dir, loggers, log)
        for lg in loggers:  # the W&B run ends with its job: the next job of an in-process multirun starts its own
            if isinstance(lg, WandbLogger):
                lg.experiment.finish()


#: Where a run keeps its composed config: Hydra's layout (``config.yaml``, ``hydra.yaml``, ``overrides.yaml``).
HYDRA_RECORD_DIR = ".hydra"


def save_hydra_record(cfg: DictConfig, output_dir: Path) -> None:
    """Write ``<run dir>/.hydra/`` as Hydra would, but only once the command has admitted the run.

    Hydra itself writes nothing into a run folder (``hydra.output_subdir: null``, configs/hydra/default.yaml):
    it would do so before the command runs, so a second run refused because the folder is busy, or a rerun
    refused for a bad value, rewrote the record of the run in the folder. A previous attempt's files that
    differ from these are kept under ``.hydra/previous/<UTC time>/``: the folder stays an append-only record.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    try:
        hydra_cfg = HydraConfig.get()
    except ValueError:  # composed outside @hydra.main (tests, notebooks): no Hydra record, as Hydra writes none
        return
    record = output_dir / HYDRA_RECORD_DIR
    files = {"config.yaml": OmegaConf.to_yaml(cfg),
             "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})),
             "overrides.yaml": OmegaConf.to_yaml(OmegaConf.create(list(hydra_cfg.overrides.task)))}
    changed = [n for n, text in files.items() if (record / n).is_file() and (record / n).read_text() != text]
    if changed:
        from canonical_network.utils.files import new_timestamped_folder

        previous = new_timestamped_folder(record / "previous")
        for name in files:
            if (record / name).is_file():
                os.replace(record / name, previous / name)
    record.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (record / name).write_text(text)


def remove_unused_run_folder(output_dir: Path) -> bool:
    """Delete ``output_dir`` if it holds nothing but set-up files (:data:`SETUP_FILES`: a run that never ran)
    and no process holds its run lock: a run admitted into the folder holds the lock from before it writes
    anything until it ends, so a refused command never deletes the folder of a run that has just started there."""
    from canonical_network.utils.files import exclusive_lock

    if not (output_dir.is_dir() and {p.name for p in output_dir.iterdir()} <= SETUP_FILES):
        return False
    with exclusive_lock(output_dir / LOCK_FILE) as holder:
        if holder is not None or not {p.name for p in output_dir.iterdir()} <= SETUP_FILES:
            return False
        shutil.rmtree(output_dir, ignore_errors=True)
    return True
