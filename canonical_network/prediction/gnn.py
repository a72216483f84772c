"""The GNN of Satorras et al. (2021): their non-equivariant N-body baseline, the paper's prediction network.

Paper §5.2 / Appendix G.2: "The GNN prediction network uses the same architecture as (Satorras et al.)":
4 layers, 64 hidden units, SiLU, residual node updates; nodes read position and velocity, edges the
charge product and the squared distance; a 2-layer decoder reads the position off each node's features.
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.nn.message_passing import (
    GraphConvLayer,
    flatten_nodes,
    fully_connected_edge_index,
    nbody_edge_attr,
)
from canonical_network.utils.checks import check_bool, check_int


class GNN(nn.Module):
    """Message-passing GNN on the complete graph of the particles, predicting their future positions.

    Node input ``[x_i, v_i]`` (6 numbers) → linear embedding → ``num_layers`` :class:`GraphConvLayer` →
    ``Linear–SiLU–Linear`` decoder → position. The decoder outputs the position itself, not a displacement
    added to ``x_i`` (as in both the EGNN and the canonical_network reference code).

    Equivariance: permutations of the particles only. Coordinates enter as raw features, so it is neither
    rotation nor translation equivariant — which is what canonicalization supplies.

    Args:
        hidden_dim: width of node features and messages (64 in the EGNN n-body runs, ``--nf``).
        num_layers: message-passing layers (4, ``--n_layers``).
        squared_distance_edge_attr: also give each edge ``‖x_i − x_j‖²`` next to ``q_i q_j``. True follows the
            canonical_network and Frame Averaging n-body code (``edges_in_nf=2``); False the EGNN
            repository's own GNN baseline, whose edges see only the charge product.
        residual: residual node updates (``recurrent=True`` in the reference runs).

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` → predicted positions ``(B, N, 3)``.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask",)

    #: node input: position (3) and velocity (3) concatenated.
    NODE_INPUT_DIM = 6

    def __init__(
        self,
        hidden_dim: int = 64,
        num_layers: int = 4,
        squared_distance_edge_attr: bool = True,
        residual: bool = True,
    ) -> None:
        super().__init__()
        self.hidden_dim = check_int("prediction.hidden_dim", hidden_dim, low=1)
        self.num_layers = check_int("prediction.num_layers", num_layers, low=1)
        self.squared_distance_edge_attr = check_bool(
            "prediction.squared_distance_edge_attr", squared_distance_edge_attr
        )
        check_bool("prediction.residual", residual)
        edge_attr_dim = 2 if squared_distance_edge_attr else 1
        self.embedding = nn.Linear(self.NODE_INPUT_DIM, hidden_dim)
        self.layers = nn.ModuleList(
            GraphConvLayer(hidden_dim, edge_attr_dim, residual=residual) for _ in range(num_layers)
        )
        self.decoder = nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, 3))

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        batch_size, num_nodes, _ = loc.shape
        edge_index = fully_connected_edge_index(batch_size, num_nodes, loc.device)
        loc_flat, vel_flat, charges_flat = flatten_nodes(loc), flatten_nodes(vel), flatten_nodes(charges)
        edge_attr = nbody_edge_attr(loc_flat, charges_flat, edge_index, self.squared_distance_edge_attr)
        h = self.embedding(torch.cat([loc_flat, vel_flat], dim=-1))
        for layer in self.layers:
            h = layer(h, edge_index, edge_attr)
        return self.decoder(h).reshape(batch_size, num_nodes, 3)
