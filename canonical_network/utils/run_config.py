"""The composed run config's checks that need more than one value: :func:`validate_run_config`.

Kept apart from :mod:`canonical_network.utils.checks` (single-value checks, a leaf every component imports)
because it reads checkpoints (:mod:`canonical_network.utils.checkpoints`, which itself raises
:class:`~canonical_network.utils.checks.ConfigError`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from canonical_network.data.catalog import data_facts, data_for_task
from canonical_network.utils.checkpoints import load_checkpoint, stored_run_config
from canonical_network.utils.checks import ConfigError, check_bool, check_int, check_number, check_positive

#: The command's own switches (configs/train.yaml): a quoted "false" would read as true.
RUN_SWITCHES = ("resume", "resume_with_changes", "skip_finished", "test", "allow_unbounded_epochs", "compile")


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

    Checked: ``seed`` (an integer), the command's switches (:data:`RUN_SWITCHES`: true or false),
    ``trainer.max_epochs`` (≥ 1; Lightning's −1, "train forever", only with
    ``allow_unbounded_epochs=true``), the optimiser's numbers (``model.optimizer.lr`` > 0, other numeric
    arguments numbers), the data module against the task (e.g. ``data=nbody`` under an image experiment), and
    a CN(pretrained) checkpoint against the data of the run that made it. Component arguments (widths, group
    orders, …) are checked by the components themselves, also before training, with the same key format.
    """
    _config_check(check_int, "seed", cfg.get("seed"))
    for switch in RUN_SWITCHES:
        if switch in cfg:
            _config_check(check_bool, switch, cfg.get(switch))
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
    served = data_for_task(task)  # a mismatch fails in a batch unpacking deep inside Lightning: caught here
    if served and data not in [facts.class_name for facts in served]:
        valid = ", ".join(facts.config_name for facts in served)
        option = facts.config_name if (facts := data_facts(data)) else data
        raise ConfigError(
            f"data={option} ({data}) does not fit the model's task {task} "
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
    tasks = set(facts.tasks) if (facts := data_facts(data)) else set()
    source_tasks = set(facts.tasks) if (facts := data_facts(source)) else set()
    if source and tasks and not tasks & source_tasks:  # the source's data serves none of this data's tasks
        raise ConfigError(
            f"canonicalization.checkpoint={checkpoint!r} comes from a run on {source}, not on data like "
            f"this run's {data}: use the checkpoint of a canonicalizer trained on the same kind of data"
        )
