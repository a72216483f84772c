"""EGNN with velocity (Satorras et al. 2021), the "EGNN" row of the paper's N-body table (§5.2, Table 3).

Set-up of the EGNN repository's n-body experiment (``main_nbody.py --model egnn_vel``): node feature
``‖v_i‖``, edge attributes ``q_i q_j`` and the squared distance of the input positions, 4 layers of
``E_GCL_vel`` with 64 hidden units, SiLU, ``coords_weight = 1``, residual node updates, and the positions
after the last layer as the prediction.
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.nn.message_passing import (
    EquivariantGraphConvLayer,
    flatten_nodes,
    fully_connected_edge_index,
    nbody_edge_attr,
)
from canonical_network.utils.checks import check_bool, check_int


class EGNN(nn.Module):
    """E(3)-equivariant GNN that moves the particles layer by layer and returns their final positions.

    Equivariance, by construction: for any rotation or reflection ``R`` (``RᵀR = I``), translation ``t`` and
    permutation ``P`` of the particles, ``EGNN(P(x Rᵀ + t), P(v Rᵀ), P q) = P(EGNN(x, v, q) Rᵀ + t)``.
    Node and edge inputs are invariants (``‖v_i‖``, ``q_i q_j``, ``‖x_i − x_j‖²``); positions change only by
    multiples of ``x_i − x_j`` and ``v_i``.

    Args:
        hidden_dim: width of node features and messages (64, ``--nf``).
        num_layers: :class:`EquivariantGraphConvLayer` layers (4, ``--n_layers``).
        coords_weight: scale of the position messages (1.0 in the reference).
        residual: residual node updates (``recurrent=True`` in the reference n-body run).

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` → predicted positions ``(B, N, 3)``.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask",)

    #: node input: the speed ‖v_i‖, the only rotation-invariant per-particle quantity the reference uses.
    NODE_INPUT_DIM = 1
    #: edge input: charge product and squared input distance (``in_edge_nf=2`` in the reference).
    EDGE_ATTR_DIM = 2

    def __init__(
        self, hidden_dim: int = 64, num_layers: int = 4, coords_weight: float = 1.0, residual: bool = True
    ) -> None:
        super().__init__()
        self.hidden_dim = check_int("prediction.hidden_dim", hidden_dim, low=1)
        self.num_layers = check_int("prediction.num_layers", num_layers, low=1)
        check_bool("prediction.residual", residual)
        self.embedding = nn.Linear(self.NODE_INPUT_DIM, hidden_dim)
        # Only positions leave the network, so the last layer's feature update would be dead weight (the
        # reference computes and discards it; same outputs, 3·H² + 2·H fewer parameters here).
        self.layers = nn.ModuleList(
            EquivariantGraphConvLayer(
                hidden_dim, self.EDGE_ATTR_DIM, coords_weight, residual, update_features=i < num_layers - 1
            )
            for i in range(num_layers)
        )

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        batch_size, num_nodes, dim = loc.shape
        edge_index = fully_connected_edge_index(batch_size, num_nodes, loc.device)
        pos, vel_flat, charges_flat = flatten_nodes(loc), flatten_nodes(vel), flatten_nodes(charges)
        edge_attr = nbody_edge_attr(pos, charges_flat, edge_index, squared_distance=True)
        # vector_norm's gradient at v = 0 is 0, not NaN, so resting particles are safe to train on.
        h = self.embedding(torch.linalg.vector_norm(vel_flat, dim=-1, keepdim=True))
        for layer in self.layers:
            h, pos = layer(h, pos, vel_flat, edge_index, edge_attr)
        return pos.reshape(batch_size, num_nodes, dim)
