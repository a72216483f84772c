"""Time our vectorised N-body generator against the one-at-a-time reference loop, side by side.

    git clone https://github.com/vgsatorras/egnn /tmp/egnn
    python scripts/benchmark_nbody_generator.py --num-sims 200 --reference-dir /tmp/egnn/n_body_system/dataset

Both generate the first ``--num-sims`` training simulations of nbody_small (seed 43) in the same process.
The reference is EGNN's own ``ChargedParticlesSim.sample_trajectory``, imported from ``--reference-dir``
(it is not part of this repository); its arrays are also compared with ours at the frames the model uses.
Without ``--reference-dir`` the baseline is our own simulator run one simulation at a time, which is
labelled as such and is not the reference.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from canonical_network.data.nbody import NBODY_DATASETS
from canonical_network.data.nbody_sim import (
    draw_initial_conditions,
    generate_split,
    resolve_dot,
    simulate_one_at_a_time,
)


def _reference_loop(reference_dir: Path, num_sims: int, seed: int, n_steps: int, sample_every: int):
    """EGNN's generate_dataset loop: seed the global stream, then sample_trajectory once per simulation."""
    os.environ.setdefault("MPLBACKEND", "Agg")  # the reference module imports matplotlib.pyplot
    spec = importlib.util.spec_from_file_location("egnn_synthetic_sim", reference_dir / "synthetic_sim.py")
    module = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(io.StringIO()):  # its constructor prints loc_std
        spec.loader.exec_module(module)
        sim = module.ChargedParticlesSim(noise_var=0.0, n_balls=5, vel_norm=0.5)
    np.random.seed(seed)
    loc, vel = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # its (d²)^1.5 of the diagonal is NaN, then zeroed
        for _ in range(num_sims):
            out = sim.sample_trajectory(T=n_steps, sample_freq=sample_every)
            loc.append(out[0])
            vel.append(out[1])
    return np.stack(loc), np.stack(vel)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-sims", type=int, default=200, help="simulations timed on each side")
    parser.add_argument(
        "--reference-dir", type=Path, help="EGNN's n_body_system/dataset directory (holding synthetic_sim.py)"
    )
    parser.add_argument("--chunk-size", type=int, default=1000, help="our simulations integrated at once")
    args = parser.parse_args(argv)

    spec = NBODY_DATASETS["nbody_small"]
    sim, n = spec.sim, args.num_sims
    print(
        f"nbody_small, first {n} training simulations (seed {spec.seed}), {sim.n_steps} steps each; "
        f"pair dot products: {resolve_dot('auto', sim)}"
    )

    start = time.perf_counter()
    ours = generate_split(np.random.RandomState(spec.seed), n, sim, chunk_size=args.chunk_size)
    t_ours = time.perf_counter() - start
    print(f"ours, vectorised:          {t_ours:8.2f} s  ({1000 * t_ours / n:7.2f} ms per simulation)")

    start = time.perf_counter()
    if args.reference_dir is not None:
        label = "reference, one at a time:"
        base_loc, base_vel = _reference_loop(args.reference_dir, n, spec.seed, sim.n_steps, sim.sample_every)
    else:
        label = "ours, one at a time:     "
        init = draw_initial_conditions(np.random.RandomState(spec.seed), n, sim)
        base = simulate_one_at_a_time(init, sim)
        base_loc, base_vel = base.loc, base.vel
    t_base = time.perf_counter() - start
    print(f"{label}  {t_base:8.2f} s  ({1000 * t_base / n:7.2f} ms per simulation)")
    print(f"speed-up: {t_base / t_ours:.1f}x")
    if args.reference_dir is None:
        print("(no --reference-dir: the baseline is our own code run one simulation at a time, not EGNN's)")

    frames = list(spec.frames)
    err = np.maximum(
        np.abs(base_loc[:, frames] - ours.loc[:, frames]).max(axis=(1, 2, 3)),
        np.abs(base_vel[:, frames] - ours.vel[:, frames]).max(axis=(1, 2, 3)),
    )
    identical = [
        np.array_equal(base_loc[s], ours.loc[s]) and np.array_equal(base_vel[s], ours.vel[s])
        for s in range(n)
    ]
    print(
        f"agreement at frames {frames}: {np.mean(err <= 1e-6):.2%} of simulations within 1e-6 "
        f"(max difference {err.max():.3g}); {np.mean(identical):.2%} identical at all frames"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
