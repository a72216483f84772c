"""SE(3)-Transformer (Fuchs et al. 2020) as the EGNN paper ran it on N-body: the "SE(3)-Transformer" row of the
paper's N-body table (§5.2, Table 3; its number, 0.0244, is quoted from Satorras et al. 2021, Table 2).

Sources: the EGNN repository (vgsatorras/egnn), ``n_body_system/se3_dynamics/``: ``dynamics.py``
(``OurDynamics``: inputs, read-out), ``models.py`` (``OurSE3Transformer``: the layer stack and its learned
output scale ``scalar_trick``) and ``equivariant_attention/modules.py`` (``GSE3Res``, ``GMABSE3``,
``GConvSE3Partial``, ``G1x1SE3``, ``GNormSE3``); its README's run ``main_nbody.py --model se3_transformer
--div 1 --degree 3 --nf 64 --lr 5e-3`` with the default ``--n_layers 4``: ``main_nbody.py`` passes
``int(nf / degree)`` = 21 channels per degree, degrees 0, 1 and 2, one attention head, ``div`` 1 (values as
wide as the layer), ReLU. The attention follows the same construction as e3nn's documented SE(3)-Transformer
example (keys and values from tensor products with the edge harmonics, weighted by an MLP of the distance).

What is computed (as the reference): inputs are the charge (degree 0) and velocity (degree 1) of each
particle (``OurDynamics``); 4 attention blocks, each followed by the norm nonlinearity
(:class:`~canonical_network.prediction.tfn.NormNonlinearity` without its linear map, ``GNormSE3`` with
``num_layers=0``); one tensor field convolution to a single degree-1 channel; that vector times a learned
scalar (initialised to 0.01) is *added to the input position*. An attention block (``GSE3Res``, whose skip
connection the reference leaves commented out, so none here):

* value ``v_ij = K_v(x_i − x_j) h_j`` and key ``k_ij = K_k(x_i − x_j) h_j`` (edge kernels as in TFN; the
  keys have the layer's channels in the degrees the input has), query ``q_i = W_q h_i`` (``o3.Linear``);
* ``a_ij = softmax_j(⟨q_i, k_ij⟩ / √dim k)`` over the neighbours ``j`` of ``i``; ``h_i ← Σ_j a_ij v_ij``.

``⟨q, k⟩`` is the plain dot product of all components: e3nn's real irreps are orthogonal, so it is rotation
invariant, and the update is rotation equivariant.

Equivariance: rotations, translations and permutations — SE(3), not E(3), for the reason given in
:mod:`canonical_network.prediction.tfn` (every coupling of the reference's kernel basis is kept).

Deviations: those of :mod:`canonical_network.prediction.tfn` (e3nn's normalisations). Also its note on
building the model for float64.
"""

from __future__ import annotations

import math

import torch
from e3nn import o3
from torch import nn
from torch_geometric.utils import scatter, softmax

from canonical_network.nn.message_passing import flatten_nodes
from canonical_network.prediction.tfn import (
    INPUT_IRREPS,
    OUTPUT_IRREPS,
    EdgeGeometry,
    EdgeKernel,
    NormNonlinearity,
    TensorFieldConv,
    harmonics_irreps,
    hidden_irreps,
)
from canonical_network.utils.checks import check_int, check_number

#: initial value of the learned scale of the output displacement (``scalar_trick`` in ``OurSE3Transformer``).
OUTPUT_SCALE_INIT = 0.01


class EquivariantAttention(nn.Module):
    """One-head SE(3)-equivariant graph attention (``GSE3Res`` with ``n_heads=1``, ``div=1``, no skip).

    Args:
        irreps_in: irreps of ``h``.
        irreps_sh: irreps of the edge harmonics.
        irreps_out: irreps of the values and so of the output.

    Shapes: ``h`` ``(B·N, irreps_in.dim)`` → ``(B·N, irreps_out.dim)``.
    """

    def __init__(self, irreps_in: o3.Irreps, irreps_sh: o3.Irreps, irreps_out: o3.Irreps) -> None:
        super().__init__()
        input_degrees = {ir.l for _, ir in irreps_in}
        # queries are a per-node linear map of h, so they (and the keys) only have the degrees h has
        irreps_key = o3.Irreps([(mul, ir) for mul, ir in irreps_out if ir.l in input_degrees])
        self.values = EdgeKernel(irreps_in, irreps_sh, irreps_out)
        self.keys = EdgeKernel(irreps_in, irreps_sh, irreps_key)
        self.queries = o3.Linear(irreps_in, irreps_key, biases=False)
        self.logit_scale = 1.0 / math.sqrt(irreps_key.dim)

    def forward(self, h: torch.Tensor, geometry: EdgeGeometry) -> torch.Tensor:
        values = self.values(h, geometry)  # (E, out)
        keys = self.keys(h, geometry)  # (E, key)
        queries = self.queries(h)[geometry.target]  # (E, key)
        logits = (queries * keys).sum(dim=-1) * self.logit_scale
        weights = softmax(logits, geometry.target, num_nodes=geometry.num_nodes)
        return scatter(weights.unsqueeze(-1) * values, geometry.target, dim=0, dim_size=geometry.num_nodes,
                       reduce="sum")


class SE3Transformer(nn.Module):
    """SE(3)-Transformer predicting each particle's displacement; returns ``loc + s · displacement``.

    Equivariance: for any rotation ``R`` (``det R = +1``), translation ``t`` and permutation ``P``,
    ``f(P(x Rᵀ + t), P(v Rᵀ), P q) = P(f(x, v, q) Rᵀ + t)``. Not reflections.

    Args:
        channels: channels per degree (21: ``int(--nf 64 / --degree 3)`` in ``main_nbody.py``).
        num_degrees: feature degrees ``0 … num_degrees − 1`` (3: ``--degree 3``).
        num_layers: attention blocks (4: ``--n_layers`` default); a final convolution follows them.
        output_scale_init: initial learned scale ``s`` of the displacement (0.01, ``scalar_trick``).

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` → predicted positions ``(B, N, 3)``.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask",)

    def __init__(
        self, channels: int = 21, num_degrees: int = 3, num_layers: int = 4,
        output_scale_init: float = OUTPUT_SCALE_INIT,
    ) -> None:
        super().__init__()
        self.channels = check_int("prediction.channels", channels, low=1)
        # >= 2: the read-out is a degree-1 channel of the harmonics of the hidden degrees (as TFN)
        self.num_degrees = check_int("prediction.num_degrees", num_degrees, low=2)
        self.num_layers = check_int("prediction.num_layers", num_layers, low=1)
        scale = check_number("prediction.output_scale_init", output_scale_init, finite=True)
        hidden = hidden_irreps(channels, num_degrees)
        self.irreps_sh = harmonics_irreps(num_degrees - 1)
        self.attention = nn.ModuleList(
            EquivariantAttention(INPUT_IRREPS if i == 0 else hidden, self.irreps_sh, hidden)
            for i in range(num_layers)
        )
        self.nonlinearities = nn.ModuleList(NormNonlinearity(hidden, num_linear=0) for _ in range(num_layers))
        self.readout = TensorFieldConv(hidden, self.irreps_sh, OUTPUT_IRREPS)
        self.output_scale = nn.Parameter(torch.tensor([scale]))

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        geometry = EdgeGeometry.of(loc, self.irreps_sh)
        h = torch.cat([flatten_nodes(charges), flatten_nodes(vel)], dim=-1)  # INPUT_IRREPS, Cartesian (x, y, z)
        for attention, nonlinearity in zip(self.attention, self.nonlinearities, strict=True):
            h = nonlinearity(attention(h, geometry))
        displacement = self.output_scale * self.readout(h, geometry)
        return loc + displacement.reshape(loc.shape)
