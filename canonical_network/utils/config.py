"""Where the configs, data and outputs are (a checkout or an installed wheel: docs/configs.md), the OmegaConf
resolvers the configs use, registered once on import (train.py and the tests import this), and composing."""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import OmegaConf

#: The installed package's folder (``canonical_network/``).
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _checkout_root(folder: Path) -> Path | None:
    """``folder`` when it is a source tree of the project (its ``configs/train.yaml`` beside its ``pyproject.toml``:
    a clone, an editable install of one, an unpacked sdist), else None (an installed wheel: site-packages)."""
    return folder if (folder / "configs" / "train.yaml").is_file() and (folder / "pyproject.toml").is_file() else None


#: The source tree this code runs from, or None when it runs from an installed wheel.
CHECKOUT_ROOT = _checkout_root(PACKAGE_DIR.parent)
#: The folder the commands compose from: the checkout's top-level ``configs/`` (so editing them takes effect
#: without reinstalling), else the copy a wheel ships as ``canonical_network/configs`` (setup.py: build_py).
CONFIG_DIR = CHECKOUT_ROOT / "configs" if CHECKOUT_ROOT is not None else PACKAGE_DIR / "configs"
#: The folder ``data/`` and ``outputs/`` live in (``paths.root_dir``) and record paths are relative to
#: (``records.path_for_record``): the checkout whatever the working directory, else (an installed wheel) the
#: working directory when the package is first imported (where the command starts), as for any command-line
#: tool. ``paths.root_dir=<dir>`` moves one command's data and outputs elsewhere. docs/configs.md.
PROJECT_ROOT = CHECKOUT_ROOT if CHECKOUT_ROOT is not None else Path.cwd().resolve()


def _slug(text: str) -> str:
    """Folder-safe form of an experiment name: ``rotmnist/cn_p4`` → ``rotmnist-cn_p4``."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", str(text)).strip("-") or "run"


def _wandb_offline() -> bool:
    # Offline unless the user asks for online explicitly (WANDB_MODE=online or logger.wandb.offline=false).
    return os.environ.get("WANDB_MODE", "offline").lower() != "online"


def _gpus_per_node(accelerator: str, devices) -> int | None:
    """GPUs a Slurm job needs for a trainer config: its device count on GPU accelerators, none on CPU."""
    if str(accelerator).lower() in ("gpu", "cuda") and isinstance(devices, int):
        return devices
    return None


def register_resolvers() -> None:
    for name, fn in (
        ("cn.root", lambda: str(PROJECT_ROOT)),
        ("cn.slug", _slug),
        ("cn.wandb_offline", _wandb_offline),
        ("cn.gpus_per_node", _gpus_per_node),
    ):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register_resolvers()


def compose_experiment(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train"):
    """The config that ``python -m canonical_network.train <overrides>`` would run, without running it.

    For scripts and notebooks: ``hydra.utils.instantiate(cfg.model)`` then builds the exact model of an
    experiment, e.g. ``compose_experiment(["experiment=rotmnist/cn_p4", "canonicalization.num_rotations=8"])``.
    ``config_name="diagnose"`` composes what ``python -m canonical_network.diagnose <overrides>`` runs.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def search_dirs(arguments: list[str] | tuple[str, ...] = ()) -> tuple[list[Path], bool]:
    """The config folders a command line composes from, in Hydra's order: :data:`CONFIG_DIR`, then each folder of
    its ``hydra.searchpath=[file://<dir>,pkg://<module>]`` (a user's own configs; Hydra appends them after the
    package's, so they add names rather than replace the package's). The flag is False when a search path entry
    could not be resolved to a folder here (then the caller cannot know every name)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    folders, complete = [CONFIG_DIR], True
    searchpath = [a.lstrip("+~") for a in arguments if a.lstrip("+~").split("=", 1)[0].strip() == "hydra.searchpath"]
    if not searchpath:
        return folders, complete
    try:
        entries = OverridesParser.create().parse_overrides(searchpath[-1:])[0].value()
    except Exception:  # Hydra reports a malformed override itself, with its own message
        return folders, False
    for entry in entries if isinstance(entries, list) else []:
        scheme, _, location = str(entry).partition("://")
        folder = Path(location) if scheme == "file" else _package_folder(location) if scheme == "pkg" else None
        if folder is not None and folder.is_dir():
            folders.append(folder)
        else:
            complete = False
    return folders, complete


def _package_folder(module: str) -> Path | None:
    """The folder of an importable package (``pkg://`` search path entries), or None."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def known_experiments(folders: list[Path] | None = None) -> list[str]:
    """Every ``experiment=`` choice: ``<config folder>/experiment/<family>/<row>.yaml`` as ``<family>/<row>``, in
    :data:`CONFIG_DIR` or the given config folders (:func:`search_dirs`)."""
    names = set()
    for folder in folders if folders is not None else [CONFIG_DIR]:
        root = folder / "experiment"
        names.update(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))
    return sorted(names)


def check_experiment_names(arguments: list[str], command: str = "canonical_network.train") -> None:
    """Exit with one clear message for an ``experiment=<name>`` of the command line that does not exist: the
    close matches and the rows of its family (Hydra says only "Could not find 'experiment/<name>'"). Names in a
    user's ``hydra.searchpath`` folders count; when one of those cannot be read here, Hydra is left to judge."""
    import difflib

    folders, complete = search_dirs(arguments)
    known = known_experiments(folders)
    for argument in arguments:
        key, _, value = argument.lstrip("+").partition("=")
        if key != "experiment" or not value or "(" in value:  # sweep functions (glob(...)) are Hydra's to expand
            continue
        for name in (v.strip() for v in value.split(",")):
            if name in known or name in ("null", "") or not complete:
                continue
            family = name.split("/")[0]
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            rows = [k for k in known if k.startswith(f"{family}/")]
            message = f"experiment={name} does not exist (no experiment/{name}.yaml in {CONFIG_DIR}"
            message += "".join(f" or {folder}" for folder in folders[1:]) + ")."
            if close:
                message += f" Did you mean: {', '.join(close)}?"
            if rows:
                message += f" The {family} rows: {', '.join(rows)}."
            else:
                families = sorted({k.split('/')[0] for k in known})
                message += f" Families: {', '.join(families)} (configs/experiment/<family>/<row>.yaml)."
            _refuse(command, message)


def _dotted_keys(node, prefix: str = "") -> list[str]:
    """Every dotted key of a plain config tree (an interpolated node is not entered: its target is listed itself)."""
    keys = []
    if isinstance(node, dict):
        for key, value in node.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            keys += [dotted, *_dotted_keys(value, dotted)]
    return keys


class Refusal(SystemExit):
    """A command line refused before it ran: exit status 2 (as argparse's refusals), its one line already printed to
    stderr; ``str()`` is that line, for a caller that catches it."""

    def __init__(self, line: str) -> None:
        super().__init__(2)
        self.line = line

    def __str__(self) -> str:
        return self.line


def _refuse(command: str, message: str):
    import sys

    line = f"{command}: error: {message}"
    print(line, file=sys.stderr)
    raise Refusal(line)


def check_override_keys(arguments: list[str], config_name: str = "train",
                        command: str = "canonical_network.train") -> None:
    """Exit with one line (status 2) for a command line Hydra cannot compose because of an override: a key the
    config does not have (``trainer.max_epoch=5``: the closest keys, and ``+`` to add an argument a component
    takes), or a group option that does not exist (``prediction=resnet19``: the close options and the group's
    list). Composed once beforehand (a fraction of a second); a multirun, a ``--config-dir`` or any other error is
    left to Hydra."""
    import difflib

    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        args = get_args_parser().parse_args(arguments)
        overrides = list(args.overrides or [])
        parsed = OverridesParser.create().parse_overrides(overrides)
    except (Exception, SystemExit):  # noqa: BLE001 - Hydra reports its own command-line errors
        return
    if args.multirun or args.config_dir or args.config_path or args.config_name or args.cfg or args.info \
            or any(o.is_sweep_override() for o in parsed):
        return
    try:
        compose_experiment(overrides, config_name)
        return
    except Exception as error:  # noqa: BLE001 - only the two cases below are rewritten
        message = str(error)
    if (found := re.search(r"Could not override '([^']+)'", message)) is not None:
        key = found.group(1)
        rest = [o for o, p in zip(overrides, parsed, strict=True) if p.key_or_group != key]
        try:
            known = _dotted_keys(OmegaConf.to_container(compose_experiment(rest, config_name), resolve=False))
        except Exception:  # noqa: BLE001
            return
        close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        _refuse(command, f"{key} is not a key of the composed config.{hint} (To give a component an argument its "
                         f"config does not list, add it with +{key}=<value>; it is checked against the component's "
                         "arguments.)")
    if (found := re.search(r"Could not find '([^']+)/([^'/]+)'", message)) is not None:
        group, option = found.group(1), found.group(2)
        options = re.findall(r"^\t(\S+)$", message.split("Config search path")[0], flags=re.M)
        close = difflib.get_close_matches(option, options, n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(f'{group}={c}' for c in close)}?" if close else ""
        _refuse(command, f"{group}={option} does not exist (no {group}/{option}.yaml).{hint} The {group} options: "
                         f"{', '.join(options) or 'none'}")


#: Overrides that name where a command writes: its run folder (Hydra's), or the root of its outputs.
OUTPUT_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "paths.log_dir", "paths.root_dir")


def unwritable_reason(folder: Path) -> str | None:
    """Why ``folder`` (to be created if missing) cannot be written by this process, else ``None``: its nearest
    existing ancestor is a file, or is not writable (permissions, a read-only file system)."""
    existing = Path(os.path.abspath(folder))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user (its permissions, or a read-only file system)"
    return None


def check_output_writable(arguments: list[str], command: str) -> None:
    """Exit with one line (status 2) when a command line's output folder (:data:`OUTPUT_KEYS`, else the default
    ``outputs/`` under :data:`PROJECT_ROOT`) cannot be written, before Hydra creates it (a raw ``OSError`` and its
    traceback otherwise)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = []
    try:
        for override in OverridesParser.create().parse_overrides([a for a in arguments if not a.startswith("-")]):
            if override.key_or_group in OUTPUT_KEYS and not override.is_delete() and not override.is_sweep_override():
                value = override.value()
                if isinstance(value, str) and "${" not in value:
                    given.append((override.key_or_group, Path(value)))
    except Exception:  # noqa: BLE001 - Hydra reports a malformed override itself
        return
    for key, folder in given or [("paths.log_dir", PROJECT_ROOT / "outputs")]:
        if key == "paths.root_dir":
            folder = folder / "outputs"
        reason = unwritable_reason(folder)
        if reason is not None:
            _refuse(command, f"{key}={folder}: cannot write there ({reason}); give a folder you can write, e.g. "
                             f"{key}=<folder> (the outputs' root for one command: paths.root_dir=<folder>)")
