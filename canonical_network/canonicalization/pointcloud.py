"""The point-cloud canonicalizers CN(L) and CN(NL) of §5.3 (Appendix G.3): Vector Neurons → 3 vectors →
Gram–Schmidt → a rotation per cloud.

Architecture (after the authors' public code, which builds its canonicalizer on DGCNN-style edge features):

* the cloud ``(B, P, 3)`` is centred on its centroid (so ``h`` is translation invariant, as §4.1 requires of
  ``h^O``) and viewed as one VN channel ``(B, 1, 3, P)``;
* edge features over the ``k`` nearest neighbours (:func:`~canonical_network.nn.knn.graph_feature`):
  ``[x_j − x_i, x_i]``, plus ``x_j × x_i`` for SO(3) (a pseudo-vector: it gives the network a third,
  out-of-plane direction but flips under reflections, so it is dropped for ``group="O3"``);
* each edge channel is divided by its mean norm over the cloud (:func:`balance_channels`, why: see there);
* ``layers="linear"`` — CN(L): **one** VN layer on the edges (``VNLinear`` → ``VNBatchNorm`` → VN leaky
  ReLU, to ``hidden_dim`` channels), pooled over the neighbours, then a ``VNLinear`` read-out to 3 channels
  pooled over the points. The layer's own non-linearity is kept on purpose: a bare linear map followed by
  mean pooling collapses to a linear function of two pooled vectors (the centred-position channel pools to
  zero), too few for a frame. The read-out is linear, so it commutes with mean pooling; mapping straight to
  3 channels instead (the authors' variant) leaves a freshly initialised O(3) network with a rank-deficient
  frame for about half of the seeds, because a VN non-linearity whose ``⟨q, k⟩`` never changes sign is
  linear;
* ``layers="nonlinear"`` — CN(NL): the same edge layer, a second, pointwise VN layer, the same read-out;
* the three pooled vectors are orthonormalised by :func:`~canonical_network.groups.euclidean.gram_schmidt`:
  ``group="SO3"`` (default) takes ``e₃ = e₁ × e₂`` so ``R`` is a proper rotation and canonical clouds are
  never mirror images; ``group="O3"`` is the reflection-equivariant variant.

Only the rotation is canonicalized: ModelNet40/ShapeNet clouds are centred by the data pipeline and the
protocols (z/z, z/SO(3), SO(3)/SO(3)) rotate about the origin. :meth:`canonicalize` therefore maps the
**uncentred** input ``x ↦ x R`` (the inverse rotation, row-vector convention of
:mod:`canonical_network.groups.euclidean`), exactly what the baseline predictor would see up to rotation.
The outputs (class logits, per-point part logits) are invariant, so :meth:`invert` is the identity.

Exactness. Every step is equivariant, but the kNN graph is a discontinuous function of the cloud: when two
candidate neighbours tie for the k-th place to within float32 rounding (~1e-7), the rounding of the rotated
coordinates can swap them, and ``h`` jumps (by up to ~0.1 with P = 96, k = 8 — seen once in ~2000 random
clouds). Mean pooling of many nearly cancelling edge vectors also makes an untrained frame sensitive to
rounding (errors ~1e-5, at worst a few 1e-4 for badly conditioned frames); VN max pooling selects actual
vectors and is better conditioned.
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.canonicalization.base import Canonicalizer
from canonical_network.groups.euclidean import gram_schmidt, invert_rotation
from canonical_network.nn.knn import EXACT, graph_feature
from canonical_network.nn.vector_neurons import (
    VN_EPS,
    VNLinear,
    VNLinearLeakyReLU,
    VNMaxPool,
    VNMeanPool,
    vn_norms,
)

LAYERS = ("linear", "nonlinear")
POOLINGS = ("mean", "max")
GROUPS = ("SO3", "O3")


def _check_choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{key} must be one of {list(choices)}, got {value!r}")
    return str(value)


def _check_int(key: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key} must be an int >= {minimum}, got {value!r}")
    return value


def balance_channels(x: torch.Tensor) -> torch.Tensor:
    """Divide each VN channel of ``(B, C, 3, *S)`` by its mean vector norm over ``S``, per sample.

    Why: the centre channel ``x_i`` is several times longer than the neighbour offsets ``x_j − x_i``, so the
    sign of ``⟨q, k⟩`` in the first VN non-linearity is decided by ``x_i`` alone for almost every edge. The
    layer is then nearly linear, and mean pooling a linear function of centred points cancels to a few
    pooled vectors that are tiny, nearly parallel, or rank-deficient: frames that float32 rounding can
    flip. With the channels balanced the non-linearity is active, and ``h`` also becomes invariant to the
    scale of the cloud. The scale is an invariant per-sample scalar, so equivariance is untouched.
    """
    scale = vn_norms(x).flatten(2).mean(dim=-1)  # (B, C)
    scale = scale.clamp_min(VN_EPS).view(*scale.shape, *([1] * (x.dim() - 2)))
    return x / scale


class VNPointCloudCanonicalizer(Canonicalizer):
    """``h(points) = R ∈ SO(3)`` (or O(3)) for point-cloud classification and part segmentation (§5.3).

    Args:
        layers: "linear" for CN(L), "nonlinear" for CN(NL) (see the module docstring).
        hidden_dim: VN channels of the hidden layers (both variants). Default 21 = 64 // 3: Vector Neuron
            networks divide scalar widths by 3 (each channel holds 3 numbers), and 64 is DGCNN's first width.
        k: neighbours of the edge features (DGCNN's default 20, Wang et al. 2019); clouds with fewer
            points use all of them.
        pooling: "mean" or VN "max" (learned direction) over neighbours and over points.
        group: "SO3" (proper rotations, the paper's setting) or "O3".
        negative_slope: of the VN leaky ReLUs (Deng et al. 2021 use 0.2).
        batch_norm: VN batch norm in each VN layer.
        freeze: keep the initial weights, the "CN(frozen)" rows.

    Equivariance: ``h(points Qᵀ + s) = Q h(points)`` for ``Q`` in ``group`` and any translation ``s``;
    invariant to permutations of the points (up to ties in the kNN graph).
    """

    def __init__(
        self,
        layers: str = "nonlinear",
        hidden_dim: int = 21,
        k: int = 20,
        pooling: str = "mean",
        group: str = "SO3",
        negative_slope: float = 0.2,
        batch_norm: bool = True,
        freeze: bool = False,
    ) -> None:
        super().__init__(freeze=freeze)
        self.layers = _check_choice("layers", layers, LAYERS)
        self.pooling = _check_choice("pooling", pooling, POOLINGS)
        self.group = _check_choice("group", group, GROUPS)
        self.hidden_dim = _check_int("hidden_dim", hidden_dim, 1)
        self.k = _check_int("k", k, 1)
        if isinstance(negative_slope, bool) or not 0.0 <= float(negative_slope) < 1.0:
            raise ValueError(f"negative_slope must be a number in [0, 1), got {negative_slope!r}")
        self.group_name = "SO(3)" if self.group == "SO3" else "O(3)"
        self.cross = self.group == "SO3"
        edge_channels = 3 if self.cross else 2

        def block(c_in: int, c_out: int) -> VNLinearLeakyReLU:
            return VNLinearLeakyReLU(c_in, c_out, negative_slope=float(negative_slope), batch_norm=batch_norm)

        def pool(channels: int) -> nn.Module:
            return VNMaxPool(channels) if self.pooling == "max" else VNMeanPool(-1)

        self.edge_layer = block(edge_channels, hidden_dim)
        hidden = [] if self.layers == "linear" else [block(hidden_dim, hidden_dim)]
        self.point_layers = nn.Sequential(*hidden, VNLinear(hidden_dim, 3))
        self.neighbour_pool = pool(hidden_dim)
        self.point_pool = pool(3)
        self.finish_init()

    def frame_vectors(self, points: torch.Tensor) -> torch.Tensor:
        """The three pooled equivariant vectors ``(B, 3, 3)`` (rows are vectors) before Gram–Schmidt."""
        if points.dim() != 3 or points.shape[-1] != 3:
            raise ValueError(f"points must have shape (B, P, 3), got {tuple(points.shape)}")
        centred = points - points.mean(dim=1, keepdim=True)
        x = centred.transpose(1, 2).unsqueeze(1)  # (B, 1, 3, P)
        k = min(self.k, points.shape[1])
        # EXACT distances: the kNN graph of a rotated cloud must be the same graph.
        edges = graph_feature(x, k, cross=self.cross, compute_mode=EXACT)  # (B, 2|3, 3, P, k)
        edges = balance_channels(edges)
        features = self.neighbour_pool(self.edge_layer(edges))  # (B, C, 3, P)
        features = self.point_layers(features)  # (B, 3, 3, P)
        return self.point_pool(features)  # (B, 3, 3)

    def group_element(self, points: torch.Tensor) -> torch.Tensor:
        """``h(points) = R`` ``(B, 3, 3)``; its columns are the learned frame axes."""
        return gram_schmidt(self.frame_vectors(points).transpose(1, 2), self.group)  # type: ignore[arg-type]

    def canonicalize(
        self, points: torch.Tensor, *rest: torch.Tensor
    ) -> tuple[torch.Tensor | tuple, torch.Tensor]:
        """``points (B, P, 3) ↦ points R``; other inputs (e.g. the ShapeNet category) pass through.

        Returns a tensor when ``points`` is the only input, else the tuple ``(points R, *rest)``, and ``R``.
        """
        rotation = self.group_element(points)
        canonical = invert_rotation(points, rotation)
        return (canonical if not rest else (canonical, *rest)), rotation


__all__ = ["GROUPS", "LAYERS", "POOLINGS", "VNPointCloudCanonicalizer"]
