"""Paired CPU-time ratios of canonicalized PointNets to PointNet, one batch at a time (issue 37 item 7).

    OMP_NUM_THREADS=1 python scripts/cpu_ratio_pointcloud.py --rounds 12

One process, one torch thread, eval mode, the models of ``benchmark_pointcloud_inference.py`` (seed 0) on one
of its synthetic batches (32 × 1,024 points). Each round times every model once on the same batch, in an
order that rotates from round to round, by ``time.process_time`` (this process's CPU time: waiting for a
core does not count), and divides each model's time by PointNet's of the same round. Pairing within a round
cancels the slow drifts of a shared machine; the median over rounds (and the quartiles) is printed. Only
ratios measured in one run compare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_pointcloud_inference import build_models, synthetic_clouds  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--points", type=int, default=1024)
    parser.add_argument("--variants", nargs="+", default=["cn_linear", "cn_linear_reference"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    models = build_models(0, ("PointNet",), ("vanilla", *args.variants))["PointNet"]
    for model in models.values():
        model.eval()
    batch = synthetic_clouds(args.batch_size, args.points, 0)
    names = list(models)
    ratios: dict[str, list[float]] = {name: [] for name in names if name != "vanilla"}
    with torch.inference_mode():
        for name in names:  # warm-up
            models[name](batch)
        for round_ in range(args.rounds):
            order = names[round_ % len(names):] + names[: round_ % len(names)]
            seconds = {}
            for name in order:
                start = time.process_time()
                models[name](batch)
                seconds[name] = time.process_time() - start
            for name in ratios:
                ratios[name].append(seconds[name] / seconds["vanilla"])
            print(f"round {round_ + 1}: " + "  ".join(f"{n} {s * 1000:.0f} ms" for n, s in seconds.items()),
                  flush=True)
    for name, values in ratios.items():
        q1, median, q3 = statistics.quantiles(values, n=4)
        print(f"{name}/vanilla CPU time: median {median:.3f} (quartiles {q1:.3f} to {q3:.3f}, "
              f"{len(values)} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
