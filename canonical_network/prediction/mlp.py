"""A plain MLP on the flattened, ordered particle array: the N-body backbone with no symmetry at all (issue 36).

The paper's promise is that canonicalization makes *any* backbone equivariant. Every N-body backbone of
Table 3 is permutation-equivariant by construction (a GNN sums over neighbours), so none of them tests the
symmetric-group half of that promise. This one does: it reads the particles as one vector
``[x₁, v₁, q₁, x₂, v₂, q₂, …]`` (particle-major, ``N · 7`` numbers), so swapping two particles, rotating,
reflecting or translating the system all change its input in ways its weights treat differently. Alone it is
the row ``nbody/mlp``; behind the E(3) × S_n canonicalizer (``canonicalization=e3_permutation``) it is
``nbody/cn_mlp``, equivariant to both.
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.utils.checks import check_bool, check_int

#: numbers per particle in the flattened input: position (3), velocity (3), charge (1)
PARTICLE_FEATURES = 7


class NBodyMLP(nn.Module):
    """``MLP([x, v, q] flattened)`` ``(B, N · 7) → (B, N · 3)``, read as the predicted positions ``(B, N, 3)``.

    Layers: ``Linear(N · 7, hidden_dim)``, then ``num_layers − 1`` of ``Linear(hidden_dim, hidden_dim)``, each
    followed by SiLU (the activation of the GNN row it is compared with), then ``Linear(hidden_dim, N · 3)``.

    Equivariance: none. The input is the particles in their given order and coordinates, so the output changes
    under permutations, rotations, reflections and translations (the control of ``nbody/cn_mlp``).

    Residual (``residual=True``): ``output = x + MLP(...)``. The positions 1,000 steps ahead are the current
    ones plus a displacement; with the residual the MLP learns the displacement, and an untrained model
    predicts "nothing moves" rather than arbitrary positions, as the GNN row's residual node updates let its
    layers refine rather than rebuild the state. Behind a canonicalizer the residual is added in the
    canonical frame, ``φ(x) = g · (g⁻¹x + MLP(g⁻¹x))``, so it costs no equivariance.

    Args:
        num_particles: ``N``, the number of particles the flattened input has (5 in the paper's N-body data);
            the first and last layers' sizes depend on it, so inputs with another ``N`` are refused.
        hidden_dim: width of the hidden layers.
        num_layers: hidden layers (each a linear map and SiLU); ``num_layers + 1`` linear maps in all.
        residual: add the input positions to the output (above).

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` → predicted positions ``(B, N, 3)``.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask",)

    def __init__(self, num_particles: int = 5, hidden_dim: int = 128, num_layers: int = 3,
                 residual: bool = True) -> None:
        super().__init__()
        self.num_particles = check_int("prediction.num_particles", num_particles, low=1)
        hidden_dim = check_int("prediction.hidden_dim", hidden_dim, low=1)
        num_layers = check_int("prediction.num_layers", num_layers, low=1)
        self.residual = check_bool("prediction.residual", residual)
        widths = [self.num_particles * PARTICLE_FEATURES] + [hidden_dim] * num_layers
        layers: list[nn.Module] = []
        for width_in, width_out in zip(widths, widths[1:], strict=False):
            layers += [nn.Linear(width_in, width_out), nn.SiLU()]
        layers.append(nn.Linear(hidden_dim, self.num_particles * 3))
        self.net = nn.Sequential(*layers)

    def _check_inputs(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> None:
        """Refuse another ``N`` with the key to change, rather than a shape error from inside ``nn.Linear``."""
        if loc.dim() != 3 or loc.shape[-1] != 3:
            raise ValueError(f"NBodyMLP: loc must be (B, N, 3); got {tuple(loc.shape)}")
        batch, n = loc.shape[:2]
        if n != self.num_particles:
            raise ValueError(f"NBodyMLP: prediction.num_particles is {self.num_particles} but the inputs have N = {n} "
                             f"particles (loc {tuple(loc.shape)}); set prediction.num_particles={n}")
        for name, x, width in (("vel", vel, 3), ("charges", charges, 1)):
            if tuple(x.shape) != (batch, n, width):
                raise ValueError(f"NBodyMLP: {name} must be (B, N, {width}) = {(batch, n, width)} like loc; "
                                 f"got {tuple(x.shape)}")

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        self._check_inputs(loc, vel, charges)
        batch = loc.shape[0]
        # particle-major: the 7 numbers of particle 1, then those of particle 2, ... (the given order matters)
        flat = torch.cat([loc, vel, charges.to(loc.dtype)], dim=-1).reshape(batch, -1)
        out = self.net(flat).view(batch, self.num_particles, 3)
        return loc + out if self.residual else out


__all__ = ["PARTICLE_FEATURES", "NBodyMLP"]
