"""Image classification (Rotated MNIST, paper §5.1): cross-entropy, accuracy and error in %."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from canonical_network.groups.image import group_elements, orbit
from canonical_network.tasks.base import CanonicalizedTask
from canonical_network.tasks.metrics import ErrorPercent
from canonical_network.utils.checks import check_int


class ImageClassificationTask(CanonicalizedTask):
    """``model(images)``: (B, C, H, W) in [0, 1] → logits (B, num_classes).

    Logs ``train/loss``, ``train/acc``, ``{val,test}/loss``, ``{val,test}/acc`` and ``{val,test}/error``
    (in %, the paper's figure).

    Group-orbit evaluation: with ``orbit_rotations=N > 0`` every test batch is also classified after
    transforming it by each element g_k of C_N (of D_N with ``orbit_reflection``; element k in escnn's
    order, rotation by k·360°/N after a flip for k ≥ N). Logged, all in %:

    * ``test/orbit/error_g{k}``: the test error with the whole test set transformed by g_k;
    * ``test/orbit/error_max`` and ``test/orbit/error_gap``: the largest of those, and largest − smallest;
    * ``test/orbit/error_mean``: their mean, the error on the test set shown under every element (100 minus
      Mondal et al.'s "C8-Avg Acc" with ``orbit_rotations=8``);
    * ``test/orbit/error_worst``: the worst case per image, i.e. the share of test images misclassified
      under at least one element of the orbit;
    * ``test/orbit/inconsistent``: the share of test images whose predicted class is not the same under
      all elements.

    An invariant model has ``error_worst`` = ``test/error`` and ``inconsistent`` = 0. The per-element
    errors alone are a weak check on rotated test sets: a set that is (close to) closed under the group,
    like rotated_mnist_5k's 8 views per digit under C_4, gives any model equal errors under every
    element; the per-image figures are what expose a pose-dependent model there. Multiples of 90° are
    applied with ``rot90`` (exact); other angles are bilinear, which blurs and crops the corners, so
    there an invariant model's figures are close to, not exactly, those of an exact invariance.
    """

    #: the group-orbit evaluation (its metrics hold no weights): ``evaluate ... model.orbit_rotations=8``
    evaluation_options = ("orbit_rotations", "orbit_reflection")

    def __init__(self, canonicalizer, predictor, optimizer, scheduler=None, num_classes: int = 10,
                 label_smoothing: float = 0.0, orbit_rotations: int = 0, orbit_reflection: bool = False,
                 canonicalizer_lr: float | None = None) -> None:
        def accuracy() -> MulticlassAccuracy:
            return MulticlassAccuracy(num_classes=num_classes, average="micro")

        metrics = {"train": {"acc": accuracy()}}
        metrics.update({split: {"acc": accuracy(), "error": ErrorPercent(num_classes)} for split in ("val", "test")})
        super().__init__(canonicalizer, predictor, optimizer, scheduler, canonicalizer_lr=canonicalizer_lr,
                         metrics=metrics)
        check_int("model.orbit_rotations", orbit_rotations, low=0)
        self.label_smoothing = float(label_smoothing)
        self.orbit: list[tuple[float, bool]] = (
            group_elements(orbit_rotations, bool(orbit_reflection)) if orbit_rotations > 0 else []
        )
        self.orbit_metrics = torch.nn.ModuleList([ErrorPercent(num_classes) for _ in self.orbit])
        # Per-image orbit figures as means of 0/1 flags (MeanMetric syncs them across DDP processes).
        self.orbit_worst = MeanMetric()
        self.orbit_inconsistent = MeanMetric()

    def loss(self, output: torch.Tensor, target: torch.Tensor, split: str) -> torch.Tensor:
        return F.cross_entropy(output, target, label_smoothing=self.label_smoothing if split == "train" else 0.0)

    def test_step(self, batch, batch_idx):
        loss = super().test_step(batch, batch_idx)
        if not self.orbit:
            return loss
        images, labels = batch
        predictions = []
        for (_, moved), metric in zip(orbit(images, self.orbit), self.orbit_metrics, strict=True):
            logits = self(moved)
            metric.update(logits, labels)
            predictions.append(logits.argmax(dim=-1))
        predictions = torch.stack(predictions)  # (|orbit|, B)
        self.orbit_worst.update((predictions != labels).any(dim=0).float())
        self.orbit_inconsistent.update((predictions != predictions[0]).any(dim=0).float())
        return loss

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        if not self.orbit:
            return
        errors = torch.stack([metric.compute() for metric in self.orbit_metrics])
        for k, error in enumerate(errors):
            self.log(f"test/orbit/error_g{k}", error)
        self.log("test/orbit/error_max", errors.max())
        self.log("test/orbit/error_mean", errors.mean())
        self.log("test/orbit/error_gap", errors.max() - errors.min())
        self.log("test/orbit/error_worst", 100.0 * self.orbit_worst.compute())
        self.log("test/orbit/inconsistent", 100.0 * self.orbit_inconsistent.compute())
        for metric in (*self.orbit_metrics, self.orbit_worst, self.orbit_inconsistent):
            metric.reset()
