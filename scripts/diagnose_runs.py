"""Diagnose finished training runs in place: ``<run>/diagnose/diagnostics.json`` beside each ``results.json``.

    python scripts/diagnose_runs.py outputs/reproduction --match "*/*/*sym_*/seed*" --num-samples 128

For every run folder below the given roots whose name matches ``--match`` (a glob relative to the root), whose
record is ``completed`` and whose tested checkpoint is still there, runs ``canonical_network.diagnose`` on that
checkpoint with the run's own experiment and overrides (its symmetrization mode included), writing into
``<run>/diagnose/`` (figures off). A run that already has a diagnosis is skipped, so the command resumes.
With ``--upgrade``, a run whose newest diagnosis is of an older format than this code writes
(``records.DIAGNOSIS_FORMAT``: older ones lack figures added since) is diagnosed again, into the next folder
(``diagnose-2``, ``diagnose-3`` …): an earlier diagnosis is never overwritten. ``scripts/collect_runs.py`` keeps
every diagnosis with the record, and the report reads the newest one's continuity figures as the run's
``diagnose/*`` metrics (``canonical_network.records``): the jump rate and output change under small rotations and
jitter of the symmetrization tables (issue 38).

A finished run's own files are never written: a diagnosis is a new subfolder beside them, holding its log
(``diagnose.log``) too. A record is data: its overrides pass the trust boundary
(``canonical_network/utils/trust.py``: plain overrides of the package's config tree, no Hydra settings, no config
folder, no group option outside ``configs/``), its seed is an integer and its tested checkpoint lies inside the run
folder, or the run is refused (``FAILED``, naming the record and the value). Several processes may work through
the same runs (stages run side by side as lanes): each run is diagnosed by the first to claim it (a lock in the
root's ``.claims/diagnose/``) and skipped as busy by the others.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from canonical_network.records import (
    DIAGNOSIS_DIR,
    DIAGNOSIS_FORMAT,
    diagnosis_dir,
    diagnosis_files,
    find_results,
    path_from_record,
    read_results,
)
from canonical_network.records import tested_checkpoint as records_tested_checkpoint
from canonical_network.utils.files import exclusive_lock
from canonical_network.utils.trust import UntrustedConfig, inside, record_overrides

#: where the locks a process holds while it diagnoses a run live: below the root, never in the run's folder
CLAIMS = Path(".claims") / "diagnose"

#: overrides of the training command that do not describe the model or data (the diagnosis sets its own)
_DROPPED = ("logger", "hydra.", "~callbacks", "callbacks", "trainer.", "ckpt_path", "skip_finished")


def claim_path(root: Path, run_dir: Path) -> Path:
    """The lock file of ``run_dir``'s diagnosis: ``<root>/.claims/diagnose/<run path with / as ->.lock``."""
    relative = run_dir.resolve().relative_to(root.resolve()).as_posix()
    return root / CLAIMS / f"{relative.replace('/', '-')}.lock"


def _value(text: str) -> str:
    """``text`` as an override value: quoted when it holds a character of the override grammar (a path may)."""
    import re

    if re.fullmatch(r"[A-Za-z0-9_./@:+-]*", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def diagnose_command(run_dir: Path, record: dict, num_samples: int, python: str = sys.executable,
                     into: str = DIAGNOSIS_DIR) -> list[str]:
    """The ``canonical_network.diagnose`` command for one finished run: its experiment and model/data overrides,
    its tested checkpoint, output into ``<run>/<into>``. The record is data from disk: its overrides pass
    :func:`~canonical_network.utils.trust.record_overrides` (after the logging, budget and folder settings of
    training are dropped), its seed must be an integer and its checkpoint a file of the run's own folder;
    :class:`~canonical_network.utils.trust.UntrustedConfig` otherwise."""
    source = run_dir / "results.json"
    kept = [o for o in record.get("overrides") or []
            if not (isinstance(o, str) and (o.lstrip("+~").startswith(_DROPPED) or o.startswith("seed=")))]
    overrides = record_overrides(kept, source)
    seed = record.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UntrustedConfig(f"{source}: refused seed={seed!r}: a run's seed is an integer")
    checkpoint = path_from_record(str(record["checkpoint"]), run_dir)
    if not inside(checkpoint, run_dir):
        raise UntrustedConfig(f"{source}: refused checkpoint={record['checkpoint']!r}: it resolves outside the run "
                              f"folder {run_dir}, whose own tested checkpoint a diagnosis reads")
    return [python, "-m", "canonical_network.diagnose", *overrides, f"seed={seed}",
            f"ckpt_path={_value(str(checkpoint))}", "logger=none", f"diagnose.num_samples={num_samples}",
            "diagnose.figures=false", f"hydra.run.dir={_value(str(run_dir / into))}"]


def diagnosis_format(path: Path) -> int:
    """The ``format`` of a ``diagnostics.json`` (1 when it predates the field, 0 when unreadable)."""
    try:
        value = json.loads(path.read_text()).get("format", 1)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def matching_runs(root: Path, match: str) -> Iterator[tuple[Path, dict]]:
    """``(run folder, record)`` of every run below ``root`` whose folder matches the glob ``match`` (relative to
    ``root``); a diagnosis's own folder is never one."""
    wanted = {p.resolve() for p in root.glob(match) if p.is_dir()}
    for results in find_results(root):
        run_dir = results.parent
        if run_dir.resolve() in wanted and not any(
                re.fullmatch(rf"{DIAGNOSIS_DIR}(-\d+)?", part) for part in run_dir.relative_to(root).parts):
            yield run_dir, read_results(results)


def tested_checkpoint(run_dir: Path, record: dict) -> Path | None:
    """:func:`canonical_network.records.tested_checkpoint`, saying so when a completed run's checkpoint is gone."""
    checkpoint = records_tested_checkpoint(run_dir, record)
    if checkpoint is None and record.get("status") == "completed" and record.get("checkpoint"):
        print(f"skip {run_dir}: its tested checkpoint is not here", flush=True)
    return checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", type=Path, help="folders of run folders (e.g. outputs/reproduction)")
    parser.add_argument("--match", default="**", help="glob of the run folders, relative to a root (default all)")
    parser.add_argument("--num-samples", type=int, default=128, help="test inputs per diagnosis (default 128)")
    parser.add_argument("--upgrade", action="store_true",
                        help=f"diagnose again (into the next diagnose-<k> folder) the runs whose newest diagnosis is "
                             f"of a format older than {DIAGNOSIS_FORMAT}")
    args = parser.parse_args(argv)
    if args.num_samples < 1:
        parser.error(f"--num-samples must be >= 1, got {args.num_samples}")
    failures = done = skipped = 0
    for root in args.roots:
        if not root.is_dir():
            parser.error(f"{root} is not a folder")
        for run_dir, record in matching_runs(root, args.match):
            earlier = diagnosis_files(run_dir)
            if earlier and not (args.upgrade and diagnosis_format(earlier[-1]) < DIAGNOSIS_FORMAT):
                skipped += 1
                continue
            if tested_checkpoint(run_dir, record) is None:
                continue
            claim = claim_path(root, run_dir)
            claim.parent.mkdir(parents=True, exist_ok=True)
            with exclusive_lock(claim) as holder:
                if holder is not None:  # another process diagnoses it now
                    print(f"busy {run_dir} (diagnosed by {holder}: left to it)", flush=True)
                    continue
                # looked at under the claim: a diagnosis another process finished meanwhile is seen
                earlier = diagnosis_files(run_dir)
                if earlier and not (args.upgrade and diagnosis_format(earlier[-1]) < DIAGNOSIS_FORMAT):
                    skipped += 1
                    continue
                into = diagnosis_dir(len(earlier) + 1)
                try:
                    command = diagnose_command(run_dir, record, args.num_samples, into=into)
                except UntrustedConfig as error:
                    print(f"FAILED {run_dir}: {error}", flush=True)
                    failures += 1
                    continue
                (run_dir / into).mkdir(exist_ok=True)
                with open(run_dir / into / "diagnose.log", "a") as log:
                    rc = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
            print(f"{'diagnosed' if rc == 0 else f'FAILED (exit {rc})'} {run_dir}", flush=True)
            done += rc == 0
            failures += rc != 0
    print(f"{done} diagnosed, {skipped} already diagnosed, {failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
