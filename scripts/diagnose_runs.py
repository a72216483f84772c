"""Diagnose finished training runs in place: ``<run>/diagnose/diagnostics.json`` beside each ``results.json``.

    python scripts/diagnose_runs.py outputs/reproduction --match "*/*/*sym_*/seed*" --num-samples 128

For every run folder below the given roots whose name matches ``--match`` (a glob relative to the root), whose
record is ``completed`` and whose tested checkpoint is still there, runs ``canonical_network.diagnose`` on that
checkpoint with the run's own experiment and overrides (its symmetrization mode included), writing into
``<run>/diagnose/`` (figures off). A run that already has ``diagnose/diagnostics.json`` is skipped, so the
command resumes. ``scripts/collect_runs.py`` keeps ``diagnose/diagnostics.json`` with the record, and the report
reads its continuity figures as the run's ``diagnose/*`` metrics (``canonical_network.records``): the jump rate
and output change under small rotations and jitter of the symmetrization tables (issue 38).

Only a run's own folder is written to (a new subfolder: the record itself is never changed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from canonical_network.records import find_results, path_from_record, read_results

DIAGNOSE_DIR = "diagnose"
#: overrides of the training command that do not describe the model or data (the diagnosis sets its own)
_DROPPED = ("logger", "hydra.", "~callbacks", "callbacks", "trainer.", "ckpt_path", "skip_finished")


def diagnose_command(run_dir: Path, record: dict, num_samples: int, python: str = sys.executable) -> list[str]:
    """The ``canonical_network.diagnose`` command for one finished run: its experiment and model/data overrides,
    its tested checkpoint, output into ``<run>/diagnose``."""
    checkpoint = path_from_record(record["checkpoint"], run_dir)
    overrides = [o for o in record.get("overrides") or []
                 if not o.lstrip("+~").startswith(_DROPPED) and not o.startswith("seed=")]
    return [python, "-m", "canonical_network.diagnose", *overrides, f"seed={record.get('seed', 0)}",
            f"ckpt_path={checkpoint}", "logger=none", f"diagnose.num_samples={num_samples}",
            "diagnose.figures=false", f"hydra.run.dir={run_dir / DIAGNOSE_DIR}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", type=Path, help="folders of run folders (e.g. outputs/reproduction)")
    parser.add_argument("--match", default="**", help="glob of the run folders, relative to a root (default all)")
    parser.add_argument("--num-samples", type=int, default=128, help="test inputs per diagnosis (default 128)")
    args = parser.parse_args(argv)
    if args.num_samples < 1:
        parser.error(f"--num-samples must be >= 1, got {args.num_samples}")
    failures = done = skipped = 0
    for root in args.roots:
        if not root.is_dir():
            parser.error(f"{root} is not a folder")
        wanted = {p.resolve() for p in root.glob(args.match) if p.is_dir()}
        for results in find_results(root):
            run_dir = results.parent
            if run_dir.resolve() not in wanted or DIAGNOSE_DIR in run_dir.relative_to(root).parts:
                continue
            record = read_results(results)
            if (run_dir / DIAGNOSE_DIR / "diagnostics.json").is_file():
                skipped += 1
                continue
            if record.get("status") != "completed" or not record.get("checkpoint"):
                continue
            if not path_from_record(record["checkpoint"], run_dir).is_file():
                print(f"skip {run_dir}: its tested checkpoint is not here", flush=True)
                continue
            command = diagnose_command(run_dir, record, args.num_samples)
            with open(run_dir / f"{DIAGNOSE_DIR}.log", "a") as log:
                rc = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
            print(f"{'diagnosed' if rc == 0 else f'FAILED (exit {rc})'} {run_dir}", flush=True)
            done += rc == 0
            failures += rc != 0
    print(f"{done} diagnosed, {skipped} already diagnosed, {failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
