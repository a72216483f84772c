"""What computing each edge kernel one coupling path at a time saves on a training step of the tensor-field rows.

    OMP_NUM_THREADS=1 python scripts/benchmark_tensor_field.py            # TFN and SE(3)-Transformer, 9 rounds
    python scripts/benchmark_tensor_field.py --rows se3_transformer --rounds 5 --output /tmp/tf.json

``canonical_network.prediction.tfn.PairKernel`` (the kernel of TFN's convolutions and of the SE(3)-Transformer's
keys and values) evaluates a wide fully connected e3nn tensor product one coupling path at a time, each path fed
its slice of the radial weights through ``split``, and a narrow one through the product itself (the class
docstring says why; ``PATHS_MIN_WEIGHTS`` draws the line). This script measures the two ways against each other
in one process: each row (the ``prediction`` config of ``nbody/tfn`` and ``nbody/se3_transformer``) is built
twice from the same seed, once with every kernel of several paths split and once with none, each with its own
Adam (the row's learning rate). Each round takes one training step of each on the same batch of 100 random
five-particle systems (N-body's training batch), the order alternating between rounds so that a shared machine's
drifts hit both alike, timed with ``time.process_time`` (one thread: this process's CPU time). Per row: median
seconds per step of each, the median of the ratios paired within a round, whether the two copies' parameters are
still equal bit for bit after all the steps (they should be: the paths give the same numbers,
``tests/test_tensor_field_rows.py``), and how many of the row's kernels the package's rule splits.

The record (``--output``, JSON) is what ``python -m canonical_network.docs_blocks`` renders into the
``tensor-field-step`` block of ``docs/measurements.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = PROJECT_ROOT / "docs" / "benchmarks" / "tensor_field_step.json"
ROWS = ("tfn", "se3_transformer")


def build(row: str, paths_min_weights: int):
    """The row's predictor (seeded: every build has the same initial weights) with its pair kernels split by
    paths from ``paths_min_weights`` radial weights on, and its learning rate, from its experiment config."""
    import torch

    from canonical_network.prediction import tfn
    from canonical_network.utils.config import compose_experiment
    from canonical_network.utils.trust import build

    cfg = compose_experiment([f"experiment=nbody/{row}"])
    rule, tfn.PATHS_MIN_WEIGHTS = tfn.PATHS_MIN_WEIGHTS, paths_min_weights
    try:
        torch.manual_seed(0)
        return build(cfg.prediction), float(cfg.model.optimizer.lr)
    finally:
        tfn.PATHS_MIN_WEIGHTS = rule


def measure(row: str, rounds: int, seed: int) -> dict:
    import torch

    from canonical_network.prediction import tfn

    by_paths, lr = build(row, 0)  # every kernel with several paths split
    by_product, _ = build(row, sys.maxsize)  # none
    as_built, _ = build(row, tfn.PATHS_MIN_WEIGHTS)  # the package's rule (build restores it after each build)
    kernels = [m for m in as_built.modules()
               if isinstance(m, tfn.PairKernel) and len(m.tensor_product.instructions) > 1]
    split = sum(m.by_paths for m in kernels)
    generator = torch.Generator().manual_seed(seed)
    loc, vel = torch.randn(100, 5, 3, generator=generator), torch.randn(100, 5, 3, generator=generator)
    charges = torch.randint(0, 2, (100, 5, 1), generator=generator).float() * 2 - 1
    target = loc + 0.1 * vel
    models = {"paths": by_paths, "product": by_product}
    optimizers = {name: torch.optim.Adam(model.parameters(), lr=lr) for name, model in models.items()}

    def step(name: str) -> float:
        start = time.process_time()
        optimizers[name].zero_grad()
        loss = (models[name](loc, vel, charges) - target).square().mean()
        loss.backward()
        optimizers[name].step()
        return time.process_time() - start

    for name in models:  # warm-up (e3nn's first calls, allocator)
        step(name)
    times = {name: [] for name in models}
    for r in range(rounds):
        for name in (("paths", "product") if r % 2 == 0 else ("product", "paths")):
            times[name].append(step(name))
    same = all(torch.equal(a, b) for a, b in zip(by_paths.parameters(), by_product.parameters(), strict=True))
    return {
        "parameters": sum(p.numel() for p in by_paths.parameters()),
        "paths_seconds_per_step": statistics.median(times["paths"]),
        "product_seconds_per_step": statistics.median(times["product"]),
        "paired_ratio": statistics.median(a / b for a, b in zip(times["paths"], times["product"], strict=True)),
        "parameters_identical": same,
        "steps": rounds + 1,
        "kernels_with_several_paths": len(kernels),
        "kernels_split_by_the_rule": split,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--rounds", type=int, default=9, help="timed steps of each copy (default 9)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1; got {args.rounds}")

    import torch

    from canonical_network.report_inference import load_average, timing_record, write_record

    torch.set_num_threads(1)
    load_start = load_average()
    rows = {}
    for row in args.rows:
        rows[row] = result = measure(row, args.rounds, args.seed)
        print(f"nbody/{row}: by paths {result['paths_seconds_per_step']:.3f} s a step, through the product "
              f"{result['product_seconds_per_step']:.3f} s (paired ratio {result['paired_ratio']:.2f}); "
              f"parameters identical after {result['steps']} steps: {result['parameters_identical']}", flush=True)
    record = timing_record("scripts/benchmark_tensor_field.py", list(argv if argv is not None else sys.argv[1:]),
                           load_start, rounds=args.rounds, seed=args.seed, rows=rows)
    write_record(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
