"""N-body dynamics prediction (paper §5.2, Appendix G.2): positions 1,000 steps ahead, MSE on positions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics.regression import MeanSquaredError

from canonical_network.tasks.base import CanonicalizedTask


class NBodyDynamicsTask(CanonicalizedTask):
    """``model(loc, vel, charges)``: (B, N, 3), (B, N, 3), (B, N, 1) → predicted positions (B, N, 3).

    Batches are ``(loc, vel, charges, target_loc)`` (:class:`~canonical_network.data.nbody.NBodyDataModule`).
    The loss is the mean squared error over every coordinate of every particle (``nn.MSELoss`` in EGNN's
    ``main_nbody.py``), which is also the paper's reported metric.

    Logs ``train/loss`` and ``{val,test}/mse``. The validation and test MSE are accumulated over the whole
    split (sum of squared errors / number of coordinates), so a smaller last batch is weighted correctly.
    """

    def __init__(self, canonicalizer, predictor, optimizer, scheduler=None,
                 canonicalizer_lr: float | None = None) -> None:
        super().__init__(canonicalizer, predictor, optimizer, scheduler, canonicalizer_lr=canonicalizer_lr)
        self.metrics = torch.nn.ModuleDict({f"{split}_mse": MeanSquaredError() for split in ("val", "test")})

    def training_step(self, batch, batch_idx):
        loc, vel, charges, target = batch
        loss = F.mse_loss(self(loc, vel, charges), target)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(loc))
        return loss

    def _eval_step(self, batch, split: str) -> None:
        loc, vel, charges, target = batch
        metric = self.metrics[f"{split}_mse"]
        # MeanSquaredError flattens its inputs: the mean runs over B · N · 3 coordinates, as the loss does.
        metric(self(loc, vel, charges), target)
        self.log(f"{split}/mse", metric, on_step=False, on_epoch=True, prog_bar=True, batch_size=len(loc))

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test")
