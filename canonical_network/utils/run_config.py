"""The composed run config's checks that need more than one value: :func:`validate_run_config`.

Kept apart from :mod:`canonical_network.utils.checks` (single-value checks, a leaf every component imports)
because it reads checkpoints (:mod:`canonical_network.utils.checkpoints`, which itself raises
:class:`~canonical_network.utils.checks.ConfigError`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from canonical_network.data.catalog import all_data_facts, data_facts, data_for_task
from canonical_network.utils.checkpoints import load_checkpoint, require_run_config
from canonical_network.utils.checks import (
    ConfigError,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_positive,
)
from canonical_network.utils.trust import locate

#: The command's own switches (configs/train.yaml): a quoted "false" would read as true.
RUN_SWITCHES = ("resume", "resume_with_changes", "skip_finished", "test", "allow_unbounded_epochs", "compile")
#: What ``test_ckpt`` may name (configs/train.yaml): the best validation checkpoint's weights, or the last ones.
TEST_CKPTS = ("best", "last")
#: The seeds Lightning's ``seed_everything`` accepts (numpy's generator takes an unsigned 32-bit integer).
SEED_RANGE = (0, 2**32 - 1)
#: Groups whose component says which tasks it serves, by a ``tasks`` attribute of its class (the task classes
#: by name; absent or ``None``: any task), as a data module does (``data/catalog.py``).
TASK_GROUPS = ("canonicalization", "prediction")
#: Groups whose keys must all be arguments of their ``_target_`` (:func:`check_group_keys`).
KEYED_GROUPS = ("canonicalization", "prediction", "data", "model", "trainer")
#: Sections that hold components by name (``callbacks.early_stopping``, ``logger.wandb``): each entry's keys too.
NAMED_COMPONENT_SECTIONS = ("callbacks", "logger")


def _short(target: Any) -> str:
    return str(target or "").rsplit(".", 1)[-1]


def _config_check(check: Any, *args: Any, hint: str = "", **kwargs: Any) -> Any:
    """``check(*args, **kwargs)`` with its ``ValueError`` raised as a :class:`ConfigError` (plus ``hint``)."""
    try:
        return check(*args, **kwargs)
    except ValueError as error:
        raise ConfigError(f"{error}{hint}") from None


def validate_run_config(cfg: Any, stored_keys: tuple[str, ...] | list[str] = ()) -> None:
    """Check a composed training config once, before anything is built; every message names the full key.

    Checked: ``seed`` (an integer Lightning accepts, :data:`SEED_RANGE`), the command's switches
    (:data:`RUN_SWITCHES`: true or false), ``test_ckpt`` (:data:`TEST_CKPTS`), ``trainer.max_epochs`` (≥ 1;
    Lightning's −1, "train forever", only with ``allow_unbounded_epochs=true``), the optimiser's numbers
    (``model.optimizer.lr`` finite and > 0, ``weight_decay``, ``momentum``, ``eps`` finite and ≥ 0), the data
    module against the task (e.g. ``data=nbody`` under an image experiment), the canonicalizer and the
    predictor against the task (:func:`check_task_components`), a CN(pretrained) checkpoint against the data of
    the run that made it, and the keys of the canonicalization, prediction, data and model nodes against their
    targets' arguments (:func:`check_group_keys`). Component arguments (widths, group orders, …) are checked
    by the components themselves, also before training, with the same key format.
    """
    seed = _config_check(check_int, "seed", cfg.get("seed"))
    _config_check(check_int, "seed", seed, *SEED_RANGE, hint=" (the seeds Lightning's seed_everything accepts)")
    for switch in RUN_SWITCHES:
        if switch in cfg:
            _config_check(check_bool, switch, cfg.get(switch))
    if "test_ckpt" in cfg:
        _config_check(check_choice, "test_ckpt", cfg.get("test_ckpt"), TEST_CKPTS)
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
        if name == "lr":  # a number > 0 first (its message), then a finite one: lr=inf is a number > 0
            _config_check(check_positive, key, value)
            _config_check(check_number, key, value, low=0, low_inclusive=False, finite=True)
        elif name in ("weight_decay", "momentum", "eps"):
            _config_check(check_number, key, value, low=0)
            _config_check(check_number, key, value, low=0, finite=True)
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
    check_task_components(cfg)
    check_input_facts(cfg)
    canonicalization = cfg.get("canonicalization") or {}
    if _short(canonicalization.get("_target_")) == "from_checkpoint" and canonicalization.get("checkpoint"):
        _check_pretrained_source(str(canonicalization.checkpoint), data)
    for group in KEYED_GROUPS:
        check_group_keys(cfg, group)
    for section in NAMED_COMPONENT_SECTIONS:
        for name in (cfg.get(section) or {}):
            check_group_keys(cfg, f"{section}.{name}")
    check_top_level_keys(cfg, stored_keys)


# --- components against the data's facts ------------------------------------------------------------------

#: Component keys that say which inputs a component was built for, and the ``data_info`` fact each must equal.
INPUT_FACTS = {"image_size": "image_size", "in_channels": "in_channels"}


def check_input_facts(cfg: Any) -> None:
    """Raise :class:`ConfigError` when a component's input size disagrees with the data's facts: an
    ``image_size`` or ``in_channels`` of the canonicalization or prediction node (the configs take them from
    ``data_info``, which the data config publishes) set to another value than the data gives. Such a run used to be
    admitted and die in the first batch, deep inside torch."""
    facts = cfg.get("data_info") or {}
    if isinstance(facts, DictConfig):
        facts = OmegaConf.to_container(facts, resolve=True)
    data = _short((cfg.get("data") or {}).get("_target_"))
    data = facts_of.config_name if (facts_of := data_facts(data)) else data
    for group in ("canonicalization", "prediction"):
        node = cfg.get(group)
        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=True)
        for key, value in _input_sizes(node, group):
            fact = INPUT_FACTS[key.rsplit(".", 1)[-1]]
            given = facts.get(fact)
            if isinstance(given, int) and isinstance(value, int) and not isinstance(value, bool) and value != given:
                raise ConfigError(
                    f"{key}={value} does not match the data: data={data} gives {given} (data_info.{fact}); the "
                    f"component would be built for inputs the data never sends. Leave {key} to the data's value, "
                    f"or choose data whose {fact} is {value}")


def _input_sizes(node: Any, key: str) -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every :data:`INPUT_FACTS` key in a component node and the nodes nested in it."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name in INPUT_FACTS:
                yield f"{key}.{name}", value
            elif isinstance(value, dict):
                yield from _input_sizes(value, f"{key}.{name}")


# --- components against the task ------------------------------------------------------------------------


def _component_tasks(target: Any) -> tuple[str, ...] | None:
    """The tasks the component ``target`` (a ``_target_``) serves: its class's ``tasks``. ``None`` (any task)
    without one, or for a target that does not import (it fails with its own message when built)."""
    try:
        tasks = getattr(locate(str(target)), "tasks", None)
    except Exception:
        return None
    return None if tasks is None else tuple(tasks)


def _task_names(target: Any) -> set[str]:
    """The class names a task ``target`` answers to: its own and its bases' (a subclass of a project task is that
    task to its components); the last part of the target when it does not import."""
    try:
        return {cls.__name__ for cls in inspect.getmro(locate(str(target)))}
    except Exception:
        return {_short(target)}


def _fits(target: Any, task_names: set[str]) -> bool:
    tasks = _component_tasks(target)
    return tasks is None or bool(task_names & set(tasks))


def _misfits(node: Any, task_names: set[str], key: str) -> Iterator[tuple[str, str]]:
    """``(dotted key, _target_)`` of each component in ``node`` (a plain container: the node itself and those
    nested in it, e.g. a product canonicalizer's factors) that serves none of ``task_names``."""
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str) and not _fits(target, task_names):
            yield key, target
        for name, value in node.items():
            yield from _misfits(value, task_names, f"{key}.{name}")


@functools.cache
def _option_targets(group: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``(option, targets)`` of every ``configs/<group>/*.yaml``, in name order: its ``_target_`` and those of
    the options of the same group its defaults list places in it (``vn_pointcloud@first``), at any depth."""
    from canonical_network.utils.config import CONFIG_DIR

    folder = CONFIG_DIR / group
    raw = {path.stem: OmegaConf.to_container(OmegaConf.load(path), resolve=False)
           for path in sorted(folder.glob("*.yaml"))}

    def targets(option: str, seen: frozenset[str]) -> tuple[str, ...]:
        node = raw.get(option)
        if not isinstance(node, dict) or option in seen:
            return ()
        own = (node["_target_"],) if isinstance(node.get("_target_"), str) else ()
        parts = [str(entry).split("@", 1)[0] for entry in node.get("defaults") or []
                 if isinstance(entry, str) and entry != "_self_" and not entry.startswith("/")]
        return own + tuple(t for part in parts for t in targets(part, seen | {option}))

    return tuple((option, targets(option, frozenset())) for option in raw)


def task_options(group: str, task: str) -> list[str]:
    """The options of ``configs/<group>/`` whose components (the option's and its factors') serve ``task`` (a
    task class name, or the ``_target_`` of a task)."""
    names = _task_names(task)
    return [option for option, targets in _option_targets(group)
            if targets and all(_fits(target, names) for target in targets)]


def check_task_components(cfg: Any) -> None:
    """Raise :class:`ConfigError` when the canonicalizer or the predictor cannot serve the model's task.

    Each component's class says which tasks it serves (its ``tasks``: e.g. the G-CNN canonicalizer and the CNN
    images only, the VN canonicalizer point clouds only); the identity, a product (whose factors say) and any
    component without ``tasks`` serve every task. Without this check ``canonicalization=vn_pointcloud`` under
    an image row fails in the first forward pass, deep inside torch, after the run was admitted. A task is
    judged by its class and its bases; one that is no task the project's data modules name, nor derives from
    one, is not judged (a task of your own code).
    """
    model = cfg.get("model") or {}
    task_target = model.get("_target_")
    names = _task_names(task_target)
    known = {task for facts in all_data_facts() for task in facts.tasks}
    if not isinstance(task_target, str) or not names & known:
        return
    task = _short(task_target)
    for group in TASK_GROUPS:
        node = cfg.get(group)
        if isinstance(node, DictConfig):  # unresolved: gcnn's ${data_info.image_size} may not exist here
            node = OmegaConf.to_container(node, resolve=False)
        for key, target in _misfits(node, names, group):
            choices = [option for option, targets in _option_targets(group) if targets and targets[0] == target]
            named = f"{group}={choices[0]}" if key == group and len(choices) == 1 else key
            valid = ", ".join(task_options(group, task_target)) or "none"
            serves = ", ".join(_component_tasks(target) or ())
            raise ConfigError(
                f"{named} ({_short(target)}, for {serves}) does not fit the model's task {task} "
                f"(experiment={cfg.get('experiment_name')}); {group} options for it: {valid}"
            )


def _node(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, (dict, DictConfig)) else None
    return node


def check_group_keys(cfg: Any, group: str) -> None:
    """Raise :class:`ConfigError` when ``cfg.<group>`` (a dotted key: ``trainer``, ``callbacks.early_stopping``)
    holds keys its ``_target_`` does not take, naming the closest valid ones.

    It happens when a key is mistyped (``+trainer.max_epoch=5``, ``+data.batchsize=8``) or when a row's experiment
    file sets keys for its own option of a group and the command line picks another option
    (``experiment=rotmnist/cn_p4 canonicalization=identity``: the row's ``num_rotations`` reach the identity
    canonicalizer). The message names the keys, the closest arguments and how to drop them, instead of a
    TypeError from deep inside instantiation.
    """
    import difflib

    node = _node(cfg, group)
    if not node or not isinstance(node.get("_target_"), str):
        return
    try:
        target = locate(node["_target_"], group)
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
        close = sorted({m for k in extra for m in difflib.get_close_matches(str(k), sorted(accepted), n=3, cutoff=0.6)})
        hint = f" Did you mean: {', '.join(f'{group}.{m}' for m in close)}?" if close else ""
        raise ConfigError(
            f"{group}: {option} takes no {', '.join(extra)} (a key mistyped, or set by "
            f"experiment={cfg.get('experiment_name')} for its own {group.split('.')[0]}, or on the command line).{hint} "
            f"Drop them with: {drops} ; or choose the row made for this option; {option} takes: "
            f"{', '.join(sorted(accepted)) or 'no arguments'}"
        )


@functools.cache
def _global_keys(folder: str) -> frozenset[str]:
    """The top-level keys a config folder can give a composed config: the keys of its entry configs (the yaml files
    at its top), its group names, and the keys of every file placed in the global package (``# @package
    _global_``: experiments, sweeps, data facts)."""
    import yaml

    root = Path(folder)
    keys: set[str] = {p.name for p in root.iterdir() if p.is_dir()}
    for path in root.rglob("*.yaml"):
        text = path.read_text()
        if path.parent != root and "@package _global_" not in "\n".join(text.splitlines()[:5]):
            continue
        try:
            tree = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if isinstance(tree, dict):
            keys |= {str(k) for k in tree if k not in ("defaults",)}
    return frozenset(keys)


def known_top_level_keys() -> frozenset[str]:
    """The top-level keys that something reads: :func:`_global_keys` of the package's configs and of the config
    folders the running Hydra command composed from (a user's ``hydra.searchpath``)."""
    from canonical_network.utils.config import CONFIG_DIR

    keys = set(_global_keys(str(CONFIG_DIR)))
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            for source in HydraConfig.get().runtime.config_sources:
                if source.schema == "file" and Path(source.path).is_dir():
                    keys |= _global_keys(str(Path(source.path).resolve()))
    except Exception:  # noqa: BLE001 - only widens what is accepted
        pass
    return frozenset(keys)


def check_top_level_keys(cfg: Any, stored_keys: tuple[str, ...] | list[str] = ()) -> None:
    """Raise :class:`ConfigError` for a top-level key that nothing reads (``+seeds=3``, ``+max_epochs=5``: accepted
    silently before), naming the closest known keys. ``stored_keys``: those of a checkpoint's run config (an
    evaluation), which an older version may have written."""
    import difflib

    known = known_top_level_keys() | set(stored_keys)
    unknown = sorted(str(k) for k in cfg if str(k) not in known)
    if unknown:
        close = sorted({m for k in unknown for m in difflib.get_close_matches(k, sorted(known), n=3, cutoff=0.6)})
        nested = [f"{group}.{k}" for k in unknown for group in KEYED_GROUPS if k in (cfg.get(group) or {})]
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        hint += f" (a key of a group is set with its group: {', '.join(nested)})" if nested else ""
        raise ConfigError(f"{', '.join(unknown)}: no such top-level key; nothing would read it.{hint} The top-level "
                          f"keys: {', '.join(sorted(k for k in known if not k.startswith('_')))}")


def _check_pretrained_source(checkpoint: str, data: str) -> None:
    path = Path(checkpoint)
    if not path.is_file():
        raise ConfigError(f"canonicalization.checkpoint={checkpoint!r} does not exist")
    # the run config the checkpoint carries, through the trust boundary (never guessed from its run folder)
    try:
        source_config = require_run_config(load_checkpoint(path), path)
    except ValueError as error:
        raise ConfigError(f"canonicalization.checkpoint: {error}") from None
    source = _short((source_config.get("data") or {}).get("_target_"))
    tasks = set(facts.tasks) if (facts := data_facts(data)) else set()
    source_tasks = set(facts.tasks) if (facts := data_facts(source)) else set()
    if source and tasks and not tasks & source_tasks:  # the source's data serves none of this data's tasks
        raise ConfigError(
            f"canonicalization.checkpoint={checkpoint!r} comes from a run on {source}, not on data like "
            f"this run's {data}: use the checkpoint of a canonicalizer trained on the same kind of data"
        )
