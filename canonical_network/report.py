"""The reproduction report: finished runs → ``REPRODUCTION.md`` with figures, beside the paper's numbers.

    python -m canonical_network.report docs/reproduction/runs --out docs/reproduction
    python -m canonical_network.report outputs/reproduction outputs/multiruns/<sweep> --out outputs/report

Every ``results.json`` below the folders is one run (``canonical_network.train`` writes them; the
``csv/metrics.csv`` beside it gives the validation curve). The report holds:

* every paper table with runs: ours as mean ± 95 % confidence interval (Student t over seeds) with n, the
  paper's mean, and Δ — one table per data set and epoch cap, so runs of different budgets or data are
  never pooled, and no Δ is printed against the paper for a data set the paper did not use;
* the paper's claims (:data:`CLAIMS`) as checks: *holds*, *does not hold* or *not resolved*, from the
  difference of two cells and its 95 % Welch interval (paired t over the seeds trained in the same
  environment for Table 4's z/SO(3) = z/z checks, the slope's t interval for a trend); a claim is resolved
  only when the interval excludes the other answer, and n < 2 on either side never resolves;
* runs that change a row's own config (ablations: any override beyond seed, budget, logging and run
  folder) grouped by those overrides, apart from the paper tables; one that moves digits between the
  splits (``SPLIT_OVERRIDES``) is tested on other digits, so it is compared with its row's default only
  through a claim run under it on both sides;
* for each claim that does not hold at the rows' own configs, what the ablations show: the claim at the
  rows' other budgets and under every ablation run on both of its sides, each ablation of its rows
  with the difference it makes, and how the runs of both sides ended (at their epoch cap or stopped early,
  and after how many epochs their validation was best: the budget's part);
* a bar chart per table (ours with CI, the paper with its std) and validation curves per row;
* every run: command, data set, epochs, wall time and the machine it ran on.

``--readme README.md`` also rewrites the README's headline, the block between ``<!-- headline:start`` and
``<!-- headline:end -->``, from the report just written: Table 1 at its largest budget and the claims table,
so the README's figures are never typed by hand.

Regenerating it from the same folders gives the same file: nothing in it depends on the clock.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from canonical_network.records import (
    COMPLETED,
    RESULTS_FILE,
    SPLIT_SETTINGS,
    budget_of,
    budget_sort_key,
    dataset_of,
    load_runs,
    no_early_stopping,
    variant_of,
)
from canonical_network.tables import Cell, build_table, paper_tables

REPORT_FILE = "REPRODUCTION.md"
FIGURES = "figures"

T_LEVEL = 0.95


#: what a claim is (``kind`` in a claims file): the paper's own comparative statements, which the scorecard
#: counts; checks that hold by construction of the models (invariance pairs); other papers' claims; this project's
#: hypotheses beyond the paper (``extension``: e.g. S_n canonicalization of a plain MLP); a user's
CLAIM_KINDS = ("paper", "construction", "other", "extension", "user")
CLAIMS_FILE = "paper_claims.yaml"


@dataclass(frozen=True)
class Claim:
    """A statement as a comparison of two cells ``(table, row, column)`` (one entry of a claims file).

    ``relation="better"``: ``a`` beats ``b`` in the table's direction (lower error, higher accuracy);
    ``relation="equal"``: ``|a − b| ≤ tolerance`` (in the table's unit), decided by two one-sided tests.
    ``relation="no_worse"``: ``a`` is worse than ``b`` by less than ``tolerance`` (non-inferiority: "at no loss
    of accuracy"), decided by one one-sided test; a better ``a`` satisfies it, as it fails ``equal``.
    ``trend_x`` (one x per column of row ``a``): a trend along that row instead, the slope of the metric on x
    over every run of its cells (``b`` unused); "better" when it moves in the table's direction as x grows.
    """

    text: str
    table: str
    a: tuple[str, int]
    b: tuple[str, int]
    relation: str = "better"
    tolerance: float = 0.0
    source: str = ""
    #: ``a`` and ``b`` of one seed are the same training run tested two ways (e.g. z/z and z/SO(3)): compare
    #: the per-seed differences (paired t) instead of two independent samples.
    paired: bool = False
    trend_x: tuple[float, ...] = ()
    #: compare ``a`` with ``b_scale × b`` (each run of ``b`` scaled): "a is more than 20 % better than b" is
    #: ``a`` beats ``0.8 × b`` (lower is better)
    b_scale: float = 1.0
    kind: str = "paper"


#: what a claim asserts of ``a − b`` (see :class:`Claim`)
RELATIONS = ("better", "equal", "no_worse")
CLAIM_KEYS = ("text", "table", "a", "b", "relation", "tolerance", "source", "paired", "trend_x", "b_scale", "kind")


def claims_from_entries(entries: object, tables: dict, origin: str, default_kind: str = "paper") -> list[Claim]:
    """Claims from the ``claims:`` list of a claims file, each checked against ``tables``; a bad entry raises
    ``ValueError`` naming the file, the entry, the bad value and the valid choices."""
    if not isinstance(entries, list):
        raise ValueError(f"{origin}: 'claims' must be a list of claims, got {type(entries).__name__}")
    claims = []
    for i, entry in enumerate(entries):
        where = f"{origin}: claim {i + 1}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is a {type(entry).__name__}, expected a mapping with keys {', '.join(CLAIM_KEYS)}")
        unknown = sorted(set(entry) - set(CLAIM_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(CLAIM_KEYS)}")
        for key in ("text", "table", "a"):
            if key not in entry:
                raise ValueError(f"{where}: missing {key!r} (a claim needs text, table, a and b)")
        where = f"{origin}: claim {entry['text']!r}"
        table = entry["table"]
        if table not in tables:
            raise ValueError(f"{where}: table={table!r} is not a table; valid tables: {', '.join(sorted(tables))}")
        spec = tables[table]
        rows = [row["name"] for row in spec["rows"]]
        sides = []
        for key in ("a", "b"):
            value = entry.get(key, entry["a"] if entry.get("trend_x") else None)
            if not (isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], int)):
                raise ValueError(f"{where}: {key}={value!r} must be [row name, column index]")
            if value[0] not in rows:
                raise ValueError(f"{where}: {key} names row {value[0]!r}, not a row of {table}; its rows: "
                                 + ", ".join(rows))
            if not 0 <= value[1] < len(spec["columns"]):
                raise ValueError(f"{where}: {key} names column {value[1]}, but {table} has columns 0 to "
                                 f"{len(spec['columns']) - 1} ({', '.join(c['name'] for c in spec['columns'])})")
            sides.append((str(value[0]), int(value[1])))
        relation, kind = entry.get("relation", "better"), entry.get("kind", default_kind)
        if relation not in RELATIONS:
            raise ValueError(f"{where}: relation={relation!r}; valid relations: {', '.join(RELATIONS)}")
        if kind not in CLAIM_KINDS:
            raise ValueError(f"{where}: kind={kind!r}; valid kinds: {', '.join(CLAIM_KINDS)}")
        tolerance = float(entry.get("tolerance", 0.0) or 0.0)
        if relation in ("equal", "no_worse") and tolerance <= 0:
            raise ValueError(f"{where}: relation={relation} needs a tolerance > 0 (in the table's unit), got {tolerance}")
        trend_x = tuple(float(x) for x in entry.get("trend_x") or ())
        if trend_x and len(trend_x) != len(spec["columns"]):
            raise ValueError(f"{where}: trend_x has {len(trend_x)} values, {table} has {len(spec['columns'])} columns")
        claims.append(Claim(str(entry["text"]), table, sides[0], sides[1], relation=relation, tolerance=tolerance,
                            source=str(entry.get("source", "")), paired=bool(entry.get("paired", False)),
                            trend_x=trend_x, b_scale=float(entry.get("b_scale", 1.0)), kind=kind))
    return claims


def load_claims(path: Path | None = None, tables: dict | None = None,
                experiments: set[str] | None = None) -> tuple[list[Claim], dict]:
    """The claims of a claims file (default: the paper's, :data:`CLAIMS_FILE` beside this module) and the
    tables it adds (its ``tables:``, in the format of ``paper_results.json``). A user's file defaults its
    claims' ``kind`` to "user". Nothing in the file runs: it is read with ``yaml.safe_load``. With
    ``experiments`` (those the runs at hand name: a user's own experiments live in their config folder), a row of
    an added table naming an experiment that is neither one of ``configs/experiment/`` nor among them is refused."""
    from importlib import resources

    import yaml

    if path is None:
        text, origin, default_kind = resources.files("canonical_network").joinpath(CLAIMS_FILE).read_text(), \
            CLAIMS_FILE, "paper"
    else:
        text, origin, default_kind = Path(path).read_text(), str(path), "user"
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{origin}: not YAML: {err}") from None
    if not isinstance(data, dict) or not set(data) <= {"claims", "tables"}:
        raise ValueError(f"{origin}: a claims file is a mapping with 'claims' (a list) and optionally 'tables'; "
                         f"got {sorted(data) if isinstance(data, dict) else type(data).__name__}")
    extra = data.get("tables") or {}
    if not isinstance(extra, dict):
        raise ValueError(f"{origin}: 'tables' must map table names to tables as in paper_results.json")
    for name, spec in extra.items():
        missing = [k for k in ("title", "metric", "columns", "rows") if not isinstance(spec, dict) or k not in spec]
        if missing:
            raise ValueError(f"{origin}: table {name!r} lacks {', '.join(missing)} (see paper_results.json)")
        if experiments is not None:
            _check_row_experiments(spec, name, origin, experiments)
    known = {**(tables if tables is not None else paper_tables()), **extra}
    return claims_from_entries(data.get("claims") or [], known, origin, default_kind), extra


def _check_row_experiments(spec: dict, table: str, origin: str, also_known: set[str]) -> None:
    """Refuse a row of a claims file's table whose experiment (``experiment``, or ``match: {experiment: ...}``) is
    none of ``configs/experiment/`` and none of ``also_known``: its cells would stay empty, silently, whatever
    ran."""
    import difflib

    from canonical_network.utils.config import known_experiments

    known = sorted(set(known_experiments()) | {e for e in also_known if isinstance(e, str)})
    for row in spec.get("rows") or []:
        if not isinstance(row, dict):
            raise ValueError(f"{origin}: table {table!r}: a row is a mapping with name and experiment, got {row!r}")
        named = row.get("experiment", (row.get("match") or {}).get("experiment"))
        if isinstance(named, str) and named not in known:
            close = difflib.get_close_matches(named, known, n=3, cutoff=0.6)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ValueError(f"{origin}: table {table!r}, row {row.get('name')!r}: experiment={named!r} does not exist "
                             f"(no configs/experiment/{named}.yaml).{hint}")


CLAIMS: list[Claim] = load_claims()[0]


# ----------------------------------------------------------------------------------------------- statistics
def t_quantile(df: float, level: float = T_LEVEL) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, df))


def mean_ci(values: list[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95 % Student-t interval (None for n < 2)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def welch_interval(a: list[float], b: list[float]) -> tuple[float, float | None, float | None]:
    """``mean(a) − mean(b)``, the 95 % Welch interval's half-width and the two-sided p-value (None: n < 2)."""
    return _interval(*difference_stats(a, b))


def paired_interval(a: list[float], b: list[float]) -> tuple[float, float | None, float | None]:
    """Like :func:`welch_interval` for pairs ``(a[i], b[i])``: the mean difference, the 95 % paired-t
    half-width and p-value (None: fewer than 2 pairs)."""
    return _interval(*difference_stats(a, b, paired=True))


def _interval(diff: float, se: float | None, df: float | None) -> tuple[float, float | None, float | None]:
    if se is None or df is None:
        return diff, None, None
    return diff, t_quantile(df) * se if se > 0 else 0.0, _two_sided_p(diff, se, df)


def difference_stats(a: list[float], b: list[float], paired: bool = False) -> tuple[float, float | None, float | None]:
    """``mean(a) − mean(b)`` (of the pairs' differences when ``paired``), its standard error and degrees of
    freedom (Welch–Satterthwaite; n − 1 for pairs); None, None for n < 2 on a side."""
    if paired:
        diffs = [x - y for x, y in zip(a, b, strict=True)]
        diff = statistics.fmean(diffs)
        if len(diffs) < 2:
            return diff, None, None
        return diff, statistics.stdev(diffs) / math.sqrt(len(diffs)), float(len(diffs) - 1)
    diff = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return diff, None, None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0.0:
        return diff, 0.0, float(len(a) + len(b) - 2)
    return diff, math.sqrt(va + vb), (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))


def tost(diff: float, se: float, df: float, tolerance: float) -> float:
    """The p-value of two one-sided t tests (TOST) of equivalence, ``|mean difference| < tolerance``: the larger
    of the p-values of H0 ``diff ≤ −tolerance`` and H0 ``diff ≥ +tolerance``. Equivalence holds at level α when
    it is below α, which is the same as the (1 − 2α) interval lying inside ±tolerance."""
    if se == 0.0:
        return 0.0 if abs(diff) < tolerance else 1.0
    from scipy import stats

    return float(max(stats.t.sf((diff + tolerance) / se, df), stats.t.cdf((diff - tolerance) / se, df)))


def equivalence_verdict(diff: float, se: float | None, df: float | None, tolerance: float) -> tuple[str, float | None]:
    """An equality claim: *holds* when TOST rejects non-equivalence at 5 % (the 90 % interval inside
    ±tolerance); *does not hold* when the 95 % interval lies wholly outside ±tolerance (the difference exceeds
    it); otherwise *not resolved*. Returns the verdict and the TOST p-value (None for n < 2)."""
    if se is None or df is None:
        return "not resolved (n < 2)", None
    p = tost(diff, se, df, tolerance)
    if p < 1 - T_LEVEL:
        return "holds", p
    half = t_quantile(df) * se
    if diff - half > tolerance or diff + half < -tolerance:
        return "does not hold", p
    return "not resolved", p


def noninferiority_verdict(diff: float, se: float | None, df: float | None, tolerance: float,
                           lower_is_better: bool) -> tuple[str, float | None]:
    """A no-worse claim (``a`` worse than ``b`` by less than ``tolerance``): *holds* when the one-sided t test
    rejects "worse by ``tolerance`` or more" at 5 % (the worse end of the 90 % interval inside the tolerance,
    TOST's level, of which it is one half); *does not hold* when the 95 % interval lies wholly beyond it;
    otherwise *not resolved*. Returns the verdict and the one-sided p-value (None for n < 2)."""
    if se is None or df is None:
        return "not resolved (n < 2)", None
    worse = diff if lower_is_better else -diff  # > 0: a is worse
    if se == 0.0:
        p = 0.0 if worse < tolerance else 1.0
    else:
        from scipy import stats

        p = float(stats.t.cdf((worse - tolerance) / se, df))
    if p < 1 - T_LEVEL:
        return "holds", p
    if worse - t_quantile(df) * se > tolerance:
        return "does not hold", p
    return "not resolved", p


def trend_interval(x: list[float], y: list[float]) -> tuple[float, float | None, float | None]:
    """The least-squares slope of ``y`` on ``x``, its 95 % half-width (Student t, n − 2 degrees of freedom)
    and the two-sided p-value of slope = 0 (None: fewer than 3 points or one distinct x)."""
    n = len(x)
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((xi - mx) ** 2 for xi in x)
    if sxx == 0.0:
        return 0.0, None, None
    slope = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y, strict=True)) / sxx
    if n < 3:
        return slope, None, None
    residual = sum((yi - my - slope * (xi - mx)) ** 2 for xi, yi in zip(x, y, strict=True))
    se = math.sqrt(residual / (n - 2) / sxx)
    if se == 0.0:
        return slope, 0.0, 0.0 if slope != 0 else 1.0
    from scipy import stats

    return slope, t_quantile(n - 2) * se, float(2 * stats.t.sf(abs(slope) / se, n - 2))


def _training_environment(run: dict) -> tuple:
    """What makes one seed's training reproducible bit for bit: the machine, the device and the torch build
    (a GPU, or another CPU's rounding, trains a different model from the same seed)."""
    return tuple(run.get(f"environment.{key}") for key in ("machine", "device", "torch"))


def _pairs(a, b) -> tuple[list[float], list[float]]:
    """The values of two cells' completed runs of the same seed trained in the same environment: only there is
    the seed the same model (runs without a seed, or whose partner trained elsewhere, are left out)."""
    a_by_key, b_by_key = ({(run.get("seed"), _training_environment(run)): v
                           for run, v in zip(c.runs, c.values, strict=True)} for c in (a, b))
    keys = [k for k in b_by_key if k[0] is not None and k in a_by_key]
    return [a_by_key[k] for k in keys], [b_by_key[k] for k in keys]


def verdict(claim: Claim, diff: float, half: float | None, lower_is_better: bool) -> str:
    """holds / does not hold / not resolved, from the interval ``diff ± half`` of ``a − b``."""
    if half is None:
        return "not resolved (n < 2)"
    lo, hi = diff - half, diff + half
    if claim.relation == "equal":
        tol = claim.tolerance
        if -tol <= lo and hi <= tol:
            return "holds"
        if hi < -tol or lo > tol:
            return "does not hold"
        return "not resolved"
    better = (hi < 0) if lower_is_better else (lo > 0)
    worse = (lo > 0) if lower_is_better else (hi < 0)
    return "holds" if better else "does not hold" if worse else "not resolved"


# ----------------------------------------------------------------------------------------------- runs
def table_cells(spec: dict, runs: list[dict]) -> dict[tuple[str, int], Cell]:
    """The tables tool's cells (same matching), keyed by ``(row name, column index)``."""
    return {(name, j): cell for name, cells in build_table(spec, runs, split_variants=False)
            for j, cell in enumerate(cells)}


def _override_key(override: str) -> str:
    """The config key a Hydra override sets: ``+a.b=1``, ``~a.b`` and ``a.b=1`` all give ``a.b``."""
    return override.split("=", 1)[0].lstrip("+~")


def table_variant(spec: dict, run: dict) -> tuple[str, ...]:
    """A run's overrides that make it an ablation *for this table*: its variant less the overrides of the
    config keys the table's cells are matched on. Table 6's sweep selects its cells with
    ``canonicalization.num_layers`` and ``canonicalization.num_rotations`` on ``rotmnist/cn_p4``: those runs
    are Table 6 cells, and stay variants for Table 1, whose rows match on the experiment alone."""
    keys = {key.removeprefix("config.") for part in (*spec["rows"], *spec["columns"])
            for key in (part.get("match") or {})}
    return tuple(o for o in variant_of(run) if _override_key(o) not in keys)


def summary(cell: Cell) -> tuple[float, float | None] | None:
    """Mean and 95 % half-width of a cell, None when it has no value."""
    return mean_ci(cell.values) if cell.values else None


def _span(values: list[int]) -> str:
    """``"a–b"`` from the smallest to the largest value, or the one value; "–" for none."""
    if not values:
        return "–"
    return str(min(values)) if min(values) == max(values) else f"{min(values)}–{max(values)}"


def _epochs_text(runs: list[dict]) -> str:
    return _span([int(r["epochs"]) for r in runs if r.get("epochs") is not None])


def _fmt(x: float | None, digits: int) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _paper(row: dict, j: int) -> tuple[float | None, float | None]:
    paper = (row.get("paper") or [None] * (j + 1))[j]
    return (paper[0], paper[1]) if paper else (None, None)


# ----------------------------------------------------------------------------------------------- protocol
def _device_class(run: dict) -> str:
    device = str(run.get("environment.device") or "not recorded")
    return "CPU" if device == "CPU" else device


def _patience(run: dict) -> str:
    """The early stopping of a run: its patience in epochs (validations × ``check_val_every_n_epoch``), "none",
    or "not recorded"."""
    if no_early_stopping(run):
        return "none"
    patience = run.get("config.callbacks.early_stopping.patience")
    if patience is None:
        return "not recorded"
    every = run.get("config.trainer.check_val_every_n_epoch")
    if isinstance(every, int) and not isinstance(every, bool) and every > 1:
        return f"patience {int(patience) * every} epochs ({patience} validations)"
    return f"patience {patience} epochs"


def _counted(values: list[str]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for value in values:
        counts[value] += 1
    return ", ".join(f"{value} ({n})" if len(counts) > 1 else value for value, n in
                     sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def protocol_differences(spec: dict, runs: list[dict]) -> list[str]:
    """How ``runs`` depart from the paper's protocol for the table (``spec["protocol"]``): data, epoch cap and
    early stopping, each named with ours and the paper's. Empty when they match (or the table states none)."""
    protocol = spec.get("protocol")
    if not protocol or not runs:
        return []
    differences = []
    data = sorted({dataset_of(r)[0] for r in runs if not dataset_of(r)[0].startswith(protocol["data"])})
    if data:
        differences.append(f"data: {'; '.join(data)} (paper: {protocol['data']})")
    caps = sorted({int(c) for r in runs if (c := r.get("config.trainer.max_epochs")) is not None
                   and int(c) != protocol["epochs"]})
    if caps:
        differences.append(f"epochs: {', '.join(map(str, caps))} (paper: {protocol['epochs']})")
    paper_patience = protocol.get("early_stopping_patience")
    wanted = "none" if paper_patience is None else f"patience {paper_patience} epochs"
    stopping = sorted({p for r in runs if (p := _patience(r)) != wanted and p != "not recorded"})
    if stopping:
        differences.append(f"early stopping: {', '.join(stopping)} (paper: {wanted})")
    return differences


def _paper_protocol_text(spec: dict) -> str:
    protocol = spec.get("protocol")
    if not protocol:
        return spec.get("source", "–")
    patience = protocol.get("early_stopping_patience")
    stopping = "best validation epoch" if patience is None and "best validation" in protocol.get("source", "") \
        else ("no early stopping" if patience is None else f"early stopping, patience {patience} epochs")
    return f"{protocol['data_text']}; {protocol['epochs']} epochs, {stopping} ({protocol['source'].split(':')[0]})"


def _our_protocol_text(runs: list[dict]) -> str:
    caps = sorted({int(c) for r in runs if (c := r.get("config.trainer.max_epochs")) is not None}, reverse=True)
    data = sorted({dataset_of(r)[0] for r in runs})
    return (f"{'; '.join(data)}; ≤ {', '.join(map(str, caps))} epochs; early stopping: "
            f"{_counted([_patience(r) for r in runs])}; device: {_counted([_device_class(r) for r in runs])}")


def render_protocols(tables: dict, runs_by_table: dict[str, list[dict]]) -> list[str]:
    lines = ["| Table | paper's protocol | ours (runs at the rows' own settings) | differences |", "|---|---|---|---|"]
    for name, runs in runs_by_table.items():
        spec = tables[name]
        differences = protocol_differences(spec, runs)
        lines.append(f"| {spec['title'].split(':')[0]} | {_paper_protocol_text(spec)} | {_our_protocol_text(runs)} | "
                     + ("; ".join(differences) if differences else "none") + " |")
    return lines


# ----------------------------------------------------------------------------------------------- code versions
def code_version(run: dict) -> str | None:
    """The code a run ran: ``<commit>[+dirty]``, or ``package <version>`` outside a checkout; None when the
    record predates the field."""
    commit = run.get("code_version.commit")
    if commit:
        return str(commit)[:12] + ("+dirty" if run.get("code_version.dirty") else "")
    package = run.get("code_version.package")
    return f"package {package}" if package else None


def mixed_versions(cell: Cell) -> list[str]:
    """The distinct recorded code versions of a cell's runs, when there are several (else [])."""
    versions = sorted({v for r in cell.runs if (v := code_version(r)) is not None})
    return versions if len(versions) > 1 else []


# ----------------------------------------------------------------------------------------------- figures
def _bar_chart(name: str, spec: dict, cells: dict, path: Path, comparable: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, ours, ours_err, paper, paper_err = [], [], [], [], []
    for row in spec["rows"]:
        for j, column in enumerate(spec["columns"]):
            s = summary(cells[(row["name"], j)])
            if s is None:
                continue
            label = row["name"] if len(spec["columns"]) == 1 else f"{row['name']} [{column['name']}]"
            p_mean, p_std = _paper(row, j)
            labels.append(label)
            ours.append(s[0])
            ours_err.append(s[1] or 0.0)
            paper.append(p_mean if (comparable and p_mean is not None) else float("nan"))
            paper_err.append(p_std or 0.0)
    if not labels:
        return
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(labels) + 2), 4.2))
    x = range(len(labels))
    width = 0.4
    ax.bar([i - width / 2 for i in x], ours, width, yerr=ours_err, capsize=3, label="ours (95 % CI)")
    if comparable:
        ax.bar([i + width / 2 for i in x], paper, width, yerr=paper_err, capsize=3, label="paper (± std)",
               color="0.7")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
    scale = spec.get("scale", 1.0)
    ax.set_ylabel(spec["metric"] + (f" × {scale:g}" if scale != 1.0 else ""))
    ax.set_title(spec["title"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_curve(run: dict, metric: str) -> list[tuple[int, float]]:
    """``(epoch, value)`` of ``metric`` from the run's ``csv/metrics.csv`` (empty when absent)."""
    path = Path(run["path"]).parent / "csv" / "metrics.csv"
    if not path.is_file():
        return []
    points: dict[int, float] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            value = row.get(metric)
            if value not in (None, "") and row.get("epoch") not in (None, ""):
                points[int(float(row["epoch"]))] = float(value)
    return sorted(points.items())


def _first_val_epoch(run: dict) -> int:
    """The 0-based epoch of a run's first validation: Lightning validates after every
    ``check_val_every_n_epoch``-th epoch (N-body: 5, so epoch 4), so a curve starting there is complete."""
    every = run.get("config.trainer.check_val_every_n_epoch")
    return int(every) - 1 if isinstance(every, (int, float)) and every >= 1 else 0


def _curves_chart(name: str, spec: dict, cells: dict, path: Path) -> list[str] | None:
    """Draw the validation curves; returns the notes on curves that do not start at epoch 0 (None: no
    curve at all)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = spec.get("val_metric") or spec["metric"].replace("test/", "val/", 1)
    series = []
    for row in spec["rows"]:
        for j, column in enumerate(spec["columns"]):
            for run in cells[(row["name"], j)].runs:
                curve = read_curve(run, metric)
                if curve:
                    label = row["name"] if len(spec["columns"]) == 1 else f"{row['name']} [{column['name']}]"
                    series.append((label, run.get("seed"), curve, _first_val_epoch(run)))
    if not series:
        return None
    partial = sorted({f"{label} seed {seed} (from epoch {curve[0][0]})" for label, seed, curve, first in series
                      if curve[0][0] > first})
    labels = sorted({s[0] for s in series}, key=[s[0] for s in series].index)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for label, seed, curve, _ in series:
        i = labels.index(label)
        ax.plot([e for e, _ in curve], [v for _, v in curve], color=colors[i % len(colors)],
                linestyle=("-", "--", ":", "-.")[(i // len(colors)) % 4], linewidth=1,
                label=label if seed == min(s[1] for s in series if s[0] == label) else None)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    if spec.get("lower_is_better") and metric.endswith(("error", "mse", "loss")):
        ax.set_yscale("log")
    ax.set_title(f"{name}: validation curves, one line per seed", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return partial


# ----------------------------------------------------------------------------------------------- report
def _groups(runs: list[dict]) -> list[tuple[tuple[str, str], list[dict]]]:
    """Runs by (data set, epoch cap): the largest budget first, the one a reader looks for."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for run in sorted(runs, key=lambda r: (dataset_of(r)[0], budget_sort_key(r))):
        groups[(dataset_of(run)[0], budget_of(run))].append(run)
    return list(groups.items())


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_").lower()[:60]


def _figure_slug(table: str, data: str, budget: str) -> str:
    """A table's figure name for one data set and budget: readable (the table, the data set's first word, the
    budget) and a digest of the whole data set and budget, so that one data set's figure keeps its name whichever
    other data sets of the same first word (the embedded shapes' sizes, difficulties) have runs."""
    digest = hashlib.sha1(f"{data}|{budget}".encode()).hexdigest()[:6]
    return f"{_slug(f'{table}_{data.split()[0]}_{budget}')[:53]}_{digest}"


def _not_counted(failures: list[str]) -> str:
    """`` (+1 diverged, +1 failed)``: the runs of a cell that its mean leaves out, said where the mean is read."""
    diverged = sum(1 for f in failures if f == "diverged")
    parts = [f"+{k} {what}" for k, what in ((diverged, "diverged"), (len(failures) - diverged, "failed")) if k]
    return f" ({', '.join(parts)})" if parts else ""


def render_table(name: str, spec: dict, groups: list[tuple[str, dict, list[dict]]], comparable: bool) -> list[str]:
    """One table for one data set: each row (and column) at every budget it has runs at, largest first, with
    the paper's number beside it; Δ only at a budget run at the paper's protocol. ``groups``: (budget, cells,
    runs) per budget."""
    digits = spec.get("digits", 2)
    multi = len(spec["columns"]) > 1
    header = (["Method"] + ([spec.get("column_label", "Column")] if multi else [])
              + ["budget", "ours (mean ± 95 % CI)", "n", "epochs run", "paper", "Δ (ours − paper)"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    same_protocol = {budget: not protocol_differences(spec, runs) and comparable for budget, _, runs in groups}
    marks = set()
    for row in spec["rows"]:
        for j, column in enumerate(spec["columns"]):
            p_mean, p_std = _paper(row, j)
            paper = "–" if p_mean is None else _fmt(p_mean, digits) + (f" ± {_fmt(p_std, digits)}" if p_std else "")
            if row.get("quoted") and p_mean is not None:
                paper += " (quoted)"
                marks.add("quoted")
            shown = [(budget, cells[(row["name"], j)]) for budget, cells, _ in groups
                     if cells[(row["name"], j)].values]
            for budget, cell in shown or [("–", None)]:
                s = summary(cell) if cell else None
                ours = "–" if s is None else _fmt(s[0], digits) + (f" ± {_fmt(s[1], digits)}" if s[1] is not None else "")
                n = "0" if cell is None else str(len(cell.values)) + _not_counted(cell.failures)
                if cell is not None and mixed_versions(cell):
                    n += " ‡"
                    marks.add("versions")
                delta, paper_shown = "–", paper
                if cell is not None and p_mean is not None:
                    if same_protocol.get(budget):
                        delta = f"{s[0] - p_mean:+.{digits}f}"
                    else:
                        paper_shown += " †"
                        marks.add("protocol")
                lines.append("| " + " | ".join([row["name"]] + ([column["name"]] if multi else [])
                                               + [budget, ours, n, "–" if cell is None else _epochs_text(cell.runs),
                                                  paper_shown, delta]) + " |")
    legend = []
    if "protocol" in marks:
        legend.append("† ours at another protocol than the paper's (the box above): no Δ")
    if "quoted" in marks:
        sources = sorted({row["quoted"] for row in spec["rows"] if row.get("quoted")})
        legend.append(f"(quoted): a number the paper quotes from {', '.join(sources)}; ours is our own run of that "
                      "model")
    if "versions" in marks:
        legend.append("‡ the cell's seeds ran different code versions (listed under Runs)")
    return lines + ([""] + ["; ".join(legend) + "."] if legend else [])


def floor_note(spec: dict, cells: dict) -> list[str]:
    """Under a table of runs on the embedded synthetic shapes: what a predictor that ignores the points scores
    on the same clouds (:mod:`canonical_network.trivial_baselines`) and every run at or below it, so "every row
    learns" is read against a measured floor. Nothing for other data, or runs of several data configs."""
    from canonical_network.trivial_baselines import SYNTHETIC_KEYS, synthetic_floor

    runs = [run for cell in cells.values() for run in cell.runs]
    if not runs or not all(str(r.get("config.data._target_", "")).endswith(".SyntheticShapesDataModule")
                           for r in runs):
        return []
    configs = {tuple(r.get(f"config.data.{key}") for key in SYNTHETIC_KEYS) for r in runs}
    if len(configs) != 1 or None in (config := next(iter(configs))):
        return []
    data_config = dict(zip(SYNTHETIC_KEYS, config, strict=True))
    floor = synthetic_floor(data_config).get(spec["metric"].removeprefix("test/"))
    if floor is None:
        return []
    value, digits = floor * spec.get("scale", 1.0), spec.get("digits", 2)
    beaten = (lambda v: v < value) if spec.get("lower_is_better") else (lambda v: v > value)
    at = [f"{row} ({spec['columns'][j]['name']}) seed {run.get('seed')}: {v:.{digits}f}"
          for (row, j), cell in cells.items() for v, run in zip(cell.values, cell.runs, strict=True)
          if not beaten(v)]
    example = next(r.get("experiment") for r in runs)
    command = " ".join([f"python -m canonical_network.trivial_baselines experiment={example}",
                        *(f"data.{key}={data_config[key]}" for key in SYNTHETIC_KEYS if key != "task")])
    return ["", "Floor: a predictor that ignores the points (the most frequent training "
            + ("category" if data_config["task"] == "classification" else "part of the shape's category")
            + f") scores **{value:.{digits}f}** on these test clouds (`{command}`). Runs at or below it: "
            + ("; ".join(at) if at else "none") + "."]


@dataclass(frozen=True)
class ClaimCheck:
    """One claim checked on one data set and budget (``variant``: under an ablation run on both sides)."""

    claim: Claim
    data: str
    budget: str
    variant: tuple[str, ...]
    interval: str
    counts: str
    p: str
    verdict: str
    #: the experiments behind the claim's two cells (what an ablation must change to bear on it)
    experiments: tuple[str, ...]
    #: the runs of side a and side b, for how they ended (:func:`stopping_text`)
    sides: tuple[tuple[str, tuple[dict, ...]], ...] = ()
    #: each side as "mean ± 95 % CI (n)" (a trend: the slope), for the scorecard
    ours: str = ""
    #: the smallest n of a side, and the epoch cap (what the scorecard picks the rows' check by)
    min_n: int = 0
    cap: float = 0.0

    @property
    def setting(self) -> str:
        return f"{self.data}, {self.budget}" + (f", with `{' '.join(self.variant)}`" if self.variant else "")

    @property
    def label(self) -> str:
        """What :attr:`interval` is an interval of."""
        return "slope" if self.claim.trend_x else "a − b"


def _cell_text(values: list[float], digits: int) -> str:
    mean, half = mean_ci(values)
    return f"{mean:.{digits}f}" + (f" ± {half:.{digits}f}" if half is not None else "") + f" (n {len(values)})"


def _cap_of(runs) -> float:
    caps = [r.get("config.trainer.max_epochs") for r in runs]
    caps = [float(c) for c in caps if isinstance(c, (int, float)) and not isinstance(c, bool)]
    return max(caps) if caps else 0.0


def check_claims(tables: dict, cells_by_table: dict, claims: list[Claim] | None = None) -> list[ClaimCheck]:
    """Every claim on every (data, budget, variant) group that has runs on both of its sides."""
    checks = []
    for claim in CLAIMS if claims is None else claims:
        spec = tables[claim.table]
        digits = spec.get("digits", 2)
        for (data, budget, variant), cells in cells_by_table.get(claim.table, {}).items():
            if claim.trend_x:
                check = _trend_check(claim, spec, data, budget, variant, cells)
                if check is not None:
                    checks.append(check)
                continue
            a, b = cells.get(claim.a), cells.get(claim.b)
            if a is None or b is None or not a.values or not b.values:
                continue
            if claim.paired:
                a_values, b_values = _pairs(a, b)
                if not a_values:
                    continue
                counts, test = f"{len(a_values)} pairs", "paired t"
            else:
                a_values, b_values = a.values, [claim.b_scale * v for v in b.values]
                counts, test = f"{len(a.values)}, {len(b.values)}", "Welch"
            diff, se, df = difference_stats(a_values, b_values, paired=claim.paired)
            _, half, p = _interval(diff, se, df)
            interval = f"{diff:+.{digits}f}" + (f" ± {half:.{digits}f}" if half is not None else "")
            if claim.b_scale != 1.0:
                interval += f" (a − {claim.b_scale:g} b)"
            if claim.relation == "equal":
                interval += f" (tolerance ±{claim.tolerance:g})"
                shown_verdict, p = equivalence_verdict(diff, se, df, claim.tolerance)
                test = f"TOST, {test}"
            elif claim.relation == "no_worse":
                lower = spec.get("lower_is_better", True)
                interval += f" (at most {claim.tolerance:g} worse)"
                shown_verdict, p = noninferiority_verdict(diff, se, df, claim.tolerance, lower)
                test = f"one-sided, {test}"
            else:
                shown_verdict = verdict(claim, diff, half, spec.get("lower_is_better", True))
                if claim.b_scale < 1.0 and not any(b.values):
                    # "a cuts b by 1/b_scale" where b is 0 in every run: there was nothing to cut, and 0 < 0
                    # cannot hold; say so instead of reading it as an unresolved interval
                    shown_verdict = f"not resolved: {_side_name(spec, claim.b)} is 0 in every run, nothing to cut"
            shown_p = "–" if p is None else f"{p:.2g} ({test})"
            experiments = tuple(dict.fromkeys(str(r.get("experiment")) for c in (a, b) for r in c.runs))
            sides = tuple((_side_name(spec, key), tuple(cell.runs)) for key, cell in ((claim.a, a), (claim.b, b)))
            scale = f"{claim.b_scale:g} × " if claim.b_scale != 1.0 else ""
            if claim.paired:  # the runs the test used: a seed without a partner in the same environment is not
                left_out = len(a.values) + len(b.values) - len(a_values) - len(b_values)
                ours = (f"{_cell_text(a_values, digits)} vs {scale}{_cell_text(b_values, digits)} (paired seeds"
                        + (f"; {left_out} runs without a partner trained in the same environment left out)"
                           if left_out else ")"))
            else:
                ours = f"{_cell_text(a.values, digits)} vs {scale}{_cell_text(b.values, digits)}"
            checks.append(ClaimCheck(claim, data, budget, variant, interval, counts, shown_p, shown_verdict,
                                     experiments, sides, ours, min(len(a_values), len(b_values)),
                                     _cap_of([*a.runs, *b.runs])))
    return checks


def _two_sided_p(diff: float, se: float, df: float) -> float:
    if se == 0.0:
        return 0.0 if diff != 0 else 1.0
    from scipy import stats

    return float(2 * stats.t.sf(abs(diff) / se, df))


def _trend_check(claim: Claim, spec: dict, data: str, budget: str, variant: tuple[str, ...],
                 cells: dict) -> ClaimCheck | None:
    """A trend claim on one group, when at least 3 of its row's columns have runs (2 would only repeat the
    pairwise claim)."""
    row = claim.a[0]
    columns = [(j, x, cells.get((row, j))) for j, x in enumerate(claim.trend_x)]
    columns = [(j, x, cell) for j, x, cell in columns if cell is not None and cell.values]
    if len(columns) < 3:
        return None
    xs = [x for _, x, cell in columns for _ in cell.values]
    ys = [v for _, _, cell in columns for v in cell.values]
    slope, half, p = trend_interval(xs, ys)
    digits = spec.get("digits", 2)
    interval = f"{slope:+.{digits}f}" + (f" ± {half:.{digits}f}" if half is not None else "") + " per doubling"
    shown_p = "–" if p is None else f"{p:.2g} (slope t)"
    experiments = tuple(dict.fromkeys(str(r.get("experiment")) for _, _, cell in columns for r in cell.runs))
    sides = tuple((_side_name(spec, (row, j)), tuple(cell.runs)) for j, _, cell in columns)
    return ClaimCheck(claim, data, budget, variant, interval, f"{len(ys)} runs, {len(columns)} orders", shown_p,
                      verdict(claim, slope, half, spec.get("lower_is_better", True)), experiments, sides,
                      f"{len(ys)} runs over {len(columns)} orders", min(len(c.values) for _, _, c in columns),
                      _cap_of([r for _, _, c in columns for r in c.runs]))


def _side_name(spec: dict, key: tuple[str, int]) -> str:
    """A claim side ``(row, column index)`` as text: the row, and the column when the table has several."""
    row, j = key
    columns = spec.get("columns") or []
    return f"{row} ({columns[j]['name']})" if len(columns) > 1 else row


def _paper_side(spec: dict, claim: Claim) -> str:
    """The paper's numbers for a claim: ``a vs b`` (a trend: the slope over the paper's cells of its row)."""
    digits = spec.get("digits", 2)
    rows = {row["name"]: row for row in spec["rows"]}
    if claim.trend_x:
        points = [(x, _paper(rows[claim.a[0]], j)[0]) for j, x in enumerate(claim.trend_x)]
        points = [(x, y) for x, y in points if y is not None]
        if len(points) < 2:
            return "–"
        slope = trend_interval([x for x, _ in points], [y for _, y in points])[0]
        return f"slope {slope:+.{digits}f} per doubling"
    a, b = _paper(rows[claim.a[0]], claim.a[1])[0], _paper(rows[claim.b[0]], claim.b[1])[0]
    if a is None or b is None:
        return "–"
    scale = f"{claim.b_scale:g} × " if claim.b_scale != 1.0 else ""
    return f"{a:.{digits}f} vs {scale}{b:.{digits}f}"


def pick_default(claim: Claim, checks: list[ClaimCheck]) -> ClaimCheck | None:
    """The check a claim is scored by: at the rows' own settings (no ablation), the largest epoch cap where both
    sides have ≥ 2 seeds, else the largest cap with runs on both sides."""
    candidates = [c for c in checks if c.claim is claim and not c.variant]
    return max(candidates, key=lambda c: (c.min_n >= 2, c.cap, c.min_n), default=None)


def why_unchecked(claim: Claim, tables: dict, cells_by_table: dict) -> str:
    """Why a claim has no check: which side has no runs, or no runs at a common budget."""
    spec = tables[claim.table]
    groups = {key: cells for key, cells in cells_by_table.get(claim.table, {}).items() if not key[2]}
    if claim.trend_x:
        return "fewer than 3 orders with runs at one budget"

    def budgets(side):
        return sorted({budget for (_, budget, _), cells in groups.items() if cells.get(side) and cells[side].values})

    a, b = budgets(claim.a), budgets(claim.b)
    if not a and not b:
        return "no runs at the rows' own settings"
    if not a or not b:
        return f"no runs of {_side_name(spec, claim.a if not a else claim.b)}"
    return (f"no runs at a common budget ({_side_name(spec, claim.a)}: {'; '.join(a)}; "
            f"{_side_name(spec, claim.b)}: {'; '.join(b)})")


@dataclass(frozen=True)
class Scored:
    """A claim with its number in the report and the check it is scored by (None: why not, in ``reason``)."""

    number: int
    claim: Claim
    check: ClaimCheck | None
    reason: str = ""

    @property
    def verdict(self) -> str:
        return self.check.verdict if self.check else f"not resolved: {self.reason}"


def score_claims(claims: list[Claim], checks: list[ClaimCheck], tables: dict, cells_by_table: dict) -> list[Scored]:
    return [Scored(i, claim, check, "" if check else why_unchecked(claim, tables, cells_by_table))
            for i, claim in enumerate(claims, start=1) for check in [pick_default(claim, checks)]]


def _tally(scored: list[Scored]) -> str:
    holds = sum(s.verdict == "holds" for s in scored)
    fails = sum(s.verdict == "does not hold" for s in scored)
    unresolved = len(scored) - holds - fails
    unchecked = sum(s.check is None for s in scored)
    return (f"**{holds} hold, {fails} do not hold, {unresolved} not resolved**"
            + (f" ({unchecked} of them without runs on both sides at one budget)" if unchecked else ""))


def render_scored(scored: list[Scored], tables: dict) -> list[str]:
    lines = ["| # | Claim | source | paper: a vs b | ours: a vs b, mean ± 95 % CI (n) | a − b, or slope (95 % CI) | p "
             "| budget | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for s in scored:
        spec = tables[s.claim.table]
        if s.check is None:
            lines.append(f"| {s.number} | {s.claim.text} | {s.claim.source} | {_paper_side(spec, s.claim)} | – | – | – "
                         f"| – | not resolved: {s.reason} |")
            continue
        c = s.check
        budget = c.budget + ("" if dataset_of(c.sides[0][1][0])[1] else f" ({c.data.split(' (')[0]})")
        ours = c.ours + (f"; {c.counts}" if c.claim.paired else "")
        lines.append(f"| {s.number} | {s.claim.text} | {s.claim.source} | {_paper_side(spec, s.claim)} | {ours} | "
                     f"{c.interval} | {c.p} | {budget} | **{c.verdict}** |")
    return lines


def render_checks(checks: list[ClaimCheck], numbers: dict) -> list[str]:
    """Checks as a table: each claim (by its number) on a data set, budget and ablation."""
    lines = ["| # | Claim | data, budget | a − b, or slope (95 % CI) | n (a, b) | p | verdict |",
             "|---|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {numbers[id(c.claim)]} | {c.claim.text} ({c.claim.source}) | {c.setting} | {c.interval} | "
                     f"{c.counts} | {c.p} | **{c.verdict}** |")
    return lines


def _id_span(effects: list[dict]) -> str:
    """Ablation ids as ranges: ``A6–A19, A24``."""
    numbers = sorted(int(e["id"][1:]) for e in effects)
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"A{a}" if a == b else f"A{a}–A{b}" for a, b in spans)


def render_claim_details(scored: list[Scored], checks: list[ClaimCheck], effects: list[dict]) -> list[str]:
    """Per claim: its check at the scored setting, the same claim at the other budgets and under every ablation
    run on both of its sides (one line each), and, when it does not hold, how the runs of both sides ended and
    which ablations of its rows moved what (by their ids in the ablations table)."""
    lines = []
    for s in scored:
        c = s.check
        others = [o for o in checks if o.claim is s.claim and o is not c and (c is None or o.data == c.data)]
        if c is None:
            if others:
                lines.append(f"- **#{s.number} {s.claim.text}** ({s.claim.source}): not checked at the rows' own "
                             f"settings ({s.reason}).")
                lines += [f"  - The claim with `{' '.join(o.variant)}` on both sides ({o.data}, {o.budget}): "
                          f"**{o.verdict}**, {o.label} = {o.interval} (n {o.counts})." for o in others]
            continue
        if c.verdict == "holds" and not others:
            continue
        lines += [f"- **#{s.number} {s.claim.text}** ({s.claim.source}; {c.data}, {c.budget}): {c.verdict}, "
                  f"{c.label} = {c.interval} (n {c.counts}; p {c.p})."]
        for other in others:
            where = f"with `{' '.join(other.variant)}` on both sides" if other.variant else f"at {other.budget}"
            if other.variant and other.budget != c.budget:
                where += f", {other.budget}"
            lines.append(f"  - The claim {where}: **{other.verdict}**, {other.label} = {other.interval} "
                         f"(n {other.counts}).")
        if c.verdict != "holds":
            stopping = [text for name, runs in c.sides if (text := stopping_text(name, list(runs)))]
            if stopping:
                lines.append("  - How the runs ended: " + "; ".join(stopping) + ".")
            related = [e for e in effects if e["experiment"] in c.experiments and (e["data"], e["budget"]) ==
                       (c.data, c.budget) and _same_columns(c, e)]
            if related:
                moving = [f"{e['id']} {_difference(e['values'], e['base'])}" for e in related
                          if not e.get("other_split") and _moved(e["values"], e["base"]) == "moves it"]
                lines.append(f"  - Ablations of its rows on this data and budget: {_id_span(related)}; "
                             + (f"moving it (variant − row default, 95 % CI): {'; '.join(moving)}." if moving
                                else "none moves it beyond its 95 % interval."))
            elif not any(o.variant for o in others):
                lines.append("  - No ablation of these rows has run on this data and budget yet.")
    return lines + [""] if lines else ["Every claim holds at the one setting it has runs at.", ""]


def stopping_text(name: str, runs: list[dict]) -> str | None:
    """How a cell's runs ended — at their epoch cap or stopped early — and after how many epochs their
    monitored validation metric was best (from ``csv/metrics.csv``): a side whose best epochs sit at the cap
    was still improving, so the budget bounds it. None when the runs do not record their cap."""
    capped, stopped, best = [], [], []
    for run in runs:  # records as load_runs flattens them: "config.trainer.max_epochs", ...
        cap, epochs = run.get("config.trainer.max_epochs"), run.get("epochs")
        if run.get("status") != "completed" or cap is None or epochs is None:
            continue
        (capped if int(epochs) >= int(cap) else stopped).append(int(epochs))
        # the tested checkpoint names its epoch (counted from 0); else the validation curve, when it is whole (a
        # resume can have cut its early epochs from csv/metrics.csv)
        tested = re.search(r"epoch_(\d+)\.ckpt$", str(run.get("checkpoint") or ""))
        if tested:
            best.append(int(tested.group(1)) + 1)
            continue
        metric, mode = run.get("config.optimized_metric"), run.get("config.optimized_mode", "min")
        curve = read_curve(run, metric) if metric else []
        if curve and curve[0][0] <= _first_val_epoch(run):
            pick = min if mode == "min" else max
            best.append(pick(curve, key=lambda point: point[1])[0] + 1)  # epochs are counted from 0
    if not capped and not stopped:
        return None
    total = len(capped) + len(stopped)
    parts = []
    if capped:
        parts.append(f"{len(capped)} of {total} ran to the {capped[0]}-epoch cap")
    if stopped:
        parts.append(f"{len(stopped)} of {total} stopped early after {_span(stopped)} epochs")
    text = f"{name}: " + ", ".join(parts)
    return text + (f", best validation after {_span(best)} epochs" if best else "")


def _moved(values: list[float], base: list[float]) -> str:
    """Whether the 95 % Welch interval of ``values − base`` excludes 0."""
    if len(values) < 2 or len(base) < 2:
        return "n < 2: not resolved"
    diff, half, _ = welch_interval(values, base)
    return "moves it" if abs(diff) > half else "not resolved"


def _values(runs: list[dict], metric: str) -> list[float]:
    """A test metric (``metrics[metric]``) or a flat record key (``best_val.val/acc``) of the completed runs."""
    values = [r["metrics"].get(metric, r.get(metric)) for r in runs if r.get("status") == "completed"]
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(float(v))]


#: overrides that move digits between the training, validation and test splits: such a variant is tested (and
#: validated) on other digits than its row's default, so only the claim under it on both sides compares
SPLIT_OVERRIDES = tuple(f"data.{key}" for key in SPLIT_SETTINGS)


def changes_split(variant: tuple[str, ...]) -> bool:
    return any(_override_key(override) in SPLIT_OVERRIDES for override in variant)


def _same_columns(check: ClaimCheck, effect: dict) -> bool:
    """Whether an ablation ran in a column (rotation protocol) that the claim's runs compare."""
    rotations = {_rotation(r) for _, runs in check.sides for r in runs}
    return not rotations or effect.get("rotation") in rotations


def _rotation(run: dict) -> str | None:
    """The run's rotation protocol (``data.rotation``: a point-cloud table's column), ``None`` where it has none."""
    rotation = run.get("config.data.rotation")
    return None if rotation is None else str(rotation)


def variant_effects(runs: list[dict], row_runs: list[dict]) -> list[dict]:
    """Ablation runs grouped by experiment, data, budget and the overrides that make them a variant, each
    with the row's own runs of the same data and budget: the values of its headline metric on both sides and
    the best-validation difference (what a default is chosen on)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        # the rotation protocol (point clouds: train/test rotations, a table's column) is part of the setting:
        # a variant is compared with the row's runs of the same column only, never pooled across columns
        groups[(run.get("experiment"), dataset_of(run)[0], budget_of(run), _rotation(run), variant_of(run))].append(run)
    effects = []
    for (experiment, data, budget, rotation, variant), members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        ok = [r for r in members if r.get("status") == "completed" and r["metrics"]]
        metric = _headline_metric(ok[0]["metrics"]) if ok else None
        defaults = [r for r in row_runs if r.get("experiment") == experiment and dataset_of(r)[0] == data
                    and budget_of(r) == budget and _rotation(r) == rotation]
        # What a default is chosen on: the monitored validation metric at the tested checkpoint.
        val_name = next((k for r in ok for k in r if k.startswith("best_val.")), None)
        val = "–"
        if val_name:
            val = f"{val_name.removeprefix('best_val.')} {_difference(_values(ok, val_name), _values(defaults, val_name))}"
        if changes_split(variant):
            val = "– (other digits)"
        effects.append({"experiment": experiment, "data": data, "budget": budget, "rotation": rotation,
                        "variant": variant,
                        "metric": metric or "–", "values": _values(members, metric) if metric else [],
                        "base": _values(defaults, metric) if metric else [], "val": val,
                        "other_split": changes_split(variant),
                        "epochs": _epochs_text(ok),
                        "failure": str(members[0].get("error") or members[0].get("status"))[:60]})
    return effects


#: Ablation overrides that leave the model not equivariant in practice, and why: the ablations table says so
#: beside the variant, so that no one reads their numbers as an equivariant model's.
NOT_EQUIVARIANT = {
    "canonicalization.authors_code=true": "the authors' code's biases, element-wise dropout and coordinate-row "
                                          "Gram–Schmidt break O(3) equivariance",
    "canonicalization.features=p": "positions alone leave a vanishing frame outside training (docs/nbody.md, "
                                   "scripts/nbody_frame_scale.py)",
}


def equivariance_caveat(variant: tuple[str, ...] | list[str]) -> str:
    """Why a variant's overrides leave the model not equivariant (:data:`NOT_EQUIVARIANT`), or ``""``."""
    return "; ".join(reason for override, reason in NOT_EQUIVARIANT.items() if override in variant)


def render_variants(effects: list[dict], bears_on: dict[str, list[int]] | None = None) -> list[str]:
    """The table of :func:`variant_effects`, each ablation once with its id and the claims (by number) whose rows
    it changes on the same data and budget: whether it moves the result (95 % Welch interval)."""
    lines = ["| id | Experiment | variant (overrides) | data, budget | metric | variant: mean ± 95 % CI (n) | "
             "row default: mean ± 95 % CI (n) | variant − default (95 % CI) | best validation: variant − "
             "default (95 % CI) | epochs run | claims |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def text(values: list[float]) -> str:
        if not values:
            return "–"
        m, h = mean_ci(values)
        return f"{m:.4g}" + (f" ± {h:.2g}" if h is not None else "") + f" ({len(values)})"

    for e in effects:
        shown = text(e["values"]) if e["values"] else "failed: " + e["failure"]
        difference = "– (another test split)" if e.get("other_split") else _difference(e["values"], e["base"])
        claims = ", ".join(f"#{n}" for n in (bears_on or {}).get(e["id"], [])) or "–"
        caveat = equivariance_caveat(e["variant"])
        variant = f"`{' '.join(e['variant'])}`" + (f" **not equivariant**: {caveat}" if caveat else "")
        setting = f"{e['data']}" + (f", rotation {e['rotation']}" if e.get("rotation") else "") + f", {e['budget']}"
        lines.append(f"| {e['id']} | {e['experiment']} | {variant} | {setting} | "
                     f"{e['metric']} | {shown} | {text(e['base'])} | {difference} | "
                     f"{e['val']} | {e['epochs']} | {claims} |")
    return lines


def _difference(values: list[float], base: list[float]) -> str:
    """``a − b`` with its 95 % Welch interval, or why there is none."""
    if not values or not base:
        return "–"
    diff, half, _ = welch_interval(values, base)
    return f"{diff:+.3g}" + (f" ± {half:.2g}" if half is not None else " (n < 2)")


def _headline_metric(metrics: dict) -> str:
    for name in ("test/error", "test/mse", "test/class_miou", "test/acc"):
        if name in metrics:
            return name
    return sorted(metrics)[0]


def _run_folder(run: dict, roots: list[Path]) -> str:
    """A run's folder relative to the runs folder it was found in (never an absolute path)."""
    path = Path(run["path"]).parent.resolve()
    for root in roots:
        try:
            return path.relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return path.name


def _folders_text(folders: list[str]) -> str:
    """``parent/{a,b}`` for folders that share a parent, else the list."""
    parents = {f.rpartition("/")[0] for f in folders}
    if len(folders) > 1 and len(parents) == 1:
        parent = next(iter(parents))
        names = f"{{{','.join(sorted(f.rpartition('/')[2] for f in folders))}}}"
        return f"{parent}/{names}" if parent else names
    return ", ".join(sorted(folders))


#: overrides whose values one line of the runs table lists together (the columns of a point-cloud table)
MERGED = ("data.rotation=",)


def render_runs(runs: list[dict], roots: list[Path]) -> list[str]:
    """Every run, grouped by its command less the seed: seeds, status, data, budget, epochs, fitting time,
    device and folders."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        command = [o for o in (run.get("overrides") or []) if not o.startswith(("hydra.run.dir=", "seed=") + MERGED)]
        groups[(str(run.get("experiment")), tuple(command), dataset_of(run)[0])].append(run)
    lines = ["| command (`python -m canonical_network.train` ... `seed=<seed>`) | seeds | status | data | epochs "
             "run | training time | device | folders |", "|---|---|---|---|---|---|---|---|"]
    for (_experiment, command, data), members in sorted(groups.items()):
        members.sort(key=lambda r: (str(r.get("seed")), r["path"]))
        seeds = ", ".join(sorted({str(r.get("seed")) for r in members}))
        if len(members) > len(seeds.split(", ")):
            seeds += f" ({len(members)} runs)"
        status = _counted([str(r.get("status")) for r in members])
        hours = sum(run_time_s(r) or 0.0 for r in members) / 60
        merged = [f"{key}{{{','.join(sorted(values))}}}" for key in MERGED if (values := {
            o.removeprefix(key) for r in members for o in (r.get("overrides") or []) if o.startswith(key)})]
        lines.append(f"| `{' '.join([*command, *merged])}` | {seeds} | {status} | {data} | "
                     f"{_span([int(r['epochs']) for r in members if r.get('epochs') is not None])} | "
                     f"{hours:.1f} min | {_counted([_device_class(r) for r in members])} | "
                     f"`{_folders_text([_run_folder(r, roots) for r in members])}` |")
    return lines


def render_accounting(runs: list[dict], roots: list[Path], superseded: list[tuple[str, dict]],
                      flagged: list[str]) -> list[str]:
    """Every record counted: completed runs are pooled; diverged and failed ones are listed with why, as are
    the superseded records kept beside the runs; cells whose seeds ran different code versions are named."""
    by_status: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        by_status[str(run.get("status"))].append(run)
    versions = [code_version(r) for r in runs]
    recorded = sum(v is not None for v in versions)
    lines = [f"{len(runs)} run records: " + ", ".join(f"{len(v)} {k}" for k, v in sorted(by_status.items()))
             + (f"; {len(superseded)} superseded records kept apart" if superseded else "")
             + ". Only completed runs are pooled; every other record is listed here with why. "
             f"Code version recorded by {recorded} of {len(runs)} runs"
             + (f" ({len(set(v for v in versions if v))} distinct)" if recorded else "")
             + (" (the field is newer than the other records)" if recorded < len(runs) else "") + ". "
             # a cell shown in several tables (a value and its diagnoses) is flagged once
             + ("Cells whose seeds ran different code versions: " + "; ".join(dict.fromkeys(flagged)) + "."
                if flagged else "No cell mixes code versions among the runs that record theirs."), ""]
    listed = [(r, _run_folder(r, roots), str(r.get("status")),
               str(r.get("divergence") or r.get("error") or "")) for r in runs if r.get("status") != COMPLETED]
    listed += [(r, folder, "superseded", r.get("superseded_reason", "")) for folder, r in superseded]
    if listed:
        lines += ["| folder | experiment | seed | status | why |", "|---|---|---|---|---|"]
        for run, folder, status, why in sorted(listed, key=lambda item: item[1]):
            lines.append(f"| `{folder}` | {run.get('experiment')} | {run.get('seed')} | {status} | "
                         f"{why.replace('|', '/')[:200] or '–'} |")
        lines.append("")
    return lines


def run_time_s(run: dict) -> float | None:
    """Fitting time over all the processes of a run (``fit_time_s``, resumes included), else the last
    process's wall time (older records)."""
    value = run.get("fit_time_s") or run.get("wall_time_s")
    return None if value is None else float(value)


def command_of(run: dict) -> str:
    overrides = [o for o in (run.get("overrides") or []) if not o.startswith("hydra.run.dir=")]
    return "python -m canonical_network.train " + " ".join(overrides)


DIAGNOSTICS = "diagnostics"


def render_diagnostics(out: Path) -> list[str]:
    """The ``diagnostics.json`` files under ``<out>/diagnostics/<row>/`` (``scripts/reproduce.sh diagnose``)
    as one table: exact and interpolated equivariance, the canonicalizer's own check, pose, continuity."""
    found = sorted((out / DIAGNOSTICS).glob("*/diagnostics.json"))
    if not found:
        return []

    def sci(value: float | None) -> str:
        return "–" if value is None else f"{value:.1e}"

    def pct(value: float | None) -> str:
        return "–" if value is None else f"{100 * value:.1f} %"

    lines = ["## Diagnostics of the trained models", "",
             "`python -m canonical_network.diagnose` on the tested checkpoint of each row (its run folder and "
             "inputs are in each `diagnostics.json`). Relative errors ‖φ(g·x) − ρ(g)φ(x)‖ / ‖φ(x)‖ in float64: "
             "*exact* over the rotations the pixel grid represents exactly (multiples of 90°), *interpolated* "
             "over arbitrary angles (bilinear, reported, not a test); *jumps*: share of inputs whose output "
             "moves by more than the fraction in brackets under a ±1° rotation; *element changes*: share whose "
             "chosen group element changes under it.", "",
             "| row | exact max | interpolated mean | h(g·x) = g·h(x) max | pose entropy (bits) | ambiguous "
             "| jumps under ±1° | element changes | figures |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in found:
        d = json.loads(path.read_text())
        row = path.parent.name
        canon, pose, cont = d.get("canonicalizer") or {}, d.get("pose") or {}, d.get("continuity") or {}
        entropy = (f"{pose['entropy_bits']:.2f} of {pose['max_entropy_bits']:.2f}"
                   if pose.get("entropy_bits") is not None else "–")
        figures = " ".join(f"[{Path(f).stem}]({DIAGNOSTICS}/{row}/{Path(f).name})" for f in d.get("figures", []))
        lines.append(
            f"| {d.get('experiment', row)} | {sci(d['equivariance']['exact'].get('max_rel'))} "
            f"| {sci((d['equivariance'].get('continuous') or {}).get('mean_rel'))} | {sci(canon.get('max_rel'))} "
            f"| {entropy} | {pct(pose.get('ambiguity_rate'))} | {pct(cont.get('jump_rate'))} (> {cont.get('jump', '?')}) "
            f"| {pct(cont.get('element_change_rate'))} | {figures} |")
    return lines + [""]


SUPERSEDED = "superseded"
SUPERSEDED_REASONS = "reasons.json"
BENCHMARKS = "benchmarks"


def _shown_path(folder: Path) -> str:
    """A folder as the report names it: relative to the project when below it, else its name (the report's text
    never depends on the working directory or on absolute paths)."""
    from canonical_network.utils.config import PROJECT_ROOT

    try:
        return Path(folder).resolve().relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        return Path(folder).name


def load_superseded(folder: Path | None) -> list[tuple[str, dict]]:
    """The records kept in a superseded folder, each with its reason from the folder's ``reasons.json`` (a map
    from a folder prefix below it to why its runs no longer measure their row)."""
    if folder is None or not folder.is_dir():
        return []
    reasons_file = folder / SUPERSEDED_REASONS
    reasons = json.loads(reasons_file.read_text()) if reasons_file.is_file() else {}
    found = []
    for run in load_runs(folder, include_evaluated=True):
        name = Path(run["path"]).parent.resolve().relative_to(folder.resolve()).as_posix()
        reason = next((why for prefix, why in sorted(reasons.items(), key=lambda kv: -len(kv[0]))
                       if name == prefix or name.startswith(prefix.rstrip("/") + "/")), "reason not recorded")
        found.append((f"{_shown_path(folder)}/{name}", {**run, "superseded_reason": reason}))
    return found


def _beside(folders: list[Path], name: str) -> Path | None:
    """``<parent of the first runs folder>/<name>`` when it exists (the layout of docs/reproduction)."""
    candidate = folders[0].resolve().parent / name
    return candidate if candidate.is_dir() else None


def _copy_diagnostics(source: Path | None, out: Path) -> None:
    """Bring the diagnostics into ``out`` (their table links to ``diagnostics/<row>/``), so a report built
    elsewhere keeps the section and its links."""
    import shutil

    if source is None or not source.is_dir() or source.resolve() == (out / DIAGNOSTICS).resolve():
        return
    shutil.copytree(source, out / DIAGNOSTICS, dirs_exist_ok=True)


def build_report(folders: list[Path], out: Path, claims_file: Path | None = None, diagnostics: Path | None = None,
                 superseded: Path | None = None, benchmarks: Path | None = None) -> Path:
    """Write ``<out>/REPRODUCTION.md`` and its figures from the runs below ``folders``; see the module doc.

    ``diagnostics``, ``superseded`` and ``benchmarks`` default to the folders of those names beside the first
    runs folder (docs/reproduction's layout); ``claims_file`` adds a user's claims (and tables)."""
    runs = [run for folder in folders for run in load_runs(folder)]
    if not runs:
        raise SystemExit(f"no {RESULTS_FILE} found under {' '.join(map(str, folders))}")
    tables = paper_tables()
    claims = list(CLAIMS)
    if claims_file is not None:
        user_claims, user_tables = load_claims(claims_file, tables, {str(r.get("experiment")) for r in runs})
        tables = {**tables, **user_tables}
        claims += user_claims
    diagnostics = diagnostics if diagnostics is not None else _beside(folders, DIAGNOSTICS)
    superseded_runs = load_superseded(superseded if superseded is not None else _beside(folders, SUPERSEDED))
    benchmarks = benchmarks if benchmarks is not None else _beside(folders, BENCHMARKS)
    # Inside out/ the figures are rebuilt; everything else in out/ is left alone (e.g. the committed runs).
    figures = out / FIGURES
    figures.mkdir(parents=True, exist_ok=True)
    for stale in (*figures.glob("*_bars.png"), *figures.glob("*_val_curves.png")):
        stale.unlink()  # this report's own figures (their names): a table that lost its runs leaves none behind
    _copy_diagnostics(diagnostics, out)
    row_runs = [r for r in runs if not variant_of(r)]
    variants = [r for r in runs if variant_of(r)]
    total_fit = sum(run_time_s(r) or 0.0 for r in runs)

    cells_by_table: dict[str, dict] = {}
    runs_by_table: dict[str, list[dict]] = {}
    figure_slugs: set[str] = set()
    table_sections: list[str] = []
    flagged: list[str] = []
    for name, spec in tables.items():
        mine = [r for r in runs if not table_variant(spec, r)]
        by_data: dict[tuple[str, bool], list[tuple[str, dict, list[dict]]]] = defaultdict(list)
        for (data, budget), members in _groups(mine):
            cells = table_cells(spec, members)
            if not any(c.values for c in cells.values()):
                continue
            cells_by_table.setdefault(name, {})[(data, budget, ())] = cells
            used = [r for c in cells.values() for r in c.runs]
            runs_by_table.setdefault(name, []).extend(used)
            by_data[(data, dataset_of(members[0])[1])].append((budget, cells, used))
            flagged += [f"{spec['title'].split(':')[0]} {_side_name(spec, key)} at {budget}: {', '.join(v)}"
                        for key, cell in cells.items() if (v := mixed_versions(cell))]
        for (data, comparable), groups in by_data.items():
            used = [r for _, _, group_runs in groups for r in group_runs]
            differences = protocol_differences(spec, used)
            arrow = "lower is better" if spec.get("lower_is_better") else "higher is better"
            unit = f"{spec['metric']}" + (f" × {spec['scale']:g}" if spec.get("scale", 1.0) != 1.0 else "")
            table_sections += [f"### {spec['title']}", "",
                               f"Data: {data}; metric: {unit}, {arrow}. Ours: {_our_protocol_text(used)}. "
                               f"Paper: {_paper_protocol_text(spec)}. Differences: "
                               + ("; ".join(differences) if differences else "none") + ".", ""]
            table_sections += render_table(name, spec, groups, comparable)
            # the figures show the budget with the most cells run (the largest of those): a table's fullest view
            budget, cells, _ = max(groups, key=lambda g: (sum(bool(c.values) for c in g[1].values()),
                                                          -groups.index(g)))
            table_sections += floor_note(spec, cells)
            slug = _figure_slug(name, data, budget)
            if slug in figure_slugs:
                raise RuntimeError(f"two figures of {name} named {slug}: their data sets' digests collide")
            figure_slugs.add(slug)
            bar = figures / f"{slug}_bars.png"
            _bar_chart(name, spec, cells, bar, comparable)
            table_sections += ["", f"![{spec['title']}, {budget}]({FIGURES}/{bar.name})"]
            curve = figures / f"{slug}_val_curves.png"
            partial = _curves_chart(name, spec, cells, curve)
            if partial is not None:
                table_sections += ["", f"![validation curves, {budget}]({FIGURES}/{curve.name})"]
            if partial:
                table_sections += ["", "Curves that start late (their metrics.csv lost the earlier epochs to a "
                                   "resume before the CSV logger kept them): " + "; ".join(partial) + "."]
            table_sections.append("")
    # The claims also under each ablation that ran on both sides of a claim (e.g. no early stopping for both
    # CN(p64) and augmentation), marked with the ablation's overrides.
    for name, spec in tables.items():
        by_variant: dict[tuple[str, ...], list[dict]] = defaultdict(list)
        for run in variants:
            if variant := table_variant(spec, run):
                by_variant[variant].append(run)
        for variant, members in sorted(by_variant.items()):
            for group, group_runs in _groups(members):
                cells = table_cells(spec, group_runs)
                if any(c.values for c in cells.values()):
                    cells_by_table.setdefault(name, {})[(*group, variant)] = cells
    ordered = [c for kind in CLAIM_KINDS for c in claims if c.kind == kind]
    checks = check_claims(tables, cells_by_table, ordered)
    scored = score_claims(ordered, checks, tables, cells_by_table)
    effects = variant_effects(variants, row_runs)
    for i, effect in enumerate(effects, start=1):
        effect["id"] = f"A{i}"
    bears_on = {e["id"]: sorted({s.number for s in scored for c in checks if c.claim is s.claim and not c.variant
                                 and e["experiment"] in c.experiments and (c.data, c.budget) == (e["data"], e["budget"])
                                 and _same_columns(c, e)})
                for e in effects}
    paper = [s for s in scored if s.claim.kind == "paper"]
    apart = [s for s in scored if s.claim.kind != "paper"]
    by_status = defaultdict(int)
    for run in runs:
        by_status[str(run.get("status"))] += 1
    lines = [
        "# Reproduction report",
        "",
        f"Generated by `python -m canonical_network.report {' '.join(_shown_path(f) for f in folders)} --out "
        f"<folder>` from {len(runs)} run records ("
        + ", ".join(f"{n} {status}" for status, n in sorted(by_status.items()))
        + f"; {total_fit / 3600:.1f} h of training). Ours: mean ± 95 % CI over seeds (Student t), n seeds. "
        "A claim *holds* or *does not hold* only when the 95 % interval of the difference (Welch; paired t where "
        "a claim pairs seeds; the slope's t interval for a trend) excludes the other answer, and an equality "
        "claim holds only by two one-sided tests at 5 % (TOST); otherwise it is *not resolved*.",
        "",
        "## Scorecard",
        "",
        f"The paper's {len(paper)} claims about its tables, each at the rows' own settings, at the largest epoch "
        f"cap where both sides have ≥ 2 seeds: {_tally(paper)}. Counted apart below: "
        + "; ".join(f"{kind} ({_tally(group)})" for kind, group in (
            ("checks true by construction", [s for s in apart if s.claim.kind == "construction"]),
            ("other papers' claims", [s for s in apart if s.claim.kind == "other"]),
            ("hypotheses beyond the paper", [s for s in apart if s.claim.kind == "extension"]),
            ("your claims", [s for s in apart if s.claim.kind == "user"])) if group) + ".",
        "",
        *render_scored(paper, tables),
        "",
        "### Protocol",
        "",
        *render_protocols(tables, {k: v for k, v in runs_by_table.items() if k in {s.claim.table for s in paper}}),
        "",
    ]
    if apart:
        lines += ["## Other claims: true by construction, other papers', beyond the paper, yours", "",
                  *render_scored(apart, tables), ""]
    numbers = {id(s.claim): s.number for s in scored}
    lines += ["## Each claim at its other budgets and under ablations", "",
              "Per claim: the same comparison at the rows' other budgets and under every ablation run on both of "
              "its sides; for a claim that does not hold, how the runs of both sides ended (at the epoch cap, so "
              "still improving when the best validation is near it, or stopped early) and what each ablation of "
              "its rows does (ids of the ablations table).", ""]
    lines += render_claim_details(scored, checks, effects)
    lines += ["## Tables", ""] + (table_sections or ["No run belongs to a paper table.", ""])
    if variants:
        lines += ["## Ablations and variants", "",
                  "Runs whose overrides change a row's config, grouped by those overrides, each once; `claims`: "
                  "the claims (#) whose rows it changes on the same data and budget.", ""]
        lines += render_variants(effects, bears_on) + [""]
    lines += _inference_section(benchmarks)
    lines += _symmetrization_section(runs, benchmarks)
    lines += _adapt_symmetrization_section(_beside(folders, "adapt_symmetrization"), runs)
    lines += render_diagnostics(out)
    lines += ["## Runs accounted for", ""] + render_accounting(runs, folders, superseded_runs, flagged)
    lines += ["## Runs", "", "Every run, grouped by its command (rerunning a command with "
              "`hydra.run.dir=<its folder>` resumes that run); machines: "
              + "; ".join(sorted({str(r.get("environment.machine") or "not recorded") for r in runs})) + ".", ""]
    lines += render_runs(runs, folders) + [""]
    del numbers
    path = out / REPORT_FILE
    path.write_text("\n".join(lines))
    return path


def _inference_section(benchmarks: Path | None) -> list[str]:
    if benchmarks is None:
        return []
    from canonical_network.report_inference import render_inference

    return render_inference(benchmarks)  # ends with a blank line


def _symmetrization_section(runs: list[dict], benchmarks: Path | None) -> list[str]:
    """The symmetrization modes side by side: task metric, continuity and cost (issue 38)."""
    from canonical_network.report_symmetrization import render_symmetrization

    return render_symmetrization(runs, benchmarks)  # ends with a blank line, or empty


def _adapt_symmetrization_section(folder: Path | None, runs: list[dict]) -> list[str]:
    """Test-time symmetrization of the adapt rows, from the evaluation records beside the runs folder."""
    if folder is None:
        return []
    from canonical_network.report_adapt_symmetrization import render_adapt_symmetrization

    return render_adapt_symmetrization(folder, runs)  # ends with a blank line


HEADLINE_START = "<!-- headline:start"
HEADLINE_END = "<!-- headline:end -->"


def _section(lines: list[str], start: int) -> list[str]:
    """``lines[start:]`` up to the next heading of level 2 or higher, trailing blank lines dropped."""
    end = start + 1
    while end < len(lines) and not lines[end].startswith("## "):
        end += 1
    block = lines[start:end]
    while block and not block[-1].strip():
        block.pop()
    return block


def headline(report_text: str, report_link: str) -> list[str]:
    """The README's headline from a written report: its scorecard and protocol summary."""
    lines = report_text.splitlines()
    body = [f"From the [reproduction report]({report_link}); regenerate with `python -m canonical_network.report "
            f"docs/reproduction/runs --out docs/reproduction --readme README.md`.", ""]
    start = lines.index("## Scorecard")
    return body + [line.replace("### Protocol", "**Protocol**") for line in _section(lines, start)[2:]]


def update_readme(readme: Path, report_path: Path) -> None:
    """Replace the block between the headline markers of ``readme`` with :func:`headline` of the report."""
    text = readme.read_text()
    start, end = text.find(HEADLINE_START), text.find(HEADLINE_END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme}: no headline block to rewrite; it is the text between a line starting "
                         f"{HEADLINE_START!r} and a line {HEADLINE_END!r}, in that order")
    link = os.path.relpath(report_path, readme.parent)  # relpath makes both absolute first
    block = [f"{HEADLINE_START} (generated from {link}: do not edit by hand) -->",
             *headline(report_path.read_text(), link), HEADLINE_END]
    readme.write_text(text[:start] + "\n".join(block) + text[end + len(HEADLINE_END):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help=f"folders searched recursively for {RESULTS_FILE}")
    parser.add_argument("--out", type=Path, required=True, help=f"where {REPORT_FILE} and {FIGURES}/ go")
    parser.add_argument("--readme", type=Path, help="also rewrite this README's headline block from the report")
    parser.add_argument("--claims", type=Path, help="a YAML file of your own claims (and tables) over your runs, in "
                        f"the format of canonical_network/{CLAIMS_FILE}")
    for name in (DIAGNOSTICS, SUPERSEDED, BENCHMARKS):
        parser.add_argument(f"--{name}", type=Path, default=None,
                            help=f"the {name} folder (default: {name}/ beside the first runs folder, if there)")
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder")
    for name in (DIAGNOSTICS, SUPERSEDED, BENCHMARKS):
        if getattr(args, name) is not None and not getattr(args, name).is_dir():
            parser.error(f"--{name} {getattr(args, name)} is not a folder")
    if args.readme is not None and not args.readme.is_file():
        parser.error(f"--readme {args.readme} is not a file")
    if args.claims is not None and not args.claims.is_file():
        parser.error(f"--claims {args.claims} is not a file")
    try:
        path = build_report(args.folders, args.out, claims_file=args.claims, diagnostics=args.diagnostics,
                            superseded=args.superseded, benchmarks=args.benchmarks)
    except ValueError as err:  # a claims file that names what is not there
        parser.error(str(err))
    print(f"wrote {path}")
    if args.readme is not None:
        update_readme(args.readme, path)
        print(f"rewrote the headline of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
