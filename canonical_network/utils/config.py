"""OmegaConf resolvers used by the configs, registered once on import (train.py and the tests import this)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import OmegaConf

#: The repository root: configs/, data/ and outputs/ live here whatever the working directory.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = PROJECT_ROOT / "configs"


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


def known_experiments() -> list[str]:
    """Every ``experiment=`` choice: ``configs/experiment/<family>/<row>.yaml`` as ``<family>/<row>``."""
    root = CONFIG_DIR / "experiment"
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def check_experiment_names(arguments: list[str], command: str = "canonical_network.train") -> None:
    """Exit with one clear message for an ``experiment=<name>`` of the command line that does not exist: the
    close matches and the rows of its family (Hydra says only "Could not find 'experiment/<name>'")."""
    import difflib

    known = known_experiments()
    for argument in arguments:
        key, _, value = argument.lstrip("+").partition("=")
        if key != "experiment" or not value or "(" in value:  # sweep functions (glob(...)) are Hydra's to expand
            continue
        for name in (v.strip() for v in value.split(",")):
            if name in known or name in ("null", ""):
                continue
            family = name.split("/")[0]
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            rows = [k for k in known if k.startswith(f"{family}/")]
            message = f"experiment={name} does not exist (no configs/experiment/{name}.yaml)."
            if close:
                message += f" Did you mean: {', '.join(close)}?"
            if rows:
                message += f" The {family} rows: {', '.join(rows)}."
            else:
                families = sorted({k.split('/')[0] for k in known})
                message += f" Families: {', '.join(families)} (configs/experiment/<family>/<row>.yaml)."
            raise SystemExit(f"{command}: error: {message}")
