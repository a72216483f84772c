"""DGCNN (Wang et al. 2019, "Dynamic Graph CNN") for ModelNet40 classification and ShapeNet part
segmentation (paper §5.3): the prediction network ``f`` of the "DGCNN" and "CN(·)-DGCNN" rows.

The architecture follows the DGCNN that Deng et al. (2021) and the paper's authors trained
(``dgcnn_cls`` / ``dgcnn_partseg``, after Wang et al.'s code):

* EdgeConv: for every point ``i`` and each of its ``k`` nearest neighbours ``j`` *in the current feature
  space* (the graph is rebuilt at every layer, hence "dynamic"), the edge feature ``[x_j − x_i, x_i]``
  goes through 1×1 convolutions (no bias) → batch norm → leaky ReLU (0.2), then a max over the neighbours;
* classification (k = 20): EdgeConv 64, 64, 128, 256 → concat (512) → 1024 (``emb_dims``) → max and mean
  over points (2048) → 512 → 256 → classes, dropout 0.5 before the last two linear layers;
* segmentation (k = 40): a spatial transform (3×3, from edge features of the input) → EdgeConv (64, 64),
  (64, 64), 64 → concat (192) → 1024 → max; the one-hot category through a 64-unit layer; every point sees
  ``[global 1024, category 64, its 192 edge features]`` (1,280 channels) → 256 → 256 → 128 → parts,
  dropout 0.5 after the first two.

Neighbours include the point itself, as in the reference. Not rotation invariant. Invariant to
permutations of the points (per-point outputs permutation-equivariant), up to ties in the kNN graph.
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.nn.knn import gather_neighbours, knn
from canonical_network.prediction.pointnet import PointCloudPredictor, category_one_hot, check_points, scaled
from canonical_network.utils.checks import check_fraction, check_int, check_positive


def _edge_layer(c_in: int, c_out: int, negative_slope: float) -> nn.Sequential:
    """1×1 convolution on edges ``(B, C_in, P, k)`` → batch norm → leaky ReLU."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.LeakyReLU(negative_slope)
    )


def _point_layer(c_in: int, c_out: int, negative_slope: float) -> nn.Sequential:
    """Shared per-point map ``(B, C_in, P)`` → ``(B, C_out, P)``, no bias → batch norm → leaky ReLU."""
    return nn.Sequential(
        nn.Conv1d(c_in, c_out, 1, bias=False), nn.BatchNorm1d(c_out), nn.LeakyReLU(negative_slope)
    )


def edge_conv(x: torch.Tensor, idx: torch.Tensor, edge_mlp: nn.Sequential) -> torch.Tensor:
    """``edge_mlp`` on the edge features ``[x_j − x_i, x_i]`` of the graph ``idx``, then a max over each
    point's neighbours: ``(B, C, P)`` → ``(B, C_out, P)``, the same function as
    ``edge_mlp(graph_feature(x, idx=idx)).amax(-1)`` with fewer operations on ``(B, ·, P, k)`` tensors.

    ``edge_mlp`` is a sequence of ``(1×1 Conv2d, BatchNorm2d, LeakyReLU)`` layers (:func:`_edge_layer`); its
    parameters and batch-norm statistics are used and updated exactly as the plain form would.

    * The first convolution is linear, so with its weight ``W = [W_d, W_c]`` (differences, centres) the edge
      value ``W_d (x_j − x_i) + W_c x_i`` equals ``u_j + v_i`` with ``u = W_d x`` and ``v = (W_c − W_d) x``:
      two products over the ``P`` points instead of one over the ``P k`` edges of ``2C`` channels, and no
      ``(B, 2C, P, k)`` edge features.
    * The last leaky ReLU (slope in [0, 1]: non-decreasing) commutes with the max over neighbours, so it is
      applied to the ``(B, C_out, P)`` maxima; the max is taken as the value at the ``argmax`` (the backward
      pass writes one entry per maximum instead of masking the whole tensor). Where several neighbours
      tie for the maximum (duplicate points) the gradient goes to the first instead of being split: the
      same sum over the tied, identical features.

    Rounding differs from the plain form (``u_j + v_i`` against the product of the differences): outputs
    agree to float32 rounding of the layer's scale, except where that rounding reorders two nearly
    equidistant neighbours of a later layer's graph (as a different BLAS would). ``tests/test_pointcloud_models.py``
    checks the outputs, gradients and statistics against the plain form in float64.
    """
    layers = list(edge_mlp)
    conv, norm, act = layers[0]
    c = x.shape[1]
    weight = conv.weight.view(conv.weight.shape[0], 2 * c)
    w_diff, w_centre = weight[:, :c], weight[:, c:]
    neighbour = torch.matmul(w_diff, x)  # (B, C_out, P)
    centre = torch.matmul(w_centre - w_diff, x)
    if conv.bias is not None:
        centre = centre + conv.bias.view(1, -1, 1)
    h = norm(gather_neighbours(neighbour, idx) + centre.unsqueeze(-1))
    for next_conv, next_norm, next_act in layers[1:]:
        h = next_norm(next_conv(act(h)))
        act = next_act
    with torch.no_grad():
        best = h.argmax(dim=-1, keepdim=True)
    return act(h.gather(-1, best).squeeze(-1))


class EdgeConv(nn.Module):
    """``(B, C, P)`` → ``(B, widths[-1], P)``: kNN in the input feature space, edge features
    ``[x_j − x_i, x_i]`` ``(B, 2C, P, k)``, the edge layers, max over neighbours (computed by :func:`edge_conv`,
    which never builds the edge features themselves)."""

    def __init__(
        self, in_channels: int, widths: tuple[int, ...], k: int, negative_slope: float = 0.2
    ) -> None:
        super().__init__()
        self.k = k
        self.out_channels = widths[-1]
        layers, c_in = [], 2 * in_channels
        for c_out in widths:
            layers.append(_edge_layer(c_in, c_out, negative_slope))
            c_in = c_out
        self.edge_mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return edge_conv(x, knn(x, self.k), self.edge_mlp)


class SpatialTransform(nn.Module):
    """DGCNN's input alignment network: a 3×3 matrix per cloud from the edge features of the input.

    Edge layers 64 → 128, max over neighbours, 1024, max over points, 512 → 256 → 9 (+ identity start: the
    last layer is initialised to zero weights and an identity bias). ``(B, 3, P)`` → ``(B, 3, 3)``.
    """

    def __init__(self, k: int, width: float = 1.0, negative_slope: float = 0.2) -> None:
        super().__init__()
        c1, c2, c3, f1, f2 = (scaled(c, width) for c in (64, 128, 1024, 512, 256))
        self.k = k
        self.edge_mlp = nn.Sequential(_edge_layer(6, c1, negative_slope), _edge_layer(c1, c2, negative_slope))
        self.point_mlp = _point_layer(c2, c3, negative_slope)
        self.global_mlp = nn.Sequential(
            nn.Linear(c3, f1, bias=False),
            nn.BatchNorm1d(f1),
            nn.LeakyReLU(negative_slope),
            nn.Linear(f1, f2, bias=False),
            nn.BatchNorm1d(f2),
            nn.LeakyReLU(negative_slope),
        )
        self.to_matrix = nn.Linear(f2, 9)
        nn.init.zeros_(self.to_matrix.weight)
        with torch.no_grad():
            self.to_matrix.bias.copy_(torch.eye(3).flatten())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        edges = edge_conv(x, knn(x, self.k), self.edge_mlp)  # (B, 128, P)
        pooled = self.point_mlp(edges).amax(dim=-1)  # (B, 1024)
        return self.to_matrix(self.global_mlp(pooled)).view(-1, 3, 3)


class DGCNNClassificationHead(nn.Module):
    """``(B, F)`` → ``(B, num_classes)``: 512 (no bias) → 256 → classes, batch norm, leaky ReLU and
    dropout after each hidden layer."""

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        width: float = 1.0,
        dropout: float = 0.5,
        negative_slope: float = 0.2,
    ) -> None:
        super().__init__()
        f1, f2 = scaled(512, width), scaled(256, width)
        self.net = nn.Sequential(
            nn.Linear(in_features, f1, bias=False),
            nn.BatchNorm1d(f1),
            nn.LeakyReLU(negative_slope),
            nn.Dropout(dropout),
            nn.Linear(f1, f2),
            nn.BatchNorm1d(f2),
            nn.LeakyReLU(negative_slope),
            nn.Dropout(dropout),
            nn.Linear(f2, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DGCNNSegmentationHead(nn.Module):
    """Per-point part logits: the one-hot category through a 64-unit layer, ``[global, category]``
    broadcast to every point and concatenated with per-point features, then 256 → (dropout) → 256 →
    (dropout) → 128 → parts (1×1 convolutions without bias, batch norm, leaky ReLU).

    ``forward(global (B, G), one_hot (B, K), point_features (B, F, P))`` → ``(B, P, num_parts)``.
    """

    def __init__(
        self,
        global_features: int,
        point_features: int,
        num_categories: int,
        num_parts: int,
        width: float = 1.0,
        dropout: float = 0.5,
        negative_slope: float = 0.2,
    ) -> None:
        super().__init__()
        c_cat, c1, c2, c3 = (scaled(c, width) for c in (64, 256, 256, 128))
        self.category_mlp = _point_layer(num_categories, c_cat, negative_slope)
        self.in_channels = global_features + c_cat + point_features
        self.net = nn.Sequential(
            _point_layer(self.in_channels, c1, negative_slope),
            nn.Dropout(dropout),
            _point_layer(c1, c2, negative_slope),
            nn.Dropout(dropout),
            _point_layer(c2, c3, negative_slope),
            nn.Conv1d(c3, num_parts, 1, bias=False),
        )

    def forward(self, global_feature: torch.Tensor, one_hot: torch.Tensor, point_features: torch.Tensor):
        category = self.category_mlp(one_hot.unsqueeze(-1)).squeeze(-1)  # (B, 64)
        shape_code = torch.cat([global_feature, category], dim=1)
        shape_code = shape_code.unsqueeze(-1).expand(-1, -1, point_features.shape[-1])
        return self.net(torch.cat([shape_code, point_features], dim=1)).transpose(1, 2)


#: EdgeConv blocks (widths of their edge layers) per head; VN-DGCNN uses the same layout
EDGE_CONV_BLOCKS = {
    "classification": ((64,), (64,), (128,), (256,)),
    "segmentation": ((64, 64), (64, 64), (64,)),
}


class DGCNN(PointCloudPredictor):
    """DGCNN classifier or part segmenter.

    Args:
        head: "classification" (ModelNet40) or "segmentation" (ShapeNet-part).
        num_classes: classification logits (ModelNet40: 40).
        num_parts: segmentation logits per point (ShapeNet-part: 50).
        num_categories: object categories, one-hot into the segmentation head (ShapeNet-part: 16).
        k: neighbours of every EdgeConv; ``None``: 20 (classification) or 40 (segmentation). Clouds need at
            least ``k`` points.
        emb_dims: width of the global feature (1024).
        width: multiplies every other layer width (1.0: the reference network; smaller for tests).
        dropout: of the heads (0.5).
        input_transform: the 3×3 spatial transform; ``None``: only for segmentation, as in the reference.
        negative_slope: of the leaky ReLUs (0.2).

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
        input_transform: bool | None = None,
        negative_slope: float = 0.2,
    ) -> None:
        super().__init__(head, num_classes, num_parts, num_categories)
        self.k = self.neighbours(k)
        emb_dims = check_int("prediction.emb_dims", emb_dims, low=1)
        width = check_positive("prediction.width", width)
        dropout = check_fraction("prediction.dropout", dropout)
        slope = check_fraction("prediction.negative_slope", negative_slope)
        if input_transform is None:
            input_transform = self.head_type == "segmentation"
        self.transform = SpatialTransform(self.k, width, slope) if input_transform else None

        blocks, c_in = [], 3
        for widths in EDGE_CONV_BLOCKS[self.head_type]:
            widths = tuple(scaled(c, width) for c in widths)
            blocks.append(EdgeConv(c_in, widths, self.k, slope))
            c_in = widths[-1]
        self.blocks = nn.ModuleList(blocks)
        concat = sum(block.out_channels for block in self.blocks)
        self.embed = _point_layer(concat, emb_dims, slope)
        if self.head_type == "classification":
            # max and mean pooling side by side: 2 × emb_dims
            self.head: nn.Module = DGCNNClassificationHead(
                2 * emb_dims, self.num_classes, width, dropout, slope
            )
        else:
            self.head = DGCNNSegmentationHead(
                emb_dims, concat, self.num_categories, self.num_parts, width, dropout, slope
            )
        self.last_input_transform: torch.Tensor | None = None

    def forward(self, points: torch.Tensor, category: torch.Tensor | None = None) -> torch.Tensor:
        check_points(points)
        x = points
        self.last_input_transform = None
        if self.transform is not None:
            self.last_input_transform = self.transform(points.transpose(1, 2))
            x = torch.bmm(points, self.last_input_transform)
        x = x.transpose(1, 2)  # (B, 3, P)
        features = []
        for block in self.blocks:
            x = block(x)
            features.append(x)
        point_features = torch.cat(features, dim=1)  # (B, 512 | 192, P)
        embedded = self.embed(point_features)
        if self.head_type == "classification":
            return self.head(torch.cat([embedded.amax(dim=-1), embedded.mean(dim=-1)], dim=1))
        one_hot = category_one_hot(category, self.num_categories, points.shape[0]).to(embedded.dtype)
        return self.head(embedded.amax(dim=-1), one_hot, point_features)


__all__ = [
    "DGCNN",
    "DGCNNClassificationHead",
    "DGCNNSegmentationHead",
    "EdgeConv",
    "SpatialTransform",
    "edge_conv",
]
