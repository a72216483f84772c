"""CN(OPT): canonicalization by minimising a learned energy over rotations (paper §4, Appendices B and G.1).

The optimisation approach defines  h(x) ∈ argmin_g s(ρ(g), x)  with  s(ρ(g), x) = E(ρ(g)⁻¹ x)  for an energy
E that need not be equivariant: s then satisfies condition 1 of the theorem in Appendix B by construction,
s(ρ(g), ρ(g₁)x) = s(ρ(g₁)⁻¹ρ(g), x), so rotating the input by α moves every minimiser by α.

Energy. "The image is transformed to a point cloud and fed into a Deep Sets architecture" (Appendix G.1):
one point per pixel at its display coordinates (x right, y up, origin at the image centre, divided by half
the side), weighted by its intensity (zeroed below ``threshold``) in the Deep Sets mean. Rotating the cloud is
exact and cheap, so s(θ, x) = E(R_θ⁻¹ x) needs no image interpolation; only the final canonical image is
resampled (kornia, bilinear). The authors' code also feeds each pixel's intensity to φ as a feature
(``intensity_feature: true``). We do not by default: a digit rotated by a non-grid angle is resampled, which
blurs the per-pixel intensities but nearly preserves intensity-weighted averages of smooth functions, so the
feature makes E, and hence its minimiser, sensitive to interpolation (swept by hand, not recorded:
``docs/measurements.md``).

Descent. ``steps`` gradient-descent steps of size ``step_size`` on the angle θ in radians (paper: 5 steps,
learning rate 0.1), from ``num_starts`` evenly spaced angles; the start with the lowest final energy wins.
The paper reports that its descent "can get stuck in flat regions"; the starts are our answer to that.

Scale. Plain gradient descent depends on E's scale, which the paper does not fix and which training does
not control (at a minimum, the gradient to E's overall scale vanishes). At PyTorch's default initialisation
E varies by ~1e-3 over a turn (curvature ~5e-4 rad⁻², measured on real digits): 5 steps of 0.1 leave θ at
its start, the flat regions again. The descent therefore runs on the standardised energy
    s̃(θ, x) = energy_scale · s(θ, x) / σ(x),
where σ(x) is the standard deviation of s(·, x) over 8 evenly spaced probe angles (a positive number per
input, held constant during the descent). Dividing by σ(x) changes neither the minimisers nor the implicit
gradient, and σ(x) is invariant to quarter turns (the probes are permuted) and nearly so to other angles.
For a landscape ∝ cos(kθ), s̃ has curvature √2 · energy_scale · k² at its minimum; the default
energy_scale = 2.8 gives the same contraction per step, |1 − step_size · curvature| = 0.6, for one (k = 1) and
two (k = 2) minima per turn, the common cases for digits.

Gradient. Training uses implicit differentiation, not backpropagation through the steps: at the found θ*,
dθ*/dw = −(∂²s̃/∂θ²)⁻¹ ∂²s̃/∂θ∂w. We return ``θ*.detach() − (s̃'(θ*; w) − s̃'(θ*; w).detach()) / c`` with
s̃' = ∂s̃/∂θ and c = ∂²s̃/∂θ² detached: the value is θ*, the gradient exactly that formula. Where
c ≤ ``min_curvature`` (a flat region, a maximum, or a descent that has not converged) c is clamped to it, by
default 1 / (steps · step_size): the gradient is then at most steps · step_size · |∂s̃'/∂w|, the sensitivity
of the unrolled descent on a flat energy.

How closely the found angle follows a rotated input, with the defaults, more starts, or the intensity
feature, was swept by hand and not recorded; ``docs/measurements.md`` says what the tests check. The digits it
missed there were those whose energy is flat around its minimum, where resampling moves the minimum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from canonical_network.canonicalization.base import Canonicalizer
from canonical_network.groups.image import PlanarElement, act_inverse, check_images
from canonical_network.utils.checks import check_bool, check_fraction, check_int, check_positive

#: Probe angles for σ(x): 8 keeps the standard deviation invariant to quarter turns and smooth in the input.
NUM_PROBES = 8

PointCloud = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def image_point_cloud(images: torch.Tensor, threshold: float) -> PointCloud:
    """(B, C, H, W) images → coordinates (B, K, 2), intensities (B, K), weights (B, K).

    Coordinates are display coordinates (x right, y up) centred at the image centre and divided by half the
    side, so a quarter turn of the image (``torch.rot90``) permutes the points exactly. Intensities are summed
    over channels; weights are the intensities, zeroed below ``threshold``. Only the K pixels with the largest
    weights are kept, K being the largest number of weighted pixels in the batch: the others have weight 0
    and would not change the energy; on MNIST batches K ≈ 290 of 784, so the descent is ~3× cheaper.
    """
    b, _, h, w = images.shape
    rows = torch.arange(h, device=images.device, dtype=images.dtype)
    cols = torch.arange(w, device=images.device, dtype=images.dtype)
    scale = (max(h, w) - 1) / 2
    y = ((h - 1) / 2 - rows) / scale
    x = (cols - (w - 1) / 2) / scale
    coords = torch.stack(torch.meshgrid(x, y, indexing="xy"), dim=-1).reshape(h * w, 2)
    intensity = images.sum(dim=1).reshape(b, h * w)
    weights = torch.where(intensity >= threshold, intensity, torch.zeros_like(intensity))
    k = max(1, int((weights > 0).sum(dim=1).max()))
    index = weights.detach().topk(k, dim=1).indices
    return coords[index], intensity.gather(1, index), weights.gather(1, index)


def rotate_points(coords: torch.Tensor, angle_rad: torch.Tensor) -> torch.Tensor:
    """Rotate (B, P, 2) points counter-clockwise by ``angle_rad`` (B, *S) → (B, *S, P, 2)."""
    extra = (1,) * (angle_rad.dim() - 1)
    coords = coords.view(coords.shape[0], *extra, *coords.shape[1:])
    cos, sin = angle_rad.cos().unsqueeze(-1), angle_rad.sin().unsqueeze(-1)
    x, y = coords[..., 0], coords[..., 1]
    return torch.stack([cos * x - sin * y, sin * x + cos * y], dim=-1)


def _mlp(dims: Sequence[int], final_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2 or final_activation:
            # Smooth activation: implicit differentiation needs the curvature ∂²E/∂θ², ReLU's is 0 a.e.
            layers.append(nn.SiLU())
    return nn.Sequential(*layers)


class DeepSetsEnergy(nn.Module):
    """E(x) = ρ(Σᵢ mᵢ φ(pᵢ) / Σᵢ mᵢ): Deep Sets over points p = (x, y) (or (x, y, intensity)) with weights m.

    Permutation invariant, not rotation invariant (on purpose: its dependence on orientation is what the
    canonicalizer minimises). Points are given already rotated, so one network scores every candidate angle.

    Args:
        hidden_dims: widths of φ's layers; ρ maps the last width through one hidden layer of the same width
            to a scalar.
        intensity_feature: φ sees (x, y, intensity) instead of (x, y).
    """

    def __init__(self, hidden_dims: Sequence[int] = (64, 64), intensity_feature: bool = False) -> None:
        super().__init__()
        hidden_dims = list(hidden_dims)
        self.intensity_feature = bool(intensity_feature)
        self.phi = _mlp([3 if intensity_feature else 2, *hidden_dims], final_activation=True)
        self.rho = _mlp([hidden_dims[-1], hidden_dims[-1], 1], final_activation=False)

    def forward(self, points: torch.Tensor, intensity: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """points (..., P, 2); intensity and weights broadcastable to (..., P) → energy (...)."""
        weights = weights.expand(points.shape[:-1])
        if self.intensity_feature:
            points = torch.cat([points, intensity.expand(points.shape[:-1]).unsqueeze(-1)], dim=-1)
        features = self.phi(points)
        total = weights.sum(dim=-1, keepdim=True).clamp_min(1e-8)
        pooled = (weights.unsqueeze(-1) * features).sum(dim=-2) / total
        return self.rho(pooled).squeeze(-1)


class OptimizationCanonicalizer(Canonicalizer):
    """CN(OPT): h(x) = argmin_θ E(R_θ⁻¹ x) over planar rotations, found by gradient descent on θ.

    Equivariance: s(θ, R_α x) = s(θ − α, x) (exactly for quarter turns, whose point clouds are permutations of
    each other; up to pixel interpolation for other angles), so a descent from θ₀ on R_α x retraces the descent
    from θ₀ − α on x. For quarter turns and ``num_starts`` divisible by 4 the start set is shifted onto itself,
    hence h(R_α x) = α + h(x) up to float error (and up to near-ties between starts, where float noise may
    pick a different start). For other angles this holds as far as the descents converge to the same minimum:
    the paper's h is an argmin, a few steps approximate it. The canonical image h(x)⁻¹ · x is then the same
    for x and R_α x, up to interpolation.

    Args:
        steps: gradient-descent steps on θ (paper: 5).
        step_size: learning rate of those steps, on θ in radians (paper: 0.1).
        num_starts: evenly spaced starting angles, the first at 0; the start with the lowest final energy wins.
            A multiple of 4 makes quarter turns exact; 8 leaves each descent at most 22.5° to travel.
        hidden_dims: widths of the Deep Sets point network φ (see :class:`DeepSetsEnergy`).
        threshold: pixels below this intensity (inputs in [0, 1]) carry no weight.
        intensity_feature: feed each pixel's intensity to φ as well (the authors' choice; module docstring).
        energy_scale: the standardised energy's scale, which sets how far each step moves (module docstring).
        min_curvature: lower clamp of ∂²s̃/∂θ² in the implicit gradient; ``None`` = 1 / (steps · step_size)
            (1 when steps = 0).
        freeze: keep E at its initialisation (no gradient reaches it).

    ``canonicalize((B, C, H, W))`` returns the canonical images and a :class:`PlanarElement` whose
    ``angle_deg`` carries the implicit gradient to E's weights (and to the images if they require grad).
    """

    #: the tasks (model._target_'s class) whose inputs h takes (utils/run_config.py checks it)
    tasks = ("ImageClassificationTask",)

    group_name = "SO(2)"

    def __init__(
        self,
        steps: int = 5,
        step_size: float = 0.1,
        num_starts: int = 8,
        hidden_dims: Sequence[int] = (64, 64),
        threshold: float = 0.1,
        intensity_feature: bool = False,
        energy_scale: float = 2.8,
        min_curvature: float | None = None,
        freeze: bool = False,
    ) -> None:
        super().__init__(freeze=freeze)
        check_int("canonicalization.steps", steps, low=0)
        check_int("canonicalization.num_starts", num_starts, low=1)
        check_positive("canonicalization.step_size", step_size)
        check_positive("canonicalization.energy_scale", energy_scale)
        hidden_dims = list(hidden_dims) if isinstance(hidden_dims, Sequence) else hidden_dims
        if not isinstance(hidden_dims, list) or not hidden_dims or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in hidden_dims
        ):
            raise ValueError(
                f"canonicalization.hidden_dims must be a non-empty list of positive integers; got {hidden_dims!r}"
            )
        check_bool("canonicalization.intensity_feature", intensity_feature)
        check_fraction("canonicalization.threshold", threshold)
        if min_curvature is None:
            min_curvature = 1.0 / (steps * step_size) if steps > 0 else 1.0
        check_positive("canonicalization.min_curvature", min_curvature)
        self.steps = int(steps)
        self.step_size = float(step_size)
        self.num_starts = int(num_starts)
        self.threshold = float(threshold)
        self.energy_scale = float(energy_scale)
        self.min_curvature = float(min_curvature)
        self.energy = DeepSetsEnergy(hidden_dims, intensity_feature=intensity_feature)

    def start_angles_rad(self, count: int, like: torch.Tensor) -> torch.Tensor:
        """(count,) evenly spaced angles in radians, the first at 0."""
        return torch.arange(count, device=like.device, dtype=like.dtype) * (2 * math.pi / count)

    def point_cloud(self, images: torch.Tensor) -> PointCloud:
        """The weighted point cloud the energy sees (see :func:`image_point_cloud`)."""
        return image_point_cloud(images, self.threshold)

    def pose_energy(self, cloud: PointCloud, angle_rad: torch.Tensor) -> torch.Tensor:
        """s(θ, x) = E(R_θ⁻¹ x) for a point cloud of B inputs and angles θ (B, *S) → (B, *S)."""
        coords, intensity, weights = cloud
        extra = (1,) * (angle_rad.dim() - 1)
        shape = (intensity.shape[0], *extra, intensity.shape[1])
        return self.energy(rotate_points(coords, -angle_rad), intensity.view(shape), weights.view(shape))

    def energy_spread(self, cloud: PointCloud) -> torch.Tensor:
        """σ(x): (B,) standard deviation of s(·, x) over the probe angles, detached (a constant per input)."""
        with torch.no_grad():
            probes = self.start_angles_rad(NUM_PROBES, cloud[0]).expand(cloud[0].shape[0], -1)
            # Constant energies (blank images) have σ = 0 and zero slope: the floor only avoids 0/0.
            return self.pose_energy(cloud, probes).std(dim=-1).clamp_min(1e-12)

    def standardized_energy(self, cloud: PointCloud, angle_rad: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
        """s̃(θ, x) = energy_scale · s(θ, x) / σ(x), the function the descent minimises; θ (B, *S) → (B, *S)."""
        spread = spread.view(spread.shape[0], *(1,) * (angle_rad.dim() - 1))
        return self.energy_scale * self.pose_energy(cloud, angle_rad) / spread

    def descend(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradient descent from every start on the standardised energy, without a graph to E's weights.

        Returns the final angles (B, num_starts) in radians and the energy history (steps + 1, B, num_starts).
        """
        # Lightning evaluates under inference mode, which enable_grad alone does not lift; clones of inference
        # tensors made outside it are ordinary tensors that autograd may save.
        with torch.inference_mode(False), torch.enable_grad():
            cloud = tuple(t.detach().clone() for t in self.point_cloud(images))
            spread = self.energy_spread(cloud)
            theta = self.start_angles_rad(self.num_starts, cloud[0]).expand(images.shape[0], -1).clone()
            history = []
            for step in range(self.steps + 1):
                theta = theta.detach().requires_grad_(True)
                energy = self.standardized_energy(cloud, theta, spread)
                history.append(energy.detach())
                if step == self.steps:
                    break
                # Inputs and starts are independent, so the gradient of the sum is each one's own ∂s̃/∂θ.
                (slope,) = torch.autograd.grad(energy.sum(), theta)
                theta = theta - self.step_size * slope
        return theta.detach(), torch.stack(history)

    def optimal_angle_rad(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → θ* (B,) in radians, in [−π, π): the best start's final angle.

        Carries the implicit gradient dθ*/dw when gradients are enabled and E is trainable (or the images
        require grad); otherwise it is a detached tensor.
        """
        theta, history = self.descend(images)
        best = history[-1].argmin(dim=-1, keepdim=True)
        theta = torch.remainder(theta.gather(1, best).squeeze(1) + math.pi, 2 * math.pi) - math.pi
        trainable = any(p.requires_grad for p in self.energy.parameters())
        if not torch.is_grad_enabled() or not (trainable or images.requires_grad):
            return theta
        cloud = self.point_cloud(images)
        spread = self.energy_spread(cloud)
        theta_leaf = theta.detach().requires_grad_(True)
        energy = self.standardized_energy(cloud, theta_leaf, spread)
        (slope,) = torch.autograd.grad(energy.sum(), theta_leaf, create_graph=True)
        (curvature,) = torch.autograd.grad(slope.sum(), theta_leaf, retain_graph=True)
        curvature = curvature.detach().clamp_min(self.min_curvature)
        # Value θ*, gradient −(∂²s̃/∂θ²)⁻¹ ∂²s̃/∂θ∂w: the implicit function theorem at the minimum.
        return theta - (slope - slope.detach()) / curvature

    def canonicalize(self, images: torch.Tensor):
        weight = next(self.parameters(), None)
        check_images(images, "OptimizationCanonicalizer", None, None if weight is None else weight.dtype)
        angle_deg = torch.rad2deg(self.optimal_angle_rad(images))
        g = PlanarElement(angle_deg=angle_deg, reflect=torch.zeros_like(angle_deg))
        return (act_inverse(images, g),), g
