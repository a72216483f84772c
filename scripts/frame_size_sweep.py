"""Weighted frames of growing size at test time, on the checkpoints of models trained with one (issue 38).

    python scripts/frame_size_sweep.py outputs/reproduction --sizes 1 2 3 4 --full

Why: on Rotated MNIST a weighted frame of two elements (``frame_size=2``, ``gap`` weights) removes the jumps
that come with a change of the chosen element, but its weights swing steeply where the three best scores
nearly tie, so under a 1° rotation its output still moves by more than 10 % for about as many inputs as the
canonical mode's (the report's symmetrization tables, with the split of ``diagnose``). A larger frame leaves
more elements to share the weight where scores tie. This measures, on each trained weighted-frame checkpoint
and without retraining, what each frame size does to the test error and to the jump rate.

For every completed run below the roots that matches ``--match`` and whose tested checkpoint is here, and for
every setting (``--sizes``: 1 is the canonical mode, k > 1 a weighted frame of k; ``--full``: the whole group):

* ``canonical_network.evaluate`` on the checkpoint with that setting (the test split):
  ``<out>/<run>/<setting>/eval/results.json``;
* ``canonical_network.diagnose`` with the run's own overrides and that setting:
  ``<out>/<run>/<setting>/diagnose/diagnostics.json``.

Finished steps are skipped, so the command resumes. Then the record (``--record``) is rebuilt from every
finished setting under ``--out``: per run folder without its seed (the row) and setting, each seed's test
metrics and the ±1° rotation figures of its diagnosis. ``python -m canonical_network.report`` renders it (section
"Weighted frames of growing size, at test time"). Nothing is written into the run folders.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

from diagnose_runs import diagnose_command, matching_runs, tested_checkpoint

from canonical_network.records import RESULTS_FILE
from canonical_network.utils.files import atomic_write_text

#: the runs swept by default: the Rotated MNIST weighted-frame rows of ``scripts/reproduce.sh symmetrization``
DEFAULT_MATCH = "rotmnist/*/*sym_weighted_frame_ep*/seed*"
#: where the settings' folders and the record go by default
DEFAULT_OUT = Path("outputs/frame_size_sweep")
DEFAULT_RECORD = Path("docs/reproduction/benchmarks/frame_size_sweep.json")
#: the diagnosis's figures kept per seed (its ``continuity.by_perturbation.rotation``)
ROTATION_FIGURES = ("jump_rate", "element_change_rate", "jump_with_element_change_rate",
                    "jump_without_element_change_rate", "mean_rel")
#: beside a row's settings: how its runs were trained (``symmetrization``, ``frame_size``, ``frame_weights``,
#: ``num_rotations``)
TRAINED_FILE = "trained.json"
#: the keys a setting overrides (a run's own values of them are dropped from its overrides)
SETTING_KEYS = ("canonicalization.symmetrization", "canonicalization.frame_size")


def setting_name(mode: str, size: int | None) -> str:
    """A setting's folder: ``canonical``, ``weighted_frame_k3``, ``full``."""
    return f"{mode}_k{size}" if mode == "weighted_frame" else mode


def settings(sizes: list[int], full: bool) -> list[tuple[str, int | None]]:
    """``(mode, frame_size)`` per setting: size 1 is the canonical mode (frame_size ignored), None for full."""
    chosen = [("canonical", None) if k == 1 else ("weighted_frame", k) for k in sizes]
    return chosen + ([("full", None)] if full else [])


def setting_overrides(mode: str, size: int | None) -> list[str]:
    return [f"canonicalization.symmetrization={mode}"] + ([] if size is None else [f"canonicalization.frame_size={size}"])


def evaluate_command(checkpoint: Path, seed: int, mode: str, size: int | None, output_dir: Path,
                     python: str = sys.executable) -> list[str]:
    """``canonical_network.evaluate`` of the checkpoint with the setting (only the symmetrization keys change;
    the checkpoint's own run config gives the rest)."""
    return [python, "-m", "canonical_network.evaluate", f"ckpt_path={checkpoint}", *setting_overrides(mode, size),
            f"seed={seed}", "logger=csv", f"hydra.run.dir={output_dir}"]


def sweep_diagnose_command(run_dir: Path, record: dict, num_samples: int, mode: str, size: int | None,
                           output_dir: Path, python: str = sys.executable) -> list[str]:
    """The run's own diagnosis command (scripts/diagnose_runs.py) with the setting in place of its symmetrization
    keys, written to ``output_dir``."""
    command = diagnose_command(run_dir, record, num_samples, python=python)
    command = [c for c in command if not c.startswith(tuple(f"{k}=" for k in SETTING_KEYS))
               and not c.startswith("hydra.run.dir=")]
    return [*command, *setting_overrides(mode, size), f"hydra.run.dir={output_dir}"]


def _call(command: list[str], log: Path) -> bool:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as handle:
        return subprocess.call(command, stdout=handle, stderr=subprocess.STDOUT) == 0


def build_record(out: Path, command: str) -> dict:
    """The record of every finished setting under ``out`` (``<row>/<setting>/seed<k>/{eval,diagnose}``)."""
    rows: dict[str, dict] = {}
    for results in sorted(out.glob(f"**/seed*/eval/{RESULTS_FILE}")):
        seed_dir = results.parent.parent
        setting_dir, row = seed_dir.parent, seed_dir.parent.parent.relative_to(out).as_posix()
        evaluation = json.loads(results.read_text())
        canonicalization = (evaluation.get("config") or {}).get("canonicalization") or {}
        mode = canonicalization.get("symmetrization", "canonical")
        size = canonicalization.get("frame_size") if mode == "weighted_frame" else None
        if setting_name(mode, size) != setting_dir.name:
            raise ValueError(f"{results}: an evaluation with symmetrization={mode!r}, frame_size={size!r} filed "
                             f"under {setting_dir.name!r}")
        passes = 1 if mode == "canonical" else size if mode == "weighted_frame" else (
            int(canonicalization.get("num_rotations", 0)) * (2 if canonicalization.get("reflection") else 1))
        entry = {"test": {k: v for k, v in (evaluation.get("metrics") or {}).items() if k.startswith("test/")}}
        diagnosis = seed_dir / "diagnose" / "diagnostics.json"
        if diagnosis.is_file():
            rotation = json.loads(diagnosis.read_text())["continuity"]["by_perturbation"].get("rotation") or {}
            entry["rotation"] = {k: rotation[k] for k in ROTATION_FIGURES if k in rotation}
            entry["num_samples"] = json.loads(diagnosis.read_text())["inputs"]["num_samples"]
        trained_file = setting_dir.parent / TRAINED_FILE
        trained = json.loads(trained_file.read_text()) if trained_file.is_file() else None
        row_entry = rows.setdefault(row, {"experiment": evaluation.get("experiment"), "trained": trained,
                                          "settings": {}})
        setting = row_entry["settings"].setdefault(setting_dir.name, {"mode": mode, "frame_size": size,
                                                                       "passes": passes, "seeds": {}})
        setting["seeds"][seed_dir.name.removeprefix("seed")] = entry
    from canonical_network.utils.runs import environment

    return {"command": command, "date": datetime.date.today().isoformat(),
            "machine": environment()["machine"], "rows": rows}


def regenerating_command(record: dict, args: argparse.Namespace) -> str:
    """The command that makes every setting the record holds (its settings may come from several calls: a
    finished setting is kept, so ``--full`` of an earlier call stays): the roots, the sizes found, ``--full``
    where a full setting is there, and the options that differ from their defaults."""
    found = [s for row in record["rows"].values() for s in row["settings"].values()]
    sizes = sorted({1 if s["mode"] == "canonical" else s["frame_size"] for s in found if s["mode"] != "full"})
    words = ["python", "scripts/frame_size_sweep.py", *map(str, args.roots)]
    if args.match != DEFAULT_MATCH:
        words += ["--match", repr(args.match)]
    words += ["--sizes", *map(str, sizes)] + (["--full"] if any(s["mode"] == "full" for s in found) else [])
    words += [f"--num-samples {args.num_samples}"] if args.num_samples != 128 else []
    words += [f"--out {args.out}"] if args.out != DEFAULT_OUT else []
    return " ".join(words + ([f"--record {args.record}"] if args.record != DEFAULT_RECORD else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", type=Path, help="folders of run folders (e.g. outputs/reproduction)")
    parser.add_argument("--match", default=DEFAULT_MATCH, help=f"glob of the run folders (default {DEFAULT_MATCH})")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4],
                        help="frame sizes (1: the canonical mode; default 1 2 3 4)")
    parser.add_argument("--full", action="store_true", help="also the whole group (symmetrization=full)")
    parser.add_argument("--num-samples", type=int, default=128, help="test inputs per diagnosis (default 128)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    parser.add_argument("--record", type=Path, default=DEFAULT_RECORD, help=f"default {DEFAULT_RECORD}")
    args = parser.parse_args(argv)
    if any(k < 1 for k in args.sizes):
        parser.error(f"--sizes must be >= 1 (1: the canonical mode), got {args.sizes}")
    if args.num_samples < 1:
        parser.error(f"--num-samples must be >= 1, got {args.num_samples}")
    failures = 0
    for root in args.roots:
        if not root.is_dir():
            parser.error(f"{root} is not a folder")
        for run_dir, record in matching_runs(root, args.match):
            checkpoint = tested_checkpoint(run_dir, record)
            if checkpoint is None:
                continue
            relative = run_dir.relative_to(root)
            trained = ((record.get("config") or {}).get("canonicalization") or {})
            (args.out / relative.parent).mkdir(parents=True, exist_ok=True)
            atomic_write_text(args.out / relative.parent / TRAINED_FILE, json.dumps(
                {k: trained.get(k) for k in ("symmetrization", "frame_size", "frame_weights", "num_rotations")}) + "\n")
            for mode, size in settings(args.sizes, args.full):
                dest = args.out / relative.parent / setting_name(mode, size) / relative.name
                steps = (("eval", RESULTS_FILE, evaluate_command(checkpoint, int(record.get("seed", 0)), mode, size,
                                                                 dest / "eval")),
                         ("diagnose", "diagnostics.json", sweep_diagnose_command(
                             run_dir, record, args.num_samples, mode, size, dest / "diagnose")))
                for name, done_file, command in steps:
                    if (dest / name / done_file).is_file():
                        continue
                    ok = _call(command, dest / f"{name}.log")
                    print(f"{'done' if ok else 'FAILED'} {name} {relative} {setting_name(mode, size)}", flush=True)
                    failures += not ok
    if args.out.is_dir():
        record = build_record(args.out, "")
        record["command"] = regenerating_command(record, args)
        args.record.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.record, json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.record}: {sum(len(r['settings']) for r in record['rows'].values())} settings", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
