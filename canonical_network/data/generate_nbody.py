"""Generate the charged-particle N-body dataset (EGNN's files and layout) plus a manifest.

    python -m canonical_network.data.generate_nbody --out data/nbody      # nbody_small, as in the paper
    python -m canonical_network.data.generate_nbody --out /tmp/tiny --num-train 8 --num-valid 4 --num-test 4

Part of the package (an installed wheel has it too); ``scripts/generate_nbody.py`` in a checkout runs the same.

Defaults reproduce EGNN's `generate_dataset.py --num-train 10000 --seed 43 --sufix small`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from canonical_network.data.nbody import NBODY_DATASETS, generate_nbody_dataset, get_dataset_spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="data/nbody", help="output directory (default: data/nbody)")
    parser.add_argument(
        "--dataset",
        default="nbody_small",
        choices=sorted(NBODY_DATASETS),
        help="named dataset whose parameters are the defaults (default: nbody_small)",
    )
    parser.add_argument("--seed", type=int, help="global NumPy seed (nbody_small: 43)")
    parser.add_argument("--num-train", type=int, help="training simulations (nbody_small: 10000)")
    parser.add_argument("--num-valid", type=int, help="validation simulations (nbody_small: 2000)")
    parser.add_argument("--num-test", type=int, help="test simulations (nbody_small: 2000)")
    parser.add_argument("--n-particles", type=int, help="particles per simulation (5)")
    parser.add_argument("--n-steps", type=int, help="leapfrog steps per trajectory (5000)")
    parser.add_argument("--sample-every", type=int, help="steps between saved frames (nbody_small: 100)")
    parser.add_argument("--chunk-size", type=int, default=1000, help="simulations integrated at once")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    spec = get_dataset_spec(
        args.dataset,
        seed=args.seed,
        num_train=args.num_train,
        num_valid=args.num_valid,
        num_test=args.num_test,
        n_particles=args.n_particles,
        n_steps=args.n_steps,
        sample_every=args.sample_every,
    )
    start = time.perf_counter()
    manifest_path = generate_nbody_dataset(
        args.out, spec, progress=not args.no_progress, chunk_size=args.chunk_size
    )
    manifest = json.loads(manifest_path.read_text())
    total = spec.num_train + spec.num_valid + spec.num_test
    elapsed = time.perf_counter() - start
    print(
        f"wrote {len(manifest['files'])} files and {manifest_path} "
        f"({total} simulations in {elapsed:.1f} s, {1000 * elapsed / total:.2f} ms per simulation)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
