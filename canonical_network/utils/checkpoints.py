"""Checkpoints: written atomically, and carrying the config of their run.

**Atomic.** A checkpoint file is either the old one or the complete new one.

Lightning's own writer stages the file in the system's temporary folder and then moves it into place; when
that folder is on another file system (a tmpfs ``/tmp``, a node-local disk on a cluster) the move is a copy,
and a process killed during the copy leaves a truncated ``last.ckpt``. :class:`AtomicCheckpointIO` writes
the new file beside the old one and renames it over it (``os.replace``, atomic within a file system), after
``fsync``, so an interruption at any moment leaves a readable checkpoint.

**Self-describing.** Every checkpoint a run writes carries the run's resolved config under
:data:`RUN_CONFIG_KEY`, so the model can be rebuilt from the file alone, wherever it was copied:
:func:`run_config_from_checkpoint` reads the config, :func:`model_from_checkpoint` rebuilds the model with
its weights, and ``python -m canonical_network.evaluate ckpt_path=<file>`` runs its test loop. An evaluation
may change the data and the task's evaluation options, never the network (:func:`refused_override`,
:func:`check_architecture_unchanged`), with one exception: a training-free canonicalizer
(:data:`TRAINING_FREE_CANONICALIZATIONS`, ``canonicalization=tta``) may be put in front of a checkpoint whose
canonicalizer is the identity, since it adds no weights (:func:`training_free_choice`).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf

from canonical_network.utils.checks import ConfigError
from canonical_network.utils.trust import build, granted, locate, plain_config


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)``, but through a temporary file in the same folder renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        full = _disk_full(error, path)
        if full is None:
            raise
        raise full from error
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(obj, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        full = _disk_full(error, path) if isinstance(error, Exception) else None
        if full is not None:
            raise full from error
        raise


#: Below this much free space, a failed write is taken for a full disk (torch's zip writer reports one as
#: "[enforce fail at inline_container.cc:...] unexpected pos", with no errno).
DISK_FULL_BELOW = 64 * 2**20


def _disk_full(error: BaseException, path: Path) -> OSError | None:
    """An ``OSError(ENOSPC)`` that says so and where, when ``error`` came from a full disk; else ``None``."""
    import errno
    import shutil

    chain, cause = [], error
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    if any(getattr(e, "errno", None) == errno.ENOSPC for e in chain) or (free is not None and free < DISK_FULL_BELOW):
        where = f"{free / 2**20:.1f} MiB free there" if free is not None else "free space unknown"
        return OSError(errno.ENOSPC, f"no space left on device: could not write the checkpoint {path} ({where}); "
                       "free some space (or point paths.log_dir elsewhere) and rerun to resume")
    return None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` with :func:`atomic_torch_save` for local paths."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote: Lightning's own
        atomic_torch_save(checkpoint, path)


# --- the run config a checkpoint carries ----------------------------------------------------------------

#: The checkpoint key under which a canonical_network checkpoint carries its run:
#: ``checkpoint["canonical_network"] = {"version": RUN_CONFIG_VERSION, "config": <resolved run config>}``,
#: written by :meth:`canonical_network.tasks.base.CanonicalizedTask.on_save_checkpoint` (``train`` gives the
#: module ``OmegaConf.to_container(cfg, resolve=True)``, the composed config of the run with every
#: interpolation resolved). Lightning ignores the key when it resumes from the checkpoint.
RUN_CONFIG_KEY = "canonical_network"
#: Version of the entry's layout; a reader refuses a newer one instead of misreading it.
RUN_CONFIG_VERSION = 1

#: Config sections that make up the network a checkpoint's weights belong to: no evaluation may change them,
#: except the task's :attr:`~canonical_network.tasks.base.CanonicalizedTask.evaluation_options` under
#: ``model``. ``data_info`` holds the sizes the networks were built for (classes, channels, parts).
ARCHITECTURE_SECTIONS = ("canonicalization", "prediction", "model", "data_info")
#: Overrides that swap a whole architecture (a config group of train.yaml that picks one).
_ARCHITECTURE_GROUPS = ("experiment",)
#: The canonicalizer's symmetrization keys (docs/symmetrization.md): they say over which weighted group elements
#: the trained predictor is averaged and add no weights, so an evaluation may change them, e.g. test a
#: checkpoint trained canonically with ``canonicalization.symmetrization=weighted_frame``. A mode the
#: canonicalizer cannot build still fails, with the canonicalizer's own error, when the model is built.
SYMMETRIZATION_KEYS = ("symmetrization", "frame_size", "frame_temperature", "frame_weights")
#: Those keys as the dotted keys an override or a config difference names (``model.canonicalizer`` is the
#: interpolated ``${canonicalization}`` of the task's config).
_SYMMETRIZATION_OVERRIDES = frozenset(f"canonicalization.{key}" for key in SYMMETRIZATION_KEYS)
_SYMMETRIZATION_DIFFERENCES = _SYMMETRIZATION_OVERRIDES | {f"model.canonicalizer.{key}" for key in SYMMETRIZATION_KEYS}


#: Canonicalization options with no weights, hence evaluation options rather than architecture: any of them
#: may replace the identity canonicalizer of a checkpoint (``canonicalization=tta``, plus its own
#: ``canonicalization.<key>=...`` options); option name -> the ``_target_`` of its yaml.
TRAINING_FREE_CANONICALIZATIONS = {"tta": "canonical_network.canonicalization.test_time.TestTimeCanonicalizer"}
#: The ``_target_`` of the identity canonicalizer (configs/canonicalization/identity.yaml): a plain backbone.
IDENTITY_CANONICALIZER = "canonical_network.canonicalization.identity.IdentityCanonicalizer"


class CheckpointWithoutConfig(ValueError):
    """A checkpoint that carries no run config (written before checkpoints did, or not by canonical_network)."""


def run_config_entry(config: dict[str, Any]) -> dict[str, Any]:
    """What :data:`RUN_CONFIG_KEY` holds for the resolved run config ``config``."""
    return {"version": RUN_CONFIG_VERSION, "config": config}


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint in ``path``, on the CPU. Loaded with ``weights_only=True`` (tensors and plain Python
    values only): reading a checkpoint runs no code from it, and canonical_network's checkpoints need none."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={str(path)!r} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"ckpt_path={str(path)!r} is not a readable checkpoint: {error}") from error


def stored_run_config(checkpoint: dict[str, Any], path: str | os.PathLike = "<checkpoint>") -> dict[str, Any] | None:
    """The resolved run config a loaded checkpoint carries, or ``None`` when it carries none. It is data read from
    a file: it passes the trust boundary (:func:`~canonical_network.utils.trust.plain_config`: plain values, no key
    Hydra composes, no interpolation, only the package's components and those the user trusts) or is refused."""
    entry = checkpoint.get(RUN_CONFIG_KEY)
    if entry is None:
        return None
    version = entry.get("version") if isinstance(entry, dict) else None
    if not isinstance(version, int) or version > RUN_CONFIG_VERSION or not isinstance(entry.get("config"), dict):
        raise ValueError(
            f"{path}: its {RUN_CONFIG_KEY!r} entry has version {version!r}; this canonical_network reads versions "
            f"up to {RUN_CONFIG_VERSION}: update canonical_network to read it"
        )
    return plain_config(entry["config"], path)


def require_run_config(checkpoint: dict[str, Any], path: str | os.PathLike) -> dict[str, Any]:
    """:func:`stored_run_config`, or :class:`CheckpointWithoutConfig` saying what to do instead."""
    config = stored_run_config(checkpoint, path)
    if config is None:
        raise CheckpointWithoutConfig(
            f"{path} carries no run config (no {RUN_CONFIG_KEY!r} entry): it predates checkpoints that store "
            "the config of their run, so the model cannot be rebuilt from it alone. Continue its run with "
            "`python -m canonical_network.train experiment=<row> [its overrides] ckpt_path=<this file>` (the "
            "checkpoints it then writes carry their config), or train the row again."
        )
    return config


def run_config_from_checkpoint(path: str | os.PathLike) -> DictConfig:
    """The composed, resolved config of the run that wrote the checkpoint ``path``.

    Read from the checkpoint alone (:data:`RUN_CONFIG_KEY`), not from the run folder around it, so a
    checkpoint copied elsewhere still rebuilds. Raises :class:`CheckpointWithoutConfig` for a checkpoint
    that carries none, ``FileNotFoundError`` for a missing file.
    """
    return OmegaConf.create(require_run_config(load_checkpoint(path), path))


def evaluation_options(model_config: Any) -> tuple[str, ...]:
    """The ``model`` keys an evaluation may change for the task of ``model_config`` (its ``_target_``)."""
    target = model_config.get("_target_") if model_config is not None else None
    try:
        task = locate(target, "the run config's model")
    except Exception:  # refused, or it does not import: no evaluation option is allowed
        return ()
    return tuple(getattr(task, "evaluation_options", ()))


def refused_override(override: str, options: tuple[str, ...]) -> str | None:
    """The key of a command-line override that would change a checkpoint's architecture, else ``None``.

    ``override`` is a Hydra override (``key=value``, ``+key=value``, ``~key``, ``group=option``); refused are
    the :data:`ARCHITECTURE_SECTIONS` and their keys (``canonicalization=gcnn``, ``prediction.width=2``,
    ``model.optimizer.lr=0.1``), except ``model.<option>`` for ``option`` in ``options`` and the
    :data:`SYMMETRIZATION_KEYS` (``canonicalization.symmetrization=weighted_frame``), and ``experiment=<row>``.
    """
    key = override.lstrip("+~").split("=", 1)[0].strip()
    section = re.split(r"[./@]", key, maxsplit=1)[0]
    if section in _ARCHITECTURE_GROUPS:
        return key
    if section not in ARCHITECTURE_SECTIONS or key in _SYMMETRIZATION_OVERRIDES:
        return None
    if section == "model" and key in {f"model.{option}" for option in options}:
        return None
    return key


def architecture_error(key: str, options: tuple[str, ...], detail: str = "") -> str:
    """The one message for an override that would change a checkpoint's architecture."""
    allowed = ", ".join(f"model.{o}" for o in options) or "none for this task"
    return (
        f"{key}{detail} cannot be overridden when evaluating a checkpoint: its weights belong to the network "
        f"its run config describes ({', '.join(f'{s}.*' for s in ARCHITECTURE_SECTIONS)} are fixed). What may be "
        f"overridden: data (data=<option> with the same data_info sizes, data.<key>, e.g. data.rotation or "
        f"data.batch_size), the task's evaluation options ({allowed}), the symmetrization of the canonicalizer "
        f"({', '.join(f'canonicalization.{k}' for k in SYMMETRIZATION_KEYS)}), seed, trainer, logger, paths and hydra. "
        "To change the network, train it: python -m canonical_network.train experiment=<row> <overrides>"
    )


def training_free_choice(overrides: list[str] | tuple[str, ...]) -> str | None:
    """The training-free canonicalization an evaluation's overrides pick (``canonicalization=tta`` →
    ``"tta"``, :data:`TRAINING_FREE_CANONICALIZATIONS`), else ``None``."""
    for override in overrides:
        if override.startswith(("~", "+")) or "=" not in override:
            continue
        key, value = (part.strip() for part in override.split("=", 1))
        if key == "canonicalization" and value in TRAINING_FREE_CANONICALIZATIONS:
            return value
    return None


def _check_training_free(choice: str, stored: dict[str, Any]) -> None:
    """A training-free canonicalizer replaces the checkpoint's canonicalizer: only the identity's (which has
    no weights to drop) may be replaced."""
    target = (stored.get("canonicalization") or {}).get("_target_")
    if target != IDENTITY_CANONICALIZER:
        raise ConfigError(
            f"canonicalization={choice} replaces the checkpoint's canonicalizer, which must then be the identity "
            f"(a plain backbone run, e.g. experiment=rotmnist/cnn); this checkpoint's is {target}, whose trained "
            f"weights would be dropped. Evaluate a checkpoint of the backbone alone with canonicalization={choice}."
        )


def use_training_free_canonicalizer(config: DictConfig) -> bool:
    """Point the task at the config's top-level ``canonicalization`` when it is a training-free one; returns
    whether it is. A stored run config is resolved, so its ``model.canonicalizer`` is a copy of the run's
    canonicalization (the identity), not the ``${canonicalization}`` interpolation of the yaml: without this
    step ``canonicalization=tta`` would change the top-level key and leave the network as it was."""
    from omegaconf import open_dict

    canonicalization = config.get("canonicalization")
    if canonicalization is None or canonicalization.get("_target_") not in TRAINING_FREE_CANONICALIZATIONS.values():
        return False
    with open_dict(config):
        config.model.canonicalizer = OmegaConf.create(OmegaConf.to_container(canonicalization, resolve=True))
    return True


def use_symmetrization(config: DictConfig) -> None:
    """Give the task's canonicalizer the :data:`SYMMETRIZATION_KEYS` of the config's top-level
    ``canonicalization``. A stored run config is resolved, so its ``model.canonicalizer`` is a copy, not the
    ``${canonicalization}`` interpolation of the yaml: without this step
    ``canonicalization.symmetrization=weighted_frame`` would change the top-level key only and the network
    would still be tested canonically."""
    from omegaconf import open_dict

    canonicalization = config.get("canonicalization")
    model = config.get("model")
    if canonicalization is None or model is None or OmegaConf.is_interpolation(model, "canonicalizer"):
        return
    canonicalizer = model.get("canonicalizer")
    if not isinstance(canonicalizer, DictConfig):
        return
    with open_dict(canonicalizer):
        for key in SYMMETRIZATION_KEYS:
            if key in canonicalization:
                canonicalizer[key] = canonicalization[key]


def check_overrides(overrides: list[str] | tuple[str, ...], stored: dict[str, Any]) -> None:
    """Raise :class:`~canonical_network.utils.checks.ConfigError` for the first override that would change
    the network of the stored run config ``stored`` (:func:`refused_override`). A training-free
    canonicalization (``canonicalization=tta`` and its ``canonicalization.<key>`` options) is allowed when
    the stored canonicalizer is the identity, and refused with its own message otherwise."""
    options = evaluation_options(stored.get("model"))
    choice = training_free_choice(overrides)
    if choice is not None:
        _check_training_free(choice, stored)
    for override in overrides:
        key = refused_override(override, options)
        of_choice = choice is not None and re.split(r"[./@]", key or "", maxsplit=1)[0] == "canonicalization"
        if key is not None and not of_choice:
            raise ConfigError(architecture_error(key, options))


class _Absent:
    """A key that one of two compared configs lacks."""

    def __repr__(self) -> str:
        return "absent"


_ABSENT = _Absent()


def _differences(stored: Any, new: Any, key: str) -> list[tuple[str, Any, Any]]:
    """``(dotted key, stored value, new value)`` for every leaf where two resolved configs differ."""
    if isinstance(stored, dict) and isinstance(new, dict):
        found = []
        for name in list(stored) + [k for k in new if k not in stored]:
            found += _differences(stored.get(name, _ABSENT), new.get(name, _ABSENT), f"{key}.{name}")
        return found
    return [] if stored == new else [(key, stored, new)]


def check_architecture_unchanged(stored: dict[str, Any], config: Any) -> None:
    """Raise :class:`~canonical_network.utils.checks.ConfigError` (naming the first differing key) when
    ``config`` describes another network than the stored run config ``stored``: any difference under the
    :data:`ARCHITECTURE_SECTIONS` except the task's evaluation options."""
    options = evaluation_options(stored.get("model"))
    canonicalization = config.get("canonicalization") or {}
    training_free = canonicalization.get("_target_") in TRAINING_FREE_CANONICALIZATIONS.values()
    for section in ARCHITECTURE_SECTIONS:
        if section == "canonicalization" and training_free:
            # no weights: any of its options is an evaluation option, over an identity checkpoint only
            name = {t: n for n, t in TRAINING_FREE_CANONICALIZATIONS.items()}[canonicalization.get("_target_")]
            _check_training_free(name, stored)
            continue
        new = config.get(section, _ABSENT)
        if isinstance(new, DictConfig):
            new = OmegaConf.to_container(new, resolve=True)
        for key, before, after in _differences(stored.get(section, _ABSENT), new, section):
            if training_free and (key + ".").startswith("model.canonicalizer."):
                continue  # the training-free canonicalizer, as use_training_free_canonicalizer put it there
            if key in _SYMMETRIZATION_DIFFERENCES:
                continue  # no weights: the symmetrization is an evaluation option
            if refused_override(key, options) is not None:
                raise ConfigError(architecture_error(key, options, f" ({before!r} in the checkpoint, {after!r} here)"))


#: Keys a run may change when it resumes its own folder (:func:`check_resume_unchanged`): where files live (they
#: differ between machines and after a parked run is restored), the epoch budget and early stopping (a run is
#: continued to a longer budget), what is logged and shown, the accelerator (a run moves between a GPU and a CPU
#: machine; ``trainer.devices`` and ``trainer.num_nodes`` are not here: they change the global batch under DDP),
#: the loader's worker count, the command's own switches, and the components the user trusts (which build nothing
#: by being named). Shell-style patterns over dotted keys.
RESUME_NEUTRAL_KEYS = (
    "paths", "paths.*", "data.data_dir", "data.num_workers", "data.generate_if_missing",
    "logger", "logger.*", "callbacks.rich_progress_bar", "callbacks.rich_progress_bar.*",
    "callbacks.pose_histogram", "callbacks.pose_histogram.*",
    "callbacks.early_stopping", "callbacks.early_stopping.*", "callbacks.last_checkpoint.every_n_epochs",
    "trainer.max_epochs", "trainer.min_epochs", "trainer.accelerator", "trainer.enable_progress_bar",
    "trainer.log_every_n_steps", "trainer.num_sanity_val_steps",
    "ckpt_path", "resume", "resume_with_changes", "skip_finished", "test", "test_ckpt", "allow_unbounded_epochs",
    "compile", "tags", "trusted_targets",
)


def resume_differences(stored: dict[str, Any], config: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, value in the checkpoint, value now)`` for every difference between the resolved run config
    a run's checkpoint was written with and the one resuming it, except :data:`RESUME_NEUTRAL_KEYS` and a path
    that only follows ``paths`` (a value under the stored run folder or project root that names the same place
    under the new ones: the folder was moved or restored on another machine)."""
    import fnmatch

    def as_dict(node: Any) -> dict:
        return node if isinstance(node, dict) else {}

    moved = sorted(((str(before), str(as_dict(config.get("paths")).get(key)))
                    for key, before in as_dict(stored.get("paths")).items()
                    if isinstance(before, str) and isinstance(as_dict(config.get("paths")).get(key), str)),
                   key=lambda pair: -len(pair[0]))

    def follows_paths(before: Any, after: Any) -> bool:
        if not (isinstance(before, str) and isinstance(after, str)):
            return False
        for old, new in moved:
            if before == old or before.startswith(old.rstrip("/") + "/"):
                return new + before[len(old):] == after
        return False

    found = []
    for name in list(stored) + [k for k in config if k not in stored]:
        found += _differences(stored.get(name, _ABSENT), config.get(name, _ABSENT), name)
    return [(key, before, after) for key, before, after in found
            if not any(fnmatch.fnmatchcase(key, p) for p in RESUME_NEUTRAL_KEYS) and not follows_paths(before, after)]


def check_resume_unchanged(checkpoint_path: str | os.PathLike, config: dict[str, Any], allow: bool = False) -> list:
    """Refuse to resume a run folder's own checkpoint under another config than the one it was written with.

    A resumed run continues one record: its ``results.json`` states one config, and the report pools it with
    the runs of that config. Resumed with another learning rate, canonicalizer or data size, the record would
    claim a run that never happened. Raises :class:`~canonical_network.utils.checks.ConfigError` naming every
    changed key with both values and what to do instead; ``allow`` (``resume_with_changes=true``) resumes anyway
    and the caller logs the differences. Returns the differences. A checkpoint that carries no run config
    (written before checkpoints did) is not checked. Read lazily (``mmap``): the weights are not loaded here.
    """
    path = Path(checkpoint_path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        raise ValueError(f"{path} is not a readable checkpoint: {error}") from error
    stored = stored_run_config(checkpoint, path)
    if stored is None:
        return []
    changed = resume_differences(stored, config)
    if changed and not allow:
        shown = "; ".join(f"{key}: {before!r} in the checkpoint, {after!r} now" for key, before, after in changed[:8])
        more = f" (and {len(changed) - 8} more)" if len(changed) > 8 else ""
        raise ConfigError(
            f"the run in {path.parent.parent} resumes from {path.name}, written under another config: {shown}{more}. "
            "A resumed run continues one record, so its config may change only where files live, its epoch budget, "
            "early stopping, logging and the accelerator. Resume it with the command that started it; or start "
            "the folder over with resume=false (its files are set aside); or continue it into a new folder "
            f"under the new config: hydra.run.dir=<new folder> ckpt_path={path}; or resume here anyway with "
            "resume_with_changes=true (the record then holds the new config, the old one stays in .hydra/previous/)"
        )
    return changed


def load_weights(model: torch.nn.Module, checkpoint: dict[str, Any], path: str | os.PathLike,
                 mismatch: str = "the model rebuilt from its run config") -> None:
    """Load the checkpoint's ``state_dict`` into ``model``, strictly: every weight present and fitting.

    In either mode: escnn's expanded filters, which escnn keeps as buffers in eval mode only, are derived state,
    never stored and re-expanded on loading (``utils/escnn_compat.py``, fix 4; the filter keys of checkpoints
    written before are ignored). ``mismatch`` names what the weights were expected to fit, for the error message.
    """
    if "state_dict" not in checkpoint:
        raise ValueError(f"{path} holds no 'state_dict': not a Lightning checkpoint of canonical_network.train")
    try:
        model.load_state_dict(checkpoint["state_dict"], strict=True)
    except RuntimeError as error:
        raise ValueError(f"ckpt_path={str(path)!r}: its weights do not fit {mismatch}: {error}") from None


#: Components that read pretrained weights when built, by ``_target_``: a model rebuilt from a checkpoint is
#: built without them (:func:`without_pretrained_weights`; the checkpoint's state dict replaces every weight),
#: so the weights file need not exist on the machine that reads the checkpoint.
PRETRAINED_WEIGHTS_TARGETS = ("canonical_network.prediction.torchvision_backbones.TorchvisionBackbone",)


def without_pretrained_weights(model: DictConfig) -> DictConfig:
    """A copy of the model config that builds the same network without reading pretrained weights: each
    :data:`PRETRAINED_WEIGHTS_TARGETS` node gets ``weights: null`` (and no download), its ``normalize: auto``
    first resolved as the run resolved it (``imagenet`` when it loaded weights, else ``none``). The checkpoint's
    state dict then sets every weight, as it would have replaced the pretrained ones."""

    def rebuilt(node: Any) -> Any:
        if isinstance(node, list):
            return [rebuilt(item) for item in node]
        if not isinstance(node, dict):
            return node
        node = {key: rebuilt(value) for key, value in node.items()}
        if node.get("_target_") in PRETRAINED_WEIGHTS_TARGETS and node.get("weights") is not None:
            if node.get("normalize", "auto") == "auto":
                node["normalize"] = "imagenet"
            node["weights"], node["download_weights"] = None, False
        return node

    return OmegaConf.create(rebuilt(OmegaConf.to_container(model, resolve=True)))


def model_from_checkpoint(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (),
                          trusted_targets: tuple[str, ...] | list[str] = ()) -> torch.nn.Module:
    """The LightningModule of the run that wrote ``path``, with its trained weights, in eval mode.

    Rebuilt from the checkpoint alone: the run config it carries (:func:`run_config_from_checkpoint`),
    ``overrides`` applied (``key=value`` dotted keys, e.g. ``["model.orbit_rotations=8"]``; only the task's
    evaluation options may change the model, see :func:`refused_override`), then the weights (strict;
    pretrained weights the run started from are not read again: :func:`without_pretrained_weights`). The
    stored config may build only the package's own components (``utils/trust.py``), plus ``trusted_targets``,
    those of your own code that you name. E.g.::

        model = model_from_checkpoint("outputs/runs/<date>/<time>_rotmnist-cn_p4/checkpoints/last.ckpt")
        logits = model(images)  # (B, 1, 28, 28) -> (B, 10)
    """
    with granted(trusted_targets):
        return _model_from_checkpoint(path, overrides)


def _model_from_checkpoint(path: str | os.PathLike, overrides: list[str] | tuple[str, ...]) -> torch.nn.Module:
    checkpoint = load_checkpoint(path)
    stored = require_run_config(checkpoint, path)
    check_overrides(overrides, stored)
    overrides = list(overrides)
    config = OmegaConf.create(stored)
    choice = training_free_choice(overrides)
    if choice is not None:  # canonicalization=tta: its yaml replaces the identity's node
        from canonical_network.utils.config import CONFIG_DIR

        config.canonicalization = OmegaConf.load(CONFIG_DIR / "canonicalization" / f"{choice}.yaml")
        overrides = [o for o in overrides if o.split("=", 1)[0].strip() != "canonicalization"]
    config = OmegaConf.merge(config, OmegaConf.from_dotlist(overrides))
    use_training_free_canonicalizer(config)
    use_symmetrization(config)
    check_architecture_unchanged(stored, config)
    # its weights: the checkpoint's
    model = build(without_pretrained_weights(config.model), f"{path} (its model)")
    load_weights(model, checkpoint, path)
    model.run_config = OmegaConf.to_container(config, resolve=True)
    return model.eval()
