"""The "Linear" row of the paper's N-body table (§5.2, Table 3): constant-velocity extrapolation.

The EGNN paper's linear baseline (``Linear_dynamics`` in vgsatorras/egnn, ``--model linear_vel``) predicts
``x(t) = x(0) + t · v(0)`` with one learned scalar ``t``; charges are ignored.
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.utils.checks import check_number


class LinearDynamics(nn.Module):
    """``x + t · v`` with a single learned ``t``: straight-line motion, no interactions.

    E(3)- and permutation-equivariant trivially (positions and velocities enter linearly, ``t`` is a scalar).

    Args:
        init_time: initial value of ``t``; 0.7 in the reference (``torch.ones(1) * 0.7``).

    Forward:
        loc ``(B, N, 3)``, vel ``(B, N, 3)``, charges ``(B, N, 1)`` (unused) → positions ``(B, N, 3)``.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask",)

    def __init__(self, init_time: float = 0.7) -> None:
        super().__init__()
        init_time = check_number("prediction.init_time", init_time, finite=True)
        self.time = nn.Parameter(torch.tensor([init_time]))

    def forward(self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        return loc + self.time * vel
