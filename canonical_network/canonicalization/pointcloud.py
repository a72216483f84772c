"""The point-cloud canonicalizers CN(L) and CN(NL) of §5.3 (Appendix G.3): Vector Neurons → 3 vectors →
Gram–Schmidt → a rotation per cloud.

The cloud ``(B, P, 3)`` is centred on its centroid (so ``h`` is translation invariant, as §4.1 requires of
``h^O``) and turned into a few VN channels per point, by one of two input stages:

* ``k=None`` (default) — **pointwise**: per point ``i`` the channels ``[x_i, D x_i]``, plus ``x_i × D x_i``
  for SO(3), where ``D`` is the traceless part of the cloud's second-moment matrix
  ``M = (1/P) Σ_j x_j x_jᵀ`` (:func:`second_moment_channels`): ``M x_i = (1/P) Σ_j ⟨x_j, x_i⟩ x_j`` is the
  mean of all points weighted by their (invariant) dot products with ``x_i``. Why the second channel: a
  pointwise VN layer on ``x_i`` alone can only rescale ``x_i`` (every channel stays parallel to it), and
  pooled vectors would be radially weighted means of the points, nearly parallel and nearly cancelling: no
  frame. ``D x_i`` brings in the shape of the whole cloud at ``O(P)`` cost, where kNN edges cost ``O(P²)``
  distances and ``k`` times the features; the canonicalizer then costs a few per cent of PointNet
  (``scripts/benchmark_pointcloud_inference.py``), which is the paper's point (Table 5: its overhead is
  "negligible");
* ``k=<int>`` — **edges**, after the authors' public code (DGCNN-style edge features): over the ``k``
  nearest neighbours (:func:`~canonical_network.nn.knn.graph_feature`) ``[x_j − x_i, x_i]``, plus
  ``x_j × x_i`` for SO(3), pooled over the neighbours after the first VN layer. Several times the cost of
  PointNet itself on a CPU.

``x × y`` is a pseudo-vector: it gives the network a third, out-of-plane direction but flips under
reflections, so it is dropped for ``group="O3"``. Then:

* each input channel is divided by its mean norm over the cloud (:func:`balance_channels`, why: see there);
* ``layers="linear"`` — CN(L): **one** VN layer (``VNLinear`` → ``VNBatchNorm`` → VN leaky ReLU, to
  ``hidden_dim`` channels), then a ``VNLinear`` read-out to 3 channels pooled over the points. The layer's
  own non-linearity is kept on purpose: a bare linear map followed by mean pooling collapses to a linear
  function of the pooled inputs (the centred-position channel pools to zero, and so does ``D x_i``), too
  few for a frame. The read-out is linear, so it commutes with mean pooling; mapping straight to
  3 channels instead (the authors' variant) leaves a freshly initialised O(3) network with a
  rank-deficient frame for about half of the seeds, because a VN non-linearity whose ``⟨q, k⟩`` never
  changes sign is linear;
* ``layers="nonlinear"`` — CN(NL): the same first layer, a second, pointwise VN layer, the same read-out;
* the three pooled vectors are orthonormalised by :func:`~canonical_network.groups.euclidean.gram_schmidt`:
  ``group="SO3"`` (default) takes ``e₃ = e₁ × e₂`` so ``R`` is a proper rotation and canonical clouds are
  never mirror images; ``group="O3"`` is the reflection-equivariant variant.

Only the rotation is canonicalized: ModelNet40/ShapeNet clouds are centred by the data pipeline and the
protocols (z/z, z/SO(3), SO(3)/SO(3)) rotate about the origin. :meth:`canonicalize` therefore maps the
**uncentred** input ``x ↦ x R`` (the inverse rotation, row-vector convention of
:mod:`canonical_network.groups.euclidean`), exactly what the baseline predictor would see up to rotation.
The outputs (class logits, per-point part logits) are invariant, so :meth:`invert` is the identity.

Exactness. Every step is equivariant. With the pointwise input and mean pooling, ``h`` is moreover a
continuous function of the cloud (up to Gram–Schmidt's fallbacks on degenerate frames): rounding is only
amplified by the conditioning of the frame (rotated synthetic shapes, float32: ~1e-6 to 1e-5 on ``R``).
With ``group="O3"``, a cloud with a mirror plane has no equivariant frame at all (paper Appendix A: its
third pooled vector is decided by sampling noise); most real and synthetic objects have one up to noise,
which is one more reason for the SO(3) default. The kNN graph is not continuous: when two candidate
neighbours tie for the k-th place to within float32 rounding (~1e-7), the rounding of the rotated
coordinates can swap them, and ``h`` jumps (by up to ~0.1 with P = 96, k = 8 — seen once in ~2000 random
clouds). Mean pooling of many nearly cancelling vectors also makes an untrained frame sensitive to rounding
(errors ~1e-5, at worst a few 1e-4 for badly conditioned frames); VN max pooling selects actual vectors
and is better conditioned.
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
    vn_mean_pool,
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


def second_moment_channels(centred: torch.Tensor, cross: bool) -> torch.Tensor:
    """Pointwise VN input ``(B, 2|3, 3, P)``: ``[x_i, D x_i(, x_i × D x_i)]`` from centred points
    ``(B, P, 3)``, with ``D`` the traceless part of the second-moment matrix ``M = (1/P) Σ_j x_j x_jᵀ``.

    ``M`` (hence ``D``) becomes ``Q M Qᵀ`` when the points become ``x Qᵀ``, so ``D x_i`` rotates with ``x_i``
    (O(3)); the cross product is SO(3)-equivariant only. Permutation-equivariant.

    Why ``D = M − (tr M / 3) I`` rather than ``M``: ``M x_i = D x_i + (tr M / 3) x_i`` adds nothing that the
    first channel does not hold, and ``x_i × M x_i = x_i × D x_i`` is the same vector, but computed from ``D``
    its rounding error scales with the anisotropy of the cloud instead of its size. For a nearly round
    cloud (a mug is a cylinder plus a handle) the cross product is small and, computed from ``M``, a rotated
    copy moved it by ~1e-5 relative: after :func:`balance_channels`, enough to move logits by ~1e-4.
    """
    # Moments in float64: a float32 sum over 1,024 points is off by ~1e-6 relative, which moved the frame of
    # a rotated cloud by up to ~1e-3 (pooled vectors nearly cancel); in float64 the frame is as exact as the
    # kNN variant's (~1e-5). Cost: a (3, P) @ (P, 3) product per cloud.
    exact = centred.double()
    second_moment = exact.transpose(1, 2) @ exact / centred.shape[1]
    trace = second_moment.diagonal(dim1=1, dim2=2).sum(-1)
    identity = torch.eye(3, dtype=exact.dtype, device=exact.device)
    deviator = second_moment - (trace / 3).view(-1, 1, 1) * identity
    context = exact @ deviator  # row vectors: (D x_i)ᵀ = x_iᵀ D, D symmetric
    channels = [exact, context]
    if cross:
        channels.append(torch.linalg.cross(exact, context, dim=-1))
    return torch.stack(channels, dim=1).transpose(2, 3).to(centred.dtype)


def balance_channels(x: torch.Tensor) -> torch.Tensor:
    """Divide each VN channel of ``(B, C, 3, *S)`` by its mean vector norm over ``S``, per sample.

    Why: the centre channel ``x_i`` is several times longer than the neighbour offsets ``x_j − x_i`` (and
    ``D x_i`` scales with the squared radius times ``x_i``), so the sign of ``⟨q, k⟩`` in the first VN
    non-linearity is decided by one channel alone for almost every element. The layer is then nearly
    linear, and mean pooling a linear function of centred points cancels to a few pooled vectors that are
    tiny, nearly parallel, or rank-deficient: frames that float32 rounding can flip. With the channels
    balanced the non-linearity is active, and ``h`` also becomes invariant to the scale of the cloud. The
    scale is an invariant per-sample scalar, so equivariance is untouched.
    """
    scale = vn_norms(x).flatten(2).mean(dim=-1)  # (B, C)
    scale = scale.clamp_min(VN_EPS).view(*scale.shape, *([1] * (x.dim() - 2)))
    return x / scale


class VNPointCloudCanonicalizer(Canonicalizer):
    """``h(points) = R ∈ SO(3)`` (or O(3)) for point-cloud classification and part segmentation (§5.3).

    Args:
        layers: "linear" for CN(L), "nonlinear" for CN(NL) (see the module docstring).
        hidden_dim: VN channels of the hidden layers (both variants). Default 8: ``h`` only has to produce
            three vectors, and 8 channels keep CN(NL) at ~2 % of PointNet's CPU inference time (21 = 64 // 3,
            the VN width of DGCNN's first layer, costs ~7 %; one thread, batch 32 × 1,024 points).
        k: ``None`` (default): pointwise input (second-moment context, no neighbours, ``O(P)``); an int:
            kNN edge features over ``k`` neighbours (DGCNN uses 20, Wang et al. 2019; clouds with fewer
            points use all of them), the authors' variant, ``O(P²)``.
        pooling: "mean" or VN "max" (learned direction) over points (and over neighbours with ``k``).
        group: "SO3" (proper rotations, the paper's setting) or "O3".
        negative_slope: of the VN leaky ReLUs (Deng et al. 2021 use 0.2).
        batch_norm: VN batch norm in each VN layer.
        freeze: keep the initial weights, the "CN(frozen)" rows.

    Equivariance: ``h(points Qᵀ + s) = Q h(points)`` for ``Q`` in ``group`` and any translation ``s``;
    invariant to permutations of the points (up to ties in the kNN graph or in VN max pooling).
    """

    def __init__(
        self,
        layers: str = "nonlinear",
        hidden_dim: int = 8,
        k: int | None = None,
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
        self.k = None if k is None else _check_int("k", k, 1)
        if isinstance(negative_slope, bool) or not 0.0 <= float(negative_slope) < 1.0:
            raise ValueError(f"negative_slope must be a number in [0, 1), got {negative_slope!r}")
        self.group_name = "SO(3)" if self.group == "SO3" else "O(3)"
        self.cross = self.group == "SO3"
        in_channels = 3 if self.cross else 2

        def block(c_in: int, c_out: int) -> VNLinearLeakyReLU:
            return VNLinearLeakyReLU(c_in, c_out, negative_slope=float(negative_slope), batch_norm=batch_norm)

        def pool(channels: int) -> nn.Module:
            return VNMaxPool(channels) if self.pooling == "max" else VNMeanPool(-1)

        self.input_layer = block(in_channels, hidden_dim)
        hidden = [] if self.layers == "linear" else [block(hidden_dim, hidden_dim)]
        self.point_layers = nn.Sequential(*hidden)
        self.read_out = VNLinear(hidden_dim, 3)
        self.neighbour_pool = None if self.k is None else pool(hidden_dim)
        self.point_pool = pool(3)
        self.finish_init()

    def frame_vectors(self, points: torch.Tensor) -> torch.Tensor:
        """The three pooled equivariant vectors ``(B, 3, 3)`` (rows are vectors) before Gram–Schmidt."""
        if points.dim() != 3 or points.shape[-1] != 3:
            raise ValueError(f"points must have shape (B, P, 3), got {tuple(points.shape)}")
        centred = points - points.mean(dim=1, keepdim=True)
        if self.k is None:
            features = self.input_layer(balance_channels(second_moment_channels(centred, self.cross)))
        else:
            x = centred.transpose(1, 2).unsqueeze(1)  # (B, 1, 3, P)
            k = min(self.k, points.shape[1])
            # EXACT distances: the kNN graph of a rotated cloud must be the same graph.
            edges = graph_feature(x, k, cross=self.cross, compute_mode=EXACT)  # (B, 2|3, 3, P, k)
            features = self.neighbour_pool(self.input_layer(balance_channels(edges)))
        features = self.point_layers(features)  # (B, C, 3, P)
        if self.pooling == "mean":
            # The read-out is linear, so it commutes with the mean: pooling first is P times less work.
            return self.read_out(vn_mean_pool(features))  # (B, 3, 3)
        return self.point_pool(self.read_out(features))  # (B, 3, 3, P) → (B, 3, 3)

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


__all__ = [
    "GROUPS",
    "LAYERS",
    "POOLINGS",
    "VNPointCloudCanonicalizer",
    "balance_channels",
    "second_moment_channels",
]
