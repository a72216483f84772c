"""CN(pretrained) (paper Table 2): a canonicalizer taken from a finished run and frozen.

The ablation asks whether the learned canonicalization is meaningful on its own: the canonicalizer of a
trained CN(p64)-CNN is kept, the prediction network is re-initialised and trained from scratch.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from canonical_network.canonicalization.base import Canonicalizer
from canonical_network.utils.checkpoints import CheckpointWithoutConfig, load_checkpoint, require_run_config
from canonical_network.utils.trust import build

PREFIX = "network.canonicalizer."


def _run_config(path: Path, checkpoint: dict):
    """The composed config of the run that wrote the checkpoint: the one it carries
    (canonical_network/utils/checkpoints.py), through the trust boundary. A run folder's ``.hydra/config.yaml`` is
    never read for it: Hydra writes it unresolved (interpolations, resolvers), and it is a record for people, not
    a config to build from."""
    return OmegaConf.create(require_run_config(checkpoint, path))


def from_checkpoint(checkpoint: str | None, freeze: bool = True, prior_weight: float = 0.0,
                    symmetrization: str = "canonical", frame_size: int = 2, frame_temperature: float = 1.0,
                    frame_weights: str = "gap") -> Canonicalizer:
    """Rebuild the canonicalizer of the run that wrote ``checkpoint`` and load its trained weights.

    Args:
        checkpoint: a Lightning checkpoint of a canonical_network run (e.g. ``<run>/checkpoints/last.ckpt``
            of a ``rotmnist/cn_p64`` run).
        freeze: keep it fixed while the new predictor trains (the paper's setting).
        prior_weight: the canonicalization prior's weight in *this* run (replaces the source run's); it
            only moves h with ``freeze=False``.
        symmetrization, frame_size, frame_temperature, frame_weights: *this* run's symmetrization of the
            rebuilt canonicalizer (replacing the source run's; the base class checks them,
            ``canonicalization/symmetrization.py``).
    """
    if not checkpoint:
        raise ValueError("canonicalization.checkpoint is required: the path of a finished CN run's checkpoint")
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(f"canonicalization.checkpoint={checkpoint!r} does not exist")
    try:  # weights only: reading the file runs no code from it
        checkpoint_dict = load_checkpoint(path)
    except ValueError as error:
        raise ValueError(f"canonicalization.checkpoint: {error}") from None
    try:
        canon_cfg = _run_config(path, checkpoint_dict).canonicalization
    except CheckpointWithoutConfig as error:
        raise ValueError(f"canonicalization.checkpoint: {error}") from None
    canon_cfg.freeze = freeze  # checked by the Canonicalizer base class
    canon_cfg.prior_weight = prior_weight  # checked by the Canonicalizer base class
    for key, value in (("symmetrization", symmetrization), ("frame_size", frame_size),
                       ("frame_temperature", frame_temperature), ("frame_weights", frame_weights)):
        canon_cfg[key] = value  # checked by the Canonicalizer base class too
    # the config comes from the file: it may build only the package's canonicalizers (the trust boundary)
    canonicalizer = build(canon_cfg, f"{path} (its canonicalization)")
    state = checkpoint_dict["state_dict"]
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
