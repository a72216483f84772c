"""How long generating the N-body data takes: nbody_small (10,000 / 2,000 / 2,000 simulations) from scratch.

    OMP_NUM_THREADS=1 python scripts/benchmark_nbody_generation.py     # writes docs/benchmarks/nbody_generation.json
    python -m canonical_network.docs_blocks                           # renders the nbody-generation block from it

Each of ``--repeats`` runs generates the whole dataset into a fresh temporary folder with the function the data
module calls on first use (``canonical_network.data.nbody.generate_nbody_dataset``, as
``scripts/generate_nbody.py`` does), and records its wall time and the process's CPU time (NumPy and torch
threads included), the manifest's ``generation_seconds`` and dot-product path, and whether the files' SHA-256
equal those of the manifest in ``--compare`` (default ``data/nbody``, when one is there). The temporary folder is
removed after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_OUTPUT = Path("docs/benchmarks/nbody_generation.json")


def generate_once(dataset: str, compare: Path | None) -> dict:
    from canonical_network.data.nbody import generate_nbody_dataset, get_dataset_spec

    spec = get_dataset_spec(dataset)
    with tempfile.TemporaryDirectory(prefix="nbody_generation_") as folder:
        start, cpu_start = time.perf_counter(), time.process_time()
        manifest_path = generate_nbody_dataset(folder, spec, progress=False)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        manifest = json.loads(manifest_path.read_text())
    same = None
    reference = compare / manifest_path.name if compare is not None else None
    if reference is not None and reference.exists():
        theirs = json.loads(reference.read_text())["files"]
        same = {name: entry["sha256"] for name, entry in manifest["files"].items()} == \
               {name: entry["sha256"] for name, entry in theirs.items()}
    return {"wall_s": wall, "cpu_s": cpu, "generation_seconds": manifest["generation_seconds"],
            "dot_products": manifest["dot_products"], "same_files_as_compare": same,
            "simulations": {"train": spec.num_train, "valid": spec.num_valid, "test": spec.num_test}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="nbody_small")
    parser.add_argument("--repeats", type=int, default=2, help="whole generations (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--compare", type=Path, default=Path("data/nbody"),
                        help="a folder whose manifest the generated files are checked against, when it has one")
    parser.add_argument("--conditions", default="", help="what else ran on the machine, for the record")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1; got {args.repeats}")

    import torch

    from canonical_network.report_inference import load_average, timing_record, write_record

    torch.set_num_threads(args.threads)
    load_start = load_average()
    runs = []
    for repeat in range(args.repeats):
        runs.append(result := generate_once(args.dataset, args.compare))
        print(f"run {repeat}: {result}", flush=True)
    summary = {key: {"median": statistics.median(r[key] for r in runs), "min": min(r[key] for r in runs),
                     "max": max(r[key] for r in runs)} for key in ("wall_s", "cpu_s")}
    record = timing_record("scripts/benchmark_nbody_generation.py", list(argv if argv is not None else sys.argv[1:]),
                           load_start, dataset=args.dataset, repeats=args.repeats, conditions=args.conditions,
                           omp_num_threads=os.environ.get("OMP_NUM_THREADS"), **summary, runs=runs)
    write_record(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
