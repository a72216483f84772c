"""N-body prediction networks: shapes, E(3)/O(3) equivariance where claimed, permutation equivariance,
one training step, the graph helper, and constructor validation."""

from __future__ import annotations

import itertools

import pytest
import torch

from canonical_network.nn.message_passing import fully_connected_edge_index
from canonical_network.prediction.egnn import EGNN
from canonical_network.prediction.frame_averaging import FrameAveragingGNN
from canonical_network.prediction.gnn import GNN
from canonical_network.prediction.linear import LinearDynamics
from tests.helpers import rel_tol, scale_of

ALL_MODELS = [GNN, EGNN, LinearDynamics, FrameAveragingGNN]
EQUIVARIANT_MODELS = [EGNN, FrameAveragingGNN, LinearDynamics]
#: ``n`` of the tolerances below (tests/helpers.py): the longest chain of sums of these networks (hidden 64,
#: 4 layers): per layer the edge MLP's inner products (2·64 + 2 and 64 terms), the message sum over 4
#: neighbours, the node MLP's (128 and 64 terms), ≈ 400; with the embedding and decoder ≈ 1.7e3 ≤ 2¹¹.
NBODY_TERMS = 2**11
#: A tolerance must leave room for the checks to mean something: the plain GNN misses by ~1 × the outputs'
#: scale, so a tolerance above 1 % of the scale (a frame too close to degenerate) would make it pass too.
MEANINGFUL = 1e-2
NUM_PARTICLES = 5  # the paper's system (§5.2); the models must not depend on it
BATCH_SIZE = 8
# Mean speed of the inputs, roughly that of the charged-particle data set (§5.2, Satorras et al. set-up).
SPEED = 0.5


def nbody_inputs(
    batch_size: int = BATCH_SIZE, num_particles: int = NUM_PARTICLES, dtype=torch.float32, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions ~N(0, 1), velocities of norm ~``SPEED``, charges ±1: ``(B, N, 3), (B, N, 3), (B, N, 1)``."""
    gen = torch.Generator().manual_seed(seed)
    loc = torch.randn(batch_size, num_particles, 3, generator=gen, dtype=torch.float64)
    vel = torch.randn(batch_size, num_particles, 3, generator=gen, dtype=torch.float64) * SPEED / 3**0.5
    charges = torch.randint(0, 2, (batch_size, num_particles, 1), generator=gen).to(torch.float64) * 2 - 1
    return loc.to(dtype), vel.to(dtype), charges.to(dtype)


def random_orthogonal(det: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Haar-random ``(3, 3)`` matrix of O(3) with determinant ``det`` (+1 rotation, −1 reflection)."""
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))  # the sign fix that makes QR Haar-distributed
    if torch.det(q) * det < 0:
        q[:, 0] = -q[:, 0]
    return q.to(dtype)


def build(model_cls, dtype=torch.float32, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return model_cls().to(dtype).eval()


def min_relative_eigengap(loc: torch.Tensor) -> float:
    """Smallest ``(λ_{a+1} − λ_a) / λ_max`` of the centred scatter matrices: PCA frames need it > 0."""
    centred = (loc - loc.mean(dim=1, keepdim=True)).double()
    eigvals = torch.linalg.eigvalsh(centred.transpose(1, 2) @ centred)
    return ((eigvals[:, 1:] - eigvals[:, :-1]) / eigvals[:, -1:]).min().item()


def equivariance_factor(model_cls, loc: torch.Tensor) -> float:
    """``factor = n · κ`` of the equivariance tolerance (tests/helpers.py): ``n = NBODY_TERMS``; ``κ = 1`` for
    EGNN and the linear model (no frame, no division by a small quantity); for frame averaging the PCA
    axes' amplification of a relative error of the points, ``λ_max / min gap`` (Davis–Kahan), i.e. one
    over :func:`min_relative_eigengap`."""
    kappa = 1.0 / min_relative_eigengap(loc) if model_cls is FrameAveragingGNN else 1.0
    return NBODY_TERMS * kappa


def equivariance_error(model, dtype, det: int, seed: int) -> tuple[float, float, float]:
    """``max |model(x Rᵀ + t, v Rᵀ, q) − (model(x, v, q) Rᵀ + t)|`` for one sampled ``R`` and ``t``, the
    tolerance ``rel_tol(both sides, factor=equivariance_factor(...))`` in ``dtype``, and the outputs' scale."""
    loc, vel, charges = nbody_inputs(dtype=dtype, seed=seed)
    rot = random_orthogonal(det, seed=seed + 100, dtype=dtype)
    shift = torch.randn(1, 1, 3, generator=torch.Generator().manual_seed(seed + 200), dtype=torch.float64)
    shift = shift.to(dtype)
    with torch.no_grad():
        transformed_then_model = model(loc @ rot.T + shift, vel @ rot.T, charges)
        model_then_transformed = model(loc, vel, charges) @ rot.T + shift
    error = (transformed_then_model - model_then_transformed).abs().max().item()
    factor = equivariance_factor(type(model), loc)
    tol = rel_tol(transformed_then_model, model_then_transformed, factor=factor)
    return error, tol, scale_of(transformed_then_model, model_then_transformed)


def test_fully_connected_edge_index_matches_brute_force():
    for batch_size, num_nodes in [(1, 1), (1, 2), (3, 5), (2, 7), (0, 5)]:
        expected = [
            (b * num_nodes + i, b * num_nodes + j)
            for b in range(batch_size)
            for i, j in itertools.product(range(num_nodes), repeat=2)
            if i != j
        ]
        edge_index = fully_connected_edge_index(batch_size, num_nodes, torch.device("cpu"))
        assert edge_index.dtype == torch.int64
        assert edge_index.shape == (2, batch_size * num_nodes * (num_nodes - 1))
        assert [tuple(e) for e in edge_index.T.tolist()] == expected


@pytest.mark.parametrize("model_cls", ALL_MODELS)
@pytest.mark.parametrize("num_particles", [NUM_PARTICLES, 7])
def test_output_shape(model_cls, num_particles):
    loc, vel, charges = nbody_inputs(batch_size=3, num_particles=num_particles)
    out = build(model_cls)(loc, vel, charges)
    assert out.shape == (3, num_particles, 3)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("det", [1, -1], ids=["rotation", "reflection"])
@pytest.mark.parametrize("model_cls", EQUIVARIANT_MODELS)
def test_e3_equivariance(model_cls, det, dtype):
    model = build(model_cls, dtype)
    for seed in range(3):
        error, tol, scale = equivariance_error(model, dtype, det, seed)
        # Frame averaging is only equivariant where the PCA axes are unique: a small eigengap shows in κ,
        # and inputs too close to a degenerate frame would make the tolerance meaningless.
        assert tol < MEANINGFUL * scale, f"seed {seed}: inputs too close to a degenerate frame"
        assert error < tol, f"{model_cls.__name__}: max error {error:.3g} vs tolerance {tol:.3g}"


def test_plain_gnn_is_not_equivariant():
    """The same check fails for the plain GNN: the test can tell equivariant from not."""
    model = build(GNN)
    loc = nbody_inputs(seed=0)[0]
    for det in (1, -1):
        error, tol, _ = equivariance_error(model, torch.float32, det, seed=0)
        # against the loosest tolerance the equivariant models get on these inputs (frame averaging's κ)
        loosest = tol * equivariance_factor(FrameAveragingGNN, loc) / equivariance_factor(GNN, loc)
        assert error > 100 * loosest, (error, loosest)


def test_frame_averaging_is_not_trivial():
    """FA's output must depend on more than the centroid, or the equivariance test would pass vacuously."""
    loc, vel, charges = nbody_inputs()
    out = build(FrameAveragingGNN)(loc, vel, charges)
    # O(1) away from the centroid (MEANINGFUL of the positions' scale), far beyond any rounding
    assert (out - loc.mean(dim=1, keepdim=True)).abs().max() > MEANINGFUL * loc.abs().max()


def test_frame_averaging_frames_are_orthogonal():
    loc, _, _ = nbody_inputs()
    center, frames = build(FrameAveragingGNN).frames(loc)
    assert center.shape == (BATCH_SIZE, 1, 3)
    assert frames.shape == (BATCH_SIZE, 8, 3, 3)
    eye = torch.eye(3).expand_as(frames)
    # Eigenvectors of a symmetric eigensolver are orthonormal to p(n)·eps whatever the eigengaps (LAPACK's
    # backward stability), plus the 3-term products of the check: 2⁴ eps for n = 3.
    torch.testing.assert_close(frames.transpose(-1, -2) @ frames, eye, atol=rel_tol(eye, factor=2**4), rtol=0)
    # The 8 sign choices include both orientations: half rotations, half reflections.
    assert (torch.linalg.det(frames) > 0).sum(dim=1).eq(4).all()


@pytest.mark.parametrize("model_cls", [GNN, EGNN, FrameAveragingGNN])
def test_permutation_equivariance(model_cls):
    loc, vel, charges = nbody_inputs()
    perm = torch.randperm(NUM_PARTICLES, generator=torch.Generator().manual_seed(1))
    model = build(model_cls)
    with torch.no_grad():
        permuted_then_model = model(loc[:, perm], vel[:, perm], charges[:, perm])
        model_then_permuted = model(loc, vel, charges)[:, perm]
    # Permuting only reorders sums (messages, the scatter matrix): the equivariance tolerance applies.
    tol = rel_tol(permuted_then_model, model_then_permuted, factor=equivariance_factor(model_cls, loc))
    torch.testing.assert_close(permuted_then_model, model_then_permuted, atol=tol, rtol=0)


@pytest.mark.parametrize("model_cls", ALL_MODELS)
def test_one_training_step(model_cls):
    loc, vel, charges = nbody_inputs()
    target = loc + vel  # any fixed target will do
    model = build(model_cls).train()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss = torch.nn.functional.mse_loss(model(loc, vel, charges), target)
    assert torch.isfinite(loss)
    loss.backward()
    # Every parameter takes part in the output: unused ones would break DDP.
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    optimizer.step()
    changed = [not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)]
    assert all(changed)


@pytest.mark.parametrize(
    "model_cls, kwargs, key",
    [
        (GNN, {"hidden_dim": 0}, "prediction.hidden_dim"),
        (GNN, {"num_layers": 0}, "prediction.num_layers"),
        (GNN, {"squared_distance_edge_attr": 1}, "prediction.squared_distance_edge_attr"),
        (EGNN, {"num_layers": True}, "prediction.num_layers"),
        (EGNN, {"hidden_dim": 2.5}, "prediction.hidden_dim"),
        (EGNN, {"coords_weight": "1"}, "prediction.coords_weight"),
        (FrameAveragingGNN, {"hidden_dim": -1}, "prediction.hidden_dim"),
        (LinearDynamics, {"init_time": float("nan")}, "prediction.init_time"),
    ],
)
def test_invalid_arguments_raise(model_cls, kwargs, key):
    with pytest.raises(ValueError, match=key):
        model_cls(**kwargs)


def test_fully_connected_edge_index_rejects_negative_sizes():
    with pytest.raises(ValueError, match="num_nodes"):
        fully_connected_edge_index(2, -1, torch.device("cpu"))
