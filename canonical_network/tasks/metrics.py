"""Point-cloud metrics (paper §5.3): ShapeNet-part mIoU and ModelNet40 class-mean accuracy.

Part segmentation (Table 5b) follows the convention of PointNet / DGCNN / Vector Neurons and the paper's
reference code:

1. The category of every shape is known, so its prediction is restricted to that category's parts: the
   argmax over the logits of those parts only.
2. For each part of the category, IoU = |pred ∩ gt| / |pred ∪ gt| over the shape's points; a part absent
   from both the prediction and the ground truth counts as IoU 1.
3. A shape's mIoU is the mean over its category's parts.
4. ``instance_miou`` is the mean over shapes; ``class_miou`` the mean over categories of the mean shape mIoU
   of each category (categories without shapes are left out).

Values are fractions in [0, 1]; the paper's tables show them ×100.

ModelNet40 (Table 4) reports overall accuracy (``test/acc``: torchmetrics ``MulticlassAccuracy`` with
``average="micro"``); :func:`class_mean_accuracy` gives the class-mean accuracy (``average="macro"``: the mean
over classes of per-class recall) that point-cloud papers often show beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy


def resolve_category_parts(category_parts: str | Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """The part ids of each category: a sequence as given, or a dataset name.

    Args:
        category_parts: ``"shapenet_part"``, ``"synthetic_shapes"``, or one sequence of global part ids per
            category (e.g. a data module's ``category_parts``).
    """
    if isinstance(category_parts, str):
        if category_parts == "shapenet_part":
            from canonical_network.data.shapenet import SHAPENET_CATEGORY_PARTS

            return SHAPENET_CATEGORY_PARTS
        if category_parts == "synthetic_shapes":
            from canonical_network.data.synthetic_shapes import SYNTHETIC_CATEGORY_PARTS

            return SYNTHETIC_CATEGORY_PARTS
        raise ValueError(
            f"category_parts must be 'shapenet_part', 'synthetic_shapes' or a list of part-id lists; "
            f"got {category_parts!r}"
        )
    parts = tuple(tuple(int(p) for p in group) for group in category_parts)
    if not parts or any(not group for group in parts):
        raise ValueError(
            f"category_parts needs at least one category, each with at least one part; got {parts}"
        )
    return parts


def category_part_mask(category_parts: Sequence[Sequence[int]], num_parts: int | None = None) -> torch.Tensor:
    """Boolean (num_categories, num_parts) mask: ``mask[c, p]`` iff part ``p`` belongs to category ``c``."""
    num_parts = num_parts or 1 + max(p for group in category_parts for p in group)
    mask = torch.zeros(len(category_parts), num_parts, dtype=torch.bool)
    for c, group in enumerate(category_parts):
        mask[c, list(group)] = True
    return mask


def restricted_argmax(logits: torch.Tensor, category: torch.Tensor, part_mask: torch.Tensor) -> torch.Tensor:
    """Predicted part per point among the parts of each shape's category.

    Args:
        logits: (B, P, num_parts) part scores (logits, log-probabilities: any monotone score).
        category: (B,) int64 category per shape.
        part_mask: (num_categories, num_parts) bool from :func:`category_part_mask`.

    Returns:
        (B, P) int64 global part ids, each a part of the shape's category.
    """
    allowed = part_mask[category].unsqueeze(1)  # (B, 1, num_parts)
    return logits.masked_fill(~allowed, float("-inf")).argmax(dim=-1)


def shape_miou(
    preds: torch.Tensor, target: torch.Tensor, category: torch.Tensor, part_mask: torch.Tensor
) -> torch.Tensor:
    """Per-shape mIoU over the category's parts, a part absent from prediction and target counting as 1.

    Args:
        preds: (B, P) int64 predicted global part ids.
        target: (B, P) int64 true global part ids.
        category: (B,) int64.
        part_mask: (num_categories, num_parts) bool.

    Returns:
        (B,) float64 mIoU per shape.
    """
    batch, num_parts = preds.shape[0], part_mask.shape[1]
    # Flattened (shape, part) cells counted with bincount: no (B, P, num_parts) one-hot tensors.
    offset = (torch.arange(batch, device=preds.device) * num_parts).unsqueeze(1)
    cells = batch * num_parts
    pred_count = torch.bincount((preds + offset).flatten(), minlength=cells)
    true_count = torch.bincount((target + offset).flatten(), minlength=cells)
    hit = preds == target
    intersection = torch.bincount((target + offset)[hit], minlength=cells)
    union = pred_count + true_count - intersection
    iou = torch.where(union > 0, intersection.double() / union.clamp_min(1).double(), 1.0)
    iou = iou.view(batch, num_parts)
    mask = part_mask[category]  # (B, num_parts)
    return (iou * mask).sum(dim=1) / mask.sum(dim=1)


class FigureDict(Metric):
    """A metric whose ``compute`` returns several named figures, ``{name: scalar tensor}``.

    Lightning's ``self.log`` takes one value per metric, so a task logs these itself at the epoch's end as
    ``{split}/{name}`` (:meth:`~canonical_network.tasks.base.CanonicalizedTask.log_figures`) and resets them.
    """

    #: the names ``compute`` returns (what a callback may monitor, ``CanonicalizedTask.monitorable_metrics``)
    names: tuple[str, ...] = ()

    def compute(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class PartSegmentationMIoU(FigureDict):
    """ShapeNet-part mIoU, accumulated over batches (and over processes under DDP).

    ``update(logits, target, category)`` with logits (B, P, num_parts), target (B, P) int64 global part ids,
    category (B,) int64. ``compute()`` returns ``{"instance_miou": (), "class_miou": ()}`` float tensors in
    [0, 1] (see the module docstring for the convention); a task logs them at the epoch's end as
    ``{split}/instance_miou`` and ``{split}/class_miou`` (a :class:`FigureDict`).

    Args:
        category_parts: part ids per category, or ``"shapenet_part"`` / ``"synthetic_shapes"``.
        num_parts: width of the logits (default: largest part id + 1, 50 for ShapeNet-part).
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False
    names = ("instance_miou", "class_miou")

    def __init__(
        self,
        category_parts: str | Sequence[Sequence[int]] = "shapenet_part",
        num_parts: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.category_parts = resolve_category_parts(category_parts)
        mask = category_part_mask(self.category_parts, num_parts)
        self.num_categories, self.num_parts = mask.shape
        self.register_buffer("part_mask", mask, persistent=False)
        # Sums per category: instance and class means both follow, and sums reduce across processes.
        self.add_state(
            "miou_sum", torch.zeros(self.num_categories, dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state(
            "shape_count", torch.zeros(self.num_categories, dtype=torch.long), dist_reduce_fx="sum"
        )

    def update(self, logits: torch.Tensor, target: torch.Tensor, category: torch.Tensor) -> None:
        if logits.dim() != 3 or logits.shape[-1] != self.num_parts or logits.shape[:2] != target.shape:
            raise ValueError(
                f"expected logits (B, P, {self.num_parts}) and target (B, P); got {tuple(logits.shape)} and "
                f"{tuple(target.shape)}"
            )
        if category.shape != target.shape[:1]:
            raise ValueError(f"expected category (B,) = ({target.shape[0]},); got {tuple(category.shape)}")
        mask = self.part_mask.to(logits.device)
        target, category = target.long(), category.long()
        if not mask[category.unsqueeze(1), target].all():
            raise ValueError("target holds part ids that do not belong to the shape's category")
        preds = restricted_argmax(logits, category, mask)
        ious = shape_miou(preds, target, category, mask)
        # One-hot sums rather than index_add_, which is nondeterministic on CUDA.
        one_hot = torch.nn.functional.one_hot(category, self.num_categories)  # (B, C)
        self.miou_sum += one_hot.to(self.miou_sum.dtype).T @ ious.to(self.miou_sum.dtype)
        self.shape_count += one_hot.sum(dim=0)

    def compute(self) -> dict[str, torch.Tensor]:
        seen = self.shape_count > 0
        per_category = self.miou_sum[seen] / self.shape_count[seen]
        total = self.shape_count.sum().clamp_min(1)
        return {
            "instance_miou": (self.miou_sum.sum() / total).float(),
            "class_miou": per_category.mean().float() if seen.any() else torch.zeros((), device=total.device),
        }

    def per_category(self) -> torch.Tensor:
        """(num_categories,) mean shape mIoU of each category (NaN where no shape was seen)."""
        return (self.miou_sum / self.shape_count).float()


class ErrorPercent(MulticlassAccuracy):
    """Classification error in % (100 · (1 − accuracy)), the paper's Rotated MNIST figure;
    ``update(logits (B, C), labels (B,))``, micro-averaged over samples by default."""

    higher_is_better = False

    def __init__(self, num_classes: int, **kwargs) -> None:
        kwargs.setdefault("average", "micro")
        super().__init__(num_classes=num_classes, **kwargs)

    def compute(self) -> torch.Tensor:
        return 100.0 * (1.0 - super().compute())


def class_mean_accuracy(num_classes: int = 40) -> MulticlassAccuracy:
    """Class-mean accuracy (mean over classes of the fraction of that class predicted right), ModelNet40's
    ``mAcc``; ``update(logits (B, num_classes), labels (B,))``."""
    return MulticlassAccuracy(num_classes=num_classes, average="macro")
