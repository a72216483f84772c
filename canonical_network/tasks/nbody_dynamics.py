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

    log_eval_loss = False  # the loss is the metric, logged as {val,test}/mse

    def __init__(self, canonicalizer, predictor, optimizer, scheduler=None,
                 canonicalizer_lr: float | None = None) -> None:
        # MeanSquaredError flattens its inputs: the mean runs over B · N · 3 coordinates, as the loss does.
        metrics = {split: {"mse": MeanSquaredError()} for split in ("val", "test")}
        super().__init__(canonicalizer, predictor, optimizer, scheduler, canonicalizer_lr=canonicalizer_lr,
                         metrics=metrics)

    def loss(self, output: torch.Tensor, target: torch.Tensor, split: str) -> torch.Tensor:
        return F.mse_loss(output, target)
