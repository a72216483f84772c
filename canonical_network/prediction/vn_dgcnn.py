"""VN-DGCNN (Deng et al. 2021, "Vector Neurons"): the rotation-invariant DGCNN baseline of §5.3.

The architecture follows Deng et al.'s ``vn_dgcnn_cls`` / ``vn_dgcnn_partseg``: DGCNN with every scalar
channel replaced by a Vector Neuron channel and widths divided by 3 (64 → 21, 128 → 42, 256 → 85,
1024 → 341):

* VN EdgeConv: kNN in the current VN feature space (distances over all ``3C`` coordinates, which rotations
  preserve), edge features ``[x_j − x_i, x_i]``, VN layers (linear → VN batch norm → VN leaky ReLU 0.2),
  pooled over the neighbours (mean, the reference's default, or VN max);
* classification (k = 20): VN EdgeConv 21, 21, 42, 85 → concat (169) → 341 (shared non-linearity
  direction) → concatenated with its mean over the cloud (682) → the invariant layer
  (:class:`VNInvariant`, two hidden VN layers) → 2,046 invariant numbers per point → max and mean over
  points → DGCNN's classification head (512 → 256 → classes);
* segmentation (k = 40): VN EdgeConv (21, 21), (21, 21), 21 → concat (63) → 341 → the same invariant
  layer; the per-point skip features are made invariant in the invariant layer's frame (189), the global
  max-pooled feature (2,046) and the category (64) are broadcast to every point → DGCNN's segmentation
  head (2,299 → 256 → 256 → 128 → parts).

Invariance: no cross products, so the VN part is O(3)-equivariant and logits and per-point part logits are
**O(3)-invariant** (so SO(3)-invariant) by construction, up to float32 rounding and ties in the kNN
graphs. Invariant to permutations of the points (per-point outputs equivariant).
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.nn.knn import gather_neighbours, knn
from canonical_network.nn.vector_neurons import VNLinearLeakyReLU, channel_mix, vn_in_frame
from canonical_network.prediction.dgcnn import (
    EDGE_CONV_BLOCKS,
    DGCNNClassificationHead,
    DGCNNSegmentationHead,
)
from canonical_network.prediction.pointnet import PointCloudPredictor, category_one_hot, check_points
from canonical_network.prediction.vn_pointnet import POOLINGS, std_feature, vn_channels, vn_pool, with_mean
from canonical_network.utils.checks import check_choice, check_fraction, check_int, check_positive

#: neighbours per head (Deng et al.'s training scripts: 20 and 40)


def edge_linear(x: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``channel_mix(graph_feature(x, idx=idx), weight)`` without the ``(B, 2C, 3, P, k)`` edge features.

    With ``weight = [W_d, W_c]`` (differences, centres) the map of the edge ``[x_j − x_i, x_i]`` is
    ``W_d x_j + (W_c − W_d) x_i``: two channel mixes over the points, a gather and a sum. ``x`` ``(B, C, 3, P)``,
    ``idx`` ``(B, P, k)``, ``weight`` ``(C_out, 2C)`` → ``(B, C_out, 3, P, k)``; the same values up to rounding
    (``tests/test_pointcloud_models.py``)."""
    c = x.shape[1]
    w_diff, w_centre = weight[:, :c], weight[:, c:]
    neighbour = channel_mix(x, w_diff)  # (B, C_out, 3, P)
    centre = channel_mix(x, w_centre - w_diff)
    return gather_neighbours(neighbour, idx) + centre.unsqueeze(-1)


class VNEdgeConv(nn.Module):
    """``(B, C, 3, P)`` → ``(B, widths[-1], 3, P)``: kNN in VN feature space, edge features
    ``[x_j − x_i, x_i]`` ``(B, 2C, 3, P, k)``, VN layers, pooling over the neighbours. O(3)-equivariant.

    The first layer's two linear maps (features and non-linearity directions) are applied to the points
    before the gather (:func:`edge_linear`), so the edge features themselves are never built."""

    def __init__(
        self,
        in_channels: int,
        widths: tuple[int, ...],
        k: int,
        pooling: str = "mean",
        negative_slope: float = 0.2,
    ) -> None:
        super().__init__()
        self.k = k
        self.out_channels = widths[-1]
        layers, c_in = [], 2 * in_channels
        for c_out in widths:
            layers.append(VNLinearLeakyReLU(c_in, c_out, negative_slope=negative_slope))
            c_in = c_out
        self.edge_mlp = nn.Sequential(*layers)
        self.pool = vn_pool(pooling, c_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = knn(x, self.k)
        first = self.edge_mlp[0]
        h = first.activate(edge_linear(x, idx, first.linear.weight), edge_linear(x, idx, first.direction.weight))
        for layer in self.edge_mlp[1:]:
            h = layer(h)
        return self.pool(h)




class VNDGCNN(PointCloudPredictor):
    """VN-DGCNN classifier or part segmenter, O(3)-invariant by construction.

    Args:
        head: "classification" (ModelNet40) or "segmentation" (ShapeNet-part).
        num_classes: classification logits (ModelNet40: 40).
        num_parts: segmentation logits per point (ShapeNet-part: 50).
        num_categories: object categories, one-hot into the segmentation head (ShapeNet-part: 16).
        k: neighbours of every VN EdgeConv; ``None``: 20 (classification) or 40 (segmentation).
        emb_dims: scalar-equivalent width of the global VN layer (VN channels: ``emb_dims // 3``; 1024).
        width: multiplies every other layer width, heads included (1.0: the reference; smaller for tests).
        dropout: of the heads (0.5).
        pooling: over the neighbours: "mean" (the reference's default) or VN "max".
        negative_slope: of the VN leaky ReLUs and the heads' leaky ReLUs (0.2).

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
        emb_dims: int = 1024,
        width: float = 1.0,
        dropout: float = 0.5,
        pooling: str = "mean",
        negative_slope: float = 0.2,
    ) -> None:
        super().__init__(head, num_classes, num_parts, num_categories)
        self.k = self.neighbours(k)
        emb_channels = check_int("prediction.emb_dims", emb_dims, low=3) // 3
        width = check_positive("prediction.width", width)
        dropout = check_fraction("prediction.dropout", dropout)
        self.pooling = check_choice("prediction.pooling", pooling, POOLINGS)
        slope = check_fraction("prediction.negative_slope", negative_slope)

        blocks, c_in = [], 1  # the input cloud is one VN channel
        # Same block layout as DGCNN, the widths read as scalar-equivalent VN widths.
        for widths in EDGE_CONV_BLOCKS[self.head_type]:
            widths = tuple(vn_channels(c, width) for c in widths)
            blocks.append(VNEdgeConv(c_in, widths, self.k, self.pooling, slope))
            c_in = widths[-1]
        self.blocks = nn.ModuleList(blocks)
        concat = sum(block.out_channels for block in self.blocks)
        # one shared non-linearity direction for the wide global layer, as in the reference
        self.embed = VNLinearLeakyReLU(concat, emb_channels, negative_slope=slope, share_nonlinearity=True)
        self.invariant = std_feature(2 * emb_channels, slope)
        invariant_features = 3 * 2 * emb_channels
        if self.head_type == "classification":
            self.head: nn.Module = DGCNNClassificationHead(
                2 * invariant_features, self.num_classes, width, dropout, slope
            )
        else:
            self.head = DGCNNSegmentationHead(
                invariant_features, 3 * concat, self.num_categories, self.num_parts, width, dropout, slope
            )

    def forward(self, points: torch.Tensor, category: torch.Tensor | None = None) -> torch.Tensor:
        check_points(points)
        batch, num_points = points.shape[:2]
        x = points.transpose(1, 2).unsqueeze(1)  # (B, 1, 3, P)
        features = []
        for block in self.blocks:
            x = block(x)
            features.append(x)
        point_features = torch.cat(features, dim=1)  # (B, 169 | 63, 3, P)
        invariant, frame = self.invariant(with_mean(self.embed(point_features)))
        invariant = invariant.reshape(batch, -1, num_points)  # (B, 6E, P)
        if self.head_type == "classification":
            return self.head(torch.cat([invariant.amax(dim=-1), invariant.mean(dim=-1)], dim=1))
        skip = vn_in_frame(point_features, frame).reshape(batch, -1, num_points)
        one_hot = category_one_hot(category, self.num_categories, batch).to(invariant.dtype)
        return self.head(invariant.amax(dim=-1), one_hot, skip)


__all__ = ["VNDGCNN", "VNEdgeConv", "edge_linear"]
