"""A small Transformer over the points of a cloud, with positional encodings of each point's *index*: a point-cloud
backbone that depends on the order of the points (issue 36 item 3, paper §4 on the symmetric group).

Every other point-cloud backbone here (PointNet, DGCNN and their VN versions) is permutation-invariant by
construction, so canonicalizing the order of the points would test nothing with them. This one is not:

* each point ``x_i`` ``(3,)`` is embedded by a small per-point MLP and added to the encoding ``e_i`` of its
  position ``i`` in the array (learned, or the fixed sinusoids of Vaswani et al. 2017 §3.5, divided by
  ``√dim``);
* ``depth`` pre-norm Transformer encoder layers (torch's ``nn.TransformerEncoderLayer``: self-attention over all
  points, ``heads`` heads, then a feed-forward block of ``ffn_ratio · dim``) mix the points;
* the tokens are pooled (mean or max) and a two-layer head gives class logits.

Self-attention and pooling alone would be permutation-invariant; the index encoding ``e_i`` is what makes the
logits change when the points are reordered (point ``x`` at index 3 is another token than at index 7). The
coordinates enter through an ordinary per-point MLP, so rotating the cloud changes the logits too: neither
SO(3)- nor S_n-invariant, which is why the ``modelnet/cn_transformer`` row puts it behind SO(3)×S_n
canonicalization (``canonicalization=so3_permutation``): a learned frame, then a learned order of the
canonical points, and ``f`` only ever sees the cloud in its canonical pose and order.

A learned encoding of the index needs one vector per index, so the number of points is part of the network
(``num_points``, ``${data.num_points}`` in ``configs/prediction/point_transformer.yaml``); a cloud of another
size is refused with an error naming that key rather than silently encoded with a truncated table.
Attention costs ``O(P² · dim)`` per layer: the defaults (64 channels, 2 layers, 4 heads) are sized for 256-point
clouds on a CPU.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from canonical_network.prediction.pointnet import PointCloudPredictor, check_points
from canonical_network.utils.checks import check_choice, check_fraction, check_int

#: how the index of a point is encoded (``prediction.positional``)
POSITIONAL = ("learned", "sinusoidal")
#: how the point tokens become one vector per cloud (``prediction.pooling``)
POOLINGS = ("mean", "max")


def sinusoidal_encoding(num_positions: int, dim: int) -> torch.Tensor:
    """``(num_positions, dim)``: ``sin(i / 10000^(2k/dim))`` in the even and ``cos`` in the odd channels
    (Vaswani et al. 2017 §3.5), values in [-1, 1]; ``dim`` must be even (one sine and one cosine per frequency)."""
    if dim % 2:
        raise ValueError(f"prediction.dim must be even for sinusoidal position encodings; got {dim}")
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table.float()


class PointTransformer(PointCloudPredictor):
    """``(B, P, 3)`` points → ``(B, num_classes)`` logits, dependent on the order of the points (module docstring).

    Args:
        head: "classification" only (``forward(points) -> logits``); the part segmentation head is not built.
        num_classes, num_parts, num_categories: from ``data_info`` (the last two unused; the shared base checks them).
        num_points: ``P``, the points per cloud; the learned encoding has one vector per index, and inputs of any
            other size are refused.
        dim: width of the tokens (even: the sinusoidal table pairs a sine with a cosine).
        depth: Transformer encoder layers.
        heads: attention heads; must divide ``dim``.
        ffn_ratio: the feed-forward block's width is ``ffn_ratio · dim``.
        dropout: before the head's last layer (training only); none inside the encoder (see ``__init__``).
        positional: "learned" (a parameter per index, initialised to the sinusoidal table) or "sinusoidal" (fixed).
        pooling: "mean" or "max" over the point tokens.
    """

    #: the tasks f serves: classification only, no part segmentation head (utils/run_config.py checks it)
    tasks = ("PointCloudClassificationTask",)

    def __init__(
        self,
        head: str = "classification",
        num_classes: int = 40,
        num_parts: int = 50,
        num_categories: int = 16,
        num_points: int = 1024,
        dim: int = 64,
        depth: int = 2,
        heads: int = 4,
        ffn_ratio: int = 2,
        dropout: float = 0.1,
        positional: str = "learned",
        pooling: str = "mean",
    ) -> None:
        super().__init__(head, num_classes, num_parts, num_categories)
        check_choice("prediction.head", head, ("classification",))
        self.num_points = check_int("prediction.num_points", num_points, low=1)
        dim = check_int("prediction.dim", dim, low=2)
        depth = check_int("prediction.depth", depth, low=1)
        heads = check_int("prediction.heads", heads, low=1)
        if dim % heads:
            raise ValueError(f"prediction.heads must divide prediction.dim; got heads={heads}, dim={dim}")
        ffn_ratio = check_int("prediction.ffn_ratio", ffn_ratio, low=1)
        dropout = check_fraction("prediction.dropout", dropout)
        self.positional = check_choice("prediction.positional", positional, POSITIONAL)
        self.pooling = check_choice("prediction.pooling", pooling, POOLINGS)

        # a per-point MLP rather than one linear map: three coordinates are too few numbers for attention's
        # queries and keys to be built from directly
        self.embed = nn.Sequential(nn.Linear(3, dim), nn.GELU(), nn.Linear(dim, dim))
        # The sinusoids divided by √dim: Vaswani et al.'s ratio of encoding to embedding (§3.4 multiplies the
        # embeddings by √d_model instead). At full size (entries of ±1, far above a point's embedding at
        # initialisation) the tokens are mostly position codes, which carry nothing about the shape (the data's
        # point order is random), and the network starts learning far more slowly.
        table = sinusoidal_encoding(self.num_points, dim) / math.sqrt(dim)
        if self.positional == "learned":
            # Initialised to the scaled sinusoids rather than to ~0 (BERT/ViT's 0.02): a near-zero encoding would
            # start the network almost permutation-invariant (attention + pooling), and the row is about a
            # backbone that depends on the order from its first step.
            self.position = nn.Parameter(table)
        else:
            self.register_buffer("position", table, persistent=False)
        # No dropout inside the encoder: attention dropout draws a Bernoulli per entry of the (B, heads, P, P)
        # weights, O(P²) random numbers per layer, and keeps torch from its fused attention kernel (together
        # the largest cost of a training step at 256 points on a CPU); like PointNet, the network is
        # regularised in its head.
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=ffn_ratio * dim, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        # pre-norm layers (stable without a warm-up) end un-normalised: one LayerNorm before pooling;
        # no nested tensors: every cloud has P points, there is no padding to skip
        self.encoder = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(dim), enable_nested_tensor=False)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(dim, num_classes))

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        """``(B, P, 3)`` → logits ``(B, num_classes)``; ``P`` must be ``prediction.num_points``."""
        check_points(points)
        if points.shape[1] != self.num_points:
            raise ValueError(f"PointTransformer: clouds of {points.shape[1]} points, but prediction.num_points is "
                             f"{self.num_points} (one position encoding per index; set it to the data's "
                             "data.num_points)")
        tokens = self.embed(points) + self.position.to(points.dtype)
        tokens = self.encoder(tokens)
        pooled = tokens.mean(dim=1) if self.pooling == "mean" else tokens.amax(dim=1)
        return self.head(pooled)


__all__ = ["POOLINGS", "POSITIONAL", "PointTransformer", "sinusoidal_encoding"]
