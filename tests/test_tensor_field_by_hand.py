"""What the tensor-field rows (TFN, SE(3)-Transformer), Puny et al.'s layer-wise FA-GNN and the classification
tasks' evaluation losses compute, recomputed from their formulas with explicit loops in float64.

The rows' other tests (tests/test_tensor_field_rows.py, tests/test_fa_gnn.py) check their symmetry, shapes and
one training step. A change that keeps the symmetry but changes the function passes those: a sum instead of the
mean over neighbours of a tensor field convolution, the edge direction ``x_j − x_i`` for ``x_i − x_j``, an
attention softmax normalised over the edges *out of* a node instead of into it, an attention without its
``1/√dim k`` scale, a layer-wise frame built from uncentred latent vectors. Each moves the rows' Table 3 numbers
and none is seen by an equivariance check. These tests pin:

1. :class:`~canonical_network.prediction.tfn.TensorFieldConv` and :class:`~canonical_network.prediction.tfn.TFN`:
   ``h_i ← W h_i + 1/(N−1) Σ_{j≠i} K(x_i − x_j) h_j``, the kernel evaluated with e3nn's harmonics of
   ``x_i − x_j`` and the module's own pair kernels (tensor products and radial MLPs), the last convolution's
   vector added to the input position;
2. :class:`~canonical_network.prediction.se3_transformer.EquivariantAttention` and the whole
   :class:`~canonical_network.prediction.se3_transformer.SE3Transformer`: ``a_ij = softmax_j(⟨q_i, k_ij⟩ / √dim k)``
   over the edges into ``i`` (the module's weights sum to 1 per target), ``h_i ← Σ_j a_ij v_ij``, and
   ``x + s · readout``;
3. :class:`~canonical_network.prediction.frame_averaging.LayerwiseFrameAveragingGNN`: the whole forward pass by
   loops over systems, the 8 sign frames and the layers, with every latent frame built from the centred vectors
   ``u − ū`` and the features re-written as ``(u − ū) F_k`` (as ``model_FA.py``); and every set of vectors the
   module writes into a frame has mean zero;
4. the image and point-cloud classification tasks under a real ``Trainer``: ``{val,test}/loss`` is the plain
   (never label-smoothed) cross-entropy, and the epoch's value is the mean over *samples* (batches of 3 and 1
   weighted by their sizes), not the mean of the batch means.

No harmonics or Clebsch–Gordan code is written here: the loops call e3nn's ``o3.spherical_harmonics`` and the
modules' own ``FullyConnectedTensorProduct``\\ s, radial MLPs, ``o3.Linear`` maps and norm nonlinearities; what is
checked is how they are combined (aggregation, direction, normalisation, scale, centring).

Tolerances (float64 unless stated): a loop and the vectorised module compute the same terms in another order,
which changes a sum of ``n`` terms by at most ``n·eps`` of the sum of their magnitudes. The longest chain here
(see each test) has ``n ≤ 2⁹`` terms per layer, a few layers, and no division by a small quantity except the norm
nonlinearity's ``1/‖v‖`` and LayerNorm's ``1/σ`` (κ ≤ 2⁷, the suite's deep-network assumption, tests/helpers.py),
so ``RTOL = 2¹⁸·eps ≈ 5.8e-11`` relative to the outputs' scale bounds rounding (the layer-wise FA-GNN, whose PCA
frames amplify rounding by their condition numbers, uses tests/test_fa_gnn.py's derived bound instead). Each
mutation named above moves the outputs by ``O(1e-2)`` of their scale or more (the FA-GNN's centring: ~3e-3, still
~10⁷ times its bound), which each test also asserts of its own by-hand variant: a control that the comparison
can tell the formulas apart.
"""

from __future__ import annotations

import math

import pytest
import torch
from e3nn import o3
from lightning import Trainer
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from canonical_network.canonicalization.identity import IdentityCanonicalizer
from canonical_network.nn.message_passing import fully_connected_edge_index, nbody_edge_attr
from canonical_network.prediction import frame_averaging, se3_transformer
from canonical_network.prediction.frame_averaging import AXIS_SIGNS, LayerwiseFrameAveragingGNN
from canonical_network.prediction.se3_transformer import EquivariantAttention, SE3Transformer
from canonical_network.prediction.tfn import (
    TFN,
    EdgeGeometry,
    EdgeKernel,
    TensorFieldConv,
    harmonics_irreps,
    hidden_irreps,
)
from canonical_network.tasks.image_classification import ImageClassificationTask
from canonical_network.tasks.pointcloud_classification import PointCloudClassificationTask
from tests.helpers import seeded_gen
from tests.test_fa_gnn import equivariance_tolerance
from tests.test_tensor_field_rows import default_dtype  # e3nn builds its coefficients in the default dtype

EPS64 = torch.finfo(torch.float64).eps
EPS32 = torch.finfo(torch.float32).eps
#: float64 loops against the vectorised module, relative to the outputs' scale: n ≤ 2⁹ terms along a layer's
#: longest sum (an edge kernel's output component: ≤ 3 coupling paths × ≤ 4 input channels × ≤ 5 Clebsch–Gordan
#: terms, plus a radial MLP of 32 and the mean over ≤ 4 neighbours: < 2⁸; doubled for the attention's keys and
#: softmax), ≤ 3 layers (2²), κ ≤ 2⁷ (norm nonlinearity, LayerNorm): 2⁹ · 2² · 2⁷ = 2¹⁸; the observed errors are
#: ~1e-16, a mutation's ≥ 1e-2.
RTOL = 2**18 * EPS64
#: what the tensor-field mutations pinned here move the outputs by at least, relative to their scale (the controls)
MEANINGFUL = 1e-2
NUM_PARTICLES = 4


def inputs(seed: int = 0, batch_size: int = 2, num_particles: int = NUM_PARTICLES):
    """float64 positions (spread ~1.5), velocities and ±1 charges, ``(B, N, 3), (B, N, 3), (B, N, 1)``."""
    gen = seeded_gen(seed)
    loc = 1.5 * torch.randn(batch_size, num_particles, 3, generator=gen, dtype=torch.float64)
    vel = 0.5 * torch.randn(batch_size, num_particles, 3, generator=gen, dtype=torch.float64)
    charges = torch.randint(0, 2, (batch_size, num_particles, 1), generator=gen).to(torch.float64) * 2 - 1
    return loc, vel, charges


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = RTOL) -> None:
    """``max |actual − expected| ≤ rtol · max |expected|`` (a bound relative to the outputs' scale)."""
    scale = expected.abs().max().item()
    error = (actual - expected).abs().max().item()
    assert error <= rtol * scale, f"max error {error:.3e} > {rtol:.1e} · scale {scale:.3e}"


def assert_apart(a: torch.Tensor, b: torch.Tensor) -> None:
    """The control: two formulas' outputs differ by ≥ MEANINGFUL of their scale (far beyond RTOL)."""
    scale = b.abs().max().item()
    assert (a - b).abs().max().item() > MEANINGFUL * scale


# ------------------------------------------------------------------------------------------- tensor field layers


def message_by_hand(kernel: EdgeKernel, h_j: torch.Tensor, relative: torch.Tensor,
                    irreps_sh: o3.Irreps) -> torch.Tensor:
    """``K(r) h_j`` of one edge with ``r = x_i − x_j``: per output degree, the sum over input degrees of the pair
    kernel's tensor product of ``h_j``'s block with the harmonics of ``r``, weighted by its radial MLP of ``‖r‖``."""
    harmonics = o3.spherical_harmonics(irreps_sh, relative[None], normalize=True, normalization="component")
    distance = torch.linalg.vector_norm(relative)[None, None]
    blocks = []
    for (mul_out, ir_out), terms in zip(kernel.irreps_out, kernel.pair_index, strict=True):
        block = h_j.new_zeros(mul_out * ir_out.dim)
        for i, p in terms:
            start, stop = kernel.input_slices[i]
            pair = kernel.pairs[p]
            block = block + pair.tensor_product(h_j[None, start:stop], harmonics, pair.radial(distance))[0]
        blocks.append(block)
    return torch.cat(blocks)


def conv_by_loops(conv: TensorFieldConv, h: torch.Tensor, pos: torch.Tensor, irreps_sh: o3.Irreps,
                  reduce: str = "mean", direction: int = 1) -> torch.Tensor:
    """``W h_i + mean_{j≠i} K(x_i − x_j) h_j`` for one system (``h`` ``(N, dim)``, ``pos`` ``(N, 3)``);
    ``reduce="sum"`` and ``direction=-1`` (``x_j − x_i``) are the controls' wrong formulas."""
    n = len(pos)
    rows = []
    for i in range(n):
        messages = [message_by_hand(conv.kernel, h[j], direction * (pos[i] - pos[j]), irreps_sh)
                    for j in range(n) if j != i]
        pooled = sum(messages) / (len(messages) if reduce == "mean" else 1)
        rows.append(conv.self_interaction(h[i][None])[0] + pooled)
    return torch.stack(rows)


@pytest.fixture(scope="module")
def tfn_conv() -> tuple[TensorFieldConv, o3.Irreps]:
    """A hidden → hidden convolution (3 channels of degrees 0 and 1; harmonics of degrees 0-2), float64."""
    torch.manual_seed(0)
    with default_dtype(torch.float64):
        irreps_sh = harmonics_irreps(1)
        conv = TensorFieldConv(hidden_irreps(3, 2), irreps_sh, hidden_irreps(3, 2))
    return conv.double(), irreps_sh


def test_tfn_convolution_is_self_interaction_plus_the_mean_of_the_messages_of_x_i_minus_x_j(tfn_conv):
    """``h_i ← W h_i + 1/(N−1) Σ_{j≠i} K(x_i − x_j) h_j``, per node, against the module on the geometry it builds
    itself (``EdgeGeometry.of``: the edge direction is the module's, not given by the test). A sum over
    neighbours is 3× the pooled term; ``x_j − x_i`` flips the odd harmonics (degree 1), so the 0 → 1 and
    1 → 0 couplings change sign: both move the output by O(1) (the controls)."""
    conv, irreps_sh = tfn_conv
    loc, _, _ = inputs(1, batch_size=2)
    h = torch.randn(2 * NUM_PARTICLES, conv.kernel.input_slices[-1][1], generator=seeded_gen(2), dtype=torch.float64)
    with torch.no_grad():
        out = conv(h, EdgeGeometry.of(loc, irreps_sh))
        for b in range(2):
            nodes = slice(b * NUM_PARTICLES, (b + 1) * NUM_PARTICLES)
            # n ≤ 2⁸ (RTOL's count for one layer), κ = 1 (no division): within RTOL
            expected = conv_by_loops(conv, h[nodes], loc[b], irreps_sh)
            assert_close(out[nodes], expected)
            assert_apart(conv_by_loops(conv, h[nodes], loc[b], irreps_sh, reduce="sum"), expected)
            assert_apart(conv_by_loops(conv, h[nodes], loc[b], irreps_sh, direction=-1), expected)


def test_tfn_is_its_convolutions_and_norm_nonlinearities_added_to_the_positions():
    """The whole row: ``h⁰ = [q, v]``, ``h ← σ(conv(h))`` for all but the last convolution, ``x + conv(h)``,
    each convolution by loops (``mean`` over ``x_i − x_j``) and the module's own norm nonlinearities."""
    torch.manual_seed(0)
    with default_dtype(torch.float64):
        model = TFN(channels=3, num_degrees=2, num_layers=3).double().eval()
    loc, vel, charges = inputs(3, batch_size=1)
    with torch.no_grad():
        out = model(loc, vel, charges)
        for b in range(len(loc)):
            h = torch.cat([charges[b], vel[b]], dim=-1)
            for conv, nonlinearity in zip(model.convs[:-1], model.nonlinearities, strict=True):
                h = nonlinearity(conv_by_loops(conv, h, loc[b], model.irreps_sh))
            expected = loc[b] + conv_by_loops(model.convs[-1], h, loc[b], model.irreps_sh)
            # 3 layers of ≤ 2⁸ terms, two norm nonlinearities (κ ≤ 2⁷): within RTOL of the positions' scale
            assert_close(out[b], expected)
            assert_apart(out[b], loc[b])  # the read-out moves the positions visibly


# ------------------------------------------------------------------------------------------------ attention


def attention_by_loops(attention: EquivariantAttention, h: torch.Tensor, pos: torch.Tensor, irreps_sh: o3.Irreps,
                       scaled: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One system: per target ``i``, ``a_ij = exp(l_ij) / Σ_j' exp(l_ij')`` over its ``N − 1`` incoming edges with
    ``l_ij = ⟨W_q h_i, K_k(x_i − x_j) h_j⟩ / √dim k``, and ``Σ_j a_ij K_v(x_i − x_j) h_j``.

    Returns the outputs ``(N, out)`` and the weights ``(N, N)`` (``[i, j]``, zero diagonal).
    ``scaled=False`` drops ``1/√dim k`` (a control)."""
    n = len(pos)
    key_dim = attention.keys.irreps_out.dim
    rows, weights = [], pos.new_zeros(n, n)
    for i in range(n):
        query = attention.queries(h[i][None])[0]
        sources = [j for j in range(n) if j != i]
        keys = [message_by_hand(attention.keys, h[j], pos[i] - pos[j], irreps_sh) for j in sources]
        values = [message_by_hand(attention.values, h[j], pos[i] - pos[j], irreps_sh) for j in sources]
        logits = torch.stack([(query * k).sum() for k in keys]) / (math.sqrt(key_dim) if scaled else 1.0)
        exp = torch.exp(logits - logits.max())
        a = exp / exp.sum()
        weights[i, sources] = a
        rows.append(sum(a_j * v for a_j, v in zip(a, values, strict=True)))
    return torch.stack(rows), weights


def test_attention_is_a_scaled_softmax_over_the_edges_into_each_node(monkeypatch):
    """``h_i ← Σ_j softmax_j(⟨q_i, k_ij⟩ / √dim k) v_ij`` by loops, and the module's own weights (recorded at its
    softmax call) sum to 1 over the edges into every target. The queries are scaled up so that the logits
    spread over O(1): then dropping ``1/√dim k`` (here 1/√8) or normalising over sources moves the output by
    O(1e-1) (the controls), where near-uniform weights would hide both."""
    torch.manual_seed(0)
    with default_dtype(torch.float64):
        irreps_sh = harmonics_irreps(1)
        attention = EquivariantAttention(hidden_irreps(2, 2), irreps_sh, hidden_irreps(2, 2)).double()
    with torch.no_grad():
        attention.queries.weight.mul_(4.0)
    loc, _, _ = inputs(4, batch_size=2)
    h = torch.randn(2 * NUM_PARTICLES, hidden_irreps(2, 2).dim, generator=seeded_gen(5), dtype=torch.float64)
    recorded = []

    def recording_softmax(src, index, *args, **kwargs):
        weights = se3_transformer_softmax(src, index, *args, **kwargs)
        recorded.append(weights)
        return weights

    se3_transformer_softmax = se3_transformer.softmax
    monkeypatch.setattr(se3_transformer, "softmax", recording_softmax)
    geometry = EdgeGeometry.of(loc, irreps_sh)
    with torch.no_grad():
        out = attention(h, geometry)
    # the weights into each target sum to 1: a sum of N − 1 = 3 terms, ≤ 3 eps off
    (weights,) = recorded
    _, target = fully_connected_edge_index(2, NUM_PARTICLES)
    into = torch.zeros(2 * NUM_PARTICLES, dtype=torch.float64).index_add_(0, target, weights)
    assert (into - 1).abs().max().item() <= 4 * EPS64
    with torch.no_grad():
        for b in range(2):
            nodes = slice(b * NUM_PARTICLES, (b + 1) * NUM_PARTICLES)
            expected, by_hand_weights = attention_by_loops(attention, h[nodes], loc[b], irreps_sh)
            # keys and values: ≤ 2⁸ terms each, their dot product and the softmax sums ≤ 2⁴ more; exp is
            # 1-Lipschitz-relative on logits of O(1): within RTOL
            assert_close(out[nodes], expected)
            edges = (target >= nodes.start) & (target < nodes.stop)
            source, tgt = fully_connected_edge_index(2, NUM_PARTICLES)[:, edges] - nodes.start
            assert_close(weights[edges], by_hand_weights[tgt, source])
            # the controls: no 1/√dim k; weights normalised over the edges out of each source instead
            assert_apart(attention_by_loops(attention, h[nodes], loc[b], irreps_sh, scaled=False)[0], expected)
            out_of = by_hand_weights / by_hand_weights.sum(dim=0, keepdim=True)  # columns (sources) sum to 1
            assert_apart(out_of, by_hand_weights)


def test_se3_transformer_is_attention_blocks_then_a_scaled_readout_added_to_the_positions():
    """The whole row by loops: ``h⁰ = [q, v]``, ``h ← σ(attention(h))`` per block (the module's norm
    nonlinearities), ``x + s · conv(h)`` with ``s`` the learned output scale (set to 0.7 so that it is visible)."""
    torch.manual_seed(0)
    with default_dtype(torch.float64):
        model = SE3Transformer(channels=2, num_degrees=2, num_layers=2).double().eval()
    with torch.no_grad():
        model.output_scale.fill_(0.7)
    loc, vel, charges = inputs(6, batch_size=1)
    with torch.no_grad():
        out = model(loc, vel, charges)
        for b in range(len(loc)):
            h = torch.cat([charges[b], vel[b]], dim=-1)
            for attention, nonlinearity in zip(model.attention, model.nonlinearities, strict=True):
                h = nonlinearity(attention_by_loops(attention, h, loc[b], model.irreps_sh)[0])
            displacement = conv_by_loops(model.readout, h, loc[b], model.irreps_sh)
            # 3 layers (2 attention, 1 convolution), 2 norm nonlinearities: within RTOL
            assert_close(out[b], loc[b] + 0.7 * displacement)
            assert_apart(out[b] - loc[b], displacement)  # the scale is applied (0.7, not 1)


# ----------------------------------------------------------------------------------------- layer-wise FA-GNN


def principal_axes(points: torch.Tensor) -> torch.Tensor:
    """Columns: eigenvectors of ``Σ_m p_mᵀ p_m`` of the (already centred) ``points`` ``(M, 3)``, ascending."""
    return torch.linalg.eigh(points.T @ points)[1]


def sign_frames(axes: torch.Tensor) -> list[torch.Tensor]:
    """The 8 frames: ``axes`` with its columns signed by each of ``AXIS_SIGNS``. Which sign ``eigh`` gives a
    column does not matter: the set of 8 is the same, and everything below averages over it."""
    return [axes * torch.tensor(signs, dtype=axes.dtype) for signs in AXIS_SIGNS]


def layerwise_fa_by_loops(model: LayerwiseFrameAveragingGNN, loc, vel, charges, centred: bool = True):
    """Puny et al.'s ``model_FA.py`` by loops over systems, frames and layers (``centred=False``: the latent
    frames and features built from ``u`` instead of ``u − ū``, a control)."""
    gnn = model.backbone
    num_nodes = loc.shape[1]
    edge_index = fully_connected_edge_index(1, num_nodes)
    last = len(gnn.layers) - 1
    outputs = []
    for b in range(len(loc)):
        x, v = loc[b], vel[b]
        center = x.mean(dim=0)
        frames = sign_frames(principal_axes(x - center))
        edge_attr = nbody_edge_attr(x, charges[b], edge_index, gnn.squared_distance_edge_attr)
        hs = [gnn.embedding(torch.cat([(x - center) @ f, v @ f], dim=-1)) for f in frames]
        for depth, layer in enumerate(gnn.layers):
            hs = [layer(h, edge_index, edge_attr) for h in hs]
            if depth == last:
                break
            # back out of each pose and averaged over the 8: N·H/3 equivariant vectors
            u = sum(h.reshape(num_nodes, model.num_vectors, 3) @ f.T for h, f in zip(hs, frames, strict=True)) / 8
            vectors = u - u.reshape(-1, 3).mean(dim=0) if centred else u
            frames = sign_frames(principal_axes(vectors.reshape(-1, 3)))
            hs = [(vectors @ f).reshape(num_nodes, -1) for f in frames]
        decoded = sum(gnn.decoder(h) @ f.T for h, f in zip(hs, frames, strict=True)) / 8
        outputs.append(center + decoded)
    return torch.stack(outputs)


def test_layerwise_fa_gnn_by_loops_with_centred_latent_frames(monkeypatch):
    """The whole forward pass by loops (frames from our own eigendecompositions), and every set of vectors the
    module writes into a frame is centred: the input positions (channel 0 of the first call) over the particles,
    each layer's latent vectors over all ``N·H/3`` of a system. Without ``− ū`` the latent frames (and the
    features written in them) are those of uncentred vectors: the output moves by ~3e-3 of its scale (the
    control), ~10⁷ times the rounding bound. ``ū`` is small at initialisation (the embedding's position terms sum
    to zero over the particles, its bias averages out over the 8 sign flips): a common drift of the velocities,
    a system moving as a whole, is what makes it visible."""
    torch.manual_seed(0)
    model = LayerwiseFrameAveragingGNN(hidden_dim=12, num_layers=3).double().eval()
    loc, vel, charges = inputs(7, batch_size=3, num_particles=5)
    vel = vel + torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64)
    framed = []

    def recording_into_frames(vectors, axes):
        framed.append(vectors.detach().clone())
        return into_frames(vectors, axes)

    into_frames = frame_averaging.into_frames
    monkeypatch.setattr(frame_averaging, "into_frames", recording_into_frames)
    with torch.no_grad():
        out, frames = model.forward_with_frames(loc, vel, charges)
        expected = layerwise_fa_by_loops(model, loc, vel, charges)
        uncentred = layerwise_fa_by_loops(model, loc, vel, charges, centred=False)
    assert len(framed) == len(model.backbone.layers)
    # a mean of ≤ N·H/3 = 20 centred values: ≤ 2⁵ eps of their scale off zero
    positions = framed[0][:, :, 0]
    assert positions.mean(dim=1).abs().max().item() <= 2**5 * EPS64 * positions.abs().max().item()
    for latent in framed[1:]:
        vectors = latent.reshape(len(loc), -1, 3)
        assert vectors.mean(dim=1).abs().max().item() <= 2**5 * EPS64 * vectors.abs().max().item()
    # rounding compounded through the frames' conditioning: test_fa_gnn's derived bound (n·eps·Π(1 + κ_l)·scale)
    tolerance = equivariance_tolerance(model, frames, expected.abs().max().item())
    assert (out - expected).abs().max().item() <= tolerance
    scale = expected.abs().max().item()
    assert (uncentred - expected).abs().max().item() > max(1e-3 * scale, 1e6 * tolerance)


# -------------------------------------------------------------------------------------- evaluation losses


class _Linear(nn.Module):
    """A fixed linear classifier of the flattened input."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(num_classes, in_features, generator=seeded_gen(11)))
            self.linear.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


def _classification_task(kind: str, eps: float):
    """A task with a fixed linear predictor and label smoothing ``eps``, and its 4 inputs and labels: sample 3
    (alone in the second batch of a batch size 3 loader) confidently wrong, the others right, so its loss is far
    from the first batch's mean (the sample mean and the mean of batch means differ by O(1))."""
    gen = seeded_gen(10)
    num_classes = 3
    if kind == "image":
        x = torch.randn(4, 1, 2, 2, generator=gen)
        task = ImageClassificationTask(IdentityCanonicalizer(), _Linear(4, num_classes), optimizer=None,
                                       num_classes=num_classes, label_smoothing=eps)
    else:
        x = torch.randn(4, 2, 3, generator=gen)
        task = PointCloudClassificationTask(IdentityCanonicalizer(), _Linear(6, num_classes), optimizer=None,
                                            num_classes=num_classes, label_smoothing=eps)
    logits = task(x)
    labels = logits.argmax(dim=-1)
    labels[3] = logits[3].argmin()  # confidently wrong
    return task, x, labels


@pytest.mark.parametrize("kind", ["image", "pointcloud"])
def test_eval_loss_is_the_plain_cross_entropy_averaged_over_samples(kind, one_thread):
    """``Trainer.validate`` and ``Trainer.test`` over batches of 3 and 1: ``{val,test}/loss`` is the mean over the
    4 samples of the unsmoothed cross-entropy, though the task smooths its training loss (ε = 0.3)."""
    eps = 0.3
    task, x, labels = _classification_task(kind, eps)
    with torch.no_grad():
        logits = task(x)
    per_sample = F.cross_entropy(logits, labels, reduction="none")
    expected = per_sample.mean().item()
    # the controls: smoothing the evaluation loss, or averaging the two batch means, moves it by > 10 %
    smoothed = F.cross_entropy(logits, labels, label_smoothing=eps).item()
    batch_means = (per_sample[:3].mean().item() + per_sample[3].item()) / 2
    assert abs(smoothed - expected) > 0.1 * expected and abs(batch_means - expected) > 0.1 * expected
    # and training does smooth
    assert task.loss(logits, labels, "train").item() == pytest.approx(smoothed, rel=2**4 * EPS32)

    loader = DataLoader(TensorDataset(x, labels), batch_size=3)
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
                      enable_model_summary=False, callbacks=[])
    (val,) = trainer.validate(task, loader, verbose=False)
    (test,) = trainer.test(task, loader, verbose=False)
    # float32: 4 per-sample losses of 3-term log-sum-exps, weighted sum and count of 2 batches: ≤ 2⁴ roundings
    assert val["val/loss"] == pytest.approx(expected, rel=2**4 * EPS32)
    assert test["test/loss"] == pytest.approx(expected, rel=2**4 * EPS32)
