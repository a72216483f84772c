"""The N-body layers compute the formulas of EGNN's reference code, checked entry by entry with explicit loops.

The models' other tests check their symmetry (E(3), permutations), shapes and training; a change that keeps the
symmetry (a sum for a mean over neighbours, a swapped edge direction, another invariant edge attribute, a sum over
the frames of frame averaging) passes those and changes every number Table 3 compares with the EGNN paper's. These
tests recompute each layer from its formula (vgsatorras/egnn: ``E_GCL_vel``, ``GCL_rf_vel``, ``GCL``), reusing
the layer's own MLPs, in float64. Tolerance: ``assert_close``'s float64 default (rtol 1e-7): the loop and the
vectorised layer differ only in summation order (a few ulps, ~1e-15 relative, on O(1) values), while any change
of formula moves the outputs by O(1e-2) or more.
"""
from __future__ import annotations

import torch

from canonical_network.nn.message_passing import (
    EquivariantGraphConvLayer,
    GraphConvLayer,
    fully_connected_edge_index,
    nbody_edge_attr,
)
from canonical_network.prediction.egnn import EGNN
from canonical_network.prediction.frame_averaging import FrameAveragingGNN
from canonical_network.prediction.linear import LinearDynamics
from canonical_network.prediction.radial_field import RadialFieldLayer


def _graph(n=4, seed=0, hidden=8):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(n, 3, generator=g, dtype=torch.float64)
    vel = torch.randn(n, 3, generator=g, dtype=torch.float64)
    q = torch.randn(n, 1, generator=g, dtype=torch.float64)
    h = torch.randn(n, hidden, generator=g, dtype=torch.float64)
    return pos, vel, q, h


def test_nbody_edge_attr_by_hand():
    loc = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 2.0]])
    q = torch.tensor([[2.0], [-3.0]])
    ei = fully_connected_edge_index(1, 2)
    assert nbody_edge_attr(loc, q, ei).tolist() == [[-6.0, 9.0], [-6.0, 9.0]]


def test_egnn_layer_matches_the_reference_formula_by_loops():
    """x_i += C mean_j (x_i - x_j) phi_x(m_ij) + phi_v(h_i) v_i ; h_i += phi_h([h_i, sum_j m_ij])."""
    torch.manual_seed(0)
    n, H = 4, 8
    layer = EquivariantGraphConvLayer(H, edge_attr_dim=2, coords_weight=0.7).double()
    pos, vel, q, h = _graph(n, hidden=H)
    ei = fully_connected_edge_index(1, n)
    attr = nbody_edge_attr(pos, q, ei)
    h_out, x_out = layer(h, pos, vel, ei, attr)
    for i in range(n):
        shift, msum = torch.zeros(3, dtype=torch.float64), torch.zeros(H, dtype=torch.float64)
        for e in range(ei.shape[1]):
            j, t = ei[:, e].tolist()
            if t != i:
                continue
            d = pos[i] - pos[j]
            m = layer.edge_mlp(torch.cat([h[i], h[j], d.pow(2).sum()[None], attr[e]]))
            shift += d * layer.coord_mlp(m)
            msum += m
        x_ref = pos[i] + 0.7 * shift / (n - 1) + layer.vel_mlp(h[i]) * vel[i]
        h_ref = h[i] + layer.node_mlp(torch.cat([h[i], msum]))
        torch.testing.assert_close(x_out[i], x_ref)
        torch.testing.assert_close(h_out[i], h_ref)


def test_egnn_edge_attributes_are_those_of_the_input_positions():
    torch.manual_seed(0)
    model = EGNN(hidden_dim=8, num_layers=3).double()
    pos, vel, q, _ = _graph(5)
    ei = fully_connected_edge_index(1, 5)
    attr = nbody_edge_attr(pos, q, ei)  # fixed: input positions, as main_nbody.py's loc_dist
    h, x = model.embedding(vel.norm(dim=-1, keepdim=True)), pos
    for layer in model.layers:
        h, x = layer(h, x, vel, ei, attr)
    torch.testing.assert_close(model(pos[None], vel[None], q[None])[0], x)


def test_gnn_layer_residual_by_hand():
    torch.manual_seed(0)
    layer = GraphConvLayer(8, 2, residual=True).double()
    pos, vel, q, h = _graph(3)
    ei = fully_connected_edge_index(1, 3)
    attr = nbody_edge_attr(pos, q, ei)
    out = layer(h, ei, attr)
    i = 0
    msum = sum(layer.edge_mlp(torch.cat([h[i], h[j], attr[e]])) for e, (j, t) in enumerate(ei.T.tolist()) if t == i)
    torch.testing.assert_close(out[i], h[i] + layer.node_mlp(torch.cat([h[i], msum])))


def test_radial_field_layer_by_loops():
    torch.manual_seed(0)
    n = 4
    layer = RadialFieldLayer(8, 2).double()
    torch.nn.init.normal_(layer.radial_mlp[2].weight)  # O(1) pulls so the pair term is visible
    pos, vel, q, _ = _graph(n)
    ei = fully_connected_edge_index(1, n)
    attr = nbody_edge_attr(pos, q, ei)
    speed = vel.norm(dim=-1, keepdim=True)
    out = layer(pos, vel, speed, ei, attr)
    for i in range(n):
        pull = torch.zeros(3, dtype=torch.float64)
        for e, (j, t) in enumerate(ei.T.tolist()):
            if t == i:
                d = pos[i] - pos[j]
                pull += d * layer.radial_mlp(torch.cat([d.norm()[None], attr[e]]))
        torch.testing.assert_close(out[i], pos[i] + pull / (n - 1) + vel[i] * layer.speed_mlp(speed[i]))


class _Lin(torch.nn.Module):
    def forward(self, loc, vel, q):
        return loc + 0.3 * vel


def test_frame_averaging_of_an_equivariant_map_is_that_map():
    """FA(f) = f when f is already O(3)-equivariant: catches a sum instead of a mean over the 8 frames, or a
    centre not added back / not subtracted."""
    model = FrameAveragingGNN().double()
    model.backbone = _Lin()
    pos, vel, q, _ = _graph(5)
    torch.testing.assert_close(model(pos[None], vel[None], q[None])[0], pos + 0.3 * vel)


def test_linear_dynamics_by_hand():
    model = LinearDynamics(init_time=0.5)
    loc, vel = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    torch.testing.assert_close(model(loc, vel, torch.ones(2, 5, 1)), loc + 0.5 * vel)
