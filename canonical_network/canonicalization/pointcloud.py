"""The point-cloud canonicalizers CN(L) and CN(NL) of §5.3 (Appendix G.3): Vector Neurons → 3 vectors →
Gram–Schmidt → a rotation per cloud.

The cloud ``(B, P, 3)`` is centred on its centroid (so ``h`` is translation invariant, as §4.1 requires of
``h^O``) and turned into a few VN channels by one of two input stages (``input``):

* ``input="edges"`` (default) — **the paper's input**, as in the authors' code
  (``models/pointcloud_networks.py:172-207``, ``VNSmall``, and ``get_graph_feature_cross`` in
  ``utils.py:140-164`` of oumarkaba/canonical_network): DGCNN-style edge features over the ``k`` nearest
  neighbours ``j`` of each point ``i`` (:func:`~canonical_network.nn.knn.graph_feature`, the point itself
  included), ``[x_j − x_i, x_i]`` plus ``x_j × x_i`` for SO(3): ``(B, 2|3, 3, P, k)``. ``k`` = 20 for
  ModelNet40 and 40 for ShapeNet-part (the authors' ``--n_knn`` defaults, ``train_modelnet.py`` and
  ``train_shapenet.py``). ``O(P²)`` distances;
* ``input="pointwise"`` — **our own fast variant**, not the paper's: per point ``i`` the channels
  ``[x_i, D x_i]``, plus ``x_i × D x_i`` for SO(3), where ``D`` is the traceless part of the cloud's
  second-moment matrix (:func:`second_moment_channels`). ``D x_i`` brings in the shape of the whole cloud
  at ``O(P)`` cost (a few per cent of PointNet, ``scripts/benchmark_pointcloud_inference.py``). ``k`` is
  ignored. Only with ``layers="nonlinear"`` (see below).

``x × y`` is a pseudo-vector: it gives the network a third, out-of-plane direction but flips under
reflections, so it is dropped for ``group="O3"``. Each input channel is then divided by its mean norm over
the cloud (:func:`balance_channels`, kept for both variants, see there). Then:

* ``layers="linear"`` — **CN(L)**, "a single linear layer of Vector Neurons followed by pooling" (§5.3):
  one bias-free ``VNLinear`` from the edge channels straight to the 3 frame vectors, pooled over the
  neighbours and then over the points. No non-linearity and no normalisation anywhere: with mean pooling
  (the default) the frame vectors are a linear function of the (balanced) edge features,
  ``v = W · mean_{i, j∈N(i)} e_ij``. The authors' ``VNSmall`` is ``VNLinear(3 → 4)`` → mean over the
  neighbours → ``nn.Dropout(0.5)`` → mean over the points; its fourth vector (a "translation") is never
  used (``pointcloud_classification_models.py:262-267,305``), so ``VNLinear(3 → 3)`` is the same map. Not
  copied: their dropout, which zeroes single coordinates of VN vectors and so breaks equivariance while
  training, and which the paper does not mention. With centred clouds the ``x_i`` channel pools to zero,
  so the three vectors span (at most) the plane of the pooled offsets and cross products: enough for
  ``group="SO3"``, whose ``e₃ = e₁ × e₂``, but no frame for ``group="O3"`` (which needs three independent
  vectors, and has no cross-product channel): that combination is rejected with mean pooling. Likewise
  ``input="pointwise"``: every pointwise channel mean-pools to zero (``Σ x_i = 0``, hence ``Σ D x_i = 0``,
  and ``Σ x_i × D x_i = 0`` because ``D`` commutes with ``Σ x_i x_iᵀ``), so a linear map of them gives no
  frame and that combination is rejected too. ``hidden_dim``, ``negative_slope`` and ``batch_norm`` do not
  apply;
* ``layers="nonlinear"`` — **CN(NL)**: a VN layer (``VNLinear`` → ``VNBatchNorm`` → VN leaky ReLU, to
  ``hidden_dim`` channels; with edges, pooled over the neighbours), a second, pointwise VN layer, and a
  ``VNLinear`` read-out to 3 channels pooled over the points;
* the three pooled vectors are orthonormalised by :func:`~canonical_network.groups.euclidean.gram_schmidt`:
  ``group="SO3"`` (default) takes ``e₃ = e₁ × e₂`` so ``R`` is a proper rotation and canonical clouds are
  never mirror images; ``group="O3"`` is the reflection-equivariant variant (the authors' Gram–Schmidt
  takes ``e₃`` from the third vector, which with their ``VNSmall`` is decided, at evaluation, by the clouds'
  small centroid offsets only).

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
clouds). Mean pooling of many nearly cancelling vectors also makes a frame sensitive to rounding (errors
~1e-5, at worst a few 1e-4 for badly conditioned frames); VN max pooling selects actual vectors and is
better conditioned.
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.canonicalization.base import Canonicalizer
from canonical_network.canonicalization.symmetrization import Frame, FrameSpec, vector_frame
from canonical_network.groups.euclidean import EuclideanTransform, gram_schmidt_frame, invert_rotation
from canonical_network.nn.knn import EXACT, graph_feature, knn
from canonical_network.nn.vector_neurons import (
    VN_EPS,
    VNLinear,
    VNLinearLeakyReLU,
    VNMaxPool,
    VNMeanPool,
    vn_mean_pool,
    vn_norms,
)
from canonical_network.utils.checks import check_bool, check_choice, check_fraction, check_int

LAYERS = ("linear", "nonlinear")
INPUTS = ("edges", "pointwise")
POOLINGS = ("mean", "max")
GROUPS = ("SO3", "O3")


def second_moment_channels(centred: torch.Tensor, cross: bool) -> torch.Tensor:
    """Pointwise VN input ``(B, 2|3, 3, P)``: ``[x_i, D x_i(, x_i × D x_i)]`` from centred points
    ``(B, P, 3)``, with ``D`` the traceless part of the second-moment matrix ``M = (1/P) Σ_j x_j x_jᵀ``.

    ``M x_i = (1/P) Σ_j ⟨x_j, x_i⟩ x_j`` is the mean of all points weighted by their (invariant) dot
    products with ``x_i``. Why a second channel: a pointwise VN layer on ``x_i`` alone can only rescale
    ``x_i`` (every channel stays parallel to it), and pooled vectors would be radially weighted means of the
    points, nearly parallel and nearly cancelling: no frame.

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


def channel_scales(x: torch.Tensor) -> torch.Tensor:
    """Per sample and channel, the mean vector norm of ``(B, C, 3, *S)`` over ``S``: ``(B, C)``, > 0 and
    O(3)-invariant (norms are)."""
    return vn_norms(x).flatten(2).mean(dim=-1).clamp_min(VN_EPS)


def balance_channels(x: torch.Tensor) -> torch.Tensor:
    """Divide each VN channel of ``(B, C, 3, *S)`` by its mean vector norm over ``S`` (:func:`channel_scales`),
    per sample.

    What it is: a positive scalar per (sample, channel), a function of invariant norms only, so
    equivariance is untouched; it has no parameters, and every layer after it sees each channel of a sample
    scaled by one number. It is kept for both CN(L) and CN(NL); for CN(L) the learned map stays linear in the
    balanced features (``v = W · mean(e_c / s_c)``) and ``h`` as a whole becomes invariant to the scale of
    each input channel, hence of the cloud.

    Why: the channels have different units and sizes — the centre ``x_i`` (cloud radius) is several times
    longer than the neighbour offsets ``x_j − x_i`` (neighbourhood size), the cross products scale with the
    product of the two, and ``D x_i`` with the cube of the radius. Without balancing, CN(NL)'s first VN
    non-linearity has the sign of ``⟨q, k⟩`` decided by one channel alone for almost every element, so the
    layer is nearly linear, and mean pooling a linear function of centred points cancels to a few pooled
    vectors that are tiny, nearly parallel, or rank-deficient: frames that float32 rounding can flip. For
    CN(L), the mix of offsets and cross products in each frame vector would change with the size of the
    cloud (a rescaled copy — the data's per-axis scale jitter — would get another frame), which one weight
    matrix cannot undo.
    """
    scale = channel_scales(x)
    return x / scale.view(*scale.shape, *([1] * (x.dim() - 2)))


def _clamped_norms(x: torch.Tensor) -> torch.Tensor:
    """Norms of the vectors ``(B, 3, *S)`` → ``(B, *S)``, clamped at ``VN_EPS`` as :func:`vn_norms` (same
    values)."""
    return (x * x).sum(dim=1).clamp_min(VN_EPS * VN_EPS).sqrt()


class VNPointCloudCanonicalizer(Canonicalizer):
    """``h(points) = R ∈ SO(3)`` (or O(3)) for point-cloud classification and part segmentation (§5.3).

    Args:
        layers: "linear" for CN(L), "nonlinear" for CN(NL) (see the module docstring).
        input: "edges" (the paper's kNN edge features, ``O(P²)``) or "pointwise" (our second-moment
            context, ``O(P)``, ``layers="nonlinear"`` only).
        k: neighbours of the edge input (paper rows: 20 for ModelNet40, 40 for ShapeNet-part; clouds with
            fewer points use all of them). Ignored with ``input="pointwise"``.
        hidden_dim: VN channels of CN(NL)'s hidden layers. Default 8: ``h`` only has to produce three
            vectors. Unused by CN(L), which maps the input channels straight to the three frame vectors.
        pooling: "mean" or VN "max" (learned direction) over the neighbours and the points. With "max",
            CN(L) is piecewise linear (the selection is not).
        group: "SO3" (proper rotations, the paper's setting) or "O3".
        negative_slope: of CN(NL)'s VN leaky ReLUs (Deng et al. 2021 use 0.2).
        batch_norm: VN batch norm in each of CN(NL)'s VN layers.
        freeze: keep the initial weights, the "CN(frozen)" rows.

    Equivariance: ``h(points Qᵀ + s) = Q h(points)`` for ``Q`` in ``group`` and any translation ``s``;
    invariant to permutations of the points (up to ties in the kNN graph or in VN max pooling).
    """

    #: the tasks (model._target_'s class) whose inputs h takes (utils/run_config.py checks it)
    tasks = ("PointCloudClassificationTask", "PartSegmentationTask")

    def __init__(
        self,
        layers: str = "nonlinear",
        input: str = "edges",  # the config key canonicalization.input
        k: int | None = 20,
        hidden_dim: int = 8,
        pooling: str = "mean",
        group: str = "SO3",
        negative_slope: float = 0.2,
        batch_norm: bool = True,
        freeze: bool = False,
    ) -> None:
        super().__init__(freeze=freeze)
        self.layers = check_choice("canonicalization.layers", layers, LAYERS)
        self.input = check_choice("canonicalization.input", input, INPUTS)
        self.pooling = check_choice("canonicalization.pooling", pooling, POOLINGS)
        self.group = check_choice("canonicalization.group", group, GROUPS)
        self.hidden_dim = check_int("canonicalization.hidden_dim", hidden_dim, low=1)
        batch_norm = check_bool("canonicalization.batch_norm", batch_norm)
        if self.input == "edges":
            if k is None:
                raise ValueError(
                    "canonicalization.k must be an integer >= 1 with canonicalization.input=edges; "
                    "got None (k: null used to select the pointwise input, now canonicalization.input=pointwise)"
                )
            self.k: int | None = check_int("canonicalization.k", k, low=1)
        else:
            self.k = None  # the pointwise input has no neighbours
        negative_slope = check_fraction("canonicalization.negative_slope", negative_slope)
        if self.layers == "linear" and self.input == "pointwise":
            raise ValueError(
                "canonicalization.layers=linear needs canonicalization.input=edges (the paper's CN(L)): a "
                "linear map of the pointwise channels mean-pools to zero; use canonicalization.input=pointwise "
                "with canonicalization.layers=nonlinear"
            )
        if self.layers == "linear" and self.group == "O3" and self.pooling == "mean":
            raise ValueError(
                "canonicalization.layers=linear with canonicalization.pooling=mean needs "
                "canonicalization.group=SO3: the mean-pooled linear frame spans at most a plane, and O3 has no "
                "cross product to complete it; use group=SO3, pooling=max or layers=nonlinear"
            )
        self.group_name = "SO(3)" if self.group == "SO3" else "O(3)"
        self.cross = self.group == "SO3"
        in_channels = 3 if self.cross else 2

        def block(c_in: int, c_out: int) -> VNLinearLeakyReLU:
            return VNLinearLeakyReLU(c_in, c_out, negative_slope=float(negative_slope), batch_norm=batch_norm)

        def pool(channels: int) -> nn.Module:
            return VNMaxPool(channels) if self.pooling == "max" else VNMeanPool(-1)

        if self.layers == "linear":
            # CN(L): the one linear VN layer, straight to the three frame vectors; pooling follows.
            self.input_layer: nn.Module = VNLinear(in_channels, 3)
            self.point_layers = nn.Sequential()
            self.read_out: nn.Module = nn.Identity()
            width = 3
        else:
            self.input_layer = block(in_channels, hidden_dim)
            self.point_layers = nn.Sequential(block(hidden_dim, hidden_dim))
            self.read_out = VNLinear(hidden_dim, 3)
            width = hidden_dim
        self.neighbour_pool = pool(width) if self.input == "edges" else None
        self.point_pool = pool(3)

    def input_features(self, points: torch.Tensor) -> torch.Tensor:
        """The balanced input channels of the centred cloud: ``(B, 2|3, 3, P, k)`` edges or
        ``(B, 2|3, 3, P)`` pointwise."""
        if points.dim() != 3 or points.shape[-1] != 3:
            raise ValueError(f"points must have shape (B, P, 3), got {tuple(points.shape)}")
        centred = points - points.mean(dim=1, keepdim=True)
        if self.input == "pointwise":
            return balance_channels(second_moment_channels(centred, self.cross))
        x = centred.transpose(1, 2).unsqueeze(1)  # (B, 1, 3, P)
        k = min(self.k, points.shape[1])  # type: ignore[type-var]
        # EXACT distances: the kNN graph of a rotated cloud must be the same graph.
        return balance_channels(graph_feature(x, k, cross=self.cross, compute_mode=EXACT))

    def frame_from_features(self, features: torch.Tensor) -> torch.Tensor:
        """The learned part of ``h``: input features (:meth:`input_features`) → the three pooled vectors
        ``(B, 3, 3)`` (rows are vectors). For CN(L) with mean pooling, a linear map of ``features``."""
        if self.neighbour_pool is not None:
            features = self.neighbour_pool(self.input_layer(features))  # (B, C, 3, P, k) → (B, C, 3, P)
        else:
            features = self.input_layer(features)
        features = self.point_layers(features)  # (B, C, 3, P)
        if self.pooling == "mean":
            # The read-out is linear, so it commutes with the mean: pooling first is P times less work.
            return self.read_out(vn_mean_pool(features))  # (B, 3, 3)
        return self.point_pool(self.read_out(features))  # (B, 3, 3, P) → (B, 3, 3)

    @property
    def pools_linearly(self) -> bool:
        """Whether the frame vectors are a linear map of the mean edge features (CN(L), mean pooling, edge
        input), so that :meth:`frame_vectors` can take :meth:`pooled_edge_frame_vectors`."""
        return self.layers == "linear" and self.pooling == "mean" and self.input == "edges"

    def frame_vectors(self, points: torch.Tensor) -> torch.Tensor:
        """The three pooled equivariant vectors ``(B, 3, 3)`` (rows are vectors) before Gram–Schmidt.

        CN(L) with mean pooling (:attr:`pools_linearly`, unless :attr:`collapse_linear` is off) takes
        :meth:`pooled_edge_frame_vectors`: the same map without the ``(B, 3, 3, P, k)`` edge tensor; every
        other configuration, and :meth:`reference_frame_vectors`, goes through :meth:`input_features` and
        :meth:`frame_from_features`."""
        if self.collapse_linear and self.pools_linearly:
            return self.pooled_edge_frame_vectors(points)
        return self.reference_frame_vectors(points)

    #: Let CN(L) with mean pooling take :meth:`pooled_edge_frame_vectors` (set ``False`` on an instance to
    #: time or test the reference path).
    collapse_linear: bool = True

    def reference_frame_vectors(self, points: torch.Tensor) -> torch.Tensor:
        """:meth:`frame_vectors` through the materialised input features, for every configuration."""
        return self.frame_from_features(self.input_features(points))

    def pooled_edge_frame_vectors(self, points: torch.Tensor) -> torch.Tensor:
        """CN(L)'s frame vectors ``v_o = Σ_c W_oc · mean_{i, j∈N(i)} e_c(i, j) / s_c`` ``(B, 3, 3)``, computed
        without the ``(B, 3, 3, P, k)`` edge tensor of :meth:`input_features` (:attr:`pools_linearly` only).

        The same function as :meth:`reference_frame_vectors`, term by term: the same kNN graph (the same call
        on the same centred coordinates), the same per-edge offsets ``x_j − x_i`` and cross products
        ``x_j × x_i`` (``(B, 3, P, k)`` instead of ``(B, 1, 3, P, k)``), the same clamped norms,
        so the same scales ``s_c`` (:func:`channel_scales`; the centres' mean norm over ``(P, k)`` is the one
        over ``P``, each point being repeated ``k`` times). What changes is the order of the operations:
        the balancing by ``s_c`` and the linear layer ``W`` act on the pooled means ``(B, 3, 3)`` instead of
        every edge, which they may since both are linear and the same for all edges of a cloud. Only
        summation orders differ, hence rounding: ``tests/test_pointcloud_fast_linear.py`` bounds it.
        Differentiable (the same gradients, to rounding), and as equivariant as the reference path.
        """
        if not self.pools_linearly:
            raise ValueError("pooled_edge_frame_vectors needs layers=linear, pooling=mean and input=edges")
        if points.dim() != 3 or points.shape[-1] != 3:
            raise ValueError(f"points must have shape (B, P, 3), got {tuple(points.shape)}")
        batch, num_points, _ = points.shape
        centred = points - points.mean(dim=1, keepdim=True)  # (B, P, 3)
        coordinates = centred.transpose(1, 2)  # (B, 3, P), the reference's layout
        k = min(self.k, num_points)  # type: ignore[type-var]
        # the reference's knn call on the same (B, 1, 3, P) view: the same graph. Its rows unsorted: only sums
        # over each point's neighbours are taken here, so their order changes rounding only
        idx = knn(coordinates.unsqueeze(1), k, compute_mode=EXACT, ordered=False)  # (B, P, k)
        # Coordinate-major (B, 3, P, k): one gather, and per-coordinate products on contiguous planes (a
        # third of the time of point-major (B, P, k, 3) tensors and torch.linalg.cross).
        coordinates = coordinates.contiguous()
        neighbours = coordinates.gather(2, idx.view(batch, 1, -1).expand(-1, 3, -1)).view(batch, 3, num_points, k)
        centres = coordinates.unsqueeze(-1)  # (B, 3, P, 1): x_i
        offsets = neighbours - centres  # x_j − x_i
        sums = [offsets.sum(dim=(2, 3)), coordinates.sum(dim=2) * k]  # (B, 3) each
        norms = [_clamped_norms(offsets).mean(dim=(1, 2)), _clamped_norms(coordinates).mean(dim=1)]  # (B,)
        if self.cross:
            (a0, a1, a2), (b0, b1, b2) = neighbours.unbind(1), centres.unbind(1)
            cross = torch.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], dim=1)  # x_j × x_i
            sums.append(cross.sum(dim=(2, 3)))
            norms.append(_clamped_norms(cross).mean(dim=(1, 2)))
        scales = torch.stack(norms, dim=1).clamp_min(VN_EPS)  # (B, C): channel_scales
        pooled = torch.stack(sums, dim=1) / (num_points * k) / scales.unsqueeze(-1)  # (B, C, 3)
        return torch.einsum("oc,bcd->bod", self.input_layer.weight, pooled)  # (B, 3, 3)

    def group_element(self, points: torch.Tensor) -> torch.Tensor:
        """``h(points) = R`` ``(B, 3, 3)``; its columns are the learned frame axes."""
        return self.frame_axes(points)[0]

    def frame_axes(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(R (B, 3, 3), degenerate (B,) bool)``: the frame, and where no equivariant one exists for the cloud
        (its pooled vectors parallel or zero: a cloud fixed by the rotations about an axis), so Gram–Schmidt fell
        back to a fixed axis (``groups.euclidean.gram_schmidt_frame``)."""
        return gram_schmidt_frame(self.frame_vectors(points).transpose(1, 2), self.group)  # type: ignore[arg-type]

    def canonicalize(
        self, points: torch.Tensor, *rest: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], EuclideanTransform]:
        """``((points R, *rest), (R, 0))``: ``points (B, P, 3) ↦ points R``; other inputs (e.g. the ShapeNet
        category) pass through. The element is a rotation about the origin (``EuclideanTransform``, t = 0)."""
        rotation, degenerate = self.frame_axes(points)
        return (invert_rotation(points, rotation), *rest), EuclideanTransform.from_rotation(rotation, degenerate)

    def symmetrization_error(self, mode: str) -> str | None:
        if mode == "full":
            return f"{self.group_name} is infinite: there is no full frame to average over; use weighted_frame or sampled"
        return None

    def build_frame(self, inputs: tuple[torch.Tensor, ...], spec: FrameSpec) -> Frame:
        """``weighted_frame`` or ``sampled`` rotations from the three pooled vectors
        (``symmetrization.vector_frame``, with this canonicalizer's Gram–Schmidt ``group``; an O3 weighted
        frame has ``2·frame_size`` members); the other inputs are repeated, as they pass through."""
        rotations, weights = vector_frame(self.frame_vectors(inputs[0]), self.group, spec)
        points, *rest = self.repeat_inputs(inputs, weights.shape[1])
        g = EuclideanTransform.from_rotation(rotations)
        return self.frame_of((invert_rotation(points, rotations), *rest), g, weights)


__all__ = [
    "GROUPS",
    "INPUTS",
    "LAYERS",
    "POOLINGS",
    "VNPointCloudCanonicalizer",
    "balance_channels",
    "channel_scales",
    "second_moment_channels",
]
