"""Message passing on batches of small fully connected graphs (the N-body particle systems).

Conventions (PyG's): a batch of ``B`` graphs with ``N`` nodes each is flattened to ``B·N`` nodes, graph ``b``
owning nodes ``b·N … b·N + N − 1``; ``edge_index`` is ``(2, E)`` int64 with row 0 the source ``j`` and row 1
the target ``i``; messages ``m_ij`` flow from ``j`` to ``i`` and are aggregated at ``i``.

Layers (after Satorras et al. 2021, "E(n) Equivariant Graph Neural Networks", and their public code,
``models/gcl.py`` of vgsatorras/egnn):

* :class:`GraphConvLayer` — the plain GNN layer of their GNN baseline. Not equivariant to rotations: it sees
  raw coordinates through the node features.
* :class:`EquivariantGraphConvLayer` — the E(n)-equivariant layer with a velocity term (their ``E_GCL_vel``):
  updates invariant node features ``h`` and equivariant positions ``x`` together.

The graphs are built in plain torch (:func:`fully_connected_edge_index`) because PyG's ``knn_graph`` /
``radius_graph`` need ``pyg-lib``/``torch-cluster``, which this environment does not have.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import degree

from canonical_network.utils.checks import check_bool, check_int, check_number


def fully_connected_edge_index(
    batch_size: int, num_nodes: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Edges of ``batch_size`` disjoint complete graphs on ``num_nodes`` nodes each, without self loops.

    Args:
        batch_size: number of graphs ``B`` (>= 0).
        num_nodes: nodes per graph ``N`` (>= 0).
        device: where the result lives.

    Returns:
        ``(2, B·N·(N−1))`` int64: row 0 the source ``j``, row 1 the target ``i``, with nodes numbered in
        the flattened ``(B·N)`` layout. Order: graph by graph; within a graph by source, then by target
        (the order of the nested loops in the EGNN repository's ``NBodyDataset.get_edges``).
    """
    check_int("batch_size", batch_size, low=0)
    check_int("num_nodes", num_nodes, low=0)
    # source j, each with the N − 1 targets t ≠ j in increasing order: t = s + (s ≥ j) for s = 0 … N − 2.
    # Arithmetic, not a mask over the N² pairs, so the shape is known before the values (torch.compile
    # traces it without a graph break)
    others = max(num_nodes - 1, 0)
    source = torch.arange(num_nodes, device=device).repeat_interleave(others)
    slot = torch.arange(others, device=device).repeat(num_nodes)
    target = slot + (slot >= source).long()
    one_graph = torch.stack([source, target])  # (2, N·(N−1))
    offsets = torch.arange(batch_size, device=device) * num_nodes  # first node of each graph
    return (one_graph[:, None, :] + offsets[None, :, None]).reshape(2, -1)


def flatten_nodes(x: torch.Tensor) -> torch.Tensor:
    """``(B, N, C)`` → ``(B·N, C)``, the node layout :func:`fully_connected_edge_index` numbers."""
    return x.reshape(-1, x.shape[-1])


def nbody_edge_attr(
    loc: torch.Tensor, charges: torch.Tensor, edge_index: torch.Tensor, squared_distance: bool = True
) -> torch.Tensor:
    """Invariant edge attributes of the N-body graphs: ``q_i q_j`` and, optionally, ``‖x_i − x_j‖²``.

    The charge product is the ``edges`` array of the Kipf et al. simulator that the EGNN code feeds as its
    edge attribute; the squared distance of the *input* positions is appended by the EGNN and FA n-body
    scripts (``loc_dist`` in ``main_nbody.py``). Both are E(3)-invariant, so equivariant layers may use them.

    Args:
        loc: ``(B·N, 3)`` positions.
        charges: ``(B·N, 1)`` charges.
        edge_index: ``(2, E)``.
        squared_distance: append ``‖x_i − x_j‖²``.

    Returns:
        ``(E, 2)`` if ``squared_distance`` else ``(E, 1)``.
    """
    source, target = edge_index
    attrs = [charges[target] * charges[source]]
    if squared_distance:
        attrs.append((loc[target] - loc[source]).pow(2).sum(dim=-1, keepdim=True))
    return torch.cat(attrs, dim=-1)


class GraphConvLayer(MessagePassing):
    """Plain graph convolution of the EGNN paper's GNN baseline (``GCL`` in their code).

    ``m_ij = φ_e([h_i, h_j, a_ij])``, ``h_i ← h_i + φ_h([h_i, Σ_j m_ij])`` (the residual is their
    ``recurrent=True``, used in the n-body runs). Permutation equivariant; equivariant to nothing else
    beyond what its inputs already are.

    Args:
        hidden_dim: width ``H`` of node features and messages.
        edge_attr_dim: width of ``a_ij``.
        residual: add the update to ``h`` instead of replacing it.

    Shapes: ``h`` ``(B·N, H)``, ``edge_index`` ``(2, E)``, ``edge_attr`` ``(E, edge_attr_dim)``
    → ``(B·N, H)``.
    """

    def __init__(self, hidden_dim: int = 64, edge_attr_dim: int = 2, residual: bool = True) -> None:
        super().__init__(aggr="add")
        # The layers are built by the N-body predictors only (configs/prediction/{gnn,egnn,fa_gnn}.yaml), so
        # their config-facing arguments are named under ``prediction.``; edge_attr_dim comes from code.
        check_int("prediction.hidden_dim", hidden_dim, low=1)
        check_int("edge_attr_dim", edge_attr_dim, low=0)
        self.residual = check_bool("prediction.residual", residual)
        self.edge_mlp = nn.Sequential(
            nn.Linear(2 * hidden_dim + edge_attr_dim, hidden_dim),
            nn.SiLU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.SiLU(),
        )
        self.node_mlp = nn.Sequential(
            nn.Linear(2 * hidden_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, hidden_dim)
        )

    def forward(self, h: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        messages = self.propagate(edge_index, h=h, edge_attr=edge_attr)
        update = self.node_mlp(torch.cat([h, messages], dim=-1))
        return h + update if self.residual else update

    def message(self, h_i: torch.Tensor, h_j: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        return self.edge_mlp(torch.cat([h_i, h_j, edge_attr], dim=-1))


class EquivariantGraphConvLayer(MessagePassing):
    """E(n)-equivariant graph convolution with the EGNN paper's velocity extension (``E_GCL_vel``).

    With ``m_ij = φ_e([h_i, h_j, ‖x_i − x_j‖², a_ij])``:

    * ``x_i ← x_i + C · mean_j (x_i − x_j) φ_x(m_ij) + φ_v(h_i) v_i``   (``C = coords_weight``)
    * ``h_i ← h_i + φ_h([h_i, Σ_j m_ij])``

    The velocity gate ``φ_v`` reads ``h`` before its update, as in the reference. For ``g = (R, t)`` in E(3)
    acting by ``x ↦ x Rᵀ + t``, ``v ↦ v Rᵀ`` and invariant ``h``, ``a``: the layer maps ``(h, g·x, R v)`` to
    ``(h', g·x')``, since only differences and norms of positions and scalar multiples of ``x_i − x_j`` and
    ``v_i`` enter. Also permutation equivariant.

    The reference clamps each coordinate of each position message to ±100; its own comment says this never
    fires, and a per-coordinate clamp would break rotation equivariance, so it is left out here.

    Args:
        hidden_dim: width ``H`` of node features and messages.
        edge_attr_dim: width of the invariant ``a_ij``.
        coords_weight: ``C`` above; 1.0 in the EGNN n-body runs.
        residual: residual ``h`` update (``recurrent=True`` in the reference n-body runs).
        update_features: compute the new ``h``. False for a last layer whose ``h`` nobody reads: the output
            is the same, and the otherwise unused ``φ_h`` weights would trip DDP's unused-parameter check.

    Shapes: ``h`` ``(B·N, H)``, ``pos`` and ``vel`` ``(B·N, 3)``, ``edge_index`` ``(2, E)``, ``edge_attr``
    ``(E, edge_attr_dim)`` → ``(h (B·N, H), pos (B·N, 3))`` (``h`` returned unchanged if not
    ``update_features``).
    """

    #: gain of the Xavier-uniform init of φ_x's last layer, from the reference ``E_GCL``: starts the position
    #: updates near zero so the first steps are dominated by the velocity term.
    COORD_OUTPUT_GAIN = 0.001

    def __init__(
        self,
        hidden_dim: int = 64,
        edge_attr_dim: int = 2,
        coords_weight: float = 1.0,
        residual: bool = True,
        update_features: bool = True,
    ) -> None:
        super().__init__(aggr="add")
        check_int("prediction.hidden_dim", hidden_dim, low=1)
        check_int("edge_attr_dim", edge_attr_dim, low=0)
        self.hidden_dim = hidden_dim
        self.coords_weight = check_number("prediction.coords_weight", coords_weight, finite=True)
        self.residual = check_bool("prediction.residual", residual)
        self.update_features = check_bool("update_features", update_features)
        # +1: the squared distance of the current positions, recomputed in every layer.
        self.edge_mlp = nn.Sequential(
            nn.Linear(2 * hidden_dim + 1 + edge_attr_dim, hidden_dim),
            nn.SiLU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.SiLU(),
        )
        self.node_mlp = (
            nn.Sequential(nn.Linear(2 * hidden_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, hidden_dim))
            if update_features
            else None
        )
        coord_out = nn.Linear(hidden_dim, 1, bias=False)
        nn.init.xavier_uniform_(coord_out.weight, gain=self.COORD_OUTPUT_GAIN)
        self.coord_mlp = nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.SiLU(), coord_out)
        self.vel_mlp = nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, 1))

    def forward(
        self,
        h: torch.Tensor,
        pos: torch.Tensor,
        vel: torch.Tensor,
        edge_index: torch.Tensor,
        edge_attr: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # One pass carries both sums: the messages (for h) and the position shifts (for x).
        summed = self.propagate(edge_index, h=h, pos=pos, edge_attr=edge_attr)
        message_sum, shift_sum = summed.split([self.hidden_dim, pos.shape[-1]], dim=-1)
        # The reference averages the position shifts over the neighbours (unsorted_segment_mean).
        in_degree = degree(edge_index[1], num_nodes=pos.shape[0], dtype=pos.dtype).clamp(min=1).unsqueeze(-1)
        pos = pos + self.coords_weight * shift_sum / in_degree + self.vel_mlp(h) * vel
        if self.node_mlp is None:
            return h, pos
        update = self.node_mlp(torch.cat([h, message_sum], dim=-1))
        h = h + update if self.residual else update
        return h, pos

    def message(
        self,
        h_i: torch.Tensor,
        h_j: torch.Tensor,
        pos_i: torch.Tensor,
        pos_j: torch.Tensor,
        edge_attr: torch.Tensor,
    ) -> torch.Tensor:
        diff = pos_i - pos_j
        squared_distance = diff.pow(2).sum(dim=-1, keepdim=True)
        m_ij = self.edge_mlp(torch.cat([h_i, h_j, squared_distance, edge_attr], dim=-1))
        return torch.cat([m_ij, diff * self.coord_mlp(m_ij)], dim=-1)
