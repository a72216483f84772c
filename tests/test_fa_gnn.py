"""Puny et al.'s layer-wise FA-GNN (``nbody/fa_gnn``) beside our whole-GNN variant (``nbody/fa_gnn_global``):
E(3) and permutation equivariance at a derived float64 tolerance, a check that the same test fails for the
plain GNN, that the latent features really are re-framed at every layer, and that both rows build from their
experiment configs."""

from __future__ import annotations

import math

import hydra
import pytest
import torch

from canonical_network.canonicalization.base import CanonicalizedModel
from canonical_network.groups.euclidean import EuclideanTransform, random_orthogonal
from canonical_network.prediction import frame_averaging
from canonical_network.prediction.frame_averaging import (
    NUM_FRAMES,
    FrameAveragingGNN,
    LayerwiseFrameAveragingGNN,
    PCAFrame,
    pca_frame,
)
from canonical_network.prediction.gnn import GNN
from canonical_network.utils.config import compose_experiment
from tests.helpers import DEEP64, rel_tol, seeded_gen

BATCH_SIZE = 8
NUM_PARTICLES = 5  # the paper's systems (§5.2)
# Input scales of the charged-particle data (nbody_small): positions spread over a few units, speeds ~0.5.
POSITION_SCALE, SPEED, SHIFT_SCALE = 2.0, 0.5, 3.0
EPS64 = torch.finfo(torch.float64).eps


def nbody_inputs(seed: int, batch_size: int = BATCH_SIZE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 positions, velocities and ±1 charges: ``(B, N, 3), (B, N, 3), (B, N, 1)``."""
    gen = seeded_gen(seed)
    loc = POSITION_SCALE * torch.randn(batch_size, NUM_PARTICLES, 3, generator=gen, dtype=torch.float64)
    vel = SPEED / math.sqrt(3) * torch.randn(batch_size, NUM_PARTICLES, 3, generator=gen, dtype=torch.float64)
    charges = torch.randint(0, 2, (batch_size, NUM_PARTICLES, 1), generator=gen).to(torch.float64) * 2 - 1
    return loc, vel, charges


def sampled_transform(seed: int, det: int, batch_size: int = BATCH_SIZE) -> EuclideanTransform:
    """One Haar-random ``Q ∈ O(3)`` with determinant ``det`` and one translation per system, float64."""
    gen = seeded_gen(seed + 1000)
    q = random_orthogonal(batch_size, gen, dtype=torch.float64)
    q = q * (torch.det(q) * det).sign().view(-1, 1, 1)  # −Q flips the determinant in odd dimension
    return EuclideanTransform(q, SHIFT_SCALE * torch.randn(batch_size, 3, generator=gen, dtype=torch.float64))


def build(model_cls=LayerwiseFrameAveragingGNN, seed: int = 0, **kwargs) -> torch.nn.Module:
    torch.manual_seed(seed)
    return model_cls(**kwargs).double().eval()


def frame_condition(frame: PCAFrame) -> float:
    """``max_b λ_max / min_a (λ_{a+1} − λ_a)`` of a frame's scatter matrices: the factor by which a relative
    perturbation of the points is amplified in the axes (Davis–Kahan)."""
    gaps = (frame.variances[:, 1:] - frame.variances[:, :-1]).min(dim=1).values
    return (frame.variances[:, -1] / gaps).max().item()


def accumulation_length(model: LayerwiseFrameAveragingGNN) -> int:
    """Terms summed along the longest chain of a forward pass (embedding, per layer the two edge-MLP and two
    node-MLP inner products and the message sum, per re-framing the scatter sum, the 3-term frame products
    and the 8-pose average, the decoder): ``n`` in the worst-case rounding bound ``n·eps`` of sums."""
    hidden, layers = model.backbone.hidden_dim, len(model.backbone.layers)
    edge_attr_dim = 2 if model.backbone.squared_distance_edge_attr else 1
    per_layer = (2 * hidden + edge_attr_dim) + hidden + (NUM_PARTICLES - 1) + 2 * hidden + hidden
    per_frame = NUM_PARTICLES * model.num_vectors + 2 * 3 + NUM_FRAMES
    return 2 * 3 + layers * per_layer + layers * per_frame + 2 * hidden


def equivariance_tolerance(
    model: LayerwiseFrameAveragingGNN, frames: tuple[PCAFrame, ...], scale: float
) -> float:
    """Worst-case float64 error of an exactly equivariant model at these inputs.

    Rounding alone perturbs a value by at most ``n·eps`` relative (``n`` = :func:`accumulation_length`). Each
    frame turns that relative perturbation of its points into an axis error up to ``κ_l`` times larger
    (:func:`frame_condition`), and the next frame sees it again, so the errors compound to
    ``n·eps·Π_l (1 + κ_l)`` relative to the output scale (positions plus the translation). Worst case, hence
    loose (observed errors are ~1e-15 relative); it only has to stay far below the O(1) error of a model that
    is not equivariant, which the tests assert.
    """
    amplification = math.prod(1.0 + frame_condition(f) for f in frames)
    return accumulation_length(model) * EPS64 * amplification * scale


@pytest.mark.parametrize("det", [1, -1], ids=["rotation", "reflection"])
@pytest.mark.parametrize("seed", range(3))
def test_layerwise_fa_gnn_is_e3_equivariant(one_thread, seed, det):
    model = build(seed=seed)
    loc, vel, charges = nbody_inputs(seed)
    g = sampled_transform(seed, det)
    with torch.no_grad():
        out, frames = model.forward_with_frames(loc, vel, charges)
        transformed_then_model = model(g.apply_to_points(loc), g.apply_to_vectors(vel), charges)
    model_then_transformed = g.apply_to_points(out)
    scale = max(transformed_then_model.abs().max().item(), model_then_transformed.abs().max().item())
    tol = equivariance_tolerance(model, frames, scale)
    # a threshold on the inputs' conditioning, not a rounding tolerance: the plain GNN misses by O(scale)
    assert tol < 1e-3 * scale, "inputs too close to a degenerate frame for the check to mean anything"
    error = (transformed_then_model - model_then_transformed).abs().max().item()
    assert error < tol, f"max error {error:.3g} vs tolerance {tol:.3g}"
    # The prediction must move away from the centroid by far more than the tolerance, or equivariance would
    # hold vacuously (an output equal to the centroid is equivariant).
    assert (out - loc.mean(dim=1, keepdim=True)).abs().max() > 100 * tol


def test_same_check_fails_for_the_plain_gnn(one_thread):
    """The GNN under the same inputs and transforms misses by O(1): the check can tell the difference."""
    gnn = build(GNN)
    reference = build()  # for the tolerance: the layer-wise model's frames on the same inputs
    loc, vel, charges = nbody_inputs(0)
    for det in (1, -1):
        g = sampled_transform(0, det)
        with torch.no_grad():
            transformed_then_model = gnn(g.apply_to_points(loc), g.apply_to_vectors(vel), charges)
            model_then_transformed = g.apply_to_points(gnn(loc, vel, charges))
            _, frames = reference.forward_with_frames(loc, vel, charges)
        scale = max(transformed_then_model.abs().max().item(), model_then_transformed.abs().max().item())
        error = (transformed_then_model - model_then_transformed).abs().max().item()
        assert error > 1e-2 * scale > equivariance_tolerance(reference, frames, scale)


def test_layerwise_fa_gnn_is_permutation_equivariant(one_thread):
    model = build()
    loc, vel, charges = nbody_inputs(1)
    perm = torch.randperm(NUM_PARTICLES, generator=seeded_gen(2))
    with torch.no_grad():
        out, frames = model.forward_with_frames(loc, vel, charges)
        permuted_then_model = model(loc[:, perm], vel[:, perm], charges[:, perm])
    # Permuting only reorders sums (scatter matrices, messages): the same rounding bound applies.
    tol = equivariance_tolerance(model, frames, out.abs().max().item())
    assert (permuted_then_model - out[:, perm]).abs().max().item() < tol


def test_latent_features_are_reframed_at_every_layer(one_thread, monkeypatch):
    """Frame 0 is the input positions' PCA frame; frames 1 … L−1 are PCA frames of the N·H/3 latent vectors,
    depend on the weights of the layers before them, and differ from frame 0."""
    model = build()
    loc, vel, charges = nbody_inputs(0)
    framed_point_sets = []

    def recording_pca_frame(points):
        framed_point_sets.append(points.shape)
        return pca_frame(points)

    monkeypatch.setattr(frame_averaging, "pca_frame", recording_pca_frame)
    with torch.no_grad():
        _, frames = model.forward_with_frames(loc, vel, charges)
    num_layers, num_vectors = len(model.backbone.layers), model.num_vectors
    assert len(frames) == num_layers
    assert framed_point_sets == [loc.shape] + [(BATCH_SIZE, NUM_PARTICLES * num_vectors, 3)] * (
        num_layers - 1
    )

    input_frame = pca_frame(loc)
    torch.testing.assert_close(frames[0].center, input_frame.center, rtol=0, atol=0)
    torch.testing.assert_close(frames[0].axes, input_frame.axes, rtol=0, atol=0)
    for frame in frames[1:]:
        # Not the input frame up to the sign of its axes: the first principal axes point elsewhere.
        alignment = (frame.axes[:, 0, :, 0] * input_frame.axes[:, 0, :, 0]).sum(dim=-1).abs()
        assert alignment.min() < 0.99

    # Changing the first layer's weights moves every later frame and leaves the input frame alone. (A weight,
    # not a bias: a bias shared by all poses averages to zero over the 8 sign flips, so it cannot move u.)
    with torch.no_grad():
        weight = model.backbone.layers[0].node_mlp[-1].weight
        weight.add_(0.1 * torch.randn(weight.shape, generator=seeded_gen(3), dtype=weight.dtype))
        _, changed = model.forward_with_frames(loc, vel, charges)
    assert torch.equal(changed[0].axes, frames[0].axes)
    # moved by the weight change (O(0.1)), not by rounding (≤ DEEP64 eps of the axes' unit scale)
    assert all(
        (a.axes - b.axes).abs().max() > rel_tol(b.axes, factor=DEEP64)
        for a, b in zip(changed[1:], frames[1:], strict=True)
    )


def test_every_parameter_gets_a_gradient(one_thread):
    """All weights take part through the re-framings (the frames themselves carry no gradient)."""
    model = build().train()
    loc, vel, charges = nbody_inputs(0)
    loss = torch.nn.functional.mse_loss(model(loc, vel, charges), loc + vel)
    loss.backward()
    assert all(
        p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
        for p in model.parameters()
    )


def test_hidden_dim_must_hold_whole_vectors():
    with pytest.raises(ValueError, match="prediction.hidden_dim must be a multiple of 3"):
        LayerwiseFrameAveragingGNN(hidden_dim=64)


@pytest.mark.parametrize(
    "experiment, predictor_cls",
    [("nbody/fa_gnn", LayerwiseFrameAveragingGNN), ("nbody/fa_gnn_global", FrameAveragingGNN)],
)
def test_both_fa_rows_build_from_their_experiment_configs(one_thread, experiment, predictor_cls):
    cfg = compose_experiment([f"experiment={experiment}"])
    assert cfg.experiment_name == experiment
    torch.manual_seed(0)
    model = hydra.utils.instantiate(cfg.model).eval()
    assert isinstance(model.network, CanonicalizedModel)
    assert type(model.network.predictor) is predictor_cls
    loc, vel, charges = (x.float() for x in nbody_inputs(0, batch_size=2))
    with torch.no_grad():
        out = model(loc, vel, charges)
    assert out.shape == loc.shape and out.dtype == torch.float32 and torch.isfinite(out).all()
