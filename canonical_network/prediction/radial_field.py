"""Radial Field with velocity (Köhler et al. 2019, as the EGNN paper ran it): the "Radial Field" row of the
paper's N-body table (§5.2, Table 3; its number, 0.0104, is quoted from Satorras et al. 2021, Table 2).

Sources: the EGNN repository (vgsatorras/egnn), ``RF_vel`` in ``n_body_system/model.py`` and its layer
``GCL_rf_vel`` in ``models/gcl.py``; the inputs as ``main_nbody.py --model rf_vel`` builds them (node input
``‖v_i‖``, edge attributes ``q_i q_j`` and the squared distance of the input positions), and the set-up of the
README's run: 4 layers (``--n_layers 4``), 64 hidden units (``--nf`` default), SiLU, lr 2e-4
(configs/experiment/nbody/radial_field.yaml).

Deviations: none in the function computed. The distance ``‖x_i − x_j‖`` is taken with ``vector_norm`` (the
reference's ``sqrt`` of a sum of squares: the same value, but a zero gradient instead of NaN at coincident
particles).
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.utils import scatter

from canonical_network.nn.message_passing import flatten_nodes, fully_connected_edge_index, nbody_edge_attr
from canonical_network.utils.checks import check_int


class RadialFieldLayer(nn.Module):
    """One radial-field step: particles pulled along their differences, then pushed along their velocities.

    ``x_i ← x_i + mean_j (x_i − x_j) φ(‖x_i − x_j‖, a_ij) + v_i ψ(‖v_i‖)``, with ``φ`` ending in ``tanh``
    (the reference's own comment: added to keep the method stable) and ``ψ`` a scalar MLP of the speed.

    E(3)-equivariant for ``x ↦ x Rᵀ + t``, ``v ↦ v Rᵀ`` (any orthogonal ``R``): ``φ`` and ``ψ`` read
    invariants only, and positions move by multiples of ``x_i − x_j`` and ``v_i``. Permutation equivariant.

    Args:
        hidden_dim: hidden width of ``φ`` and ``ψ``.
        edge_attr_dim: width of the invariant ``a_ij``.

    Shapes: ``pos``, ``vel`` ``(B·N, 3)``, ``speed`` ``(B·N, 1)``, ``edge_index`` ``(2, E)``, ``edge_attr``
    ``(E, edge_attr_dim)`` → ``pos`` ``(B·N, 3)``.
    """

    #: gain of the Xavier-uniform init of φ's last (bias-free) layer, as in GCL_rf_vel: starts the pairwise
    #: pulls near zero.
    RADIAL_OUTPUT_GAIN = 0.001

    def __init__(self, hidden_dim: int = 64, edge_attr_dim: int = 2) -> None:
        super().__init__()
        check_int("prediction.hidden_dim", hidden_dim, low=1)
        check_int("edge_attr_dim", edge_attr_dim, low=0)
        radial_out = nn.Linear(hidden_dim, 1, bias=False)
        nn.init.xavier_uniform_(radial_out.weight, gain=self.RADIAL_OUTPUT_GAIN)
        self.radial_mlp = nn.Sequential(nn.Linear(1 + edge_attr_dim, hidden_dim), nn.SiLU(), radial_out, nn.Tanh())
        self.speed_mlp = nn.Sequential(nn.Linear(1, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, 1))

    def forward(
        self,
        pos: torch.Tensor,
        vel: torch.Tensor,
        speed: torch.Tensor,
        edge_index: torch.Tensor,
        edge_attr: torch.Tensor,
    ) -> torch.Tensor:
        source, target = edge_index
        diff = pos[target] - pos[source]  # (E, 3): x_i − x_j, aggregated at i
        distance = torch.linalg.vector_norm(diff, dim=-1, keepdim=True)
        pulls = diff * self.radial_mlp(torch.cat([distance, edge_attr], dim=-1))
        pos = pos + scatter(pulls, target, dim=0, dim_size=pos.shape[0], reduce="mean")
        return pos + vel * self.speed_mlp(speed)


class RadialField(nn.Module):
    """``num_layers`` :class:`RadialFieldLayer` steps from the input positions; the last positions are the
    prediction. The speeds, velocities and edge attributes are those of the input state in every layer.

    Equivariance: E(3) and permutations, exactly (each layer is).

    Args:
        hidden_dim: hidden width of every layer's MLPs (64, EGNN's ``--nf``).
        num_layers: layers (4, ``--n_layers 4`` of the README's ``rf_vel`` run).

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` → predicted positions ``(B, N, 3)``.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask",)

    #: edge input: charge product and squared input distance (``edge_attr_nf=2`` in main_nbody.py).
    EDGE_ATTR_DIM = 2

    def __init__(self, hidden_dim: int = 64, num_layers: int = 4) -> None:
        super().__init__()
        self.hidden_dim = check_int("prediction.hidden_dim", hidden_dim, low=1)
        self.num_layers = check_int("prediction.num_layers", num_layers, low=1)
        self.layers = nn.ModuleList(RadialFieldLayer(hidden_dim, self.EDGE_ATTR_DIM) for _ in range(num_layers))

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        batch_size, num_nodes, dim = loc.shape
        edge_index = fully_connected_edge_index(batch_size, num_nodes, loc.device)
        pos, vel_flat, charges_flat = flatten_nodes(loc), flatten_nodes(vel), flatten_nodes(charges)
        edge_attr = nbody_edge_attr(pos, charges_flat, edge_index, squared_distance=True)
        speed = torch.linalg.vector_norm(vel_flat, dim=-1, keepdim=True)
        for layer in self.layers:
            pos = layer(pos, vel_flat, speed, edge_index, edge_attr)
        return pos.reshape(batch_size, num_nodes, dim)
