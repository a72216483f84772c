"""Argument checks that fail early with one clear message naming the config key and the valid values."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def check_int_range(key: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as int if it is an integer in [low, high]; else raise ``ValueError`` naming ``key``."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int or (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]; got {value!r}")
    return int(value)


def check_choice(key: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``; else raise ``ValueError`` listing them."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{key} must be one of {choices}; got {value!r}")
    return value


class ConfigError(ValueError):
    """A composed config that cannot run; raised before anything is built or written."""


# Which data modules each task reads (by class name): a mismatch fails in a batch unpacking deep inside
# Lightning, so it is caught here instead, naming both config groups.
TASK_DATA = {
    "ImageClassificationTask": ("RotatedMNISTDataModule", "RotatedMNIST5kDataModule"),
    "NBodyDynamicsTask": ("NBodyDataModule",),
    "PointCloudClassificationTask": ("ModelNet40DataModule", "SyntheticShapesDataModule"),
    "PartSegmentationTask": ("ShapeNetPartDataModule", "SyntheticShapesDataModule"),
}
DATA_OPTIONS = {
    "RotatedMNISTDataModule": "rotated_mnist", "RotatedMNIST5kDataModule": "rotated_mnist_5k",
    "NBodyDataModule": "nbody", "ModelNet40DataModule": "modelnet40", "ShapeNetPartDataModule": "shapenet_part",
    "SyntheticShapesDataModule": "synthetic_shapes",
}


def _short(target: Any) -> str:
    return str(target or "").rsplit(".", 1)[-1]


def _number(key: str, value: Any, low: float, inclusive: bool = True) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or (value < low if inclusive else value <= low):
        bound = f">= {low:g}" if inclusive else f"> {low:g}"
        raise ConfigError(f"{key} must be a number {bound}; got {value!r}")


def validate_run_config(cfg: Any) -> None:
    """Check a composed training config once, before anything is built; every message names the full key.

    Checked: ``seed`` (an integer), ``trainer.max_epochs`` (≥ 1; Lightning's −1, "train forever", only with
    ``allow_unbounded_epochs=true``), the optimiser's numbers (``model.optimizer.lr`` > 0, other numeric
    arguments numbers), the data module against the task (e.g. ``data=nbody`` under an image experiment), and
    a CN(pretrained) checkpoint against the data of the run that made it. Component arguments (widths, group
    orders, …) are checked by the components themselves, also before training, with the same key format.
    """
    try:
        check_int_range("seed", cfg.get("seed"))
    except ValueError as error:
        raise ConfigError(str(error)) from None
    epochs = cfg.trainer.get("max_epochs")
    if epochs == -1 and cfg.get("allow_unbounded_epochs", False):
        pass
    elif isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(
            f"trainer.max_epochs must be an integer >= 1; got {epochs!r}"
            + (" (Lightning's 'train forever'; add allow_unbounded_epochs=true if that is meant, or bound the run "
               "with trainer.max_time)" if epochs == -1 else "")
        )
    optimizer = cfg.model.get("optimizer") or {}
    for name, value in optimizer.items():
        if name.startswith("_"):
            continue
        key = f"model.optimizer.{name}"
        if name == "lr":
            _number(key, value, 0.0, inclusive=False)
        elif name in ("weight_decay", "momentum", "eps"):
            _number(key, value, 0.0)
    if cfg.model.get("canonicalizer_lr") is not None:
        _number("model.canonicalizer_lr", cfg.model.canonicalizer_lr, 0.0, inclusive=False)

    task, data = _short(cfg.model.get("_target_")), _short(cfg.data.get("_target_"))
    if task in TASK_DATA and data not in TASK_DATA[task]:
        valid = ", ".join(DATA_OPTIONS.get(d, d) for d in TASK_DATA[task])
        raise ConfigError(
            f"data={DATA_OPTIONS.get(data, data)} ({data}) does not fit the model's task {task} "
            f"(experiment={cfg.get('experiment_name')}); data options for it: {valid}"
        )
    canonicalization = cfg.get("canonicalization") or {}
    if _short(canonicalization.get("_target_")) == "from_checkpoint" and canonicalization.get("checkpoint"):
        _check_pretrained_source(str(canonicalization.checkpoint), data)


def _check_pretrained_source(checkpoint: str, data: str) -> None:
    from pathlib import Path

    from omegaconf import OmegaConf

    path = Path(checkpoint)
    if not path.is_file():
        raise ConfigError(f"canonicalization.checkpoint={checkpoint!r} does not exist")
    for parent in path.resolve().parents:
        saved = parent / ".hydra" / "config.yaml"
        if saved.is_file():
            source = _short(OmegaConf.load(saved).get("data", {}).get("_target_"))
            families = [set(v) for v in TASK_DATA.values() if data in v]
            if source and families and not any(source in f for f in families):
                raise ConfigError(
                    f"canonicalization.checkpoint={checkpoint!r} comes from a run on {source}, not on data like "
                    f"this run's {data}: use the checkpoint of a canonicalizer trained on the same kind of data"
                )
            return
