"""A CSV logger that keeps a resumed run's history.

Lightning's ``CSVLogger`` deletes ``metrics.csv`` when its folder is reused, so a run resumed in its own
folder (the documented resume path, and every Slurm requeue) would keep only the epochs after the resume,
and reports would draw half a validation curve. :class:`ResumableCSVLogger` keeps the file and drops only
the rows the resumed run is about to write again: those logged at or after the first step it logs (the
part of an epoch that was lost with the process, replayed from the last checkpoint).
"""

from __future__ import annotations

import csv
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class _ResumingWriter(ExperimentWriter):
    def __init__(self, log_dir: str, keep_previous: bool, drop_replayed: bool = True) -> None:
        self._keep_previous = keep_previous
        self._drop_replayed = drop_replayed
        self._previous_rows: list[dict[str, str]] | None = None
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        if not self._keep_previous or not self._fs.isfile(self.metrics_file_path):
            super()._check_log_dir_exists()
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as handle:
            reader = csv.DictReader(handle)
            self._previous_rows = list(reader) if self._drop_replayed else None
            self.metrics_keys = sorted(reader.fieldnames or [])

    def log_metrics(self, metrics_dict: dict[str, float], step: int | None = None) -> None:
        if self._previous_rows is not None and step is not None:
            kept = [row for row in self._previous_rows if not row.get("step") or int(float(row["step"])) < step]
            # through a temporary file moved over the old one: a process killed meanwhile leaves the history whole
            partial = self.metrics_file_path + ".partial"
            with self._fs.open(partial, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=self.metrics_keys)
                writer.writeheader()
                writer.writerows(kept)
            self._fs.mv(partial, self.metrics_file_path)
            self._previous_rows = None
        super().log_metrics(metrics_dict, step)


class ResumableCSVLogger(CSVLogger):
    """``CSVLogger`` whose ``metrics.csv`` survives a resume in the same folder.

    Args:
        keep_previous: keep the rows already in ``metrics.csv`` (those before the resumed run's first
            logged step); ``False`` starts the file over, as Lightning does (``resume=false`` runs).
        Other arguments: those of :class:`lightning.pytorch.loggers.CSVLogger`.
    """

    def __init__(self, *args: Any, keep_previous: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._keep_previous = bool(keep_previous)
        self._drop_replayed = True

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ResumingWriter(self.log_dir, self._keep_previous, self._drop_replayed)
        return self._experiment

    def reload(self) -> None:
        """Start the next stage from ``metrics.csv`` as it is on disk, every row kept.

        Under DDP with forked or spawned processes (``trainer=ddp_cpu``) the rows of ``fit`` are written by the
        processes, not by this one, whose writer never saw their columns; ``test`` runs in new processes that
        inherit that writer and would rewrite the file under a header without them. After ``reload`` the next
        writer reads the file's header and appends (no row dropped: nothing is replayed between two stages).
        """
        if self._experiment is not None:
            self._experiment.save()
        self._experiment = None
        self._keep_previous, self._drop_replayed = True, False


#: Top-level sections of a run's config that say where and how it logged, not what it was: left out of the W&B
#: run's config, so the dashboard's columns are the ones a researcher compares runs by.
NOT_CHARTED_SECTIONS = ("paths", "logger", "hydra")


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested run config as one level of readable dotted keys (``model.optimizer.lr``), lists as they are, the
    sections of :data:`NOT_CHARTED_SECTIONS` left out."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if not prefix and key in NOT_CHARTED_SECTIONS:
            continue
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flat_config(value, dotted))
        else:
            flat[dotted] = value
    return flat


class QuietWandbLogger(WandbLogger):
    """Lightning's ``WandbLogger``, made to read well on the dashboard.

    * Without its ``anonymous`` argument, which current wandb no longer takes (it warned "The anonymous setting
      has no effect" at every run start).
    * ``best`` (the run's ``optimized_metric``) and ``best_mode`` (``max`` | ``min``): the summary holds that
      metric's best value over the run (``define_metric``), as the checkpoint callback judges it, instead of the
      last logged step (the ``test/*`` metrics, logged once after fitting, are the tested ones).
    * Hyperparameters as one level of dotted keys (:func:`flat_config`), without where the run wrote or logged.
    """

    def __init__(self, *args: Any, best: str | None = None, best_mode: str = "max", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wandb_init.pop("anonymous", None)
        if best_mode not in ("max", "min"):
            raise ValueError(f"logger.wandb.best_mode must be max or min; got {best_mode!r}")
        self._best, self._best_mode = best, best_mode

    @property
    @rank_zero_experiment
    def experiment(self):
        fresh = self._experiment is None
        experiment = super().experiment
        if fresh and hasattr(experiment, "define_metric"):
            if self._best:  # test/* are logged once, after fitting: their summary (the last value) is the tested one
                experiment.define_metric(self._best, summary=self._best_mode)
        return experiment

    def log_hyperparams(self, params: Any) -> None:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(params, DictConfig):
            params = OmegaConf.to_container(params, resolve=True)
        if isinstance(params, dict):
            params = flat_config(params)
        super().log_hyperparams(params)
