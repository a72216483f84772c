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
    """

    def __init__(
        self,
        canonicalizer: Canonicalizer,
        predictor: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
    ) -> None:
        super().__init__()
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
        params = [p for p in self.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params=params)
        if self.scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler_factory(optimizer=optimizer)}}
