"""Config checks: one home for "is this value valid?", one message format for every failure.

Every check raises ``ValueError`` with ``<key> must be <what>; got <value!r>``, where ``key`` is the full
config key as a Hydra override would spell it (``canonicalization.dropout``, ``prediction.width``,
``model.label_smoothing``), or a plain argument name where a value comes from code rather than a config.
A passing value is returned in its normalised type (``int``, ``float``, ``bool``), so a check can sit in an
assignment. bools are not numbers here: ``num_layers=true`` is a config typo, not 1. With ``optional=True``
``None`` (a config's ``null``) passes through and the message says "null or …".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def _fail(key: str, what: str, value: Any, optional: bool = False) -> None:
    raise ValueError(f"{key} must be {'null or ' if optional else ''}{what}; got {value!r}")


def _fmt(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _range(low: float | None, high: float | None, low_inclusive: bool, high_inclusive: bool) -> str:
    """`` >= 1``, `` > 0``, `` <= 3``, `` in [0, 1)`` or nothing."""
    if low is not None and high is not None:
        return f" in {'[' if low_inclusive else '('}{_fmt(low)}, {_fmt(high)}{']' if high_inclusive else ')'}"
    if low is not None:
        return f" {'>=' if low_inclusive else '>'} {_fmt(low)}"
    if high is not None:
        return f" {'<=' if high_inclusive else '<'} {_fmt(high)}"
    return ""


def _in_range(value: float, low: float | None, high: float | None, low_inclusive: bool, high_inclusive: bool) -> bool:
    # written so that NaN is in no range with a bound
    if low is not None and not (value >= low if low_inclusive else value > low):
        return False
    return high is None or (value <= high if high_inclusive else value < high)


def check_int(key: str, value: Any, low: int | None = None, high: int | None = None, *,
              optional: bool = False) -> int | None:
    """``value`` as int if it is an integer in [low, high] (either bound may be None); else ``ValueError``."""
    if optional and value is None:
        return None
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int or not _in_range(value, low, high, True, True):
        _fail(key, "an integer" + _range(low, high, True, True), value, optional)
    return int(value)


def check_number(key: str, value: Any, low: float | None = None, high: float | None = None, *,
                 low_inclusive: bool = True, high_inclusive: bool = True, finite: bool = False,
                 optional: bool = False) -> float | None:
    """``value`` as float if it is a real number (int or float, not bool) in the range; else ``ValueError``.

    ``finite=True`` also rejects ±inf and NaN; a bounded range never holds NaN.
    """
    if optional and value is None:
        return None
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if (not is_number or not _in_range(value, low, high, low_inclusive, high_inclusive)
            or (finite and not math.isfinite(value))):
        what = ("a finite number" if finite else "a number") + _range(low, high, low_inclusive, high_inclusive)
        _fail(key, what, value, optional)
    return float(value)


def check_positive(key: str, value: Any, *, optional: bool = False) -> float | None:
    """A number > 0 (learning rates, widths, temperatures, step sizes)."""
    return check_number(key, value, low=0, low_inclusive=False, optional=optional)


def check_fraction(key: str, value: Any) -> float:
    """A number in [0, 1) (dropout rates, leaky-ReLU slopes, label smoothing, intensity thresholds)."""
    return check_number(key, value, low=0, high=1, high_inclusive=False)


def check_bool(key: str, value: Any) -> bool:
    """``value`` if it is a bool; else ``ValueError`` (1 and "true" are not bools)."""
    if not isinstance(value, bool):
        _fail(key, "true or false", value)
    return value


def check_choice(key: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices``; else ``ValueError`` listing them."""
    choices = list(choices)
    if value not in choices:
        _fail(key, f"one of {choices}", value)
    return value


class ConfigError(ValueError):
    """A composed config that cannot run; raised before anything is built or written."""


# Which data modules each task reads (by class name): a mismatch fails in a batch unpacking deep inside
# Lightning, so it is caught here instead, naming both config groups.
TASK_DATA = {
    "ImageClassificationTask": ("RotatedMNISTDataModule", "RotatedMNIST5kDataModule", "CIFAR10DataModule",
                                "STL10DataModule"),
    "NBodyDynamicsTask": ("NBodyDataModule",),
    "PointCloudClassificationTask": ("ModelNet40DataModule", "SyntheticShapesDataModule"),
    "PartSegmentationTask": ("ShapeNetPartDataModule", "SyntheticShapesDataModule"),
}
DATA_OPTIONS = {
    "RotatedMNISTDataModule": "rotated_mnist", "RotatedMNIST5kDataModule": "rotated_mnist_5k",
    "NBodyDataModule": "nbody", "ModelNet40DataModule": "modelnet40", "ShapeNetPartDataModule": "shapenet_part",
    "SyntheticShapesDataModule": "synthetic_shapes", "CIFAR10DataModule": "cifar10", "STL10DataModule": "stl10",
}


def _short(target: Any) -> str:
    return str(target or "").rsplit(".", 1)[-1]


def _config_check(check: Any, *args: Any, hint: str = "", **kwargs: Any) -> Any:
    """``check(*args, **kwargs)`` with its ``ValueError`` raised as a :class:`ConfigError` (plus ``hint``)."""
    try:
        return check(*args, **kwargs)
    except ValueError as error:
        raise ConfigError(f"{error}{hint}") from None


def validate_run_config(cfg: Any) -> None:
    """Check a composed training config once, before anything is built; every message names the full key.

    Checked: ``seed`` (an integer), ``trainer.max_epochs`` (≥ 1; Lightning's −1, "train forever", only with
    ``allow_unbounded_epochs=true``), the optimiser's numbers (``model.optimizer.lr`` > 0, other numeric
    arguments numbers), the data module against the task (e.g. ``data=nbody`` under an image experiment), and
    a CN(pretrained) checkpoint against the data of the run that made it. Component arguments (widths, group
    orders, …) are checked by the components themselves, also before training, with the same key format.
    """
    _config_check(check_int, "seed", cfg.get("seed"))
    epochs = cfg.trainer.get("max_epochs")
    if not (epochs == -1 and cfg.get("allow_unbounded_epochs", False)):
        hint = (" (Lightning's 'train forever'; add allow_unbounded_epochs=true if that is meant, or bound the run "
                "with trainer.max_time)" if epochs == -1 else "")
        _config_check(check_int, "trainer.max_epochs", epochs, low=1, hint=hint)
    optimizer = cfg.model.get("optimizer") or {}
    for name, value in optimizer.items():
        if name.startswith("_"):
            continue
        key = f"model.optimizer.{name}"
        if name == "lr":
            _config_check(check_positive, key, value)
        elif name in ("weight_decay", "momentum", "eps"):
            _config_check(check_number, key, value, low=0)
    _config_check(check_positive, "model.canonicalizer_lr", cfg.model.get("canonicalizer_lr"), optional=True)

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
    for group in ("canonicalization", "prediction"):
        check_group_keys(cfg, group)


def check_group_keys(cfg: Any, group: str) -> None:
    """Raise :class:`ConfigError` when ``cfg.<group>`` holds keys its ``_target_`` does not take.

    It happens when a row's experiment file sets keys for its own option of a group and the command line picks
    another option (``experiment=rotmnist/cn_p4 canonicalization=identity``: the row's ``num_rotations`` reach
    the identity canonicalizer). The message names the keys and how to drop them, instead of a TypeError from
    deep inside instantiation.
    """
    import inspect

    node = cfg.get(group)
    if not node or not isinstance(node.get("_target_"), str):
        return
    try:
        from hydra.utils import get_object

        target = get_object(node["_target_"])
        if inspect.isclass(target):  # the constructor's own arguments, and those a metaclass takes on top
            parameters = [*list(inspect.signature(target.__init__).parameters.values())[1:],
                          *(p for p in inspect.signature(type(target).__call__).parameters.values()
                            if p.kind is inspect.Parameter.KEYWORD_ONLY)]
        else:
            parameters = list(inspect.signature(target).parameters.values())
    except Exception:
        return  # an unknown target fails with its own message when it is built
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    accepted = {p.name for p in parameters}
    extra = [k for k in node if not str(k).startswith("_") and k not in accepted]
    if extra:
        option = _short(node["_target_"])
        drops = " ".join(f"~{group}.{k}" for k in extra)
        raise ConfigError(
            f"{group}: {option} takes no {', '.join(extra)} (set by experiment={cfg.get('experiment_name')} for its "
            f"own {group}, or on the command line). Drop them with: {drops} ; or choose the row made for this "
            f"option; {option} takes: {', '.join(sorted(accepted)) or 'no arguments'}"
        )


def _check_pretrained_source(checkpoint: str, data: str) -> None:
    from pathlib import Path

    from omegaconf import OmegaConf

    from canonical_network.utils.checkpoints import load_checkpoint, stored_run_config

    path = Path(checkpoint)
    if not path.is_file():
        raise ConfigError(f"canonicalization.checkpoint={checkpoint!r} does not exist")
    # the run config the checkpoint carries, else (older checkpoints) the one Hydra saved beside the run
    try:
        source_config = stored_run_config(load_checkpoint(path), path)
    except ValueError as error:
        raise ConfigError(f"canonicalization.checkpoint: {error}") from None
    if source_config is None:
        saved = next((p / ".hydra" / "config.yaml" for p in path.resolve().parents
                      if (p / ".hydra" / "config.yaml").is_file()), None)
        source_config = OmegaConf.load(saved) if saved is not None else None
    if source_config is None:
        return
    source = _short((source_config.get("data") or {}).get("_target_"))
    families = [set(v) for v in TASK_DATA.values() if data in v]
    if source and families and not any(source in f for f in families):
        raise ConfigError(
            f"canonicalization.checkpoint={checkpoint!r} comes from a run on {source}, not on data like "
            f"this run's {data}: use the checkpoint of a canonicalizer trained on the same kind of data"
        )
