"""Image classification (Rotated MNIST, paper §5.1): cross-entropy, accuracy and error in %."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from canonical_network.tasks.base import CanonicalizedTask


class ImageClassificationTask(CanonicalizedTask):
    """``model(images)``: (B, C, H, W) in [0, 1] → logits (B, num_classes).

    Logs ``train/loss``, ``train/acc``, ``{val,test}/loss``, ``{val,test}/acc`` and ``{val,test}/error``
    (in %, the paper's figure).
    """

    def __init__(self, canonicalizer, predictor, optimizer, scheduler=None, num_classes: int = 10,
                 label_smoothing: float = 0.0) -> None:
        super().__init__(canonicalizer, predictor, optimizer, scheduler)
        self.label_smoothing = float(label_smoothing)
        self.metrics = torch.nn.ModuleDict(
            {f"{split}_acc": MulticlassAccuracy(num_classes=num_classes, average="micro") for split in ("train", "val", "test")}
        )

    def _step(self, batch, split: str) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing if split == "train" else 0.0)
        metric = self.metrics[f"{split}_acc"]
        metric(logits, labels)
        on_step = split == "train"
        self.log(f"{split}/loss", loss, on_step=on_step, on_epoch=True, prog_bar=split != "test")
        self.log(f"{split}/acc", metric, on_step=False, on_epoch=True, prog_bar=split == "val")
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def _log_error(self, split: str) -> None:
        # Error (%) from the epoch's accuracy: the paper reports error, users compare against it.
        acc = self.metrics[f"{split}_acc"].compute()
        self.log(f"{split}/error", 100.0 * (1.0 - acc), prog_bar=split == "val")

    def on_validation_epoch_end(self) -> None:
        self._log_error("val")

    def on_test_epoch_end(self) -> None:
        self._log_error("test")
