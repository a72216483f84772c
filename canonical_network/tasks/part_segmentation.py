"""Part segmentation (ShapeNet-part, paper §5.3, Table 5b): per-point label-smoothed cross-entropy,
instance/class mIoU."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics.classification import MulticlassAccuracy

from canonical_network.prediction.pointnet import FEATURE_TRANSFORM_NORMS, FEATURE_TRANSFORM_REG_WEIGHT
from canonical_network.tasks.base import CanonicalizedTask
from canonical_network.tasks.metrics import PartSegmentationMIoU, restricted_argmax
from canonical_network.tasks.pointcloud_classification import smoothed_loss
from canonical_network.utils.checks import check_choice, check_fraction


def refuse_invariant_permutation(canonicalizer) -> None:
    """Per-point part logits must go back to the input's point order: an S_n canonicalizer (alone or as a factor of
    a product) with ``output=invariant`` would return them in its canonical order, misaligned with the labels."""
    from canonical_network.canonicalization.permutation import PermutationCanonicalizer

    for module in canonicalizer.modules():
        if isinstance(module, PermutationCanonicalizer) and module.output == "invariant":
            key = "canonicalization.second.output" if module is not canonicalizer else "canonicalization.output"
            raise ValueError(f"{key}=invariant: part segmentation predicts one output per point, which must be "
                             f"mapped back to the input's point order; use {key}=elements")


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
        feature_transform_norm: ``"squared"`` (the paper's, default) or ``"frobenius"``, as
            :class:`~canonical_network.tasks.pointcloud_classification.PointCloudClassificationTask`.
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
        feature_transform_norm: str = "squared",
    ) -> None:
        metrics = {
            split: {
                "acc": MulticlassAccuracy(num_classes=int(num_parts), average="micro"),
                "miou": PartSegmentationMIoU(category_parts, num_parts=int(num_parts)),
            }
            for split in ("val", "test")
        }
        refuse_invariant_permutation(canonicalizer)
        super().__init__(canonicalizer, predictor, optimizer, scheduler, metrics=metrics)
        self.num_parts = int(num_parts)
        self.label_smoothing = check_fraction("model.label_smoothing", label_smoothing)
        self.feature_transform_weight = float(feature_transform_weight)
        self.feature_transform_norm = check_choice("model.feature_transform_norm", feature_transform_norm,
                                                   FEATURE_TRANSFORM_NORMS)

    def loss(self, output: torch.Tensor, target: torch.Tensor, split: str) -> torch.Tensor:
        # (B, P, num_parts) against (B, P): the mean runs over every point of every shape; torch smooths
        # over the num_parts logits (ε / num_parts each), as the class docstring explains.
        return smoothed_loss(self, output, target, split)

    def update_metrics(self, metrics, output, target, inputs) -> None:
        if not metrics:  # training measures the loss only
            return
        category = inputs[1]
        metrics["miou"].update(output, target, category)
        # The category is known (as for the mIoU): a point's part is predicted among its category's parts.
        predicted = restricted_argmax(output, category, metrics["miou"].part_mask)
        metrics["acc"].update(predicted.flatten(), target.flatten())
