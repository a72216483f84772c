"""The "Linear" row of the paper's N-body table (§5.2, Table 3): constant-velocity extrapolation.

The EGNN paper's linear baseline (``Linear_dynamics`` in vgsatorras/egnn, ``--model linear_vel``) predicts
``x(t) = x(0) + t · v(0)`` with one learned scalar ``t``; charges are ignored.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LinearDynamics(nn.Module):
    """``x + t · v`` with a single learned ``t``: straight-line motion, no interactions.

    E(3)- and permutation-equivariant trivially (positions and velocities enter linearly, ``t`` is a scalar).

    Args:
        init_time: initial value of ``t``; 0.7 in the reference (``torch.ones(1) * 0.7``).

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` (unused) → positions ``(B, N, 3)``.
    """

    def __init__(self, init_time: float = 0.7) -> None:
        super().__init__()
        if (
            isinstance(init_time, bool)
            or not isinstance(init_time, int | float)
            or not math.isfinite(init_time)
        ):
            raise ValueError(f"init_time must be a finite real number in (-∞, ∞), got {init_time!r}")
        self.time = nn.Parameter(torch.tensor([float(init_time)]))

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        return loc + self.time * vel
