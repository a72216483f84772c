"""Copy the small raw record of finished runs (``results.json``, ``csv/metrics.csv``) into a folder to commit.

    python scripts/collect_runs.py outputs/reproduction docs/reproduction/runs

Keeps each run's path below the source folder (``rotmnist/cn_p64/seed0/...``), so the report built from
the copy names the same runs. Only finished runs are copied (completed, or diverged: a final record the
report lists but never pools); checkpoints and images stay behind.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from canonical_network.records import FINAL_STATUSES, RESULTS_FILE, find_results, read_results

KEPT = (RESULTS_FILE, "csv/metrics.csv")


def collect(source: Path, dest: Path) -> list[Path]:
    copied = []
    for results in find_results(source):
        if read_results(results).get("status") not in FINAL_STATUSES:
            continue
        run = results.parent
        target = dest / run.relative_to(source)
        for name in KEPT:
            if (run / name).is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(run / name, target / name)
        copied.append(target)
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    if not args.source.is_dir():
        parser.error(f"{args.source} is not a folder")
    copied = collect(args.source, args.dest)
    print(f"copied {len(copied)} finished runs into {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
