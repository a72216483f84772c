"""What every task module shares: the canonicalized network, optimiser set-up, parameter counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning import LightningModule
from torch import nn

from canonical_network.canonicalization.base import CanonicalizedModel, Canonicalizer


class CanonicalizedTask(LightningModule):
    """Base LightningModule holding ``self.network = CanonicalizedModel(canonicalizer, predictor)``.

    Args:
        canonicalizer: h (use the identity canonicalizer for baselines).
        predictor: f.
        optimizer: a partially applied optimiser (Hydra ``_partial_: true``), finished here with the
            trainable parameters only, so frozen canonicalizers are never touched.
        scheduler: optional partially applied LR scheduler, stepped per epoch.
        canonicalizer_lr: learning rate of the canonicalizer's parameters; ``None`` (default) gives every
            parameter the optimiser's own. The authors' code uses one learning rate for both; a separate
            one is an ablation (h sees a few hundred steps and may need a larger step than f).
    """

    def __init__(
        self,
        canonicalizer: Canonicalizer,
        predictor: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
        canonicalizer_lr: float | None = None,
    ) -> None:
        super().__init__()
        if canonicalizer_lr is not None and (
            isinstance(canonicalizer_lr, bool) or not isinstance(canonicalizer_lr, (int, float)) or not canonicalizer_lr > 0
        ):
            raise ValueError(f"model.canonicalizer_lr must be null or a number > 0; got {canonicalizer_lr!r}")
        self.canonicalizer_lr = None if canonicalizer_lr is None else float(canonicalizer_lr)
        self.network = CanonicalizedModel(canonicalizer, predictor)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler

    @property
    def canonicalizer(self) -> Canonicalizer:
        return self.network.canonicalizer

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.network(*inputs)

    def parameter_counts(self) -> dict[str, int]:
        """Parameter counts for results.json and the loggers (frozen parameters count as parameters)."""

        def count(module: nn.Module, trainable_only: bool = False) -> int:
            return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)

        return {
            "total": count(self.network),
            "trainable": count(self.network, trainable_only=True),
            "canonicalizer": count(self.network.canonicalizer),
            "predictor": count(self.network.predictor),
        }

    def configure_optimizers(self):
        canonicalizer_ids = {id(p) for p in self.network.canonicalizer.parameters()}
        if self.canonicalizer_lr is None:
            params: Any = [p for p in self.parameters() if p.requires_grad]
        else:
            h = [p for p in self.parameters() if p.requires_grad and id(p) in canonicalizer_ids]
            rest = [p for p in self.parameters() if p.requires_grad and id(p) not in canonicalizer_ids]
            params = [{"params": rest}] + ([{"params": h, "lr": self.canonicalizer_lr}] if h else [])
        optimizer = self.optimizer_factory(params=params)
        if self.scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler_factory(optimizer=optimizer)}}
