"""The report's section "Test-time symmetrization of the adapt rows" (issue 38 item 4).

``scripts/reproduce.sh adapt-symmetrization`` trains CN(C8)+prior-ResNet18 canonically and evaluates each seed's
tested checkpoint three ways (``canonicalization.symmetrization`` = canonical, weighted_frame, sampled); the
evaluation records are kept in ``docs/reproduction/adapt_symmetrization/<mode>/seed<k>/results.json``.
:func:`render_adapt_symmetrization` turns them into one table: per mode the upright test error, the error
averaged over the C8 orbit and the worst case over it (mean ± 95 % Student-t half-width over seeds), each with
its paired difference to the canonical evaluation of the same checkpoint, and the upright gap to the plain
ResNet-18 runs of the report (independent runs: Welch). A difference whose interval holds zero reads
"not resolved".
"""

from __future__ import annotations

import json
from pathlib import Path

from canonical_network.records import RESULTS_FILE, variant_of

#: The folder of the evaluation records, beside the report's runs folder (docs/reproduction's layout).
ADAPT_SYMMETRIZATION = "adapt_symmetrization"
#: The order modes are shown in (docs/symmetrization.md); a mode not listed here comes after them.
MODE_ORDER = ("canonical", "weighted_frame", "sampled", "full")
#: (metric, column title): the upright test error, the C8-averaged error and the worst case over the orbit.
METRICS = (("test/error", "upright error (%)"),
           ("test/orbit/error_mean", "C8-averaged error (%)"),
           ("test/orbit/error_worst", "worst case over C8 (%)"))
#: The row whose runs give the upright reference: the plain backbone, trained upright.
REFERENCE_ROW = "adapt_mnist/resnet18"


def load_evaluations(folder: Path) -> dict[str, list[dict]]:
    """The evaluation records of ``<folder>/<mode>/seed<k>/results.json`` by mode. The mode is the record's own
    ``canonicalization.symmetrization``; a record filed under another mode's folder, or not an evaluation of
    a checkpoint, is refused naming the file."""
    found: dict[str, list[dict]] = {}
    for path in sorted(Path(folder).glob(f"*/seed*/{RESULTS_FILE}")):
        record = json.loads(path.read_text())
        canonicalization = (record.get("config") or {}).get("canonicalization") or {}
        mode = canonicalization.get("symmetrization", "canonical")
        if mode != path.parent.parent.name:
            raise ValueError(f"{path}: an evaluation with canonicalization.symmetrization={mode!r} filed under "
                             f"{path.parent.parent.name!r}; each mode's records go in <folder>/<mode>/seed<k>/")
        if not record.get("checkpoint"):
            raise ValueError(f"{path}: not an evaluation record (no 'checkpoint'): "
                             "scripts/reproduce.sh adapt-symmetrization writes them")
        found.setdefault(mode, []).append(record)
    return found


def predictor_passes(record: dict) -> int:
    """Predictor passes per input of the record's mode: 1 (canonical), ``frame_size`` (weighted_frame, sampled),
    |G| (full: the canonicalizer's rotations, twice with reflections)."""
    canonicalization = record["config"]["canonicalization"]
    mode = canonicalization.get("symmetrization", "canonical")
    if mode == "canonical":
        return 1
    if mode == "full":
        return int(canonicalization["num_rotations"]) * (2 if canonicalization.get("reflection") else 1)
    return int(canonicalization["frame_size"])


def _sorted_modes(modes) -> list[str]:
    return sorted(modes, key=lambda m: (MODE_ORDER.index(m) if m in MODE_ORDER else len(MODE_ORDER), m))


def _mean_text(values: list[float]) -> str:
    from canonical_network.report import mean_ci

    mean, half = mean_ci(values)
    return f"{mean:.2f}" + ("" if half is None else f" ± {half:.2f}")


def difference_text(diff: float, half: float | None) -> str:
    """``diff ± half`` and its reading: lower / higher when the interval excludes zero, else "not resolved"."""
    if half is None:
        return f"{diff:+.2f} (n < 2: not resolved)"
    word = "not resolved" if abs(diff) <= half else ("lower" if diff < 0 else "higher")
    return f"{diff:+.2f} ± {half:.2f} ({word})"


def _reference(runs: list[dict], epochs) -> list[float]:
    """The upright test errors of the plain ResNet-18 runs of the report at ``epochs``."""
    return [r["metrics"]["test/error"] for r in runs
            if r.get("experiment") == REFERENCE_ROW and not variant_of(r) and "test/error" in r.get("metrics", {})
            and r.get("config.trainer.max_epochs") == epochs]


def render_adapt_symmetrization(folder: Path, runs: list[dict]) -> list[str]:
    """The section's lines (ending with a blank line); empty when ``folder`` holds no evaluation record.
    ``runs`` are the report's flat run records (:func:`canonical_network.records.load_runs`), searched for the
    ResNet-18 reference."""
    from canonical_network.report import paired_interval, welch_interval

    by_mode = load_evaluations(folder)
    if not by_mode:
        return []
    records = [r for group in by_mode.values() for r in group]
    epochs = sorted({r["config"]["trainer"]["max_epochs"] for r in records})
    experiments = sorted({r.get("experiment", "?") for r in records})
    metrics = [(m, title) for m, title in METRICS if all(m in r.get("metrics", {}) for r in records)]
    canonical = {r["checkpoint"]: r for r in by_mode.get("canonical", [])}
    reference = _reference(runs, epochs[0]) if len(epochs) == 1 else []

    lines = ["## Test-time symmetrization of the adapt rows", "",
             f"{', '.join(experiments)} trained canonically (the row's default `canonicalization.symmetrization="
             f"canonical`) on the upright embedded digits for {', '.join(map(str, epochs))} epochs (training runs "
             "of its own, apart from the row's runs in the tables above), then each seed's "
             "tested checkpoint evaluated with `canonicalization.symmetrization` set at test time only (no weights "
             "added, no retraining): does averaging a few poses recover the upright gap to the plain ResNet-18? "
             "Mean ± 95 % Student-t half-width over seeds; *vs canonical*: the paired difference to the same "
             "checkpoint evaluated canonically (per seed, then mean ± half-width); an interval that holds zero reads "
             "*not resolved*. Predictor passes: per input (the orbit metrics pay them under each of the 8 "
             "rotations). Command: `scripts/reproduce.sh adapt-symmetrization` (records in "
             f"`{ADAPT_SYMMETRIZATION}/<mode>/seed<k>/`).", ""]
    header = ["mode", "predictor passes", "n"]
    for _, title in metrics:
        header += [title, "vs canonical"]
    if reference:
        header.append("upright gap to ResNet-18")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for mode in _sorted_modes(by_mode):
        group = sorted(by_mode[mode], key=lambda r: r.get("seed", 0))
        passes = sorted({predictor_passes(r) for r in group})
        cells = [f"`{mode}`", "/".join(map(str, passes)), str(len(group))]
        for metric, _ in metrics:
            values = [r["metrics"][metric] for r in group]
            cells.append(_mean_text(values))
            pairs = [(r["metrics"][metric], canonical[r["checkpoint"]]["metrics"][metric]) for r in group
                     if r["checkpoint"] in canonical]
            if mode == "canonical" or not pairs:
                cells.append("–")
            else:
                diff, half, _ = paired_interval([a for a, _ in pairs], [b for _, b in pairs])
                cells.append(difference_text(diff, half) + (f", {len(pairs)} pairs" if len(pairs) != len(group)
                                                            else ""))
        if reference:
            diff, half, _ = welch_interval([r["metrics"]["test/error"] for r in group], reference)
            cells.append(difference_text(diff, half))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if reference:
        lines += [f"Upright reference: the report's {REFERENCE_ROW} runs at {epochs[0]} epochs, upright error "
                  f"{_mean_text(reference)} % (n = {len(reference)}); the gap column is mode − ResNet-18 over "
                  "independent training runs (Welch).", ""]
    else:
        lines += [f"No {REFERENCE_ROW} run of the report at {', '.join(map(str, epochs))} epochs: no upright "
                  "gap shown.", ""]
    return lines
