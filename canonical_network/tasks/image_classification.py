"""Image classification (Rotated MNIST, paper §5.1): cross-entropy, accuracy and error in %."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from canonical_network.groups.image import act_exact, element_angles_deg
from canonical_network.tasks.base import CanonicalizedTask
from canonical_network.utils.checks import check_int_range


class ImageClassificationTask(CanonicalizedTask):
    """``model(images)``: (B, C, H, W) in [0, 1] → logits (B, num_classes).

    Logs ``train/loss``, ``train/acc``, ``{val,test}/loss``, ``{val,test}/acc`` and ``{val,test}/error``
    (in %, the paper's figure).

    Group-orbit evaluation: with ``orbit_rotations=N > 0`` every test batch is also classified after
    transforming it by each element g_k of C_N (of D_N with ``orbit_reflection``; element k in escnn's
    order, rotation by k·360°/N after a flip for k ≥ N). Logged: ``test/orbit/error_g{k}`` for each
    element, ``test/orbit/error_worst`` (the max over the orbit), ``test/orbit/error_mean`` and
    ``test/orbit/error_gap`` (worst − best). An invariant model scores the same under every element, so
    its gap is 0; a plain CNN's gap shows how much it depends on the pose. Multiples of 90° are applied
    with ``rot90`` (exact); other angles are bilinear, which blurs and crops the corners, so there an
    invariant model's gap is small but not exactly 0.
    """

    def __init__(self, canonicalizer, predictor, optimizer, scheduler=None, num_classes: int = 10,
                 label_smoothing: float = 0.0, orbit_rotations: int = 0, orbit_reflection: bool = False) -> None:
        super().__init__(canonicalizer, predictor, optimizer, scheduler)
        check_int_range("model.orbit_rotations", orbit_rotations, low=0)
        self.label_smoothing = float(label_smoothing)
        self.metrics = torch.nn.ModuleDict(
            {f"{split}_acc": MulticlassAccuracy(num_classes=num_classes, average="micro") for split in ("train", "val", "test")}
        )
        self.orbit: list[tuple[float, bool]] = []
        if orbit_rotations > 0:
            angles, reflect = element_angles_deg(orbit_rotations, bool(orbit_reflection))
            self.orbit = [(float(a), bool(r)) for a, r in zip(angles.tolist(), reflect.tolist(), strict=True)]
        self.orbit_metrics = torch.nn.ModuleList(
            [MulticlassAccuracy(num_classes=num_classes, average="micro") for _ in self.orbit]
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
        images, labels = batch
        for (angle, reflect), metric in zip(self.orbit, self.orbit_metrics, strict=True):
            metric.update(self(act_exact(images, angle, reflect)), labels)

    def _log_error(self, split: str) -> None:
        # Error (%) from the epoch's accuracy: the paper reports error, users compare against it.
        acc = self.metrics[f"{split}_acc"].compute()
        self.log(f"{split}/error", 100.0 * (1.0 - acc), prog_bar=split == "val")

    def on_validation_epoch_end(self) -> None:
        self._log_error("val")

    def on_test_epoch_end(self) -> None:
        self._log_error("test")
        if not self.orbit:
            return
        errors = torch.stack([100.0 * (1.0 - metric.compute()) for metric in self.orbit_metrics])
        for k, error in enumerate(errors):
            self.log(f"test/orbit/error_g{k}", error)
        self.log("test/orbit/error_worst", errors.max())
        self.log("test/orbit/error_mean", errors.mean())
        self.log("test/orbit/error_gap", errors.max() - errors.min())
        for metric in self.orbit_metrics:
            metric.reset()
