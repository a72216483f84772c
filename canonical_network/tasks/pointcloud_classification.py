"""Point-cloud classification (ModelNet40, paper §5.3, Table 4): label-smoothed cross-entropy, accuracy,
class-mean accuracy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from canonical_network.prediction.pointnet import (
    FEATURE_TRANSFORM_NORMS,
    FEATURE_TRANSFORM_REG_WEIGHT,
    feature_transform_regularizer,
)
from canonical_network.tasks.base import CanonicalizedTask
from canonical_network.tasks.metrics import class_mean_accuracy
from canonical_network.utils.checks import check_choice, check_fraction


def smoothed_loss(task: CanonicalizedTask, logits: torch.Tensor, labels: torch.Tensor, split: str) -> torch.Tensor:
    """The point-cloud training loss: cross-entropy over the last logit axis of ``logits`` (B, [P,] C) with
    ``task.label_smoothing`` and PointNet's feature-transform regulariser in training; plain cross-entropy on
    validation and test."""
    if split != "train":
        return F.cross_entropy(logits.movedim(-1, 1), labels)
    loss = F.cross_entropy(logits.movedim(-1, 1), labels, label_smoothing=task.label_smoothing)
    regulariser = feature_transform_loss(task.network.predictor, task.feature_transform_weight,
                                         task.feature_transform_norm)
    return loss if regulariser is None else loss + regulariser


def feature_transform_loss(predictor: nn.Module, weight: float, norm: str = "squared") -> torch.Tensor | None:
    """``weight · ‖I − A Aᵀ‖²`` (or ``‖I − A Aᵀ‖`` with ``norm="frobenius"``) for the feature T-Net matrix ``A``
    of the predictor's last forward, or ``None``.

    Only PointNet exposes ``last_feature_transform``; other predictors (and PointNet without its feature
    T-Net) get no regulariser. Read after the forward of the same batch.
    """
    transform = getattr(predictor, "last_feature_transform", None)
    if transform is None or weight == 0.0:
        return None
    return weight * feature_transform_regularizer(transform, norm)


class PointCloudClassificationTask(CanonicalizedTask):
    """``model(points)``: (B, P, 3) → logits (B, num_classes).

    Batches are ``(points (B, P, 3), label (B,) int64)``
    (:class:`~canonical_network.data.modelnet.ModelNet40DataModule`,
    :class:`~canonical_network.data.synthetic_shapes.SyntheticShapesDataModule` with
    ``task="classification"``).

    Training loss: cross-entropy with label smoothing ``ε`` (training only; validation and test losses are
    plain cross-entropy) plus PointNet's feature-transform regulariser when the predictor has one. Smoothing
    is torch's: target ``(1 − ε) · one-hot + ε / C`` over the ``C`` classes, i.e. the loss
    ``(1 − ε) · NLL + ε · mean_c(−log p_c)``. Logs ``train/loss``, ``train/acc``, ``{val,test}/loss``,
    ``{val,test}/acc`` (overall accuracy, a fraction: the paper's Table 4 ×100) and ``{val,test}/class_acc``
    (class-mean accuracy).

    Args:
        canonicalizer, predictor, optimizer, scheduler: see :class:`CanonicalizedTask`.
        num_classes: 40 for ModelNet40.
        label_smoothing: ``ε`` of the training cross-entropy, in [0, 1). Default 0.2: DGCNN's (Wang et al.
            2019) and the authors' point-cloud recipe (``configs/model/pointcloud_classification.yaml``).
        feature_transform_weight: weight of the feature-transform regulariser (PointNet: 1e-3).
        feature_transform_norm: ``"squared"`` (the paper's ``‖I − A Aᵀ‖²_F``, default) or ``"frobenius"``
            (``‖I − A Aᵀ‖_F``, the PyTorch PointNet code's, stable under SGD at lr 0.1; see
            :func:`~canonical_network.prediction.pointnet.feature_transform_regularizer`).
    """

    def __init__(
        self,
        canonicalizer,
        predictor,
        optimizer,
        scheduler=None,
        num_classes: int = 40,
        label_smoothing: float = 0.2,
        feature_transform_weight: float = FEATURE_TRANSFORM_REG_WEIGHT,
        feature_transform_norm: str = "squared",
    ) -> None:
        def accuracy() -> MulticlassAccuracy:
            return MulticlassAccuracy(num_classes=num_classes, average="micro")

        metrics = {"train": {"acc": accuracy()}}
        metrics.update({split: {"acc": accuracy(), "class_acc": class_mean_accuracy(num_classes)}
                        for split in ("val", "test")})
        super().__init__(canonicalizer, predictor, optimizer, scheduler, metrics=metrics)
        # in [0, 1): ε = 1 makes the target uniform (nothing left to learn); outside [0, 1] it is no distribution
        self.label_smoothing = check_fraction("model.label_smoothing", label_smoothing)
        self.feature_transform_weight = float(feature_transform_weight)
        self.feature_transform_norm = check_choice("model.feature_transform_norm", feature_transform_norm,
                                                   FEATURE_TRANSFORM_NORMS)

    def loss(self, output: torch.Tensor, target: torch.Tensor, split: str) -> torch.Tensor:
        return smoothed_loss(self, output, target, split)
