"""VN-PointNet (Deng et al. 2021, "Vector Neurons"): the SO(3)-invariant PointNet baseline of §5.3.

The architecture follows Deng et al.'s ``vn_pointnet_cls`` / ``vn_pointnet_partseg``. Every scalar
channel of PointNet becomes a Vector Neuron channel (a 3-D vector) and widths are divided by 3 so that
the number of floats per point stays about the same (64 → 21, 128 → 42, 1024 → 341, …):

* the first layer sees the ``k`` nearest neighbours of each point: edge features ``[x_j − x_i, x_i,
  x_j × x_i]`` (3 VN channels), a VN layer to 21 channels, pooled over the neighbours (a single point
  carries a single direction, too little for a VN layer);
* classification: VN layers 21 → (VN T-Net) → 42 → 341 (linear + VN batch norm), each point's features
  concatenated with their mean over the cloud (682), the invariant layer (:class:`VNInvariant`, two hidden
  VN layers) → 2,046 rotation-invariant numbers per point → max over points → PointNet's classification
  head (512 → 256 → classes);
* segmentation: VN layers 21 → 42 → 42 → (VN T-Net) → 170 → 682, the same invariant layer, the global
  max-pooled feature and the category one-hot broadcast to every point together with the per-point skip
  features, made invariant in the frame of the invariant layer (9,025 channels) → PointNet's
  segmentation head (256 → 256 → 128 → parts).

The VN T-Net predicts VN channels that are *concatenated* with the features (a learned matrix acting on
the features would break equivariance). Non-linearities are VN-ReLU (negative slope 0), as in the reference.

Invariance: the VN part is SO(3)-equivariant (the cross product is a pseudo-vector, so not O(3)), the
invariant layer turns it into SO(3)-invariant numbers, and everything after is an ordinary network on
invariants: logits and per-point part logits are **SO(3)-invariant** by construction, in training and eval
mode alike (up to float32 rounding and ties in the kNN graph). Invariant to permutations of the points
(per-point outputs equivariant).
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.nn.knn import graph_feature
from canonical_network.nn.vector_neurons import (
    VNBatchNorm,
    VNInvariant,
    VNLinear,
    VNLinearLeakyReLU,
    VNMaxPool,
    VNMeanPool,
    vn_in_frame,
)
from canonical_network.prediction.pointnet import (
    PointCloudPredictor,
    PointNetClassificationHead,
    PointNetSegmentationHead,
    category_one_hot,
    check_points,
    scaled,
)
from canonical_network.utils.checks import check_choice, check_fraction, check_int, check_positive

POOLINGS = ("mean", "max")
#: scalar-equivalent width of the global feature per head (VN channels: a third)
_EMB_DIMS = {"classification": 1024, "segmentation": 2048}


def vn_channels(channels: int, width: float) -> int:
    """VN channels standing in for ``channels`` scalar ones: a third (Deng et al.), times ``width``."""
    return max(1, scaled(channels, width) // 3)


def vn_pool(pooling: str, channels: int) -> nn.Module:
    """Pool the last dimension of ``(B, C, 3, *S, M)``: plain mean or VN max (a learned direction)."""
    return VNMaxPool(channels) if pooling == "max" else VNMeanPool(-1)


def with_mean(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, 3, P)`` → ``(B, 2C, 3, P)``: each point's features and their mean over the cloud, so that the
    invariant layer's frame of each point depends on the whole shape."""
    return torch.cat([x, x.mean(dim=-1, keepdim=True).expand_as(x)], dim=1)


def std_feature(channels: int, negative_slope: float) -> VNInvariant:
    """Deng et al.'s invariant layer ("VN std feature"): two hidden VN layers with batch norm, 3 vectors."""
    return VNInvariant(channels, negative_slope=negative_slope, hidden_layers=2, batch_norm=True)


class VNTNet(nn.Module):
    """The VN counterpart of PointNet's feature T-Net: ``(B, C, 3, P)`` → ``(B, C, 3)`` equivariant vectors.

    VN layers 64 → 128 → 1024 (scalar-equivalent widths), pooled over points, then 512 → 256 → ``C``
    (the last one linear). SO(3)- (indeed O(3)-) equivariant, invariant to permutations of the points.
    """

    def __init__(self, channels: int, width: float = 1.0, pooling: str = "mean", negative_slope: float = 0.0):
        super().__init__()
        c1, c2, c3, f1, f2 = (vn_channels(c, width) for c in (64, 128, 1024, 512, 256))

        def block(c_in: int, c_out: int) -> VNLinearLeakyReLU:
            return VNLinearLeakyReLU(c_in, c_out, negative_slope=negative_slope)

        self.point_mlp = nn.Sequential(block(channels, c1), block(c1, c2), block(c2, c3))
        self.pool = vn_pool(pooling, c3)
        self.global_mlp = nn.Sequential(block(c3, f1), block(f1, f2), VNLinear(f2, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.global_mlp(self.pool(self.point_mlp(x)))


class VNPointNet(PointCloudPredictor):
    """VN-PointNet classifier or part segmenter, SO(3)-invariant by construction.

    Args:
        head: "classification" (ModelNet40) or "segmentation" (ShapeNet-part).
        num_classes: classification logits (ModelNet40: 40).
        num_parts: segmentation logits per point (ShapeNet-part: 50).
        num_categories: object categories, one-hot into the segmentation head (ShapeNet-part: 16).
        k: neighbours of the first (edge) layer; ``None``: 20 (classification) or 40 (segmentation).
        emb_dims: scalar-equivalent width of the last VN layer (VN channels: ``emb_dims // 3``); ``None``:
            1024 (classification) or 2048 (segmentation), times ``width``.
        width: multiplies every other layer width, heads included (1.0: the reference; smaller for tests).
        dropout: of the classification head (0.4).
        pooling: over neighbours and in the VN T-Net: "mean" (the reference's default) or VN "max".
        feature_transform: the VN T-Net.

    Forward: ``forward(points (B, P, 3)) -> logits (B, num_classes)``; ``forward(points (B, P, 3),
    category (B,) int64) -> part logits (B, P, num_parts)``.
    """

    def __init__(
        self,
        head: str = "classification",
        num_classes: int = 40,
        num_parts: int = 50,
        num_categories: int = 16,
        k: int | None = None,
        emb_dims: int | None = None,
        width: float = 1.0,
        dropout: float = 0.4,
        pooling: str = "mean",
        feature_transform: bool = True,
    ) -> None:
        super().__init__(head, num_classes, num_parts, num_categories)
        self.k = self.neighbours(k)
        width = check_positive("prediction.width", width)
        dropout = check_fraction("prediction.dropout", dropout)
        self.pooling = check_choice("prediction.pooling", pooling, POOLINGS)
        if emb_dims is None:
            emb_dims = scaled(_EMB_DIMS[self.head_type], width)
        emb_channels = check_int("prediction.emb_dims", emb_dims, low=3) // 3
        slope = 0.0  # VN-ReLU throughout, as in the reference

        def block(c_in: int, c_out: int) -> VNLinearLeakyReLU:
            return VNLinearLeakyReLU(c_in, c_out, negative_slope=slope)

        c64, c128, c512 = (vn_channels(c, width) for c in (64, 128, 512))
        self.edge_layer = block(3, c64)  # [x_j − x_i, x_i, x_j × x_i]
        self.edge_pool = vn_pool(self.pooling, c64)
        if self.head_type == "classification":
            hidden = (c64, c128)  # the T-Net acts after the first
        else:
            hidden = (c64, c128, c128, c512)  # the T-Net acts after the third
        transform_after = 1 if self.head_type == "classification" else 3
        layers, c_in = [], c64
        for i, c_out in enumerate(hidden, start=1):
            layers.append(block(c_in, c_out))
            c_in = c_out
            if i == transform_after and feature_transform:
                c_in = 2 * c_out  # features and the T-Net's vectors side by side
        self.layers = nn.ModuleList(layers)
        self.transform_after = transform_after
        self.tnet = (
            VNTNet(hidden[transform_after - 1], width, self.pooling, slope) if feature_transform else None
        )
        # last layer: linear + VN batch norm, no non-linearity (as PointNet's last layer has no ReLU)
        self.embed = nn.Sequential(VNLinear(c_in, emb_channels), VNBatchNorm(emb_channels))
        self.invariant = std_feature(2 * emb_channels, slope)
        invariant_features = 3 * 2 * emb_channels
        if self.head_type == "classification":
            self.head: nn.Module = PointNetClassificationHead(
                invariant_features, self.num_classes, width, dropout
            )
        else:
            skip_features = 3 * sum(hidden)
            self.head = PointNetSegmentationHead(
                invariant_features,
                skip_features + invariant_features,
                self.num_categories,
                self.num_parts,
                width,
            )

    def forward(self, points: torch.Tensor, category: torch.Tensor | None = None) -> torch.Tensor:
        check_points(points)
        batch, num_points = points.shape[:2]
        x = points.transpose(1, 2).unsqueeze(1)  # (B, 1, 3, P): one VN channel
        edges = graph_feature(x, self.k, cross=True)  # (B, 3, 3, P, k)
        x = self.edge_pool(self.edge_layer(edges))  # (B, 21, 3, P)
        skips = []
        for i, layer in enumerate(self.layers, start=1):
            x = layer(x)
            skips.append(x)
            if i == self.transform_after and self.tnet is not None:
                x = torch.cat([x, self.tnet(x).unsqueeze(-1).expand_as(x)], dim=1)
        x = self.embed(x)  # (B, E, 3, P)
        invariant, frame = self.invariant(with_mean(x))  # (B, 2E, 3, P), (B, 3, 3, P)
        invariant = invariant.reshape(batch, -1, num_points)  # (B, 6E, P)
        global_feature = invariant.amax(dim=-1)
        if self.head_type == "classification":
            return self.head(global_feature)
        skip = vn_in_frame(torch.cat(skips, dim=1), frame).reshape(batch, -1, num_points)
        one_hot = category_one_hot(category, self.num_categories, batch).to(global_feature.dtype)
        return self.head(global_feature, one_hot, torch.cat([skip, invariant], dim=1))


__all__ = [
    "POOLINGS",
    "VNPointNet",
    "VNTNet",
    "std_feature",
    "vn_channels",
    "vn_pool",
    "with_mean",
]
