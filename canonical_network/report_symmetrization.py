"""The report's section "Symmetrization side by side" (issue 38 item 3).

One canonicalizer per family used four ways (``canonicalization.symmetrization``: canonical, weighted_frame,
sampled, full), each trained that way (``scripts/reproduce.sh symmetrization``). The paper tables
``sym_<family>_table`` select the runs of each mode (``canonical_network/paper_results.json``); this section puts
beside each mode's task metric what the tables show apart: the continuity figures of each run's own diagnosis
(``diagnose/<perturbation>/<figure>``: the share of inputs whose output jumps by more than 10 % under a ±1°
rotation outside the group and under jitter, and the mean relative output change; for ``sampled``, measured at
common random numbers, with its draw-to-draw change beside them), the difference to
the canonical mode's mean (Welch: each mode's runs are runs of their own), and the cost of one forward pass relative to the canonical mode, measured by
``scripts/benchmark_symmetrization.py`` (``<benchmarks>/symmetrization_cost.json``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from canonical_network.tables import build_table, paper_tables

#: the families' accuracy tables, in the order shown, with the family's name
FAMILIES = (("sym_rotmnist_table", "Rotated MNIST"), ("sym_nbody_table", "N-body"),
            ("sym_pointcloud_table", "Point clouds"))
#: the benchmark record of the modes' cost, in the report's benchmarks folder
COST_FILE = "symmetrization_cost.json"
#: (metric, column title, scale): the continuity figures of a run's diagnosis
CONTINUITY = (("diagnose/rotation/jump_rate", "jumps, ±1° rotation (%)", 100.0),
              # the part of those jumps under an unchanged element (canonical: the predictor's own; a frame: its
              # other members or steep weights)
              ("diagnose/rotation/jump_without_element_change_rate", "of which, same element (%)", 100.0),
              ("diagnose/jitter/jump_rate", "jumps, jitter (%)", 100.0),
              ("diagnose/jitter/jump_without_element_change_rate", "of which, same element (%)", 100.0),
              ("diagnose/rotation/mean_rel", "output change, ±1° rotation", 1.0),
              ("diagnose/jitter/mean_rel", "output change, jitter", 1.0),
              # sampled only: a second draw on the same input (its perturbations compare one draw, diagnostics)
              ("diagnose/redraw/mean_rel", "output change, a second draw", 1.0))


def _mean_text(values: list[float], digits: int) -> str:
    from canonical_network.report import mean_ci

    if not values:
        return "–"
    mean, half = mean_ci(values)
    text = f"{mean:.{digits}f}" if mean == 0 or abs(mean) >= 10 ** -digits else f"{mean:.2g}"
    return text + ("" if half is None else f" ± {half:.2g}") + f" ({len(values)})"


def _difference_text(values: list[float], base: list[float], digits: int, lower_is_better: bool,
                     paired: bool = False) -> str:
    """``mean(values) − mean(base)`` with its 95 % half-width (Welch, or paired-t for pairs in order) and whether
    it is better, worse or not resolved."""
    from canonical_network.report import paired_interval, welch_interval

    if not values or not base:
        return "–"
    diff, half, _ = (paired_interval if paired else welch_interval)(values, base)
    if half is None or not math.isfinite(half):
        return f"{diff:+.{digits}f} (n < 2: not resolved)"
    if abs(diff) <= half:
        word = "not resolved"
    else:
        word = "better" if (diff < 0) == lower_is_better else "worse"
    return f"{diff:+.{digits}f} ± {half:.{digits}f} ({word})"


def cost_setup(costs: dict, column: dict) -> dict | None:
    """The benchmark setup of a table column: the same experiment, and every ``config.canonicalization.*``
    value of the column's match among the setup's overrides (C8 and C16 share a canonicalizer class)."""
    match = column.get("match") or {}
    wanted = {f"{k.removeprefix('config.')}={v}" for k, v in match.items() if k.startswith("config.canonicalization.")}
    for setup in (costs.get("setups") or {}).values():
        if setup.get("experiment") == match.get("experiment") and wanted <= set(setup.get("overrides") or []):
            return setup
    return None


def load_costs(benchmarks: Path | None) -> dict:
    path = None if benchmarks is None else Path(benchmarks) / COST_FILE
    return json.loads(path.read_text()) if path is not None and path.is_file() else {}


def render_symmetrization(runs: list[dict], benchmarks: Path | None) -> list[str]:
    """The section's lines (ending with a blank line); empty when no run of a symmetrization table exists."""
    specs = paper_tables()
    costs = load_costs(benchmarks)
    blocks: list[str] = []
    for name, family in FAMILIES:
        spec = specs.get(name)
        if spec is None:
            continue
        rows = [(row, cells) for row, (shown, cells) in zip(spec["rows"], build_table(spec, runs, split_variants=False),
                                                            strict=True)
                if row["name"] == shown]
        if not any(cell.values for _, cells in rows for cell in cells):
            continue
        digits, lower = int(spec.get("digits", 2)), bool(spec.get("lower_is_better", True))
        metric = spec["metric"] + (f" × {spec['scale']:g}" if spec.get("scale", 1.0) != 1.0 else "")
        for j, column in enumerate(spec["columns"]):
            setup = cost_setup(costs, column)
            base = next((cells[j].values for row, cells in rows
                         if (row.get("match") or {}).get("config.canonicalization.symmetrization") == "canonical"), [])
            present = [(row, cells[j]) for row, cells in rows if cells[j].values]
            if not present:
                continue
            continuity = [(m, title, scale) for m, title, scale in CONTINUITY
                          if any(m in r["metrics"] for _, cell in present for r in cell.runs)]
            blocks += [f"### {family}: {column['name']}", "",
                       f"{spec['title']}; metric {metric} ({'lower' if lower else 'higher'} is better). Each mode "
                       "trained that way; continuity from each run's diagnosis of its tested checkpoint "
                       "(n in brackets: runs diagnosed); cost: one forward pass relative to canonical"
                       + (f" ({costs.get('machine', '?')}, {costs.get('date', '?')})" if setup else
                          " (not measured for this setup)") + ".", ""]
            header = ["mode", f"{metric} (n)", "vs canonical (Welch)",
                      *[title for _, title, _ in continuity], "cost vs canonical"]
            blocks += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            for row, cell in present:
                mode = (row.get("match") or {}).get("config.canonicalization.symmetrization", "canonical")
                figures = []
                for m, _, scale in continuity:
                    values = [r["metrics"][m] * scale for r in cell.runs if m in r["metrics"]]
                    figures.append(_mean_text(values, 1 if scale == 100.0 else 4))
                ratio = ((setup or {}).get("modes") or {}).get(mode, {}).get("ratio")
                blocks.append("| " + " | ".join([
                    row["name"], _mean_text(cell.values, digits),
                    "–" if mode == "canonical" else _difference_text(cell.values, base, digits, lower),
                    *figures, "–" if ratio is None else f"{ratio:.2f}×"]) + " |")
            blocks.append("")
    blocks += render_frame_size_sweep(benchmarks)
    if not blocks:
        return []
    return ["## Symmetrization side by side", "",
            "One canonicalizer per family used four ways (`canonicalization.symmetrization`, docs/symmetrization.md): "
            "its one element (`canonical`, the paper's), a weighted frame of k elements whose weights vanish where "
            "an element leaves the frame (`weighted_frame`, after Dym et al. 2024), k elements drawn from the "
            "canonicalizer's distribution (`sampled`, after Kim et al. 2023) or the whole finite group (`full`, "
            "frame averaging). The hypothesis under test (the claims above): weighted frames cut the jump rate by "
            "≥ 10× at no loss of accuracy. *Of which, same element*: the share of inputs whose output jumps while "
            "the chosen element (for a frame, its member of largest weight) stays the same; the rest of the jumps "
            "come with a change of element. For `canonical` the first are the predictor's own jumps under the "
            "perturbation, which no frame removes, and the rest the canonicalization's discontinuity, which a "
            "weighted frame is built to remove; for a frame, jumps under the same leading member come from its "
            "other members or from its weights moving steeply, continuous but by more than the threshold over "
            "the perturbation (shown where the runs' diagnoses have the split: `scripts/diagnose_runs.py "
            "--upgrade`). "
            "Command: `scripts/reproduce.sh symmetrization`.", "", *blocks]


#: the record of ``scripts/frame_size_sweep.py`` in the report's benchmarks folder
SWEEP_FILE = "frame_size_sweep.json"
#: (figure of the diagnosis's ±1° rotation part, column title, scale)
SWEEP_FIGURES = (("jump_rate", "jumps, ±1° rotation (%)", 100.0),
                 ("jump_with_element_change_rate", "with an element change (%)", 100.0),
                 ("jump_without_element_change_rate", "same element (%)", 100.0),
                 ("mean_rel", "output change, ±1° rotation", 1.0))


def _setting_label(setting: dict, trained: dict | None) -> str:
    mode, size = setting["mode"], setting.get("frame_size")
    label = {"canonical": "canonical (one element)", "full": f"full group ({setting['passes']} elements)"}.get(
        mode, f"weighted frame, k = {size}")
    return label + (" *(as trained)*" if _is_trained(setting, trained) else "")


def _is_trained(setting: dict, trained: dict | None) -> bool:
    if not trained or setting["mode"] != trained.get("symmetrization"):
        return False
    return setting["mode"] != "weighted_frame" or setting.get("frame_size") == trained.get("frame_size")


def render_frame_size_sweep(benchmarks: Path | None, metric: str = "test/error") -> list[str]:
    """The test-time frame-size sweep (``scripts/frame_size_sweep.py``): per swept row and setting, the test
    metric over seeds with its paired difference to the setting the runs were trained with, and the ±1° rotation
    figures of each setting's diagnosis; empty without the record."""
    path = None if benchmarks is None else Path(benchmarks) / SWEEP_FILE
    if path is None or not path.is_file():
        return []
    record = json.loads(path.read_text())
    blocks: list[str] = []
    for row, entry in sorted((record.get("rows") or {}).items()):
        trained = entry.get("trained")
        settings = sorted(entry["settings"].values(), key=lambda s: (s["passes"], s["mode"] == "full"))
        if not settings:
            continue
        base = next((s for s in settings if _is_trained(s, trained)), None)
        trained_text = "unknown" if not trained else (
            f"`symmetrization={trained.get('symmetrization')}`, `frame_size={trained.get('frame_size')}`, "
            f"`frame_weights={trained.get('frame_weights')}`")
        blocks += [f"### {entry.get('experiment') or row}: frame size at test time", "",
                   f"The runs of `{row}` (trained with {trained_text}), each seed's tested checkpoint evaluated on "
                   f"the test split and diagnosed ({_samples(settings)} test inputs, ±1° rotations) with each "
                   "setting at test time only: no retraining, no weights added. Mean ± 95 % Student-t half-width "
                   "over seeds (n in brackets); *vs as trained*: paired per seed. Made "
                   f"{record.get('date', '?')} on {record.get('machine', '?')} by `{record.get('command', '?')}`.",
                   ""]
        header = ["setting", "predictor passes", f"{metric} (n)", "vs as trained (paired)",
                  *[title for _, title, _ in SWEEP_FIGURES]]
        blocks += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for setting in settings:
            seeds = setting["seeds"]
            values = [v["test"][metric] for v in seeds.values() if metric in v.get("test", {})]
            if base is None or setting is base:
                versus = "–"
            else:
                pairs = [(seeds[k]["test"][metric], base["seeds"][k]["test"][metric]) for k in sorted(seeds)
                         if k in base["seeds"] and metric in seeds[k].get("test", {})
                         and metric in base["seeds"][k].get("test", {})]
                versus = _difference_text([a for a, _ in pairs], [b for _, b in pairs], 2, lower_is_better=True,
                                          paired=True)
            figures = []
            for key, _, scale in SWEEP_FIGURES:
                got = [v["rotation"][key] * scale for v in seeds.values() if key in (v.get("rotation") or {})]
                figures.append(_mean_text(got, 1 if scale == 100.0 else 4))
            blocks.append("| " + " | ".join([_setting_label(setting, trained), str(setting["passes"]),
                                             _mean_text(values, 2), versus, *figures]) + " |")
        blocks.append("")
    return blocks


def _samples(settings: list[dict]) -> str:
    counts = {v.get("num_samples") for s in settings for v in s["seeds"].values() if v.get("num_samples")}
    return "/".join(str(c) for c in sorted(counts)) or "?"
