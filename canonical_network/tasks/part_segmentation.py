"""Part segmentation (ShapeNet-part, paper §5.3, Table 5b): per-point label-smoothed cross-entropy,
instance/class mIoU."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from canonical_network.prediction.pointnet import FEATURE_TRANSFORM_REG_WEIGHT
from canonical_network.tasks.base import CanonicalizedTask
from canonical_network.tasks.metrics import PartSegmentationMIoU, restricted_argmax
from canonical_network.tasks.pointcloud_classification import check_label_smoothing, feature_transform_loss


class PartSegmentationTask(CanonicalizedTask):
    """``model(points, category)``: (B, P, 3), (B,) int64 → part logits (B, P, num_parts).

    Batches are ``(points (B, P, 3), category (B,) int64, part_labels (B, P) int64)`` with global part ids
    (:class:`~canonical_network.data.shapenet.ShapeNetPartDataModule`,
    :class:`~canonical_network.data.synthetic_shapes.SyntheticShapesDataModule` with ``task="segmentation"``).

    Training loss: cross-entropy over every point with label smoothing ``ε`` over all ``num_parts`` part
    logits (training only; validation and test losses are plain cross-entropy), plus PointNet's
    feature-transform regulariser when the predictor has one. Why over all parts and not the category's:
    the training softmax runs over all ``num_parts`` logits (only evaluation restricts the argmax to the
    category's parts), and smoothing is a property of that softmax's target; the authors' part
    segmentation smooths over every part too. The mass ``ε (1 − n_cat / num_parts)`` this puts on other
    categories' parts only keeps their logits from being pushed to −∞, which the restricted argmax never
    looks at. Not copied: the authors' ``ε / (num_classes − 1)`` with 16 *categories* in place of 50 parts
    (``pointcloud_partseg_models.py:43,173``), a target that sums to ``1 − ε + 49 ε / 15 ≠ 1``; torch's
    ``label_smoothing`` divides by the number of logits.

    Logs ``train/loss``, ``{val,test}/loss``, ``{val,test}/acc`` (fraction of points whose part is right,
    predicted among the parts of the shape's category, as the mIoU is), and ``{val,test}/instance_miou``,
    ``{val,test}/class_miou``
    (:class:`~canonical_network.tasks.metrics.PartSegmentationMIoU`: fractions, the paper's Table 5b ×100).

    Args:
        canonicalizer, predictor, optimizer, scheduler: see :class:`CanonicalizedTask`.
        num_parts: width of the part logits (ShapeNet-part: 50).
        category_parts: the part ids of each category, or ``"shapenet_part"`` / ``"synthetic_shapes"``.
        label_smoothing: ``ε`` of the training cross-entropy, in [0, 1). Default 0.2, the authors' part
            segmentation (``configs/model/part_segmentation.yaml``).
        feature_transform_weight: weight of the feature-transform regulariser (PointNet: 1e-3).
    """

    def __init__(
        self,
        canonicalizer,
        predictor,
        optimizer,
        scheduler=None,
        num_parts: int = 50,
        category_parts: str | Sequence[Sequence[int]] = "shapenet_part",
        label_smoothing: float = 0.2,
        feature_transform_weight: float = FEATURE_TRANSFORM_REG_WEIGHT,
    ) -> None:
        super().__init__(canonicalizer, predictor, optimizer, scheduler)
        self.num_parts = int(num_parts)
        self.label_smoothing = check_label_smoothing(label_smoothing)
        self.feature_transform_weight = float(feature_transform_weight)
        splits = ("val", "test")
        self.miou = nn.ModuleDict(
            {s: PartSegmentationMIoU(category_parts, num_parts=self.num_parts) for s in splits}
        )
        self.accuracy = nn.ModuleDict(
            {s: MulticlassAccuracy(num_classes=self.num_parts, average="micro") for s in splits}
        )

    def training_step(self, batch, batch_idx):
        points, category, labels = batch
        logits = self(points, category)
        # (B, num_parts, P) against (B, P): the mean runs over every point of every shape; torch smooths
        # over the num_parts logits (ε / num_parts each), as the class docstring explains.
        loss = F.cross_entropy(logits.transpose(1, 2), labels, label_smoothing=self.label_smoothing)
        regulariser = feature_transform_loss(self.network.predictor, self.feature_transform_weight)
        if regulariser is not None:
            loss = loss + regulariser
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(points))
        return loss

    def _eval_step(self, batch, split: str) -> None:
        points, category, labels = batch
        logits = self(points, category)
        loss = F.cross_entropy(logits.transpose(1, 2), labels)
        self.log(f"{split}/loss", loss, on_step=False, on_epoch=True, prog_bar=split == "val",
                 batch_size=len(points))
        miou = self.miou[split]
        miou.update(logits, labels, category)
        # The category is known (as for the mIoU): a point's part is predicted among its category's parts.
        predicted = restricted_argmax(logits, category, miou.part_mask)
        accuracy = self.accuracy[split]
        accuracy(predicted.flatten(), labels.flatten())
        self.log(f"{split}/acc", accuracy, on_step=False, on_epoch=True)

    def _log_miou(self, split: str) -> None:
        # The mIoU is a dict of two values, which self.log cannot take as a Metric: compute, log, reset.
        values = self.miou[split].compute()
        self.log_dict({f"{split}/{name}": value for name, value in values.items()}, prog_bar=split == "val")
        self.miou[split].reset()

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._log_miou("val")

    def on_test_epoch_end(self) -> None:
        self._log_miou("test")
