"""Charged-particle N-body simulator (Kipf et al. 2018, as used by EGNN, Satorras et al. 2021).

This is the data of the paper's §5.2 / Appendix G.2 ("nbody_small"): 5 particles in 3-D with charges ±1,
Coulomb interactions, leapfrog integration. The module reproduces the EGNN generator
(``n_body_system/dataset/{synthetic_sim,generate_dataset}.py``) number for number, while simulating all
trajectories of a split at once.

Why the arithmetic looks the way it does
----------------------------------------
The dynamics are chaotic: a difference in the last bit of one force grows until trajectories diverge.
To reproduce the reference's arrays we therefore (1) draw random numbers from the same legacy global
``RandomState`` stream in the same per-simulation order, and (2) evaluate every floating-point expression
with the same operations in the same order as the reference:

* squared norms and the force sum over partners are accumulated left to right (NumPy's reductions over
  3 and 5 elements are sequential);
* the dot products ``x_i·x_j`` come from BLAS in the reference (``A.dot(A.T)``), which on CPUs with FMA
  computes ``fma(x_i2, x_j2, fma(x_i1, x_j1, x_i0·x_j0))``: a fused multiply-add that plain NumPy
  element-wise arithmetic cannot express. Calling BLAS per simulation (``np.matmul`` on a stack of (N, 3)
  matrices) reproduces it but is slower (a hand timing, not recorded: ``docs/measurements.md``). The fast path evaluates the same
  chain element-wise with ``torch.addcmul`` (fused on such CPUs) and is used only where a probe of
  thousands of random configurations shows it equal to ``np.matmul`` bit for bit
  (:func:`fused_dot_matches_blas`); otherwise BLAS is used;
* ``|r|³`` is ``np.power(d², 1.5)`` (NumPy's SIMD power, which differs from libm's ``pow`` in the last bit);
* clipping, ``v += Δt·F`` and ``x += Δt·v`` are the same element-wise expressions.

Pairwise quantities are symmetric (``d²_ij = d²_ji``, ``e_ij = e_ji``) and the pair term is antisymmetric
(``f_ji = -f_ij`` exactly in IEEE arithmetic), so only the N(N-1)/2 pairs i < j are computed.

Array layouts
-------------
Files and :class:`Trajectories` use the reference layout: positions/velocities (S, T, 3, N), charges
(S, N, 1), edges (S, N, N) with ``edges_ij = q_i q_j``. Internally the simulator keeps the state as
(3, N, S), simulations last, so that element-wise operations run over long contiguous rows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

# The reference samples charges from {-1, 0, +1} with probabilities (1/2, 0, 1/2); the zero-probability
# middle entry still shapes the CDF that ``RandomState.choice`` searches, so it is kept.
_CHARGE_VALUES = np.array([-1.0, 0.0, 1.0])
_CHARGE_PROBS = [0.5, 0.0, 0.5]


@dataclass(frozen=True)
class ChargedSimConfig:
    """Physical and numerical parameters of the charged-particle system (EGNN defaults).

    Attributes:
        n_particles: number of particles N.
        dim: spatial dimension (3).
        box_size: initial positions are reflected once into [-box_size, box_size]; there are no walls
            afterwards (the reference comments out the per-step clamp).
        loc_std: standard deviation of the initial positions for N = 5; the reference scales it by
            (N / 5)^(1/3) so that the density stays constant.
        vel_norm: every particle's initial speed (velocity drawn from N(0, I) and rescaled).
        interaction_strength: Coulomb constant k in F_ij = k q_i q_j (x_i - x_j) / |x_i - x_j|³.
        noise_scale: standard deviation of the observation noise added to the saved frames (0 in EGNN;
            the noise is drawn regardless, which matters for the random stream).
        dt: integration time step Δt.
        n_steps: number of leapfrog steps T of a trajectory.
        sample_every: a frame is saved every ``sample_every`` steps, starting at step ``sample_every``.
    """

    n_particles: int = 5
    dim: int = 3
    box_size: float = 5.0
    loc_std: float = 1.0
    vel_norm: float = 0.5
    interaction_strength: float = 1.0
    noise_scale: float = 0.0
    dt: float = 0.001
    n_steps: int = 5000
    sample_every: int = 100

    def __post_init__(self) -> None:
        if self.n_particles < 2:
            raise ValueError(f"n_particles must be >= 2, got {self.n_particles}")
        if self.n_steps % self.sample_every != 0:
            raise ValueError(
                f"n_steps ({self.n_steps}) must be a multiple of sample_every ({self.sample_every})"
            )
        if self.num_frames < 1:
            raise ValueError("n_steps must be at least 2 * sample_every so that one frame is saved")

    @property
    def max_force(self) -> float:
        """Each force component is clipped to ±0.1/Δt, so a close encounter cannot change a velocity
        component by more than 0.1 in one step."""
        return 0.1 / self.dt

    @property
    def num_frames(self) -> int:
        """Frames saved per trajectory: steps sample_every, 2·sample_every, ..., n_steps - sample_every.

        The reference allocates n_steps / sample_every - 1 frames (49 for 5000 / 100).
        """
        return self.n_steps // self.sample_every - 1

    @property
    def scaled_loc_std(self) -> float:
        return self.loc_std * (float(self.n_particles) / 5.0) ** (1 / 3)

    def file_suffix(self, suffix: str = "") -> str:
        """The reference's file-name suffix, e.g. ``_charged5_initvel1small``."""
        return f"_charged{self.n_particles}_initvel1{suffix}"


@dataclass
class InitialConditions:
    """Random draws for S simulations, in the reference's per-simulation order.

    Attributes:
        charges: (S, N, 1) float64, each ±1.
        loc: (S, dim, N) float64 positions after the reflection into the box.
        vel: (S, dim, N) float64 velocities (norm ``vel_norm`` each, sign-flipped where reflected).
        noise_loc, noise_vel: (S, T, dim, N) standard-normal observation noise, or None when
            ``noise_scale`` is 0 (the numbers are still drawn, then dropped).
    """

    charges: np.ndarray
    loc: np.ndarray
    vel: np.ndarray
    noise_loc: np.ndarray | None = None
    noise_vel: np.ndarray | None = None

    def __len__(self) -> int:
        return self.charges.shape[0]

    def select(self, index: np.ndarray | slice | list[int]) -> InitialConditions:
        """Initial conditions of a subset of simulations (e.g. a chunk, or the few a test needs)."""
        pick = lambda a: None if a is None else a[index]
        return InitialConditions(*(pick(getattr(self, f.name)) for f in dataclasses.fields(self)))


@dataclass
class Trajectories:
    """Simulated trajectories in the reference's file layout.

    Attributes:
        loc: (S, T, dim, N) float64 positions at the saved frames.
        vel: (S, T, dim, N) float64 velocities at the saved frames (half a step behind, as in leapfrog).
        charges: (S, N, 1) float64.
        edges: (S, N, N) float64, ``edges[s, i, j] = q_i q_j`` (diagonal q_i² = 1, as in the reference).
    """

    loc: np.ndarray
    vel: np.ndarray
    charges: np.ndarray
    edges: np.ndarray


def draw_initial_conditions(
    rng: np.random.RandomState, num_sims: int, config: ChargedSimConfig = ChargedSimConfig()
) -> InitialConditions:
    """Draw the random numbers of ``num_sims`` consecutive simulations.

    The reference draws, per simulation: charges (``choice``), positions (``randn(dim, N)``), velocities
    (``randn(dim, N)``), and after simulating two arrays of observation noise (``randn(T, dim, N)``).
    Drawing the same calls in the same order from a legacy ``RandomState`` reproduces its stream, so the
    simulations themselves can then run in a batch.

    Args:
        rng: legacy NumPy generator, e.g. ``np.random.RandomState(43)`` (same stream as ``np.random.seed``).
        num_sims: S.
        config: simulation parameters.

    Returns:
        InitialConditions with arrays of leading dimension S (positions already reflected into the box).
    """
    n, dim, frames = config.n_particles, config.dim, config.num_frames
    charges = np.empty((num_sims, n, 1))
    loc = np.empty((num_sims, dim, n))
    vel = np.empty((num_sims, dim, n))
    keep_noise = config.noise_scale != 0.0
    noise_loc = np.empty((num_sims, frames, dim, n)) if keep_noise else None
    noise_vel = np.empty((num_sims, frames, dim, n)) if keep_noise else None
    for s in range(num_sims):
        charges[s] = rng.choice(_CHARGE_VALUES, size=(n, 1), p=_CHARGE_PROBS)
        loc[s] = rng.randn(dim, n) * config.scaled_loc_std
        vel[s] = rng.randn(dim, n)
        nl = rng.randn(frames, dim, n)
        nv = rng.randn(frames, dim, n)
        if keep_noise:
            noise_loc[s], noise_vel[s] = nl, nv

    # Rescale each particle's velocity to norm vel_norm: squared components summed left to right, then
    # (v * vel_norm) / |v|, the reference's order of operations.
    sq_norm = vel[:, 0] ** 2
    for d in range(1, dim):
        sq_norm = sq_norm + vel[:, d] ** 2
    vel = vel * config.vel_norm / np.sqrt(sq_norm)[:, None, :]

    loc, vel = _reflect_into_box(loc, vel, config.box_size)
    return InitialConditions(
        charges=charges,
        loc=loc,
        vel=vel,
        noise_loc=noise_loc,
        noise_vel=noise_vel,
    )


def _reflect_into_box(loc: np.ndarray, vel: np.ndarray, box: float) -> tuple[np.ndarray, np.ndarray]:
    """Reflect coordinates beyond ±box once and point the velocity back inwards (reference ``_clamp``)."""
    if np.any(np.abs(loc) >= 3 * box):
        # The reference asserts this; a single reflection could not bring such a point into the box.
        raise ValueError(f"an initial position lies outside ±{3 * box}; one reflection cannot fix it")
    over = loc > box
    loc = np.where(over, 2 * box - loc, loc)
    vel = np.where(over, -np.abs(vel), vel)
    under = loc < -box
    loc = np.where(under, -2 * box - loc, loc)
    vel = np.where(under, np.abs(vel), vel)
    return loc, vel


@functools.cache
def fused_dot_matches_blas(dim: int = 3, n_particles: int = 5, num_probe: int = 4096) -> bool:
    """Whether the element-wise fused chain (torch.addcmul) gives BLAS's dot products bit for bit here.

    Checked on random (n_particles, dim) matrices with the magnitudes of the simulation. A different
    evaluation order or a missing FMA changes the last bit of a large fraction of the products, so
    thousands of probes leave no doubt.
    """
    x = np.random.RandomState(0).randn(dim, n_particles, num_probe) * 3.0  # (dim, N, S), as simulated
    charges, config = np.ones((num_probe, n_particles, 1)), ChargedSimConfig(n_particles=n_particles, dim=dim)
    fused = _PairForces(charges, config, dot="fused").pair_dots(x)
    blas = _PairForces(charges, config, dot="blas").pair_dots(x)
    return bool(np.array_equal(fused, blas))


def resolve_dot(dot: str, config: ChargedSimConfig) -> str:
    """Turn ``dot="auto"`` into "fused" where that reproduces BLAS, else "blas"."""
    if dot == "auto":
        return "fused" if fused_dot_matches_blas(config.dim, config.n_particles) else "blas"
    if dot not in ("blas", "fused"):
        raise ValueError(f"dot must be 'auto', 'blas' or 'fused', got {dot!r}")
    return dot


class _PairForces:
    """Coulomb forces for a batch of S configurations, in the reference's arithmetic order.

    Works in a simulations-last layout, positions (dim, N, S), so that every element-wise operation runs
    over long contiguous rows. All work arrays are allocated once: re-allocating them every step costs
    more than the arithmetic (page faults).
    """

    def __init__(self, charges: np.ndarray, config: ChargedSimConfig, dot: str = "auto"):
        """
        Args:
            charges: (S, N, 1).
            config: simulation parameters.
            dot: how to compute x_i·x_j: "blas" (np.matmul per simulation, what the reference does) or
                "fused" (torch.addcmul chain; fast, valid where :func:`fused_dot_matches_blas` holds).
        """
        if dot not in ("blas", "fused"):
            raise ValueError(f"dot must be 'blas' or 'fused', got {dot!r}")
        self.dot = dot
        s_count, n = charges.shape[:2]
        dim = config.dim
        self.max_force = config.max_force
        self.pair_i, self.pair_j = np.triu_indices(n, k=1)  # pairs i < j, P = N(N-1)/2 of them
        self.pair_flat = self.pair_i * n + self.pair_j  # their entries of a flattened (N, N) matrix
        num_pairs = len(self.pair_i)
        # The force on i is the sum over partners j != i, left to right, of term(i, j), where
        # term(i, j) = term_p for the pair p = (i, j), i < j, and -term_p for p = (j, i). With the terms
        # stored as [term_0..term_{P-1}, -term_0..-term_{P-1}], row k of `partner_terms` is the index of
        # the k-th partner's term for every particle, so one gather lines them up for summing.
        pair_of = {(int(a), int(b)): p for p, (a, b) in enumerate(zip(self.pair_i, self.pair_j, strict=True))}
        partners = [[j for j in range(n) if j != i] for i in range(n)]
        self.partner_terms = np.array(
            [
                [
                    pair_of[(i, js[k])] if i < js[k] else num_pairs + pair_of[(js[k], i)]
                    for i, js in enumerate(partners)
                ]
                for k in range(n - 1)
            ]
        )  # (N-1, N)
        q = charges[:, :, 0].T  # (N, S)
        # k * q_i q_j: the numerator of the reference's forces_size (k * edges).
        self.strength = config.interaction_strength * (q[self.pair_i] * q[self.pair_j])  # (P, S)

        self._ends = np.concatenate([self.pair_i, self.pair_j])  # both ends of every pair
        self._partner_terms_flat = self.partner_terms.ravel()
        # Work arrays, and the views of them each step uses (made once: a step is only ~20 NumPy calls on
        # arrays of a few thousand numbers, so even creating views shows up in the profile).
        self._x_pairs = np.empty((dim, 2, num_pairs, s_count))  # x_i and x_j of every pair
        self._x_pairs_flat = self._x_pairs.reshape(dim, 2 * num_pairs, s_count)
        self._x_i, self._x_j = self._x_pairs[:, 0], self._x_pairs[:, 1]
        self._sq = np.empty((dim, 2, num_pairs, s_count))
        self._sq_rows = list(self._sq)
        self._sq_norm = np.empty((2, num_pairs, s_count))
        self._dist = np.empty((num_pairs, s_count))
        self._dot = np.empty((num_pairs, s_count))
        terms = np.empty((dim, 2 * num_pairs, s_count))
        self._terms, self._term, self._neg_term = terms, terms[:, :num_pairs], terms[:, num_pairs:]
        lined_up = np.empty((dim, n - 1, n, s_count))
        self._lined_up_flat = lined_up.reshape(dim, (n - 1) * n, s_count)
        self._lined_up_rows = [lined_up[:, k] for k in range(n - 1)]
        self._force = np.empty((dim, n, s_count))
        # torch views sharing memory with the NumPy work arrays, for the fused dot products.
        self._t_dot = torch.from_numpy(self._dot)
        self._t_x_i = [torch.from_numpy(self._x_pairs[d, 0]) for d in range(dim)]
        self._t_x_j = [torch.from_numpy(self._x_pairs[d, 1]) for d in range(dim)]

    def _dot_blas(self, x: np.ndarray, out: np.ndarray) -> None:
        """x_i·x_j for all pairs into out (P, S), from BLAS on each simulation's (N, dim) matrix."""
        dim, n, s_count = x.shape
        per_sim = np.ascontiguousarray(x.transpose(2, 1, 0))  # (S, N, dim)
        gram = np.matmul(per_sim, per_sim.transpose(0, 2, 1))  # same operands as the reference's A.dot(A.T)
        np.take(gram.reshape(s_count, n * n).T, self.pair_flat, axis=0, out=out)

    def _dot_fused(self, out: torch.Tensor) -> None:
        """x_i·x_j = fma(x_i2, x_j2, fma(x_i1, x_j1, x_i0 x_j0)) from the gathered pair coordinates."""
        torch.mul(self._t_x_i[0], self._t_x_j[0], out=out)
        for a, b in zip(self._t_x_i[1:], self._t_x_j[1:], strict=True):
            out.addcmul_(a, b)

    def pair_dots(self, x: np.ndarray) -> np.ndarray:
        """Gather both ends of every pair into the work array and return x_i·x_j (P, S) (a work buffer).

        See the module docstring for why these come from BLAS or from a fused multiply-add chain.
        """
        np.take(x, self._ends, axis=1, out=self._x_pairs_flat)
        if self.dot == "fused":
            self._dot_fused(self._t_dot)
        else:
            self._dot_blas(x, self._dot)
        return self._dot

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Forces (dim, N, S) on particles at positions x (dim, N, S), each component clipped to ±max_force.

        The returned array is a work buffer, overwritten by the next call.
        """
        sq_rows, sq_norm, dist = self._sq_rows, self._sq_norm, self._dist
        dot = self.pair_dots(x)

        # |x_i|² and |x_j|², coordinates summed left to right.
        np.multiply(self._x_pairs, self._x_pairs, out=self._sq)
        np.add(sq_rows[0], sq_rows[1], out=sq_norm)
        for row in sq_rows[2:]:
            np.add(sq_norm, row, out=sq_norm)

        # ||x_i||² + ||x_j||² - 2 x_i·x_j (the reference's _l2), then k q_i q_j / (d²)^1.5.
        np.add(sq_norm[0], sq_norm[1], out=dist)
        np.multiply(dot, 2.0, out=dot)
        np.subtract(dist, dot, out=dist)
        np.power(dist, 1.5, out=dist)
        size = np.divide(self.strength, dist, out=dist)  # (P, S)

        # Force on i from j > i: size * (x_i - x_j); on j from i it is exactly the negative.
        term = np.subtract(self._x_i, self._x_j, out=self._term)
        np.multiply(term, size, out=term)
        np.negative(term, out=self._neg_term)

        # Sum over partners j = 0..N-1 left to right (the j = i term is an exact zero and is skipped).
        np.take(self._terms, self._partner_terms_flat, axis=1, out=self._lined_up_flat)
        rows, force = self._lined_up_rows, self._force
        if len(rows) > 1:
            np.add(rows[0], rows[1], out=force)
        else:
            np.copyto(force, rows[0])
        for row in rows[2:]:
            np.add(force, row, out=force)
        # Same result as the reference's masked assignments F[F > max] = max, F[F < -max] = -max.
        np.minimum(np.maximum(force, -self.max_force, out=force), self.max_force, out=force)
        return force


def _integrate_chunk(
    init: InitialConditions, config: ChargedSimConfig, dot: str, loc_out: np.ndarray, vel_out: np.ndarray
) -> None:
    """Leapfrog for one chunk of simulations, writing the saved frames into loc_out/vel_out (S, T, dim, N)."""
    forces = _PairForces(init.charges, config, dot)
    dt = config.dt
    # Simulations-last working layout (dim, N, S); always a copy, the state is updated in place.
    x = init.loc.transpose(1, 2, 0).copy()
    v = init.vel.transpose(1, 2, 0).copy()
    increment = np.empty_like(x)  # Δt·v or Δt·F, formed before the addition as in the reference
    last_step = config.num_frames * config.sample_every  # later steps do not reach any saved frame

    np.add(v, np.multiply(forces(x), dt, out=increment), out=v)  # the initial half step of leapfrog
    frame = 0
    for step in range(1, last_step + 1):
        np.add(x, np.multiply(v, dt, out=increment), out=x)
        if step % config.sample_every == 0:
            loc_out[:, frame] = x.transpose(2, 0, 1)
            vel_out[:, frame] = v.transpose(2, 0, 1)
            frame += 1
        if step < last_step:
            np.add(v, np.multiply(forces(x), dt, out=increment), out=v)


def simulate(
    init: InitialConditions,
    config: ChargedSimConfig = ChargedSimConfig(),
    chunk_size: int = 1000,
    progress: Callable[[int], None] | None = None,
    dot: str = "auto",
) -> Trajectories:
    """Integrate S trajectories at once with leapfrog (an initial half step for the velocities).

    Per step: x += Δt·v; save the frame if the step is a multiple of ``sample_every``; v += Δt·F(x).
    Frame t (0-based) is the state after step (t + 1)·sample_every, with the velocity half a step behind.

    Args:
        init: initial conditions of S simulations (see :func:`draw_initial_conditions`).
        config: simulation parameters.
        chunk_size: simulations integrated together; bounded so the working arrays stay in cache.
        progress: called with the number of simulations finished after each chunk (e.g. tqdm.update).
        dot: "auto", "blas" or "fused": how pair dot products are computed (see :class:`_PairForces`).

    Returns:
        Trajectories with loc/vel (S, T, dim, N), T = config.num_frames.
    """
    s_total = len(init)
    n, dim, frames = config.n_particles, config.dim, config.num_frames
    loc_out = np.empty((s_total, frames, dim, n))
    vel_out = np.empty((s_total, frames, dim, n))
    dot = resolve_dot(dot, config)

    for start in range(0, s_total, chunk_size):
        stop = min(start + chunk_size, s_total)
        _integrate_chunk(
            init.select(slice(start, stop)), config, dot, loc_out[start:stop], vel_out[start:stop]
        )
        if progress is not None:
            progress(stop - start)

    if init.noise_loc is not None:
        loc_out += init.noise_loc * config.noise_scale
        vel_out += init.noise_vel * config.noise_scale
    charges = init.charges
    edges = charges * charges.transpose(0, 2, 1)  # q_i q_j; products of ±1 are exact
    return Trajectories(loc=loc_out, vel=vel_out, charges=charges.copy(), edges=edges)


def simulate_one_at_a_time(
    init: InitialConditions, config: ChargedSimConfig = ChargedSimConfig(), dot: str = "blas"
) -> Trajectories:
    """Simulate each trajectory on its own (chunks of one, BLAS dot products by default, as the reference).

    The slow loop the batched path replaces: used to check that batching does not change any number.
    """
    parts = [simulate(init.select(slice(s, s + 1)), config, chunk_size=1, dot=dot) for s in range(len(init))]
    fields = ("loc", "vel", "charges", "edges")
    return Trajectories(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))


def generate_split(
    rng: np.random.RandomState,
    num_sims: int,
    config: ChargedSimConfig = ChargedSimConfig(),
    chunk_size: int = 1000,
    progress: Callable[[int], None] | None = None,
) -> Trajectories:
    """Draw and simulate ``num_sims`` consecutive simulations from ``rng`` (one split of a dataset)."""
    return simulate(draw_initial_conditions(rng, num_sims, config), config, chunk_size, progress)
