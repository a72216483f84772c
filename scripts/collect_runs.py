"""Copy the small raw record of finished runs (``results.json``, ``csv/metrics.csv`` and, where
``scripts/diagnose_runs.py`` made them, its diagnoses ``diagnose/diagnostics.json``, ``diagnose-2/…``) into a
folder to commit.

    python scripts/collect_runs.py outputs/reproduction docs/reproduction/runs

Keeps each run's path below the source folder (``rotmnist/cn_p64/seed0/...``), so the report built from
the copy names the same runs. Only finished runs are copied (completed, or diverged: a final record the
report lists but never pools); checkpoints and images stay behind.

One folder is renamed on the way: the point-cloud budget's ``cpu_<rotation>[_ep12]`` (scripts/reproduce.sh before
issue 34, a name that said CPU also for the runs a GPU made) is copied as ``pts<points>_<rotation>[_ep12]``, the
protocol's name the script now writes, so a source folder not yet renamed never puts a second copy of a run beside
the first.

With ``--unfinished DIR`` the runs that have not finished are copied too, into DIR, with what they need to resume
on another machine (``canonical_network.utils.unfinished``: ``last.ckpt``, the best checkpoint, metrics, Hydra
record: a few MB an N-body run); copies of runs that have finished since are deleted there.
``scripts/run_protocol.py --unfinished DIR`` puts them back into an empty ``--out``:

    python scripts/collect_runs.py outputs/reproduction docs/reproduction/runs --unfinished docs/reproduction/unfinished
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from canonical_network.records import (
    FINAL_STATUSES,
    RESULTS_FILE,
    diagnosis_files,
    find_results,
    read_results,
)
from canonical_network.utils.files import atomic_write

#: what is copied of a run besides its diagnoses (every ``diagnose*/diagnostics.json``: records.diagnosis_files)
KEPT = (RESULTS_FILE, "csv/metrics.csv")
#: the folder prefix the point-cloud budget's runs had before issue 34 (``pts<points>_`` since)
LEGACY_PREFIX = "cpu_"


def renamed(relative: Path, record: dict) -> Path:
    """``relative`` with a legacy ``cpu_<protocol>`` folder named ``pts<points>_<protocol>`` (the points the
    record's data config says; kept as it is when the record does not say)."""
    points = ((record.get("config") or {}).get("data") or {}).get("num_points")
    if not isinstance(points, int) or isinstance(points, bool):
        return relative
    return Path(*(f"pts{points}_{part.removeprefix(LEGACY_PREFIX)}" if part.startswith(LEGACY_PREFIX) else part
                  for part in relative.parts))


def collect(source: Path, dest: Path, replace: bool = False, refused: list | None = None) -> list[Path]:
    """Copy each finished run's :data:`KEPT` files and diagnoses below ``source`` into ``dest``; returns the
    copies. A record in ``dest`` that differs from the run's (another run of the same job: a run started again
    here over a committed record, two source folders that map to one name) is kept, and the run is listed in
    ``refused`` as ``(run folder, kept record)``, unless ``replace``: then the new run's files replace it and the
    old run's files that the new one lacks -- its diagnoses -- are removed, so that no record is read with
    another run's files beside it."""
    copied = []
    for results in find_results(source):
        try:
            record = read_results(results)
        except ValueError as error:
            print(f"skipped {results}: not readable JSON ({error})")
            continue
        if record.get("status") not in FINAL_STATUSES:
            continue
        run = results.parent
        target = dest / renamed(run.relative_to(source), record)
        names = (*KEPT, *(str(p.relative_to(run)) for p in diagnosis_files(run)))
        old = target / RESULTS_FILE
        if old.is_file() and old.read_bytes() != results.read_bytes() and not replace:
            if refused is not None:
                refused.append((run, old))
            continue
        if old.is_file() and old.read_bytes() != results.read_bytes():  # another run's record: drop its extras
            for stale in [target / name for name in KEPT] + diagnosis_files(target):
                if str(stale.relative_to(target)) not in names or not (run / stale.relative_to(target)).is_file():
                    stale.unlink(missing_ok=True)
        for name in names:
            if (run / name).is_file():
                # through a temporary file renamed over the old one: a reader, or a copy cut short, sees the old
                # file or the new one, never part of one
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                with open(run / name, "rb") as original:
                    atomic_write(target / name, lambda stream, original=original: shutil.copyfileobj(original, stream))
        copied.append(target)
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--unfinished", type=Path, default=None,
                        help="also copy the unfinished runs, resumable, into this folder (see above)")
    parser.add_argument("--replace", action="store_true",
                        help="let a finished run replace a different record of its job kept in dest (without it such "
                             "runs are listed and not copied, and the exit status is 1)")
    args = parser.parse_args(argv)
    if not args.source.is_dir():
        parser.error(f"{args.source} is not a folder")
    from canonical_network.utils.unfinished import check_apart

    try:
        check_apart(args.source, args.dest, "the records' folder")
        if args.unfinished is not None:
            check_apart(args.source, args.unfinished, "--unfinished")
            check_apart(args.dest, args.unfinished, "--unfinished")
    except ValueError as error:
        parser.error(str(error))
    refused: list[tuple[Path, Path]] = []
    copied = collect(args.source, args.dest, replace=args.replace, refused=refused)
    print(f"copied {len(copied)} finished runs into {args.dest}")
    for run, kept in refused:
        print(f"not copied {run}: {kept} holds another run's record of that job (kept; --replace to take this "
              "run's instead)")
    if args.unfinished is not None:
        from canonical_network.utils.unfinished import park

        parked, removed, behind = park(args.source, args.unfinished)
        print(f"parked {len(parked)} unfinished runs in {args.unfinished}"
              + "".join(f"\n  {p.relative_to(args.unfinished)}" for p in parked)
              + (f"; removed {len(removed)} copies of runs finished since" if removed else ""))
        for run, copy in behind:
            print(f"kept {copy}: it is further along than {run} (that run was not parked over it)")
    return 1 if refused else 0


if __name__ == "__main__":
    raise SystemExit(main())
