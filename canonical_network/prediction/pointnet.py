"""PointNet (Qi et al. 2017) for ModelNet40 classification and ShapeNet part segmentation (paper §5.3).

The prediction network ``f`` of the "PointNet" and "CN(·)-PointNet" rows. The architecture follows the
PyTorch PointNet that Deng et al. (2021) and the paper's authors trained (``pointnet_cls`` /
``pointnet_partseg``); widths are those of the original paper:

* classification — input T-Net (3×3) → shared MLP 64 → feature T-Net (64×64) → 128 → 1024 (batch norm,
  no ReLU) → max over points → 512 → 256 (dropout 0.4) → classes;
* segmentation — input T-Net → 64 → 128 → 128 → feature T-Net (128×128) → 512 → 2048 (batch norm, no
  ReLU) → max; every point then sees ``[global 2048, one-hot category 16, its 64, 128, 128, 512 and 2048
  features]`` (4,944 channels) → 256 → 256 → 128 → parts.

One class, :class:`PointNet`, builds either network (``head=``): both share the encoder
(:class:`PointNetEncoder`, whose layer widths differ between the two) and return **logits**; losses
(cross entropy, the feature-transform regulariser scaled by :data:`FEATURE_TRANSFORM_REG_WEIGHT`) belong to
the task. The classification and segmentation heads are reused by the VN-PointNet baseline.

Not rotation invariant: the T-Nets only *learn* to align (and are free to be any matrix), which is why
the paper wraps PointNet in a learned canonicalizer. Invariant to permutations of the points (max pooling),
per-point outputs permutation-equivariant.
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.utils.checks import check_choice, check_fraction, check_int, check_positive

HEADS = ("classification", "segmentation")
#: kNN size of the edge convolutions per head (Wang et al. 2019; Deng et al. 2021 use 40 for part segmentation)
DEFAULT_K = {"classification": 20, "segmentation": 40}

#: Weight of :func:`feature_transform_regularizer` in the training loss (PointNet, Qi et al. 2017 §4.2
#: and their code: 0.001).
FEATURE_TRANSFORM_REG_WEIGHT = 1e-3


# ---------------------------------------------------------------------------------------------------------
# helpers shared by the four point-cloud backbones
# ---------------------------------------------------------------------------------------------------------
class PointCloudPredictor(nn.Module):
    """What the four point-cloud backbones share: the head they end in and the sizes the data config
    publishes, checked once with their full config keys.

    Args:
        head: "classification" (``forward(points) -> logits (B, num_classes)``) or "segmentation"
            (``forward(points, category) -> part logits (B, P, num_parts)``).
        num_classes, num_parts, num_categories: from ``data_info`` (ModelNet40: 40; ShapeNet-part: 50, 16).
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("PointCloudClassificationTask", "PartSegmentationTask")

    def __init__(self, head: str, num_classes: int, num_parts: int, num_categories: int) -> None:
        super().__init__()
        self.head_type = check_choice("prediction.head", head, HEADS)
        self.num_classes = check_int("prediction.num_classes", num_classes, low=2)
        self.num_parts = check_int("prediction.num_parts", num_parts, low=2)
        self.num_categories = check_int("prediction.num_categories", num_categories, low=1)

    def neighbours(self, k: int | None) -> int:
        """``prediction.k``, or the head's default (:data:`DEFAULT_K`) for ``None``."""
        return check_int("prediction.k", DEFAULT_K[self.head_type] if k is None else k, low=1)


def scaled(channels: int, width: float) -> int:
    """A reference layer width times ``width``, at least 1."""
    return max(1, round(channels * width))


def check_points(points: torch.Tensor) -> None:
    if points.dim() != 3 or points.shape[-1] != 3:
        raise ValueError(f"points must have shape (B, P, 3), got {tuple(points.shape)}")


def category_one_hot(category: torch.Tensor | None, num_categories: int, batch: int) -> torch.Tensor:
    """``(B,)`` int64 object categories → ``(B, num_categories)`` float one-hot (ShapeNet-part: 16)."""
    if category is None:
        raise ValueError("segmentation needs the object category: forward(points, category)")
    if category.shape != (batch,):
        raise ValueError(f"category must have shape ({batch},), got {tuple(category.shape)}")
    return nn.functional.one_hot(category.long(), num_categories).float()


#: The forms of :func:`feature_transform_regularizer`'s norm: the paper's squared Frobenius norm, or the plain
#: Frobenius norm of the PyTorch PointNet code the paper's authors trained with (SGD at lr 0.1).
FEATURE_TRANSFORM_NORMS = ("squared", "frobenius")


def feature_transform_regularizer(transform: torch.Tensor, norm: str = "squared") -> torch.Tensor:
    """PointNet's orthogonality loss ``‖I − A Aᵀ‖²_F`` (``norm="squared"``, PointNet §4.2) or ``‖I − A Aᵀ‖_F``
    (``norm="frobenius"``), averaged over the batch.

    ``transform`` ``A`` ``(B, d, d)`` → scalar. It keeps the feature T-Net close to an orthogonal map, which
    loses no information (PointNet §4.2). Zero exactly for orthogonal ``A``. Add it to the loss with weight
    :data:`FEATURE_TRANSFORM_REG_WEIGHT`. The squared norm is the paper's and the default; it grows as
    ``‖A‖⁴`` and its gradient as ``‖A‖³``, so with the DGCNN recipe the canonicalization paper trains with
    (SGD, lr 0.1, momentum 0.9) one large step can feed on itself: CN(NL)-PointNet seed 0 under z/SO(3)
    diverged within 10 steps on one CPU and not on another (``docs/pointclouds.md``). The PyTorch code the
    baselines come from takes the unsquared norm (gradient bounded by ``‖A‖``), which trains stably there.
    (One widely copied version, the authors' among them, multiplies ``A (Aᵀ − I)``, which is also zero for
    any projection ``A = A Aᵀ``: not offered.)
    """
    if transform.dim() != 3 or transform.shape[1] != transform.shape[2]:
        raise ValueError(f"transform must have shape (B, d, d), got {tuple(transform.shape)}")
    check_choice("model.feature_transform_norm", norm, FEATURE_TRANSFORM_NORMS)
    eye = torch.eye(transform.shape[1], dtype=transform.dtype, device=transform.device)
    residual = eye - transform @ transform.transpose(1, 2)
    if norm == "squared":
        return residual.square().sum(dim=(1, 2)).mean()
    return torch.linalg.matrix_norm(residual).mean()  # its gradient is 0, not NaN, at an orthogonal A


def _point_layer(c_in: int, c_out: int, relu: bool = True) -> nn.Sequential:
    """A shared per-point linear map on ``(B, C_in, P)`` → ``(B, C_out, P)``, batch norm, (ReLU)."""
    layers: list[nn.Module] = [nn.Conv1d(c_in, c_out, 1), nn.BatchNorm1d(c_out)]
    if relu:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


# ---------------------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------------------
class TNet(nn.Module):
    """PointNet's alignment network: a ``(d, d)`` matrix per cloud from per-point features ``(B, d, P)``.

    Shared MLP 64 → 128 → 1024, max over points, MLP 512 → 256 → ``d²``, plus the identity. The last layer
    starts at zero, as in Qi et al.'s original code and in DGCNN's transform network, so a fresh T-Net is
    exactly the identity and training starts from plain PointNet (the PyTorch port that Deng et al. used
    keeps PyTorch's default initialisation there, which starts from a random matrix near the identity).
    Not equivariant to anything but permutations of the points.
    """

    def __init__(self, dim: int, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, c3, f1, f2 = (scaled(c, width) for c in (64, 128, 1024, 512, 256))
        self.dim = dim
        self.point_mlp = nn.Sequential(_point_layer(dim, c1), _point_layer(c1, c2), _point_layer(c2, c3))
        self.global_mlp = nn.Sequential(
            nn.Linear(c3, f1), nn.BatchNorm1d(f1), nn.ReLU(), nn.Linear(f1, f2), nn.BatchNorm1d(f2), nn.ReLU()
        )
        self.to_matrix = nn.Linear(f2, dim * dim)
        nn.init.zeros_(self.to_matrix.weight)
        nn.init.zeros_(self.to_matrix.bias)
        self.register_buffer("identity", torch.eye(dim).flatten(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.point_mlp(x).amax(dim=-1)  # (B, 1024)
        matrix = self.to_matrix(self.global_mlp(pooled)) + self.identity
        return matrix.view(-1, self.dim, self.dim)


class PointNetEncoder(nn.Module):
    """Shared per-point MLP with optional input and feature T-Nets, then max pooling.

    ``(B, P, 3)`` → ``(global (B, widths[-1]), per-layer features [(B, w, P) for w in widths])``. The
    feature T-Net acts after layer ``feature_transform_after`` (1-based); the per-layer features are those
    *before* that transform (as in the reference segmentation network). The last layer has batch norm but
    no ReLU (the max pool follows).

    Attributes set by every forward: ``last_input_transform`` ``(B, 3, 3)`` and
    ``last_feature_transform`` ``(B, d, d)`` (``None`` when disabled).
    """

    def __init__(
        self,
        widths: tuple[int, ...],
        feature_transform_after: int,
        input_transform: bool = True,
        feature_transform: bool = True,
        width: float = 1.0,
    ) -> None:
        super().__init__()
        self.input_tnet = TNet(3, width) if input_transform else None
        self.feature_transform_after = feature_transform_after
        self.feature_tnet = TNet(widths[feature_transform_after - 1], width) if feature_transform else None
        layers, c_in = [], 3
        for i, c_out in enumerate(widths):
            layers.append(_point_layer(c_in, c_out, relu=i < len(widths) - 1))
            c_in = c_out
        self.layers = nn.ModuleList(layers)
        self.last_input_transform: torch.Tensor | None = None
        self.last_feature_transform: torch.Tensor | None = None

    def forward(self, points: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        check_points(points)
        self.last_input_transform = self.last_feature_transform = None
        x = points
        if self.input_tnet is not None:
            self.last_input_transform = self.input_tnet(points.transpose(1, 2))
            x = torch.bmm(points, self.last_input_transform)  # row vectors times the learned matrix
        x = x.transpose(1, 2)  # (B, 3, P): channels first, as Conv1d wants
        features = []
        for i, layer in enumerate(self.layers, start=1):
            x = layer(x)
            features.append(x)
            if i == self.feature_transform_after and self.feature_tnet is not None:
                self.last_feature_transform = self.feature_tnet(x)
                # (xᵀ A)ᵀ = Aᵀ x: the same right-multiplication of per-point row vectors as for the input
                x = torch.bmm(self.last_feature_transform.transpose(1, 2), x)
        return x.amax(dim=-1), features


class PointNetClassificationHead(nn.Module):
    """``(B, F)`` global feature → ``(B, num_classes)`` logits: 512 → 256 (dropout) → classes, batch norm
    and ReLU in between (the reference applies dropout to the 256 features before their batch norm)."""

    def __init__(self, in_features: int, num_classes: int, width: float = 1.0, dropout: float = 0.4) -> None:
        super().__init__()
        f1, f2 = scaled(512, width), scaled(256, width)
        self.net = nn.Sequential(
            nn.Linear(in_features, f1),
            nn.BatchNorm1d(f1),
            nn.ReLU(),
            nn.Linear(f1, f2),
            nn.Dropout(dropout),
            nn.BatchNorm1d(f2),
            nn.ReLU(),
            nn.Linear(f2, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class PointNetSegmentationHead(nn.Module):
    """Per-point part logits from ``[global feature, one-hot category]`` broadcast to every point and
    concatenated with per-point features: shared MLP 256 → 256 → 128 → parts.

    ``forward(global (B, G), one_hot (B, K), point_features (B, F, P))`` → ``(B, P, num_parts)``.
    """

    def __init__(
        self,
        global_features: int,
        point_features: int,
        num_categories: int,
        num_parts: int,
        width: float = 1.0,
    ) -> None:
        super().__init__()
        c1, c2, c3 = scaled(256, width), scaled(256, width), scaled(128, width)
        self.in_channels = global_features + num_categories + point_features
        self.net = nn.Sequential(
            _point_layer(self.in_channels, c1),
            _point_layer(c1, c2),
            _point_layer(c2, c3),
            nn.Conv1d(c3, num_parts, 1),
        )

    def forward(self, global_feature: torch.Tensor, one_hot: torch.Tensor, point_features: torch.Tensor):
        shape_code = torch.cat([global_feature, one_hot], dim=1)  # (B, G + K)
        shape_code = shape_code.unsqueeze(-1).expand(-1, -1, point_features.shape[-1])
        return self.net(torch.cat([shape_code, point_features], dim=1)).transpose(1, 2)


# ---------------------------------------------------------------------------------------------------------
# the network
# ---------------------------------------------------------------------------------------------------------
#: per-point widths and the layer after which the feature T-Net acts, per head (see the module docstring)
_ENCODER = {"classification": ((64, 128), 1), "segmentation": ((64, 128, 128, 512), 3)}
_EMB_DIMS = {"classification": 1024, "segmentation": 2048}


class PointNet(PointCloudPredictor):
    """PointNet classifier or part segmenter.

    Args:
        head: "classification" (ModelNet40) or "segmentation" (ShapeNet-part).
        num_classes: classification logits (ModelNet40: 40).
        num_parts: segmentation logits per point (ShapeNet-part: 50 parts over all categories).
        num_categories: object categories given to the segmentation head as a one-hot (ShapeNet-part: 16).
        input_transform: the 3×3 input T-Net.
        feature_transform: the feature T-Net (64×64 for classification, 128×128 for segmentation); its
            matrix of the last forward is :attr:`last_feature_transform`, for
            :func:`feature_transform_regularizer`.
        emb_dims: width of the global (max-pooled) feature; ``None``: 1024 (classification) or 2048
            (segmentation), times ``width``.
        width: multiplies every other layer width, T-Nets and heads included (1.0: the reference network;
            smaller for tests).
        dropout: before the classifier's last hidden layer (0.4); the segmentation head has none.

    Forward: ``forward(points (B, P, 3)) -> logits (B, num_classes)``; ``forward(points (B, P, 3),
    category (B,) int64) -> part logits (B, P, num_parts)``.
    """

    def __init__(
        self,
        head: str = "classification",
        num_classes: int = 40,
        num_parts: int = 50,
        num_categories: int = 16,
        input_transform: bool = True,
        feature_transform: bool = True,
        emb_dims: int | None = None,
        width: float = 1.0,
        dropout: float = 0.4,
    ) -> None:
        super().__init__(head, num_classes, num_parts, num_categories)
        width = check_positive("prediction.width", width)
        dropout = check_fraction("prediction.dropout", dropout)
        if emb_dims is None:
            emb_dims = scaled(_EMB_DIMS[self.head_type], width)
        emb_dims = check_int("prediction.emb_dims", emb_dims, low=1)
        hidden, transform_after = _ENCODER[self.head_type]
        widths = (*(scaled(c, width) for c in hidden), emb_dims)
        self.encoder = PointNetEncoder(
            widths, transform_after, bool(input_transform), bool(feature_transform), width
        )
        if self.head_type == "classification":
            self.head: nn.Module = PointNetClassificationHead(emb_dims, self.num_classes, width, dropout)
        else:
            self.head = PointNetSegmentationHead(
                emb_dims, sum(widths), self.num_categories, self.num_parts, width
            )

    @property
    def last_feature_transform(self) -> torch.Tensor | None:
        """The feature T-Net's matrix ``(B, d, d)`` of the last forward (``None`` when disabled)."""
        return self.encoder.last_feature_transform

    @property
    def last_input_transform(self) -> torch.Tensor | None:
        """The input T-Net's matrix ``(B, 3, 3)`` of the last forward (``None`` when disabled)."""
        return self.encoder.last_input_transform

    def forward(self, points: torch.Tensor, category: torch.Tensor | None = None) -> torch.Tensor:
        global_feature, features = self.encoder(points)
        if self.head_type == "classification":
            return self.head(global_feature)
        one_hot = category_one_hot(category, self.num_categories, points.shape[0]).to(global_feature.dtype)
        return self.head(global_feature, one_hot, torch.cat(features, dim=1))


__all__ = [
    "DEFAULT_K",
    "FEATURE_TRANSFORM_REG_WEIGHT",
    "HEADS",
    "PointCloudPredictor",
    "PointNet",
    "PointNetClassificationHead",
    "PointNetEncoder",
    "PointNetSegmentationHead",
    "TNet",
    "feature_transform_regularizer",
]
