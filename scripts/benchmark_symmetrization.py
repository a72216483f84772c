"""What each symmetrization mode costs per input at inference, relative to ``canonical`` (issue 38).

    OMP_NUM_THREADS=1 python scripts/benchmark_symmetrization.py                 # all families, 7 rounds
    python scripts/benchmark_symmetrization.py --families nbody --rounds 3 --output /tmp/sym.json

``canonicalization.symmetrization`` sums φ over ``k`` weighted members (``docs/symmetrization.md``): the
predictor runs once on ``k·B`` inputs, the canonicalizer once. This script measures what that costs, for the
three families of ``scripts/reproduce.sh symmetrization`` and the modes that stage trains
(``canonicalization.frame_size=2``):

* ``rotmnist``: ``rotmnist/cn_p16`` (C16) and ``rotmnist/cn_p4`` with ``canonicalization.num_rotations=8``
  (C8): ``canonical``, ``weighted_frame``, ``sampled``, ``full``;
* ``nbody``: ``nbody/cn_gnn`` (O(3) frame from VN Deep Sets): ``canonical``, ``weighted_frame``, ``sampled``;
* ``pointcloud``: ``modelnet/cn_nl_pointnet`` with ``data.num_points=256`` (the stage's ``PC_POINTS``):
  ``canonical``, ``weighted_frame``, ``sampled``.

Every model is built as ``canonical_network.train`` builds it (:func:`canonical_network.utils.config.compose_experiment`
then ``hydra.utils.instantiate(cfg.model)``, the same seed for every mode, so the modes share their weights),
in eval mode under ``torch.inference_mode``, with one torch thread. Each family gets one fixed synthetic batch
of its config's ``data.batch_size`` (the content of a batch does not change its cost): uniform pixels for the
digits, Gaussian positions and velocities with ±1 charges for the 5 particles, stretched spheres for the clouds
(``synthetic_clouds`` of ``scripts/benchmark_pointcloud_inference.py``).

Timing: one untimed forward per mode first, then ``--rounds`` rounds; each round times one forward of every
mode of a setup, in an order rotated by one mode a round (so drifts of a shared machine hit every mode alike),
with ``time.process_time`` (this process's CPU time: with one thread, the wall time of a quiet machine, nearly
blind to the other processes on the cores; their cache and memory-bandwidth contention still counts, hence the
load average at the start and end in the record). Per mode: the median seconds per batch and per input, and
the ratio to ``canonical`` *of the same round* (paired): its median and quartiles. ``k``, the predictor's
passes, is read off the frame the canonicalizer builds on that batch (``Frame.size``: 1, ``frame_size``, or
``|G|`` for ``full``; an O(3) weighted frame has two members a candidate, ``2 · frame_size``).

The record (``--output``, JSON) is what ``python -m canonical_network.docs_blocks`` renders into the
``symmetrization-cost`` block of ``docs/symmetrization.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = PROJECT_ROOT / "docs" / "reproduction" / "benchmarks" / "symmetrization_cost.json"
#: the stage's frame size (``scripts/reproduce.sh symmetrization``: ``canonicalization.frame_size=2``)
FRAME_SIZE = 2
NBODY_PARTICLES = 5


@dataclass(frozen=True)
class Setup:
    """One model of a family: its experiment, the overrides the reproduce stage adds, and the modes it trains."""

    name: str
    key: str
    family: str
    experiment: str
    overrides: tuple[str, ...]
    modes: tuple[str, ...]


FINITE_MODES = ("canonical", "weighted_frame", "sampled", "full")
INFINITE_MODES = ("canonical", "weighted_frame", "sampled")  # SO(3), O(3): no full frame
SETUPS: tuple[Setup, ...] = (
    Setup("rotmnist/cn_p16 (C16)", "rotmnist_c16", "rotmnist", "rotmnist/cn_p16", (), FINITE_MODES),
    Setup("rotmnist/cn_p4 (C8)", "rotmnist_c8", "rotmnist", "rotmnist/cn_p4", ("canonicalization.num_rotations=8",), FINITE_MODES),
    Setup("nbody/cn_gnn", "nbody", "nbody", "nbody/cn_gnn", (), INFINITE_MODES),
    Setup("modelnet/cn_nl_pointnet (256 points)", "pointcloud", "pointcloud", "modelnet/cn_nl_pointnet",
          ("data.num_points=256",), INFINITE_MODES),
)
FAMILIES = tuple(dict.fromkeys(setup.family for setup in SETUPS))
#: what ``--families`` takes: a family (all its setups) or one setup's key
CHOICES = tuple(dict.fromkeys([*FAMILIES, *(setup.key for setup in SETUPS)]))


def _pointcloud_benchmark():
    """``scripts/benchmark_pointcloud_inference.py`` as a module (for its ``synthetic_clouds``)."""
    path = PROJECT_ROOT / "scripts" / "benchmark_pointcloud_inference.py"
    spec = importlib.util.spec_from_file_location("benchmark_pointcloud_inference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synthetic_inputs(family: str, cfg, seed: int) -> tuple:
    """One fixed batch of the family's network inputs at the config's ``data.batch_size``."""
    import torch

    batch = int(cfg.data.batch_size)
    gen = torch.Generator().manual_seed(seed)
    if family == "rotmnist":
        size, channels = int(cfg.data_info.image_size), int(cfg.data_info.in_channels)
        return (torch.rand(batch, channels, size, size, generator=gen),)
    if family == "nbody":
        loc = torch.randn(batch, NBODY_PARTICLES, 3, generator=gen)
        vel = torch.randn(batch, NBODY_PARTICLES, 3, generator=gen)
        charges = torch.randint(0, 2, (batch, NBODY_PARTICLES, 1), generator=gen).float() * 2 - 1
        return loc, vel, charges
    if family == "pointcloud":
        return (_pointcloud_benchmark().synthetic_clouds(batch, int(cfg.data.num_points), seed),)
    raise ValueError(f"unknown family {family!r}; valid: {list(FAMILIES)}")


def build_network(setup: Setup, mode: str, seed: int):
    """``(network, cfg)``: the ``CanonicalizedModel`` of ``setup`` in ``mode``, built as training builds it."""
    import torch

    from canonical_network.utils.config import compose_experiment
    from canonical_network.utils.trust import build

    cfg = compose_experiment([f"experiment={setup.experiment}", *setup.overrides,
                              f"canonicalization.symmetrization={mode}", f"canonicalization.frame_size={FRAME_SIZE}"])
    torch.manual_seed(seed)
    task = build(cfg.model)
    return task.network.eval(), cfg


def quartiles(values: list[float]) -> list[float]:
    """``[q1, median, q3]`` (inclusive method; one value: that value three times)."""
    if len(values) == 1:
        return [values[0]] * 3
    return statistics.quantiles(values, n=4, method="inclusive")


def time_setup(setup: Setup, rounds: int, seed: int) -> dict:
    """Median CPU seconds per batch and per input of each mode, the paired ratio to ``canonical`` and ``k``."""
    import torch

    networks, cfg = {}, None
    for mode in setup.modes:
        networks[mode], cfg = build_network(setup, mode, seed)
    inputs = synthetic_inputs(setup.family, cfg, seed)
    batch = inputs[0].shape[0]
    passes = {}
    with torch.inference_mode():
        for mode, network in networks.items():
            passes[mode] = int(network.canonicalizer.frame(*inputs).size)
            network(*inputs)  # warm-up
        times: dict[str, list[float]] = {mode: [] for mode in setup.modes}
        for r in range(rounds):
            order = setup.modes[r % len(setup.modes):] + setup.modes[:r % len(setup.modes)]
            for mode in order:
                start = time.process_time()
                networks[mode](*inputs)
                times[mode].append(time.process_time() - start)
    modes = {}
    for mode in setup.modes:
        ratios = [t / c for t, c in zip(times[mode], times["canonical"], strict=True)]
        per_batch = statistics.median(times[mode])
        q1, median, q3 = quartiles(ratios)
        modes[mode] = {"k": passes[mode], "seconds_per_batch": per_batch, "seconds_per_input": per_batch / batch,
                       "ratio": median, "ratio_q1": q1, "ratio_q3": q3, "times_s": times[mode]}
    canonicalizer = networks["canonical"].canonicalizer
    return {
        "family": setup.family,
        "key": setup.key,
        "experiment": setup.experiment,
        "overrides": [*setup.overrides, f"canonicalization.frame_size={FRAME_SIZE}"],
        "canonicalizer": type(canonicalizer).__name__,
        "predictor": type(networks["canonical"].predictor).__name__,
        "group_order": (int(cfg.canonicalization.num_rotations)
                        if "full" in setup.modes and "num_rotations" in cfg.canonicalization else None),
        "batch_size": batch,
        "input_shapes": [list(x.shape) for x in inputs],
        "modes": modes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds, modes in rotated order (default 7)")
    parser.add_argument("--families", nargs="+", choices=CHOICES, default=list(FAMILIES),
                        help="the families to time (default: all), or single setups (rotmnist_c16, rotmnist_c8)")
    parser.add_argument("--seed", type=int, default=0, help="the models' and the batches' seed (default 0)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help="the JSON record (default docs/reproduction/benchmarks/symmetrization_cost.json)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")

    import logging

    import torch

    from canonical_network.report_inference import benchmark_environment, command_line

    torch.set_num_threads(1)
    os.environ.setdefault("WANDB_MODE", "disabled")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    environment = benchmark_environment()  # the load average before any model runs
    record = {
        "schema": "symmetrization-cost/1",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": command_line("scripts/benchmark_symmetrization.py",
                                list(argv if argv is not None else sys.argv[1:])),
        "machine": environment["machine"],
        "environment": environment,
        "threads": torch.get_num_threads(),
        "load_start": environment["load_average_1min"],
        "rounds": args.rounds,
        "seed": args.seed,
        "frame_size": FRAME_SIZE,
        "time": "the process's CPU time (time.process_time) of one forward pass on one batch, eval mode, "
                "torch.inference_mode; median over rounds; ratio to canonical paired within a round",
        "setups": {},
    }
    for setup in SETUPS:
        if setup.family not in args.families and setup.key not in args.families:
            continue
        result = time_setup(setup, args.rounds, args.seed)
        record["setups"][setup.name] = result
        print(f"{setup.name}: " + ", ".join(f"{mode} {m['ratio']:.2f}x (k={m['k']})"
                                             for mode, m in result["modes"].items()), file=sys.stderr, flush=True)
    try:
        record["load_end"] = round(os.getloadavg()[0], 2)
    except OSError:
        record["load_end"] = None
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
