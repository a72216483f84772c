"""CN(pretrained) (paper Table 2): a canonicalizer taken from a finished run and frozen.

The ablation asks whether the learned canonicalization is meaningful on its own: the canonicalizer of a
trained CN(p64)-CNN is kept, the prediction network is re-initialised and trained from scratch.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from omegaconf import OmegaConf

from canonical_network.canonicalization.base import Canonicalizer

PREFIX = "network.canonicalizer."


def _run_config(checkpoint: Path):
    """The composed config saved by Hydra beside the run: <run dir>/.hydra/config.yaml."""
    for parent in checkpoint.resolve().parents:
        config = parent / ".hydra" / "config.yaml"
        if config.is_file():
            return OmegaConf.load(config)
    raise FileNotFoundError(
        f"canonicalization.checkpoint={str(checkpoint)!r}: no .hydra/config.yaml in any folder above it, so "
        "the canonicalizer's architecture is unknown. Point to a checkpoint inside a canonical_network run folder."
    )


def from_checkpoint(checkpoint: str | None, freeze: bool = True) -> Canonicalizer:
    """Rebuild the canonicalizer of the run that wrote ``checkpoint`` and load its trained weights.

    Args:
        checkpoint: a Lightning checkpoint of a canonical_network run (e.g. ``<run>/checkpoints/last.ckpt``
            of a ``rotmnist/cn_p64`` run).
        freeze: keep it fixed while the new predictor trains (the paper's setting).
    """
    if not checkpoint:
        raise ValueError("canonicalization.checkpoint is required: the path of a finished CN run's checkpoint")
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"canonicalization.checkpoint={checkpoint!r} does not exist")
    canon_cfg = _run_config(path).canonicalization
    canon_cfg.freeze = bool(freeze)
    canonicalizer = hydra.utils.instantiate(canon_cfg)
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    weights = {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}
    if not weights or not canonicalizer.state_dict():
        raise ValueError(
            f"{checkpoint} holds no canonicalizer weights (keys starting with {PREFIX!r}); its run used "
            f"{canon_cfg._target_}. Use the checkpoint of a learned canonicalization run such as rotmnist/cn_p64."
        )
    try:
        canonicalizer.load_state_dict(weights, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{checkpoint}: its canonicalizer does not match {canon_cfg._target_}: {err}") from err
    return canonicalizer.set_frozen(bool(freeze))
