"""Tensor Field Network (Thomas et al. 2018) as the EGNN paper ran it on N-body: the "TFN" row of the paper's
N-body table (§5.2, Table 3; its number, 0.0155, is quoted from Satorras et al. 2021, Table 2). Also the
building blocks of :mod:`canonical_network.prediction.se3_transformer`.

Sources: the EGNN repository (vgsatorras/egnn), ``n_body_system/se3_dynamics/``: ``dynamics.py``
(``OurDynamics``: the inputs and the read-out), ``models.py`` (``OursTFN``: the layer stack) and
``equivariant_attention/modules.py`` (``GConvSE3``, ``PairwiseConv``, ``RadialFunc``, ``GNormSE3``: the
layers); its README's run ``main_nbody.py --model tfn --degree 2 --nf 32 --lr 1e-3`` with the default
``--n_layers 4``. ``main_nbody.py`` passes ``nf / degree`` channels per degree, so: degrees 0 and 1 with 16
channels each, 4 convolutions (3 followed by the norm nonlinearity), ReLU, radial MLPs 32 wide, no edge
features besides the distance.

What is computed (as the reference): inputs are the charge (one degree-0 channel) and the velocity (one
degree-1 channel) of each particle; a convolution gives node ``i`` ``W h_i + mean_j K(x_i − x_j) h_j``, where
``K`` is, for each (input degree, output degree) pair, a tensor product of ``h_j`` with the spherical harmonics
of the direction of ``x_i − x_j`` (degrees up to twice the largest feature degree, all couplings that the two
degrees allow), weighted per coupling and channel pair by that pair's MLP of ``‖x_i − x_j‖``; the norm
nonlinearity maps every channel ``v`` to ``f(‖v‖) v / ‖v‖`` (norms clamped to at least 1e-12) with ``f`` =
LayerNorm over the channels of a degree, ReLU and (in TFN) a linear map; the last convolution outputs one
degree-1 channel, which is *added to the input position* (``out + xs`` in ``OurDynamics.f``).

Built on e3nn (no hand-written harmonics or Clebsch–Gordan code): ``o3.spherical_harmonics``,
``o3.FullyConnectedTensorProduct`` with per-edge weights for the blocks of ``K``, ``o3.Linear`` for ``W``,
``nn.NormActivation`` for the norm nonlinearity.

Equivariance: rotations, translations and permutations — SE(3), not E(3). The reference's kernel basis uses
every coupling degree ``J`` from ``|l_in − l_out|`` to ``l_in + l_out`` whatever its parity (a degree-1
input and the degree-1 harmonic give a degree-1 output: a cross product), so it is not equivariant to
reflections. In e3nn this is expressed by declaring every vector even (``1e``: relative positions,
velocity, output), which lets all those couplings through; declaring them odd (``1o``) would drop the
parity-violating ones and give an E(3)-equivariant model that is not the reference's.

Deviations (none changes what the layers can express):

* e3nn's normalisations: component-normalised harmonics and a ``1/√fan-in`` path normalisation inside the
  tensor product and ``o3.Linear`` (the reference multiplies unnormalised kernels); the function classes are
  the same, the initial scales differ;
* the self-interaction ``W h_i`` is added once per node instead of to each of its edges' messages before the
  mean (equal, since every node has incoming edges).

Precision: e3nn computes its coupling coefficients in torch's default dtype when a layer is built, so a model
meant to run in float64 is built with float64 as the default dtype; a float32-built model converted with
``.double()`` keeps float32-rounded coefficients and is rotation equivariant to ~1e-8 relative only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from e3nn import o3
from e3nn.nn import NormActivation
from torch import nn
from torch_geometric.utils import scatter

from canonical_network.nn.message_passing import flatten_nodes, fully_connected_edge_index
from canonical_network.utils.checks import check_int

#: hidden width of the radial MLPs (``RadialFunc.mid_dim`` in the reference).
RADIAL_HIDDEN_DIM = 32
#: per-edge radial weights from which a pair kernel with several coupling paths is evaluated path by path
#: (:class:`PairKernel`): the SE(3)-Transformer's kernels (21 × 21 channels, up to 5 paths: 1,323-2,205 weights)
#: are, TFN's (16 × 16, up to 3 paths: at most 768) are not (docs/measurements.md, "Each pair kernel by paths")
PATHS_MIN_WEIGHTS = 1024
#: norms below this are clamped before the division of the norm nonlinearity (``GNormSE3.eps``).
NORM_EPSILON = 1e-12
#: irreps of each particle's input: its charge (scalar) and velocity (vector), ``G.ndata['f']`` and
#: ``G.ndata['f1']`` of ``OurDynamics.f``. Vectors are declared even (see the module docstring: SE(3)).
INPUT_IRREPS = o3.Irreps("1x0e + 1x1e")
#: irreps of the output: one vector per particle, the displacement added to its position.
OUTPUT_IRREPS = o3.Irreps("1x1e")


def hidden_irreps(channels: int, num_degrees: int) -> o3.Irreps:
    """``channels`` copies of every degree ``0 … num_degrees − 1`` (the reference's ``Fiber(num_degrees,
    channels)``), all even: e.g. ``16x0e+16x1e``."""
    return o3.Irreps([(channels, (degree, 1)) for degree in range(num_degrees)])


def harmonics_irreps(max_feature_degree: int) -> o3.Irreps:
    """Spherical harmonics of degrees ``0 … 2·max_feature_degree`` (``get_basis_and_r``: every coupling degree
    between two feature degrees), even like the vectors they are computed from."""
    return o3.Irreps.spherical_harmonics(2 * max_feature_degree, p=1)


@dataclass(frozen=True)
class EdgeGeometry:
    """What every layer of one forward pass reads off the fully connected graphs (``get_basis_and_r``).

    Attributes:
        source: ``(E,)`` node ``j`` of each edge (flattened ``B·N`` numbering).
        target: ``(E,)`` node ``i``, where the edge's message is aggregated.
        harmonics: ``(E, irreps_sh.dim)`` spherical harmonics of the direction of ``x_i − x_j``.
        distance: ``(E, 1)`` ``‖x_i − x_j‖``.
        num_nodes: ``B·N``.
    """

    source: torch.Tensor
    target: torch.Tensor
    harmonics: torch.Tensor
    distance: torch.Tensor
    num_nodes: int

    @classmethod
    def of(cls, loc: torch.Tensor, irreps_sh: o3.Irreps) -> EdgeGeometry:
        """The geometry of positions ``loc`` ``(B, N, 3)``: complete graphs without self loops."""
        batch_size, num_nodes, _ = loc.shape
        source, target = fully_connected_edge_index(batch_size, num_nodes, loc.device)
        pos = flatten_nodes(loc)
        relative = pos[target] - pos[source]  # (E, 3), as OurDynamics' xs[dst] − xs[src]
        harmonics = o3.spherical_harmonics(irreps_sh, relative, normalize=True, normalization="component")
        distance = torch.linalg.vector_norm(relative, dim=-1, keepdim=True)
        return cls(source, target, harmonics, distance, batch_size * num_nodes)


class RadialMLP(nn.Sequential):
    """``‖x_i − x_j‖`` → tensor-product weights of one edge: ``Linear–LayerNorm–act`` twice, then ``Linear``
    (``RadialFunc`` in the reference, with its Kaiming-uniform init). Reads a rotation invariant only.

    Shapes: ``(E, 1)`` → ``(E, num_weights)``.
    """

    def __init__(self, num_weights: int, hidden_dim: int = RADIAL_HIDDEN_DIM, activation: type[nn.Module] = nn.ReLU):
        super().__init__(
            nn.Linear(1, hidden_dim), nn.LayerNorm(hidden_dim), activation(),
            nn.Linear(hidden_dim, hidden_dim), nn.LayerNorm(hidden_dim), activation(),
            nn.Linear(hidden_dim, num_weights),
        )
        for module in self:
            if isinstance(module, nn.Linear):
                nn.init.kaiming_uniform_(module.weight)


class PairKernel(nn.Module):
    """The part of an edge kernel from one input degree to one output degree (``PairwiseConv``): an e3nn fully
    connected tensor product of the input channels with the edge's spherical harmonics (every coupling degree
    ``J`` the two degrees allow), weighted per coupling and channel pair by its own :class:`RadialMLP` of the
    edge length.

    Wide kernels (``by_paths``: more than one coupling path and at least :data:`PATHS_MIN_WEIGHTS` radial weights
    per edge) are computed one coupling path at a time: ``tensor_product`` (the fully connected product, which fixes the paths,
    their normalisation and the radial MLP's width, and whose buffers are what checkpoints hold) is not called;
    each of its paths is a one-path e3nn tensor product with that path's normalisation constant, fed its slice of
    the radial weights by ``split``. The result is the fully connected product's, summed in its order (the tests
    compare them bit for bit); what changes is the backward: e3nn slices one per-edge weight tensor per path,
    and autograd turns each slice into a zero-filled tensor of the whole width, summed path by path, a large
    share of a CPU training step of the SE(3)-Transformer in a ``torch.profiler`` run by hand (not recorded;
    what the split saves: docs/measurements.md, "Each pair kernel by paths"); ``split``'s backward is one
    concatenation. Narrow kernels (TFN's) call the product itself:
    their fills are small, and splitting them showed no clear gain (the same measurement, which times both ways).

    Shapes: ``x`` ``(E, mul_in · (2 l_in + 1))``, ``harmonics`` ``(E, irreps_sh.dim)``, ``distance`` ``(E, 1)``
    → ``(E, mul_out · (2 l_out + 1))``.
    """

    def __init__(self, irreps_in: o3.Irreps, irreps_sh: o3.Irreps, irreps_out: o3.Irreps) -> None:
        super().__init__()
        self.tensor_product = o3.FullyConnectedTensorProduct(
            irreps_in, irreps_sh, irreps_out, shared_weights=False, internal_weights=False
        )
        self.radial = RadialMLP(self.tensor_product.weight_numel)
        instructions = self.tensor_product.instructions
        self.by_paths = len(instructions) > 1 and self.tensor_product.weight_numel >= PATHS_MIN_WEIGHTS
        self.paths = nn.ModuleList()
        self.path_sizes: list[int] = []
        for ins in instructions if self.by_paths else ():
            # no normalisation of its own, and a path weight whose square root (e3nn takes one) is the fully
            # connected product's constant for this path: sqrt(fl(c²)) = c in binary floating point
            path = o3.TensorProduct(
                irreps_in, irreps_sh, irreps_out,
                [(ins.i_in1, ins.i_in2, ins.i_out, ins.connection_mode, ins.has_weight, ins.path_weight**2)],
                irrep_normalization="none", path_normalization="none", shared_weights=False, internal_weights=False,
            )
            # its buffers (coupling coefficients, output mask) are rebuilt with the module, not saved: checkpoints
            # keep the keys they had before the paths were split
            for module in path.modules():
                module._non_persistent_buffers_set.update(name for name, _ in module.named_buffers(recurse=False))
            self.paths.append(path)
            self.path_sizes.append(math.prod(ins.path_shape))

    def forward(self, x: torch.Tensor, harmonics: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
        if not self.by_paths:
            return self.tensor_product(x, harmonics, self.radial(distance))
        weights = self.radial(distance).split(self.path_sizes, dim=-1)
        out = self.paths[0](x, harmonics, weights[0])
        for path, w in zip(self.paths[1:], weights[1:], strict=True):
            out = out + path(x, harmonics, w)
        return out


class EdgeKernel(nn.Module):
    """The message of edge ``j → i`` before aggregation: ``K(x_i − x_j) h_j`` (``GConvSE3Partial``).

    ``K`` sums, for every output degree, a :class:`PairKernel` from each input degree, as the reference's
    one ``PairwiseConv`` per (input degree, output degree) pair. Rotation equivariant:
    ``K(R r) D_in(R) h = D_out(R) K(r) h``.

    Why per pair rather than one tensor product over all degrees with one radial MLP (e3nn's convolution
    examples, the same kind of kernel): besides following the reference, it trained faster on a CPU in a hand
    timing, where the backward of e3nn's per-path slices of one wide per-edge weight tensor dominates (not
    recorded: docs/measurements.md, "N-body rows quoted from the EGNN paper").

    Args:
        irreps_in: irreps of ``h``, one entry per degree (as :func:`hidden_irreps`).
        irreps_sh: irreps of the harmonics (:func:`harmonics_irreps`).
        irreps_out: irreps of the message, one entry per degree.

    Shapes: ``h`` ``(B·N, irreps_in.dim)`` → ``(E, irreps_out.dim)``.
    """

    def __init__(self, irreps_in: o3.Irreps, irreps_sh: o3.Irreps, irreps_out: o3.Irreps) -> None:
        super().__init__()
        for name, irreps in (("irreps_in", irreps_in), ("irreps_out", irreps_out)):
            degrees = [ir.l for _, ir in irreps]
            if len(set(degrees)) != len(degrees):
                raise ValueError(f"{name} must hold each degree once; got {irreps}")
        self.irreps_out = o3.Irreps(irreps_out)
        self.input_slices = [(s.start, s.stop) for s in irreps_in.slices()]
        self.pairs = nn.ModuleList()
        self.pair_index: list[list[tuple[int, int]]] = []  # per output degree: (input entry, pair) couples
        for mul_out, ir_out in irreps_out:
            terms = []
            for i, (mul_in, ir_in) in enumerate(irreps_in):
                pair = PairKernel(o3.Irreps([(mul_in, ir_in)]), irreps_sh, o3.Irreps([(mul_out, ir_out)]))
                if pair.tensor_product.weight_numel > 0:  # some harmonic couples the two degrees
                    terms.append((i, len(self.pairs)))
                    self.pairs.append(pair)
            self.pair_index.append(terms)

    def forward(self, h: torch.Tensor, geometry: EdgeGeometry) -> torch.Tensor:
        x = h[geometry.source]
        blocks = []
        for (mul_out, ir_out), terms in zip(self.irreps_out, self.pair_index, strict=True):
            block = x.new_zeros(x.shape[0], mul_out * ir_out.dim)
            for i, p in terms:
                start, stop = self.input_slices[i]
                block = block + self.pairs[p](x[:, start:stop], geometry.harmonics, geometry.distance)
            blocks.append(block)
        return torch.cat(blocks, dim=-1)


class TensorFieldConv(nn.Module):
    """Tensor field network layer (``GConvSE3`` with ``self_interaction=True``):
    ``h_i ← W h_i + mean_j K(x_i − x_j) h_j``.

    ``W`` (``o3.Linear``) mixes channels of equal degree; output degrees absent from the input get no
    self-interaction. SE(3)- and permutation-equivariant (translations drop out of ``x_i − x_j``).

    Args:
        irreps_in, irreps_sh, irreps_out: as :class:`EdgeKernel`.

    Shapes: ``h`` ``(B·N, irreps_in.dim)`` → ``(B·N, irreps_out.dim)``.
    """

    def __init__(self, irreps_in: o3.Irreps, irreps_sh: o3.Irreps, irreps_out: o3.Irreps) -> None:
        super().__init__()
        self.kernel = EdgeKernel(irreps_in, irreps_sh, irreps_out)
        self.self_interaction = o3.Linear(irreps_in, irreps_out, biases=False)

    def forward(self, h: torch.Tensor, geometry: EdgeGeometry) -> torch.Tensor:
        messages = self.kernel(h, geometry)
        pooled = scatter(messages, geometry.target, dim=0, dim_size=geometry.num_nodes, reduce="mean")
        return self.self_interaction(h) + pooled


class _NormMaps(nn.Module):
    """The learned map ``f`` of :class:`NormNonlinearity`, applied to the ``(..., num_channels)`` norms laid
    out degree by degree: per degree LayerNorm over its channels, ``act``, then ``num_linear`` Linear maps
    (the last with a bias; ``act`` between them), as ``GNormSE3._build_net``."""

    def __init__(self, irreps: o3.Irreps, num_linear: int, activation: type[nn.Module]) -> None:
        super().__init__()
        self.sizes = [mul for mul, _ in irreps]
        maps = []
        for mul in self.sizes:
            layers: list[nn.Module] = []
            for i in range(num_linear):
                layers += [nn.LayerNorm(mul), activation(), nn.Linear(mul, mul, bias=i == num_linear - 1)]
                nn.init.kaiming_uniform_(layers[-1].weight)
            if num_linear == 0:
                layers += [nn.LayerNorm(mul), activation()]
            maps.append(nn.Sequential(*layers))
        self.maps = nn.ModuleList(maps)

    def forward(self, norms: torch.Tensor) -> torch.Tensor:
        return torch.cat([f(n) for f, n in zip(self.maps, norms.split(self.sizes, dim=-1), strict=True)], dim=-1)


class NormNonlinearity(nn.Module):
    """Norm nonlinearity (``GNormSE3``): each channel ``v`` of each degree becomes ``f(‖v‖) v / ‖v‖``.

    ``f`` reads the norms only (rotation invariant) and the direction ``v / ‖v‖`` is kept, so the map is
    rotation equivariant. Built on e3nn's ``NormActivation``.

    Args:
        irreps: irreps of the features (one entry per degree, as :func:`hidden_irreps`).
        num_linear: Linear maps in ``f`` after LayerNorm and ``act`` (1 in TFN, 0 in the SE(3)-Transformer).
        activation: ``act`` (ReLU in the reference n-body runs).

    Shapes: ``(..., irreps.dim)`` → the same.
    """

    def __init__(self, irreps: o3.Irreps, num_linear: int = 1, activation: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.activation = NormActivation(irreps, _NormMaps(irreps, num_linear, activation), epsilon=NORM_EPSILON)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.activation(h)


class TFN(nn.Module):
    """Tensor field network predicting each particle's displacement; returns ``loc + displacement``.

    ``num_layers`` :class:`TensorFieldConv` (input → hidden, hidden → hidden …, hidden → one vector), a
    :class:`NormNonlinearity` after each but the last (``OursTFN._build_gcn``).

    Equivariance: for any rotation ``R`` (``det R = +1``), translation ``t`` and permutation ``P``,
    ``TFN(P(x Rᵀ + t), P(v Rᵀ), P q) = P(TFN(x, v, q) Rᵀ + t)``. Not reflections (see the module docstring).

    Args:
        channels: channels per degree (16: ``--nf 32`` divided by ``--degree 2`` in ``main_nbody.py``).
        num_degrees: feature degrees ``0 … num_degrees − 1`` (2: ``--degree 2``).
        num_layers: convolutions (4: ``--n_layers`` default).

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` → predicted positions ``(B, N, 3)``.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask",)

    def __init__(self, channels: int = 16, num_degrees: int = 2, num_layers: int = 4) -> None:
        super().__init__()
        self.channels = check_int("prediction.channels", channels, low=1)
        self.num_degrees = check_int("prediction.num_degrees", num_degrees, low=2)  # the output is degree 1
        self.num_layers = check_int("prediction.num_layers", num_layers, low=1)
        hidden = hidden_irreps(channels, num_degrees)
        self.irreps_sh = harmonics_irreps(num_degrees - 1)
        widths = [INPUT_IRREPS, *[hidden] * (num_layers - 1), OUTPUT_IRREPS]
        self.convs = nn.ModuleList(
            TensorFieldConv(irreps_in, self.irreps_sh, irreps_out)
            for irreps_in, irreps_out in zip(widths[:-1], widths[1:], strict=True)
        )
        self.nonlinearities = nn.ModuleList(NormNonlinearity(hidden, num_linear=1) for _ in range(num_layers - 1))

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        geometry = EdgeGeometry.of(loc, self.irreps_sh)
        # e3nn (>= 0.5) orders a degree-1 irrep's components (x, y, z): Cartesian vectors enter as they are.
        h = torch.cat([flatten_nodes(charges), flatten_nodes(vel)], dim=-1)  # INPUT_IRREPS
        for conv, nonlinearity in zip(self.convs[:-1], self.nonlinearities, strict=True):
            h = nonlinearity(conv(h, geometry))
        displacement = self.convs[-1](h, geometry)
        return loc + displacement.reshape(loc.shape)
