"""Frame averaging (Puny et al. 2022) of the N-body GNN: the "FA-GNN" row of the paper's N-body table (§5.2).

A frame is a small set of poses computed from the input itself: here the principal axes of a centred point
set (eigenvectors of its 3×3 scatter matrix), taken with all ``2³ = 8`` sign choices, because an eigenvector
is only defined up to sign. A network run on the points written in each of the 8 poses, its outputs mapped
back to the input's pose and averaged, is O(3)-equivariant whatever the network. Frame averaging is the
fixed, hand-designed relative of a learned canonicalization: where the paper's canonicalizer h picks one
pose, the frame lists 8 and averages.

Two ways of wrapping the GNN (:class:`~canonical_network.prediction.gnn.GNN`) live here:

* :class:`LayerwiseFrameAveragingGNN` — Puny et al.'s N-body FA-GNN, the model the paper's FA-GNN row is
  taken from (configs ``prediction=fa_gnn``, ``experiment=nbody/fa_gnn``): the latent node features are
  read as 3-vectors, and the frame is recomputed from them between every two GNN layers.
* :class:`FrameAveragingGNN` — our simpler variant: one frame of the input positions, averaged around the
  whole GNN (``prediction=fa_gnn_global``, ``experiment=nbody/fa_gnn_global``).

Reference: Puny, Atzmon, Ben-Hamu, Misra, Grover, Smith, Lipman, "Frame Averaging for Invariant and
Equivariant Network Design", ICLR 2022; code omri1348/Frame-Averaging, ``nbody/n_body_system/model_FA.py``
(model) with ``nbody/models/gcl.py`` (its GNN layer) and ``nbody/nbody.py`` (inputs and training set-up).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
from torch import nn

from canonical_network.nn.message_passing import (
    flatten_nodes,
    fully_connected_edge_index,
    nbody_edge_attr,
)
from canonical_network.prediction.gnn import GNN
from canonical_network.utils.checks import check_int

#: Every choice of orientation of the three principal axes: ``(8, 3)`` of ±1, half of them reflections.
AXIS_SIGNS: tuple[tuple[float, float, float], ...] = tuple(itertools.product((1.0, -1.0), repeat=3))
NUM_FRAMES = len(AXIS_SIGNS)


class PCAFrame(NamedTuple):
    """The PCA frame of a batch of point sets: a centre and 8 orthogonal axis matrices per set.

    Attributes:
        center: ``(B, 1, 3)`` mean of the points; differentiable (only the axes are constants).
        axes: ``(B, 8, 3, 3)`` in the points' dtype, no gradient; ``axes[b, k]`` holds the principal axes as
            columns (ascending variance), the columns signed by ``AXIS_SIGNS[k]``.
        variances: ``(B, 3)`` float64 eigenvalues of the scatter matrix, ascending. The axes are unique up to
            sign only where they are distinct; ``λ_max / min_a (λ_{a+1} − λ_a)`` is the frame's condition
            number (eigenvector perturbation ≤ ‖δS‖ / gap, Davis–Kahan).
    """

    center: torch.Tensor
    axes: torch.Tensor
    variances: torch.Tensor


def pca_frame(points: torch.Tensor) -> PCAFrame:
    """The PCA frame of ``points`` ``(B, M, 3)`` (row vectors): ``Σ_m (p_m − c)ᵀ(p_m − c) = F diag(λ) Fᵀ``.

    Equivariance: for ``points ↦ points Rᵀ + t`` with ``RᵀR = I``, ``c ↦ c Rᵀ + t``, ``λ`` is unchanged and
    the *set* ``{F_k}`` becomes ``{R F_k}`` (which member is which may change, since ``eigh`` picks signs
    arbitrarily; frame averages do not care about the order). Invariant to permutations of the ``M`` points.

    The eigendecomposition runs in float64 whatever the input dtype (cheap for 3×3 matrices) and carries no
    gradient: eigenvector gradients scale like ``1 / (λ_a − λ_b)`` and blow up near degenerate inputs; the
    reference code detaches it as well.
    """
    center = points.mean(dim=1, keepdim=True)
    centred = (points.detach() - center.detach()).to(torch.float64)
    scatter = centred.transpose(1, 2) @ centred  # (B, 3, 3)
    variances, principal_axes = torch.linalg.eigh(scatter)  # columns are eigenvectors
    signs = torch.tensor(AXIS_SIGNS, dtype=torch.float64, device=points.device)
    axes = principal_axes[:, None, :, :] * signs[None, :, None, :]
    return PCAFrame(center, axes.to(points.dtype), variances)


def into_frames(vectors: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """Coordinates of ``vectors`` ``(B, N, C, 3)`` in each frame ``axes`` ``(B, K, 3, 3)``: ``v F_k``.

    Returns ``(B, K, N, C, 3)``. Vectors only: centre points before calling.
    """
    return torch.einsum("bncd,bkde->bknce", vectors, axes)


def average_out_of_frames(framed: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """Map ``framed`` ``(B, K, N, C, 3)`` back from each frame (``y F_kᵀ``) and average over the ``K`` frames.

    Returns ``(B, N, C, 3)``: equivariant vectors if the framed values are invariant (as a set over ``k``).
    """
    return torch.einsum("bknce,bkde->bkncd", framed, axes).mean(dim=1)


class LayerwiseFrameAveragingGNN(nn.Module):
    """Puny et al.'s N-body FA-GNN: the GNN with its latent 3-vectors re-framed by PCA between every layer.

    The GNN's modules (embedding, ``L`` :class:`~canonical_network.nn.message_passing.GraphConvLayer`,
    decoder) are those of :class:`~canonical_network.prediction.gnn.GNN`; the ``H`` hidden features of a
    node are read as ``H/3`` vectors in R³ (``H`` a multiple of 3; their runs use ``H = 60``). Each system is
    copied into 8 poses, a batch of ``8·B`` graphs:

    0. Frame ``F⁰`` of the positions ``x`` (centre ``c``). Node input ``[(x_i − c) F⁰_k, v_i F⁰_k]``;
       edge input ``[q_i q_j, ‖x_i − x_j‖²]`` (the same in every pose); linear embedding.
    1. For ``l = 1 … L−1``: GNN layer ``l`` in each pose; the node features, read as ``(H/3, 3)``, mapped
       back out of their poses and averaged, ``u = 1/8 Σ_k h_k F^{l−1}_kᵀ`` — now ``H/3`` equivariant
       vectors per node; a new frame ``F^l`` from the PCA of all ``N·H/3`` vectors ``u`` of the system,
       centred by their mean ``ū``; the features re-written as ``(u − ū) F^l_k``.
    2. Last GNN layer in each pose, decoder to one 3-vector per node and pose, mapped back with the last
       frame and averaged; plus ``c``: ``x̂ = c + 1/8 Σ_k dec(h_k) F^{L−1}_kᵀ``.

    Equivariance, for ``x ↦ x Rᵀ + t``, ``v ↦ v Rᵀ``, ``RᵀR = I``, by induction over the layers: the
    framed features are invariant as a set over the 8 poses, since each frame turns with the input
    (``F ↦ R F``) and the centres absorb ``t``; the GNN acts pose by pose, so its outputs are invariant too;
    mapping back and averaging gives vectors ``u ↦ u Rᵀ`` — equivariant, translation invariant (no centre is
    added back to latents), whose own frame again turns with ``R``. The final map adds the input centre,
    so ``x̂ ↦ x̂ Rᵀ + t``. Edge inputs are invariant. Permutations of the particles: the frames are sums over
    particles and the GNN is permutation equivariant. Exact where every scatter matrix — of the positions and
    of each layer's latent vectors — has three distinct eigenvalues, as for PCA frames in general; the
    returned :class:`PCAFrame` variances say how far from degenerate each one is.

    Where this differs from the reference code, none of which changes the function computed:

    * the number of particles is read from the input (the reference hard-codes 5);
    * eigendecompositions in float64 (reference: float32 ``symeig``), for tighter equivariance;
    * poses are batched system-major ``(B, 8, N)`` rather than pose-major ``(8, B, N)`` — a relabelling of
      disjoint graphs.

    The latent centring ``u − ū`` is kept as in the reference: it removes the mean latent vector of each
    system at every layer (translation invariance does not need it, since ``u`` is already invariant).

    Args:
        hidden_dim: node feature width ``H``, a multiple of 3 (60 in the reference runs, ``--nf 60``).
        num_layers: GNN layers ``L`` (4, ``--n_layers``); ``L − 1`` latent re-framings.
        squared_distance_edge_attr: give edges ``‖x_i − x_j‖²`` next to ``q_i q_j`` (the reference does).
        residual: residual node updates (``recurrent=True`` in the reference).

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` → predicted positions ``(B, N, 3)``.
        :meth:`forward_with_frames` also returns the ``L`` frames used.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask",)

    def __init__(
        self,
        hidden_dim: int = 60,
        num_layers: int = 4,
        squared_distance_edge_attr: bool = True,
        residual: bool = True,
    ) -> None:
        super().__init__()
        check_int("prediction.hidden_dim", hidden_dim, low=3)
        if hidden_dim % 3:
            raise ValueError(
                f"prediction.hidden_dim must be a multiple of 3 (features are read as 3-vectors); got {hidden_dim!r}"
            )
        # The plain GNN holds the layers; this class only changes how features flow between them.
        self.backbone = GNN(hidden_dim, num_layers, squared_distance_edge_attr, residual)
        self.num_vectors = hidden_dim // 3

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        return self.forward_with_frames(loc, vel, charges)[0]

    def forward_with_frames(
        self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[PCAFrame, ...]]:
        """Predicted positions ``(B, N, 3)`` and the frames of the ``L`` layers: ``[0]`` of the input
        positions (``M = N`` points), ``[l ≥ 1]`` of the latent vectors after layer ``l`` (``M = N·H/3``)."""
        batch_size, num_nodes, dim = loc.shape
        gnn = self.backbone
        hidden_dim = gnn.hidden_dim

        frame = pca_frame(loc)
        frames = [frame]
        node_vectors = torch.stack([loc - frame.center, vel], dim=2)  # (B, N, 2, 3)
        h = gnn.embedding(into_frames(node_vectors, frame.axes).reshape(-1, 2 * dim))

        # Edge inputs are invariant: computed once per system, shared by its 8 poses.
        edge_attr = nbody_edge_attr(
            flatten_nodes(loc),
            flatten_nodes(charges),
            fully_connected_edge_index(batch_size, num_nodes, loc.device),
            gnn.squared_distance_edge_attr,
        )
        edge_attr = edge_attr.reshape(batch_size, 1, -1, edge_attr.shape[-1]).expand(-1, NUM_FRAMES, -1, -1)
        edge_attr = edge_attr.reshape(-1, edge_attr.shape[-1])
        edge_index = fully_connected_edge_index(batch_size * NUM_FRAMES, num_nodes, loc.device)

        last = len(gnn.layers) - 1
        for depth, layer in enumerate(gnn.layers):
            h = layer(h, edge_index, edge_attr)
            if depth == last:
                break
            framed = h.reshape(batch_size, NUM_FRAMES, num_nodes, self.num_vectors, dim)
            latent = average_out_of_frames(framed, frame.axes)  # (B, N, H/3, 3), equivariant
            frame = pca_frame(latent.reshape(batch_size, -1, dim))
            frames.append(frame)
            h = into_frames(latent - frame.center[:, :, None, :], frame.axes).reshape(-1, hidden_dim)

        framed_out = gnn.decoder(h).reshape(batch_size, NUM_FRAMES, num_nodes, 1, dim)
        out = average_out_of_frames(framed_out, frame.axes).squeeze(2) + frames[0].center
        return out, tuple(frames)


class FrameAveragingGNN(nn.Module):
    """FA around the whole GNN (our variant): one PCA frame of the positions, the GNN run in its 8 poses.

    Not Puny et al.'s N-body model (that is :class:`LayerwiseFrameAveragingGNN`): the frame here comes from
    the input positions only and the GNN runs unchanged inside it: frame averaging exactly as their general
    recipe states it, applied once to the whole network. With ``c`` the mean position and ``F_1 … F_8`` the
    eigenvector matrices of ``Σ_i (x_i − c)ᵀ(x_i − c)`` (columns = principal axes) under the 8 sign flips::

        FA(x, v, q) = c + 1/8 Σ_k GNN((x − c) F_k, v F_k, q) F_kᵀ

    (row-vector points). Under ``x ↦ x Rᵀ + t``, ``v ↦ v Rᵀ`` with ``RᵀR = I``: ``c ↦ c Rᵀ + t`` and the
    set ``{F_k}`` ↦ ``{R F_k}``, so each term is unchanged in the frame and rotated back out:
    ``FA ↦ FA Rᵀ + t``. This holds when the three eigenvalues are distinct (for ``N ≥ 3`` particles in
    general position); with a repeated eigenvalue the eigenvectors are not unique beyond sign and the
    output is not equivariant — a known limitation of PCA frames. Gradients treat the frame as constant
    (see :func:`pca_frame`).

    Args:
        hidden_dim, num_layers, squared_distance_edge_attr, residual: of the backbone :class:`GNN`.

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` → predicted positions ``(B, N, 3)``.
        The backbone runs on a batch of ``8·B`` systems.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask",)

    def __init__(
        self,
        hidden_dim: int = 64,
        num_layers: int = 4,
        squared_distance_edge_attr: bool = True,
        residual: bool = True,
    ) -> None:
        super().__init__()
        self.backbone = GNN(hidden_dim, num_layers, squared_distance_edge_attr, residual)

    @torch.no_grad()
    def frames(self, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The frame of each system: its centre ``(B, 1, 3)`` and its 8 axis matrices ``(B, 8, 3, 3)``.

        Both in ``loc``'s dtype and without gradient; ``frames[b, k]`` has the principal axes (ascending
        variance) as columns, signed by ``AXIS_SIGNS[k]``.
        """
        frame = pca_frame(loc)
        return frame.center, frame.axes

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        batch_size, num_nodes, dim = loc.shape
        center, axes = self.frames(loc)
        framed = into_frames(torch.stack([loc - center, vel], dim=2), axes)  # (B, 8, N, 2, 3)
        framed = framed.reshape(batch_size * NUM_FRAMES, num_nodes, 2, dim)
        charges_framed = (
            charges[:, None].expand(-1, NUM_FRAMES, -1, -1).reshape(-1, num_nodes, charges.shape[-1])
        )
        out_framed = self.backbone(framed[:, :, 0], framed[:, :, 1], charges_framed)
        out_framed = out_framed.reshape(batch_size, NUM_FRAMES, num_nodes, 1, dim)
        return average_out_of_frames(out_framed, axes).squeeze(2) + center
