"""What a diagnosis reports besides ``diagnostics.json``: the console table, the CI verdict and the flat
numbers a logger takes."""

from __future__ import annotations

from typing import Any

#: below this ``equivariance.output_spread`` (outputs differing between inputs by < 0.1 %) an equivariance
#: error could hide under the outputs' own variation: the summary warns that the checks say little
VACUOUS_SPREAD = 1e-3


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2e}"
    return str(value)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def failed(results: dict, fail_above: float | None) -> bool | None:
    """Whether ``equivariance.exact.max_rel`` exceeds ``fail_above`` (``None`` when no threshold is set).

    A diagnosis without exact elements (no ``max_rel``) cannot show an equivariant model: it fails."""
    if fail_above is None:
        return None
    worst = results["equivariance"]["exact"]["max_rel"]
    return worst is None or worst > fail_above


def summary_table(results: dict) -> str:
    """One plain-text table of the headline figures of ``diagnostics.json``."""
    exact, continuous = results["equivariance"]["exact"], results["equivariance"]["continuous"]
    canonicalizer, pose, continuity = results["canonicalizer"], results["pose"], results["continuity"]
    model = results["model"]
    rows = [("measure", "max_rel", "mean_rel", "notes")]
    rows.append(("equivariance.exact", _fmt(exact["max_rel"]), _fmt(exact["mean_rel"]),
                 f"{exact['num_elements']} element(s) × {exact['num_inputs']} inputs"))
    rows.append(("equivariance.continuous", _fmt(continuous["max_rel"]), _fmt(continuous["mean_rel"]),
                 continuous.get("note", "")))
    # None: the identity canonicalizer, or one without a coordinate factor (S_n alone: see its rows)
    no_pose = "identity canonicalizer" if model["group"] == "trivial" else f"{model['group']}: no coordinate action"
    if canonicalizer is None:
        rows.append(("canonicalizer", "–", "–", no_pose))
    else:
        notes = [f"group {canonicalizer['group']}"]
        if canonicalizer["index_mismatch_rate"] is not None:
            notes.append(f"index mismatch {_percent(canonicalizer['index_mismatch_rate'])}")
        if canonicalizer["translation_max_rel"] is not None:
            notes.append(f"translation max_rel {_fmt(canonicalizer['translation_max_rel'])}")
        rows.append(("canonicalizer", _fmt(canonicalizer["max_rel"]), _fmt(canonicalizer["mean_rel"]),
                     ", ".join(notes)))
    for name, part in continuity["by_perturbation"].items():
        notes = f"{part['perturbation']}: jumps > {continuity['jump']:g} {_percent(part['jump_rate'])}"
        if part.get("jump_with_element_change_rate") is not None:
            notes += (f" ({_percent(part['jump_with_element_change_rate'])} with an element change), element "
                      f"changes {_percent(part['element_change_rate'])}")
        elif part["element_change_rate"] is not None:
            notes += f", element changes {_percent(part['element_change_rate'])}"
        rows.append((f"continuity.{name}", _fmt(part["max_rel"]), _fmt(part["mean_rel"]), notes))
    if pose is None:
        rows.append(("pose", "", "", no_pose))
    else:
        notes = f"{pose['kind']}: entropy {pose['entropy_bits']:.2f} of {pose['max_entropy_bits']:.2f} bits"
        if pose.get("ambiguity_rate") is not None:
            notes += f", ambiguous {_percent(pose['ambiguity_rate'])} (margin {pose['margin']:g})"
        if pose.get("degenerate_rate") is not None:
            notes += f", degenerate frames {_percent(pose['degenerate_rate'])} (equivariant only up to their stabilizer)"
        rows.append(("pose", "", "", notes))
    permutation = results.get("permutation")
    if permutation is not None:
        sn, ties, moved = permutation["equivariance"], permutation["ties"], permutation["continuity"]
        rows.append(("permutation.equivariance", _fmt(sn["max_rel"]), _fmt(sn["mean_rel"]),
                     f"S_n alone, {sn['outputs'].split(':')[0]} outputs; order mismatches "
                     f"{_percent(sn['order_mismatch_rate'])}"))
        rows.append(("permutation.ties", "", "", f"ambiguous {_percent(ties['ambiguity_rate'])} (distinct elements "
                     f"{_percent(ties['ambiguity_rate_distinct'])}, duplicates {_percent(ties['duplicate_rate'])}), "
                     f"near ties {_percent(ties['near_tie_rate'])} (margin {ties['margin']:g})"))
        rows.append(("permutation.continuity", _fmt(moved["max_rel"]), _fmt(moved["mean_rel"]),
                     f"{moved['perturbation']}: jumps > {moved['jump']:g} {_percent(moved['jump_rate'])}, order "
                     f"changes {_percent(moved['order_change_rate'])}"))
    widths = [max(len(row[k]) for row in rows) for k in range(3)]
    lines = [f"Diagnosis of {results['experiment']} ({model['canonicalizer']} [{model['group']}] + "
             f"{model['predictor']}; {results['inputs']['num_samples']} test inputs, {results['numerics']['dtype']})"]
    lines += ["  ".join(row[k].ljust(widths[k]) for k in range(3)) + "  " + row[3] for row in rows]
    spread = results["equivariance"].get("output_spread")
    if spread is not None and spread < VACUOUS_SPREAD:
        lines.append(f"WARNING: the outputs barely vary between inputs (output_spread {spread:.1e}): the checks "
                     "say little (an untrained model with initial batch-norm statistics does this)")
    verdict = results.get("failed")
    if verdict is not None:
        threshold = results["fail_above"]
        lines.append(f"{'FAIL' if verdict else 'PASS'}: equivariance.exact.max_rel {_fmt(exact['max_rel'])} "
                     f"{'>' if verdict else '≤'} fail_above {threshold:g}")
    return "\n".join(lines)


def flat_metrics(results: dict, prefix: str = "diagnose") -> dict[str, float]:
    """Every number of the measures as ``{"diagnose/equivariance/exact/max_rel": ...}`` (no lists, no None)."""
    flat: dict[str, float] = {}

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for name, child in node.items():
                walk(child, f"{key}/{name}")
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            flat[key] = float(node)

    for section in ("equivariance", "canonicalizer", "pose", "continuity", "permutation"):
        walk(results.get(section), f"{prefix}/{section}")
    return flat
