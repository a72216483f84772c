"""Frame averaging (Puny et al. 2022) around the GNN: the "FA-GNN" row of the paper's N-body table (§5.2).

A frame is a small set of poses computed from the input itself: here the principal axes of the centred
positions (eigenvectors of their 3×3 scatter matrix), taken with all ``2³ = 8`` sign choices, because an
eigenvector is only defined up to sign. The backbone :class:`~canonical_network.prediction.gnn.GNN` runs on
the positions and velocities written in each of the 8 poses, each output is mapped back to the input's
pose, and the 8 predictions are averaged. Frame averaging is the fixed, hand-designed relative of a learned
canonicalization: where the paper's canonicalizer h picks one pose, the frame lists 8 and averages.

Reference: Puny et al., "Frame Averaging for Invariant and Equivariant Network Design", ICLR 2022, and their
code (omri1348/Frame-Averaging, ``nbody/n_body_system/model_FA.py``). Their FA-GNN also re-frames the latent
features between GNN layers; this module averages once around the whole GNN, as the issue specifies.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from canonical_network.prediction.gnn import GNN


class FrameAveragingGNN(nn.Module):
    """GNN averaged over the O(3) PCA frame of the particles; O(3)-, translation- and permutation-equivariant.

    With ``c`` the mean position and ``F_1 … F_8`` the eigenvector matrices of ``Σ_i (x_i − c)ᵀ(x_i − c)``
    (columns = principal axes) under the 8 sign flips of their columns::

        FA(x, v, q) = c + 1/8 Σ_k GNN((x − c) F_k, v F_k, q) F_kᵀ

    (row-vector points). Under ``x ↦ x Rᵀ + t``, ``v ↦ v Rᵀ`` with ``RᵀR = I``: ``c ↦ c Rᵀ + t`` and the
    set ``{F_k}`` ↦ ``{R F_k}``, so each term is unchanged in the frame and rotated back out:
    ``FA ↦ FA Rᵀ + t``. This holds when the three eigenvalues are distinct (for ``N ≥ 3`` particles in
    general position); with a repeated eigenvalue the eigenvectors are not unique beyond sign and the
    output is not equivariant — a known limitation of PCA frames.

    The frame carries no gradient: eigenvector gradients scale like ``1 / (λ_a − λ_b)`` and blow up for
    near-degenerate inputs, and the frame is a function of the input only (no parameters to train through
    it). Gradients with respect to the *inputs* therefore treat the frame as constant. The eigendecomposition
    runs in float64 whatever the model's dtype — cheap for ``(B, 3, 3)`` matrices, and it keeps float32
    models equivariant to ~1e-6 unless two eigenvalues nearly coincide.

    Args:
        hidden_dim, num_layers, squared_distance_edge_attr, residual: of the backbone :class:`GNN`.

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` → predicted positions ``(B, N, 3)``.
        The backbone runs on a batch of ``8·B`` systems.
    """

    def __init__(
        self,
        hidden_dim: int = 64,
        num_layers: int = 4,
        squared_distance_edge_attr: bool = True,
        residual: bool = True,
    ) -> None:
        super().__init__()
        self.backbone = GNN(hidden_dim, num_layers, squared_distance_edge_attr, residual)
        # (8, 3): every choice of orientation for the three principal axes; together with the eigenvector
        # matrix these are the O(3) frame. Not persistent: a constant, not state.
        signs = torch.tensor(list(itertools.product((1.0, -1.0), repeat=3)))
        self.register_buffer("axis_signs", signs, persistent=False)

    @torch.no_grad()
    def frames(self, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The frame of each system: its centre and its 8 orthogonal axis matrices.

        Args:
            loc: ``(B, N, 3)`` positions.

        Returns:
            ``center`` ``(B, 1, 3)`` and ``frames`` ``(B, 8, 3, 3)``, both in ``loc``'s dtype and without
            gradient; ``frames[b, k]`` has the principal axes (ascending variance) as columns, signed by
            ``axis_signs[k]``.
        """
        center = loc.mean(dim=1, keepdim=True)
        centred = (loc - center).to(torch.float64)
        scatter = centred.transpose(1, 2) @ centred  # (B, 3, 3)
        _, axes = torch.linalg.eigh(scatter)  # columns are eigenvectors
        frames = axes[:, None, :, :] * self.axis_signs.to(torch.float64)[None, :, None, :]
        return center, frames.to(loc.dtype)

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        batch_size, num_nodes, dim = loc.shape
        center, frames = self.frames(loc)
        num_frames = frames.shape[1]
        # Row-vector points: coordinates in frame F are x F; back in the input pose, y Fᵀ.
        loc_framed = torch.einsum("bnd,bkde->bkne", loc - center, frames)
        vel_framed = torch.einsum("bnd,bkde->bkne", vel, frames)
        charges_framed = charges[:, None].expand(batch_size, num_frames, num_nodes, charges.shape[-1])
        out_framed = self.backbone(
            loc_framed.reshape(batch_size * num_frames, num_nodes, dim),
            vel_framed.reshape(batch_size * num_frames, num_nodes, dim),
            charges_framed.reshape(batch_size * num_frames, num_nodes, -1),
        ).reshape(batch_size, num_frames, num_nodes, dim)
        out = torch.einsum("bkne,bkde->bknd", out_framed, frames)
        return out.mean(dim=1) + center
