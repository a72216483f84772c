"""What ``compile=true`` saves on an N-body training epoch, and whether it changes the numbers.

    OMP_NUM_THREADS=1 python scripts/benchmark_compile.py                          # GNN, EGNN, CN-GNN, FA-GNN, 30 epochs
    python scripts/benchmark_compile.py --experiments nbody/gnn --epochs 10 --output /tmp/compile.json

Each experiment is trained twice from the same seed, the same initial weights and the same batches: eagerly,
then with its network compiled (:func:`canonical_network.utils.compile.compiled_network`, what ``compile=true``
does in ``canonical_network.train``), on the experiment's own data (``data/nbody``, generated on first use) and
settings (batch, learning rate, validation every ``trainer.check_val_every_n_epoch`` epochs), with a Lightning
``Trainer`` on one CPU thread and without loggers or checkpoints. Per epoch, the training epoch and its
validation (when one falls due) are timed with ``time.process_time`` (this process's CPU time: with one thread,
the wall time of a quiet machine, nearly blind to other processes on the cores; their cache and
memory-bandwidth contention still counts, hence the load averages in the record). The first ``--warmup``
epochs are left out of the means (compilation happens in the first epoch, for training, and in the first
validation, for evaluation); the ratio is the eager mean over the compiled one, and the compilation's cost is
the compiled run's first epoch minus its mean. Means, not medians: the epochs with a validation are part of
the protocol's cost.

Same numbers: after the last epoch the record compares the two runs' last validation MSE and training loss and
the largest difference of any parameter. Inductor may fuse element-wise operations into kernels that round
differently from the eager ones; any difference is reported as measured, and a difference that the training
then amplifies is reported as such (never hidden).

The record (``--output``, JSON) is what ``python -m canonical_network.docs_blocks`` renders into the
``compile-nbody`` block of ``docs/measurements.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = PROJECT_ROOT / "docs" / "benchmarks" / "compile_nbody.json"
#: where the compiled code's per-process cache directories are made (and removed): inside outputs/
SCRATCH = PROJECT_ROOT / "outputs" / "benchmarks" / "compile"
EXPERIMENTS = ("nbody/gnn", "nbody/egnn", "nbody/cn_gnn", "nbody/fa_gnn")


def train_once(experiment: str, compiled: bool, epochs: int, seed: int) -> dict:
    """Fit ``experiment`` for ``epochs`` epochs; per-epoch CPU seconds, last metrics and final weights."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback

    from canonical_network.utils.compile import compiled_network
    from canonical_network.utils.config import compose_experiment
    from canonical_network.utils.trust import build

    class EpochClock(Callback):
        """CPU seconds of each training epoch, its validation included (it runs before the epoch's end)."""

        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._start = 0.0

        def on_train_epoch_start(self, trainer, pl_module) -> None:
            self._start = time.process_time()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            self.seconds.append(time.process_time() - self._start)

    cfg = compose_experiment([f"experiment={experiment}", f"seed={seed}"])
    L.seed_everything(seed, workers=True, verbose=False)
    datamodule = build(cfg.data)
    model = build(cfg.model)
    clock = EpochClock()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs,
                        check_val_every_n_epoch=cfg.trainer.check_val_every_n_epoch, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[clock])
    SCRATCH.mkdir(parents=True, exist_ok=True)
    with compiled_network(model.network, SCRATCH, compiled):
        trainer.fit(model, datamodule=datamodule)
    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()
               if name in ("val/mse", "train/loss_epoch")}
    weights = {name: value.detach().clone() for name, value in model.state_dict().items()
               if torch.is_floating_point(value)}
    return {"seconds": clock.seconds, "metrics": metrics, "weights": weights}


def summarise(eager: dict, compiled: dict, warmup: int) -> dict:
    # the mean, not the median: validation falls due every few epochs, and its cost is part of an epoch's
    eager_mean = statistics.fmean(eager["seconds"][warmup:])
    compiled_mean = statistics.fmean(compiled["seconds"][warmup:])
    largest = max((eager["weights"][name] - compiled["weights"][name]).abs().max().item()
                  for name in eager["weights"])
    return {
        "eager_seconds_per_epoch": eager_mean,
        "compiled_seconds_per_epoch": compiled_mean,
        "ratio": eager_mean / compiled_mean,
        "compile_seconds": compiled["seconds"][0] - compiled_mean,
        "eager_metrics": eager["metrics"],
        "compiled_metrics": compiled["metrics"],
        "metrics_identical": eager["metrics"] == compiled["metrics"],
        "largest_weight_difference": largest,
        "eager_epoch_seconds": eager["seconds"],
        "compiled_epoch_seconds": compiled["seconds"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS))
    parser.add_argument("--epochs", type=int, default=30, help="epochs per run (default 30)")
    parser.add_argument("--warmup", type=int, default=6, help="first epochs left out of the means (default 6)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if args.epochs <= args.warmup:
        parser.error(f"--epochs must exceed --warmup ({args.warmup}); got {args.epochs}")
    unknown = [e for e in args.experiments if not e.startswith("nbody/")]
    if unknown:
        parser.error(f"--experiments takes N-body experiments (nbody/<row>); got {unknown}")

    import torch

    from canonical_network.report_inference import load_average, timing_record, write_record

    torch.set_num_threads(1)
    load_start = load_average()
    results = {}
    for experiment in args.experiments:
        eager = train_once(experiment, False, args.epochs, args.seed)
        compiled = train_once(experiment, True, args.epochs, args.seed)
        results[experiment] = summarise(eager, compiled, args.warmup)
        row = results[experiment]
        print(f"{experiment}: eager {row['eager_seconds_per_epoch']:.3f} s/epoch, compiled "
              f"{row['compiled_seconds_per_epoch']:.3f} s/epoch ({row['ratio']:.2f}x), compiling "
              f"{row['compile_seconds']:.0f} s; same metrics: {row['metrics_identical']}, largest weight "
              f"difference {row['largest_weight_difference']:.3g}", flush=True)
    record = timing_record("scripts/benchmark_compile.py", list(argv if argv is not None else sys.argv[1:]),
                           load_start, epochs=args.epochs, warmup=args.warmup, seed=args.seed,
                           experiments=results)
    write_record(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
