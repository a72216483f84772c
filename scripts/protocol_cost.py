"""What the paper's full protocol costs, table by table: measured step times × the paper's data sizes and epochs.

    python scripts/protocol_cost.py                          # every table on this machine's CPU, 1 thread
    python scripts/protocol_cost.py --tables nbody --threads 2
    python scripts/protocol_cost.py --device cuda            # GPU-hours, on a machine with a GPU
    python scripts/protocol_cost.py --output docs/reproduction/benchmarks/protocol_cost_cpu.json --markdown

A row is an experiment (``configs/experiment``), with overrides after it where a table's cells are settings of
one experiment (Table 6: ``rotmnist/cn_p4 canonicalization.num_layers=2 canonicalization.num_rotations=16``).
For every row of a table, the row's own experiment config is built exactly as
``canonical_network.train`` builds it, at the paper's input sizes (1,024 points for ModelNet40, 2,048 for
ShapeNet-part, 28 × 28 digits, 5 particles) and batch sizes, and a Lightning ``Trainer`` times
``--train-steps`` optimizer steps (after ``--warmup`` untimed ones) and ``--val-steps`` evaluation batches on
the embedded data (the content of a batch does not change its cost). Then, per row and seed,

    hours = epochs × (ceil(train / batch) × train step + ceil(val / batch) × eval batch / validation interval)
            + ceil(test / batch) × eval batch

with the paper's split sizes (``PROTOCOLS``): no early stopping, so an upper bound where the paper stops early
(Rotated MNIST, patience 20; N-body "early stopping" keeps the best-validation epoch of all 10,000, as EGNN's
code does). A table's total is its rows × seeds × protocols (ModelNet40: z/z, z/SO(3), SO(3)/SO(3); ShapeNet:
z/SO(3), SO(3)/SO(3)): rotations do not change a step's cost, so each row is timed once.

Single-device figures (device-hours, one process); not measured: data loading from disk (the embedded data
sit in memory), DDP, mixed precision. On a CPU a step's time is the process's CPU time (``time.process_time``):
with one thread that is the wall time on a quiet machine, and other processes on shared cores barely move it
(their cache and memory-bandwidth contention still can: the load average at the start and end is recorded).
On a GPU it is the wall time between CUDA synchronisations. ``--markdown`` prints the table that
``docs/measurements.md`` carries (``python -m canonical_network.docs_blocks`` renders it there from the record in
``docs/reproduction/benchmarks/protocol_cost_cpu.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Protocol:
    """One paper table at the paper's protocol."""

    title: str
    rows: tuple[str, ...]
    #: overrides that set the paper's input sizes on the embedded data (kept small in count: only shapes matter)
    overrides: tuple[str, ...]
    train: int
    val: int
    test: int
    epochs: int
    seeds: int = 5  # the sweeps' (configs/sweep): the paper's ± std
    protocols: int = 1


PROTOCOLS: dict[str, Protocol] = {
    # App. G.1: 100 epochs, early stopping (patience 20) on validation; MNIST-rot: 10,000 train, 2,000
    # validation, 50,000 test rows
    "rotmnist": Protocol(
        "Table 1 (Rotated MNIST)",
        ("rotmnist/cnn", "rotmnist/cnn_aug", "rotmnist/cn_pca", "rotmnist/cn_p4", "rotmnist/cn_p4_frozen",
         "rotmnist/cn_p64", "rotmnist/cn_opt", "rotmnist/gcnn_p4", "rotmnist/gcnn_p4_eqparams",
         "rotmnist/gcnn_p64_eqparams"),
        ("data.num_workers=0",), train=10_000, val=2_000, test=50_000, epochs=100),
    # Table 2 (augmentation ablation), same protocol as Table 1. CN(pretrained)-CNN is timed as CN(p64)-CNN with its
    # canonicalizer frozen: the same networks (the pretrained one is a trained CN(p64) run's canonicalizer, kept
    # frozen), whose weights' values do not change a step's cost; the real row needs that run's checkpoint.
    "rotmnist_table2": Protocol(
        "Table 2 (Rotated MNIST, augmentation)",
        ("rotmnist/cnn", "rotmnist/cnn_aug", "rotmnist/cn_p64", "rotmnist/cn_p64 canonicalization.freeze=true"),
        ("data.num_workers=0",), train=10_000, val=2_000, test=50_000, epochs=100),
    # Table 6 (App.: canonicalizer layers x order of the rotation group), configs/sweep/rotmnist_table6.yaml's cells
    "rotmnist_table6": Protocol(
        "Table 6 (Rotated MNIST, canonicalizer layers × order)",
        tuple(f"rotmnist/cn_p4 canonicalization.num_layers={layers} canonicalization.num_rotations={order}"
              for layers in (1, 2, 3) for order in (4, 8, 16, 32, 64)),
        ("data.num_workers=0",), train=10_000, val=2_000, test=50_000, epochs=100),
    # App. G.2: 10,000 epochs (EGNN's protocol: validation every 5 epochs, the best-validation epoch tested);
    # nbody_small: 3,000 of 10,000 training simulations, 2,000 validation, 2,000 test
    "nbody": Protocol(
        "Table 3 (N-body)",
        ("nbody/linear", "nbody/gnn", "nbody/egnn", "nbody/fa_gnn", "nbody/cn_gnn", "nbody/cn_gnn_o3",
         "nbody/cn_gnn_frozen", "nbody/radial_field", "nbody/tfn", "nbody/se3_transformer"),
        (), train=3_000, val=2_000, test=2_000, epochs=10_000),
    # App. G.3: 200 epochs, batch 32, 1,024 points; ModelNet40 9,843 train / 2,468 test clouds, validated on the
    # test split every epoch (the reference code's protocol); three rotation protocols
    "modelnet": Protocol(
        "Table 4 (ModelNet40)",
        ("modelnet/pointnet", "modelnet/dgcnn", "modelnet/vn_pointnet", "modelnet/vn_dgcnn",
         "modelnet/cn_frozen_pointnet", "modelnet/cn_l_pointnet", "modelnet/cn_nl_pointnet",
         "modelnet/cn_frozen_dgcnn", "modelnet/cn_l_dgcnn", "modelnet/cn_nl_dgcnn"),
        ("data.num_points=1024", "data.num_train=128", "data.num_val=64", "data.num_test=64"),
        train=9_843, val=2_468, test=2_468, epochs=200, protocols=3),
    # App. G.3: 200 epochs, batch 32, 2,048 points; ShapeNet-part 14,007 train+val / 2,874 test shapes,
    # validated on the test split; two rotation protocols (z/SO(3), SO(3)/SO(3))
    "shapenet": Protocol(
        "Table 5b (ShapeNet-part)",
        ("shapenet/pointnet", "shapenet/dgcnn", "shapenet/vn_pointnet", "shapenet/vn_dgcnn",
         "shapenet/cn_frozen_pointnet", "shapenet/cn_l_pointnet", "shapenet/cn_nl_pointnet",
         "shapenet/cn_frozen_dgcnn", "shapenet/cn_l_dgcnn", "shapenet/cn_nl_dgcnn"),
        ("data.num_points=2048", "data.num_train=128", "data.num_val=64", "data.num_test=64"),
        train=14_007, val=2_874, test=2_874, epochs=200, protocols=2),
}


def _timing_callback(warmup: int, clock):
    from lightning.pytorch.callbacks import Callback

    class StepTimes(Callback):
        """Time of every training batch (forward, backward, optimizer step) and evaluation batch on ``clock``."""

        def __init__(self) -> None:
            self.train: list[float] = []
            self.val: list[float] = []
            self._seen = 0
            self._t0 = 0.0

        def _sync(self, pl_module) -> None:
            if pl_module.device.type == "cuda":
                import torch

                torch.cuda.synchronize(pl_module.device)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._sync(pl_module)
            self._t0 = clock()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._sync(pl_module)
            self._seen += 1
            if self._seen > warmup:
                self.train.append(clock() - self._t0)

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            self._sync(pl_module)
            self._t0 = clock()

        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            self._sync(pl_module)
            if batch_idx > 0:  # the first evaluation batch of a run warms up the eval path
                self.val.append(clock() - self._t0)

    return StepTimes()


def row_overrides(row: str, overrides: tuple[str, ...] = ()) -> list[str]:
    """The overrides that build a row's config: its experiment, the row's own settings, the table's sizes."""
    experiment, *settings = row.split()
    return [f"experiment={experiment}", *settings, *overrides]


def time_row(row: str, overrides: tuple[str, ...], device: str, warmup: int, train_steps: int,
             val_steps: int) -> dict:
    """Median seconds per training step and per evaluation batch of one row, and its batch size."""
    from lightning import Trainer

    from canonical_network.utils.config import compose_experiment
    from canonical_network.utils.trust import build

    cfg = compose_experiment(row_overrides(row, overrides))
    datamodule = build(cfg.data)
    model = build(cfg.model)
    # On a CPU the process's CPU time (one thread: the wall time of a quiet machine, and nearly blind to other
    # processes sharing the cores); on a GPU the wall time between synchronisations
    timer = _timing_callback(warmup, time.perf_counter if device == "cuda" else time.process_time)
    trainer = Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, max_epochs=1,
                      limit_train_batches=warmup + train_steps, limit_val_batches=val_steps + 1,
                      num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[timer])
    trainer.fit(model, datamodule=datamodule)
    if len(timer.train) < train_steps or len(timer.val) < val_steps:
        raise RuntimeError(
            f"{row}: the embedded data gave {len(timer.train)} timed training steps and {len(timer.val)} "
            f"evaluation batches; {train_steps} and {val_steps} were asked (lower --train-steps/--val-steps)")
    return {
        "batch_size": int(cfg.data.batch_size),
        "val_interval": int(cfg.trainer.get("check_val_every_n_epoch") or 1),
        "train_step_s": statistics.median(timer.train),
        "eval_batch_s": statistics.median(timer.val),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def row_hours(protocol: Protocol, timing: dict) -> float:
    """Device-hours of one run (one seed, one rotation protocol) of a row at the paper's protocol."""
    batch = timing["batch_size"]
    per_epoch = (math.ceil(protocol.train / batch) * timing["train_step_s"]
                 + math.ceil(protocol.val / batch) * timing["eval_batch_s"] / timing["val_interval"])
    return (protocol.epochs * per_epoch + math.ceil(protocol.test / batch) * timing["eval_batch_s"]) / 3600


def _with_kept(protocol: Protocol, rows: dict[str, dict], kept: dict[str, dict]) -> dict[str, dict]:
    """The rows timed so far and the rows an earlier run measured that this one has not reached yet, in the
    protocol's order: a resumed run stopped again loses none of them."""
    return {row: rows[row] if row in rows else kept[row] for row in protocol.rows if row in rows or row in kept}


def _set_table(record: dict, name: str, protocol: Protocol, rows: dict[str, dict]) -> None:
    total = sum(t["hours_per_run"] for t in rows.values() if "hours_per_run" in t)
    record["tables"][name] = {
        "title": protocol.title, "epochs": protocol.epochs, "seeds": protocol.seeds,
        "protocols": protocol.protocols, "train": protocol.train, "val": protocol.val, "test": protocol.test,
        "rows": dict(rows), "total_hours": total * protocol.seeds * protocol.protocols,
    }


def _write(record: dict, output: Path | None) -> None:
    """The record so far, replaced atomically (a reader never sees half a file)."""
    record["load_end"] = os.getloadavg()[0]
    if output is None:
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".part")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(output)


#: what must match for --resume to keep a row timed by an earlier run
_RESUME_KEYS = ("device", "threads", "train_steps", "val_steps")


def _previous_rows(output: Path | None, record: dict) -> dict[str, dict[str, dict]]:
    """Rows timed by an earlier run into ``output`` at the same settings (errors are timed again)."""
    if output is None or not output.is_file():
        return {}
    earlier = json.loads(output.read_text())
    if any(earlier.get(key) != record[key] for key in _RESUME_KEYS):
        mismatch = {key: (earlier.get(key), record[key]) for key in _RESUME_KEYS if earlier.get(key) != record[key]}
        raise SystemExit(f"--resume: {output} was measured with other settings {mismatch}; "
                         "write to another --output or rerun without --resume")
    return {name: {row: timing for row, timing in table["rows"].items() if "error" not in timing}
            for name, table in earlier.get("tables", {}).items()}


def _timed_elsewhere(row: str, table: str, record: dict, previous: dict[str, dict[str, dict]]) -> tuple[str, dict] | None:
    """``(table, timing)`` of the same row timed for another table, in this run or kept from an earlier one."""
    for name in PROTOCOLS:
        if name == table:
            continue
        for rows in (record["tables"].get(name, {}).get("rows", {}), previous.get(name, {})):
            timing = rows.get(row)
            if timing is not None and "error" not in timing and "timed_in" not in timing:
                return name, timing
    return None


#: the smallest batch a row that does not fit in memory is retried at (halving from the protocol's)
SMALLEST_BATCH = 4


def _time_row_apart(table: str, row: str, args: argparse.Namespace) -> dict:
    """One row timed in a process of its own, so a row the machine cannot hold (the system kills a process out
    of memory) does not end the whole run. Such a row is timed again at half the batch, down to
    :data:`SMALLEST_BATCH`: the protocol's hours then count that many more, smaller steps (a step's time is
    close to proportional to its batch for these models; the record says which batch was timed and why), or
    it is recorded as not measured."""
    import subprocess

    batch = protocol_batch = None
    while True:
        command = [sys.executable, str(Path(__file__).resolve()), "--one-row", table, row, "--device", args.device,
                   "--threads", str(args.threads), "--warmup", str(args.warmup), "--train-steps",
                   str(args.train_steps), "--val-steps", str(args.val_steps)]
        if batch is not None:
            command += ["--batch-size", str(batch)]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode == 0:
            timing = json.loads(proc.stdout.strip().splitlines()[-1])
            if batch is not None:
                timing["protocol_batch_size"] = protocol_batch
            return timing
        if proc.returncode < 0 or proc.returncode == 137:
            if protocol_batch is None:  # the protocol's batch, read from the row's config
                protocol_batch = _config_batch_size(row, PROTOCOLS[table].overrides)
            batch = (batch or protocol_batch) // 2
            if batch >= SMALLEST_BATCH:
                print(f"{row}: killed (out of memory?) at batch {batch * 2}; timing it at batch {batch}",
                      file=sys.stderr, flush=True)
                continue
            return {"error": f"killed by signal {-proc.returncode if proc.returncode < 0 else 9} while timing, "
                             f"at every batch down to {SMALLEST_BATCH} (out of memory on this machine?)"}
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return {"error": last[:160]}


def _device_name(device: str) -> str:
    """The GPU's name, or the CPU's model and cores."""
    import torch

    from canonical_network.utils.runs import cpu_model

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"CPU ({cpu_model()}, {os.cpu_count()} cores)"


def _config_batch_size(row: str, overrides: tuple[str, ...]) -> int:
    from canonical_network.utils.config import compose_experiment

    return int(compose_experiment(row_overrides(row, overrides)).data.batch_size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS))
    parser.add_argument("--rows", nargs="+", default=None,
                        help="only these rows of the chosen tables (a row with settings is one quoted argument)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on a CPU (default 1)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed training steps first (default 1)")
    parser.add_argument("--train-steps", type=int, default=3, help="timed training steps a row (default 3)")
    parser.add_argument("--val-steps", type=int, default=1, help="timed evaluation batches a row (default 1)")
    parser.add_argument("--output", type=Path, default=None, help="write the record as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print the docs/measurements.md table")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows --output already holds at the same settings; time the others")
    parser.add_argument("--one-row", nargs=2, metavar=("TABLE", "ROW"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=None, help=argparse.SUPPRESS)  # the retry at a smaller batch
    args = parser.parse_args(argv)
    for name, value in (("--train-steps", args.train_steps), ("--val-steps", args.val_steps),
                        ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{name} must be at least 1, got {value}")
    known = {row for name in args.tables for row in PROTOCOLS[name].rows}
    if args.rows is not None and (unknown := sorted(set(args.rows) - known)):
        parser.error(f"--rows {', '.join(unknown)}: not a row of {', '.join(args.tables)}; "
                     f"valid: {', '.join(sorted(known))}")

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible here (valid: cpu)")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("WANDB_MODE", "disabled")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    if args.one_row is not None:  # the worker of _time_row_apart: one row, its timing as the last stdout line
        table, row = args.one_row
        if table not in PROTOCOLS or row not in PROTOCOLS[table].rows:
            parser.error(f"--one-row {table} {row}: not a row of a protocol table")
        overrides = PROTOCOLS[table].overrides
        if args.batch_size is not None:
            overrides = (*overrides, f"data.batch_size={args.batch_size}")
        timing = time_row(row, overrides, args.device, args.warmup, args.train_steps, args.val_steps)
        print(json.dumps(timing), flush=True)
        return 0
    record = {
        "command": "python " + " ".join([str(Path(sys.argv[0]).relative_to(PROJECT_ROOT)
                                              if Path(sys.argv[0]).is_absolute() else sys.argv[0]),
                                         *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "device": args.device,
        "device_name": _device_name(args.device),
        "threads": args.threads,
        "load_start": os.getloadavg()[0],
        "train_steps": args.train_steps,
        "val_steps": args.val_steps,
        "tables": {},
    }
    previous = _previous_rows(args.output, record) if args.resume else {}
    if previous:  # rows kept from an earlier run: the record spans both days
        earlier = json.loads(args.output.read_text()).get("date", "")
        if earlier and record["date"] in earlier:
            record["date"] = earlier  # measured again on a day it already names
        elif earlier:
            record["date"] = f"{earlier.split(' and ')[0]} and {record['date']}"
    for name in args.tables:
        protocol = PROTOCOLS[name]
        rows: dict[str, dict] = {}
        for row in protocol.rows:
            if args.rows is not None and row not in args.rows:
                continue
            if row in previous.get(name, {}):
                rows[row] = previous[name][row]
                print(f"{row}: kept from {args.output}", file=sys.stderr, flush=True)
            elif (other := _timed_elsewhere(row, name, record, previous)) is not None:
                # the same row in another table (Table 2 repeats Table 1's): one timing, this table's hours
                table_name, timing = other
                rows[row] = {**timing, "timed_in": table_name, "hours_per_run": row_hours(protocol, timing)}
                print(f"{row}: the timing of its row in {table_name}", file=sys.stderr, flush=True)
            else:
                rows[row] = _time_row_apart(name, row, args)
                if "error" in rows[row]:
                    print(f"{row}: {rows[row]['error']}", file=sys.stderr, flush=True)
                else:
                    rows[row]["hours_per_run"] = row_hours(protocol, rows[row])
                    # rows kept by --resume may come from other days and machines: each says its own
                    rows[row]["measured"] = {"date": datetime.now(UTC).strftime("%Y-%m-%d"),
                                             "device": record["device_name"]}
                    print(f"{row}: {rows[row]['train_step_s']:.3f} s a training step, {rows[row]['eval_batch_s']:.3f} "
                          f"s an evaluation batch -> {rows[row]['hours_per_run']:.2f} h a run", file=sys.stderr,
                          flush=True)
            _set_table(record, name, protocol, _with_kept(protocol, rows, previous.get(name, {})))
            _write(record, args.output)  # after every row: a run stopped later keeps what it measured (--resume)
        _set_table(record, name, protocol, _with_kept(protocol, rows, previous.get(name, {})))
    record["complete"] = True
    _write(record, args.output)
    from canonical_network.docs_blocks import protocol_cost_table

    print("\n".join(protocol_cost_table(record)) if args.markdown else json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
