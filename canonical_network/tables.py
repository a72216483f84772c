"""Turn finished runs into the paper's tables: ours (mean ± std over seeds) beside the paper's numbers.

    python -m canonical_network.tables outputs/multiruns/<sweep dir> [--format markdown|latex] [--table NAME]
    python -m canonical_network.tables <sweep dir> <another sweep dir> --table rotmnist_table2
    python -m canonical_network.tables <sweep dir> --table rotmnist_table1 --metric test/orbit/error_worst
    python -m canonical_network.tables --wandb <entity>/<project> [--group rotmnist_table1]

Every ``results.json`` below the folder is one run (see ``canonical_network.train``); runs are matched to
table cells by experiment name and, for tables with several columns or a grid, by config values (a row's
``match``; its optional ``exclude``, a list of matches, leaves the runs they match to another row). A cell
whose runs all failed shows the reason instead of a number. The paper's numbers live in
``paper_results.json`` beside this file, one entry per table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from canonical_network.records import (
    EVALUATED_CHECKPOINT_KEY,
    RESULTS_FILE,
    budget_of,
    budget_sort_key,
    dataset_of,
    load_runs,
    metric_info,
    record_from_results,
    variant_of,
)

__all__ = ["RESULTS_FILE", "build_table", "load_runs", "load_wandb_runs", "make_tables", "paper_tables",
           "record_from_results", "render"]

def paper_tables() -> dict[str, dict]:
    text = resources.files("canonical_network").joinpath("paper_results.json").read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def load_wandb_runs(project: str, group: str | None = None, api=None) -> list[dict[str, Any]]:
    """The same records from W&B runs (online): the config logged by train.py and the run summary.
    Evaluations (W&B runs of ``evaluate``) are left out, as :func:`~canonical_network.records.load_runs` does."""
    if api is None:
        import wandb

        api = wandb.Api()
    filters = {"group": group} if group else None
    runs = []
    for run in api.runs(project, filters=filters):
        config = {k: v for k, v in dict(run.config).items() if not k.startswith("_")}
        if config.get(EVALUATED_CHECKPOINT_KEY):
            continue  # an `evaluate` run: a checkpoint tested again, not a training run of the row
        full_summary = dict(run.summary)
        summary = {k: v for k, v in full_summary.items() if isinstance(v, (int, float))}
        # the record's own status (train writes it to the summary: a diverged run also finishes in W&B's sense);
        # W&B's run state where the summary has none (runs logged before it did)
        status = full_summary.get("status")
        if not isinstance(status, str):
            status = "completed" if run.state == "finished" else run.state
        results = {
            "experiment": config.get("experiment_name"),
            "seed": config.get("seed"),
            "status": status,
            "config": config,
            "metrics": {k: v for k, v in summary.items() if k.startswith("test/")},
        }
        runs.append(record_from_results(results))
    return runs


@dataclass
class Cell:
    """One table cell: the finite metric values of its completed runs (``runs``, in the same order), why the
    others are missing, and the paper's ``(mean, std)``."""

    values: list[float]
    failures: list[str]
    paper: tuple[float | None, float | None] | None
    runs: list[dict] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        """The sample standard deviation over seeds; ``None`` below two values (one run has no spread)."""
        return statistics.stdev(self.values) if len(self.values) > 1 else None


def _matches(record: dict, match: dict) -> bool:
    return all(record.get(k) == v for k, v in match.items())


def _excluded(record: dict, row: dict) -> bool:
    """Whether the row's ``exclude`` (a list of matches) takes the record out: a row that matches on fewer keys
    than another row of its table (the GNN beside the GNN with O(3) augmentation, whose records before the key
    existed do not have it) leaves the other row's runs to it."""
    return any(_matches(record, match) for match in row.get("exclude") or [])


def build_table(spec: dict, runs: Iterable[dict], split_variants: bool = True) -> list[tuple[str, list[Cell]]]:
    """The rows of one table. Runs are pooled into a cell only when they are the same run but for the seed
    (and for where they log, :data:`~canonical_network.records.NEUTRAL_OVERRIDE_PREFIXES`): the row's own
    runs make the paper's row; runs with any other override (``model.optimizer.lr=0.05``,
    ``trainer.limit_train_batches=2``) make a row of their own per set of overrides, named after it and
    shown without the paper's numbers. ``split_variants=False``: every matching run in the row (for a caller
    that has already selected one variant, as the report does)."""
    runs = list(runs)
    column_keys = {key for column in spec["columns"] for key in (column.get("match") or {})}
    rows = []
    for row in spec["rows"]:
        row_match = dict(row.get("match") or {"experiment": row["experiment"]})
        # overrides that set what the row's and columns' matches read are what places a run there, not a variant
        placed_by = {key.removeprefix("config.") for key in {*row_match, *column_keys}}

        def variant(run: dict, placed_by: set[str] = placed_by) -> tuple[str, ...]:
            return tuple(o for o in variant_of(run) if o.lstrip("+~").split("=", 1)[0] not in placed_by)

        if not split_variants:
            rows.append((row["name"], _cells(spec, row, row_match, runs)))
            continue
        variants = sorted({variant(r) for r in runs if _matches(r, row_match) and not _excluded(r, row)} | {()})
        for overrides in variants:
            name = row["name"] if not overrides else f"{row['name']} [{', '.join(overrides)}]"
            rows.append((name, _cells(spec, row if not overrides else {**row, "paper": None}, row_match,
                                      [r for r in runs if variant(r) == overrides])))
    return rows


def _cells(spec: dict, row: dict, row_match: dict, runs: list[dict]) -> list[Cell]:
    """One row's cells from ``runs`` (already one variant of the row)."""
    cells = []
    for j, column in enumerate(spec["columns"]):
        match = {**row_match, **(column.get("match") or {})}
        selected = [r for r in runs if _matches(r, match) and not _excluded(r, row)]
        ok = [r for r in selected if r["status"] == "completed" and spec["metric"] in r["metrics"]]
        scored = [(float(r["metrics"][spec["metric"]]) * spec.get("scale", 1.0), r) for r in ok]
        scored = [(v, r) for v, r in scored if math.isfinite(v)]
        failures = [str(r.get("error") or r["status"]) for r in selected if r not in ok]
        paper = (row.get("paper") or [None] * len(spec["columns"]))[j]
        cells.append(Cell([v for v, _ in scored], failures, tuple(paper) if paper else None,
                          [r for _, r in scored]))
    return cells


def _fmt(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters in table text (``&`` would split a cell, ``%`` end the line)."""
    for char, escaped in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                          ("$", r"\$"), ("{", r"\{"), ("}", r"\}")):
        text = text.replace(char, escaped)
    return text


def _cell_text(cell: Cell, digits: int, latex: bool, show_paper: str | None) -> list[str]:
    """``[ours, paper, Δ]``; ``show_paper`` is None to compare, else the text shown instead of the paper's."""
    pm = r" $\pm$ " if latex else " ± "
    if cell.values:
        spread = f"{pm}{_fmt(cell.std, digits)}" if cell.std is not None else ""
        ours = f"{_fmt(cell.mean, digits)}{spread} (n={len(cell.values)})"
    elif cell.failures:
        ours = f"missing: {cell.failures[0][:80]}"
    else:
        ours = "missing"
    if show_paper is not None:
        return [ours, show_paper, "–"]
    if cell.paper and cell.paper[0] is not None:
        paper = _fmt(cell.paper[0], digits) + (f"{pm}{_fmt(cell.paper[1], digits)}" if cell.paper[1] is not None else "")
        diff = f"{cell.mean - cell.paper[0]:+.{digits}f}" if cell.values else "–"
    else:
        paper, diff = "–", "–"
    return [ours, paper, diff]


def render(name: str, spec: dict, rows: list[tuple[str, list[Cell]]], fmt: str = "markdown",
           caption: str = "", show_paper: str | None = None) -> str:
    digits = spec.get("digits", 2)
    latex = fmt == "latex"
    header = ["Method"]
    for column in spec["columns"]:
        prefix = "" if len(spec["columns"]) == 1 else f"{column['name']} "
        header += [f"{prefix}ours", f"{prefix}paper", f"{prefix}Δ"]
    body = [[row_name] + [t for cell in cells for t in _cell_text(cell, digits, latex, show_paper)]
            for row_name, cells in rows]
    if latex:
        def cell(text: str) -> str:
            # ours/paper cells carry their own math ($\pm$); escape the rest of the text only
            return "$\\pm$".join(latex_escape(part) for part in text.split("$\\pm$"))

        lines = [f"% {spec['title']} ({name}){'; ' + caption if caption else ''}",
                 r"\begin{tabular}{l" + "c" * (len(header) - 1) + "}", r"\toprule",
                 " & ".join(latex_escape(h).replace("Δ", r"$\Delta$") for h in header) + r" \\", r"\midrule"]
        lines += [" & ".join(cell(t) for t in r) + r" \\" for r in body]
        lines += [r"\bottomrule", r"\end{tabular}"]
        return "\n".join(lines)
    direction = spec.get("lower_is_better")
    arrow = "direction unknown" if direction is None else "lower is better" if direction else "higher is better"
    lines = [f"### {spec['title']} — `{name}` ({spec['metric']}, {arrow})", ""]
    if caption:
        lines += [caption, ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def metric_spec(spec: dict, metric: str | None) -> tuple[dict, str | None]:
    """The table spec for ``metric`` (None: the table's own) and, when the paper's numbers do not measure the
    same quantity in the same unit and direction, the text shown instead of them."""
    if not metric or metric == spec["metric"]:
        return spec, None
    ours, theirs = metric_info(metric), metric_info(spec["metric"])
    table_in_percent = (theirs is not None and theirs.unit == "%") or spec.get("scale") == 100.0
    scale = ours.in_percent() if ours is not None and table_in_percent else 1.0
    new = {**spec, "metric": metric, "scale": scale, "title": f"{spec['title']} [ours: {metric}]",
           "lower_is_better": None if ours is None else ours.lower_is_better}
    same = ours is not None and theirs is not None and ours.lower_is_better == theirs.lower_is_better and (
        ours.unit == theirs.unit or {ours.unit, theirs.unit} == {"%", "fraction"})
    return new, None if same else "(another metric)"


def make_tables(runs: list[dict], fmt: str = "markdown", only: str | None = None, metric: str | None = None) -> str:
    """All paper tables that have runs (or only ``only``); ``metric`` replaces each table's own metric.

    Runs are grouped by data set and epoch cap, one table per group, captioned with both: a 1-epoch smoke
    run never sits in the cell of a 100-epoch one. The paper's numbers and Δ are shown only for the paper's
    data (or a subset of it) and for a metric measuring the same quantity: with ``test/orbit/error_worst``
    (an error in %, like the table's) the paper column still shows the paper's plain test error.
    """
    tables = paper_tables()
    if only and only not in tables:
        raise SystemExit(f"--table {only!r} is not a paper table; valid: {', '.join(tables)}")
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in sorted(runs, key=lambda r: (dataset_of(r)[0], budget_sort_key(r))):
        groups.setdefault((dataset_of(run)[0], budget_of(run)), []).append(run)
    out = []
    for name, base_spec in tables.items():
        if only and name != only:
            continue
        spec, hidden = metric_spec(base_spec, metric)
        rendered = []
        for (data, budget), members in groups.items():
            rows = build_table(spec, members)
            if not any(cell.values or cell.failures for _, cells in rows for cell in cells):
                continue
            comparable = dataset_of(members[0])[1]
            show_paper = hidden or (None if comparable else "(other data)")
            caption = f"Data: {data}; budget: {budget}."
            if not comparable:
                caption += " Not the paper's data set: no comparison with the paper's numbers."
            rendered.append(render(name, spec, rows, fmt, caption, show_paper))
        if not rendered and only:
            rendered.append(render(name, spec, build_table(spec, []), fmt))
        out += rendered
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", nargs="*", help=f"folders searched recursively for {RESULTS_FILE} files")
    parser.add_argument("--format", choices=("markdown", "latex"), default="markdown")
    parser.add_argument("--table", help="print only this table (e.g. rotmnist_table1)")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read runs from W&B instead of a folder")
    parser.add_argument("--group", help="with --wandb: only runs of this W&B group (a sweep name)")
    parser.add_argument("--metric", help="report this logged metric instead of the table's (e.g. test/orbit/error_worst)")
    args = parser.parse_args(argv)
    if bool(args.folder) == bool(args.wandb):
        parser.error("give either a results folder or --wandb ENTITY/PROJECT")
    if args.folder:
        for folder in args.folder:
            if not Path(folder).is_dir():
                parser.error(f"{folder} is not a folder")
        runs = [run for folder in args.folder for run in load_runs(Path(folder))]
    else:
        runs = load_wandb_runs(args.wandb, args.group)
    if not runs:
        print(f"no {RESULTS_FILE} found under {' '.join(args.folder) or args.wandb}", file=sys.stderr)
        return 1
    if args.metric and not any(args.metric in run["metrics"] for run in runs):
        known = sorted({name for run in runs for name in run["metrics"]})
        parser.error(f"--metric {args.metric!r} was not logged by any of these runs; logged: {', '.join(known)}")
    text = make_tables(runs, args.format, args.table, args.metric)
    print(text or "none of the runs belongs to a paper table (see canonical_network/paper_results.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
