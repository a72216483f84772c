"""Point-cloud classification (ModelNet40, paper §5.3, Table 4): label-smoothed cross-entropy, accuracy,
class-mean accuracy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from canonical_network.prediction.pointnet import FEATURE_TRANSFORM_REG_WEIGHT, feature_transform_regularizer
from canonical_network.tasks.base import CanonicalizedTask
from canonical_network.tasks.metrics import class_mean_accuracy


def check_label_smoothing(value: float) -> float:
    """``model.label_smoothing`` as a float in [0, 1), else ``ValueError`` naming the key.

    ε = 1 would make the target uniform (nothing left to learn), and ε outside [0, 1] is no distribution.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"model.label_smoothing must be a number in [0, 1); got {value!r}")
    return float(value)


def feature_transform_loss(predictor: nn.Module, weight: float) -> torch.Tensor | None:
    """``weight · ‖I − A Aᵀ‖²`` for the feature T-Net matrix ``A`` of the predictor's last forward, or
    ``None``.

    Only PointNet exposes ``last_feature_transform``; other predictors (and PointNet without its feature
    T-Net) get no regulariser. Read after the forward of the same batch.
    """
    transform = getattr(predictor, "last_feature_transform", None)
    if transform is None or weight == 0.0:
        return None
    return weight * feature_transform_regularizer(transform)


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
    ) -> None:
        super().__init__(canonicalizer, predictor, optimizer, scheduler)
        self.label_smoothing = check_label_smoothing(label_smoothing)
        self.feature_transform_weight = float(feature_transform_weight)
        metrics = {f"{split}_acc": MulticlassAccuracy(num_classes=num_classes, average="micro")
                   for split in ("train", "val", "test")}
        metrics.update({f"{split}_class_acc": class_mean_accuracy(num_classes) for split in ("val", "test")})
        self.metrics = nn.ModuleDict(metrics)

    def _step(self, batch, split: str) -> torch.Tensor:
        points, labels = batch
        logits = self(points)
        smoothing = self.label_smoothing if split == "train" else 0.0
        loss = F.cross_entropy(logits, labels, label_smoothing=smoothing)
        if split == "train":
            regulariser = feature_transform_loss(self.network.predictor, self.feature_transform_weight)
            if regulariser is not None:
                loss = loss + regulariser
        batch_size = len(points)
        self.log(f"{split}/loss", loss, on_step=split == "train", on_epoch=True, prog_bar=split != "test",
                 batch_size=batch_size)
        accuracy = self.metrics[f"{split}_acc"]
        accuracy(logits, labels)
        self.log(f"{split}/acc", accuracy, on_step=False, on_epoch=True, prog_bar=split == "val")
        if split != "train":
            class_accuracy = self.metrics[f"{split}_class_acc"]
            class_accuracy(logits, labels)
            self.log(f"{split}/class_acc", class_accuracy, on_step=False, on_epoch=True)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")
