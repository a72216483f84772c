"""The report's inference-time section (Table 5a, Fig. 3): our benchmark records beside the paper's numbers.

The two benchmark scripts (``scripts/benchmark_pointcloud_inference.py``, Table 5a; and
``scripts/benchmark_image_inference.py``, Fig. 3) write, besides their own detail, the keys below, which
:func:`render_inference` reads (``scripts/reproduce.sh benchmarks`` writes both into
``docs/reproduction/benchmarks``)::

    schema            "inference-benchmark/1"
    benchmark         "pointcloud_inference" | "image_inference"
    title             what is timed, one line
    paper_ref         "table5a" | "fig3": the entry of paper_inference.json it is compared with
    command           the command line that rewrote the file (paths relative to the repository)
    environment       canonical_network.utils.runs.environment() of the process (machine, device,
                      torch_threads, versions) + omp_num_threads, load_average_1min
    settings          {batch_size, repeats, threads, device, ...}: everything that sets what was timed
    unit              "s" | "ms": the unit of every row's time
    time_of           what one time covers, e.g. "one pass over 64 clouds (median of 3 repeats)"
    samples_per_time  how many inputs one time covers (for the per-sample column)
    sample_name       "cloud" | "image"
    rows              [{key, model, time, baseline, ratio, paper_key, params?}]: ``ratio`` is ``time`` over
                      the time of the row whose key is ``baseline``, both measured in the same run;
                      ``paper_key`` names the paper's counterpart (null: none)

The paper's side comes from ``paper_inference.json`` beside this file (transcribed from the tex, with line
numbers). Absolute times on different hardware do not compare; the ratios, each taken within one run, do.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

SCHEMA = "inference-benchmark/1"
SECTION = "## Inference time (Table 5a, Fig. 3)"
STAGE = "scripts/reproduce.sh benchmarks"
#: the keys render_inference reads from a benchmark record, and from each of its rows
RECORD_KEYS = ("schema", "benchmark", "title", "paper_ref", "command", "environment", "settings", "unit",
               "time_of", "samples_per_time", "sample_name", "rows")
ROW_KEYS = ("key", "model", "time", "baseline", "ratio", "paper_key")
_TO_MS = {"s": 1000.0, "ms": 1.0}


def paper_inference() -> dict[str, Any]:
    """``paper_inference.json``: the paper's Table 5a seconds and Fig. 3 claims, with their tex lines."""
    return json.loads(resources.files("canonical_network").joinpath("paper_inference.json").read_text())


def benchmark_environment(device: Any = None) -> dict[str, Any]:
    """:func:`canonical_network.utils.runs.environment` of this process, for a benchmark record: the machine
    (CPU model, cores, accelerator), torch threads and versions, plus ``OMP_NUM_THREADS`` and the 1-minute
    load average when the benchmark started (other processes share the cores)."""
    import torch

    from canonical_network.utils.runs import environment

    env = environment()
    if device is not None and torch.device(device).type == "cuda":
        name = torch.cuda.get_device_name(torch.device(device))
        env["machine"] = env["machine"].rsplit(", ", 1)[0] + f", {name}"
        env["device"] = name
    env["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    env["load_average_1min"] = load_average()
    return env


def status_mb(key: str) -> float:
    """A memory line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in MB (OSError where there is no /proc,
    KeyError where the line is missing)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def reset_peak() -> float | None:
    """Reset the process's peak resident memory (``VmHWM``) to its current resident memory by writing 5 to
    ``/proc/self/clear_refs``; return that (MB), or ``None`` where this is not allowed. A benchmark's peak of a
    call is then ``status_mb("VmHWM")`` minus it: the memory the call made resident. Memory the allocator serves
    from pages the process already holds (freed earlier but kept, as glibc keeps blocks under its mmap threshold,
    32 MB at most) raises no peak, so a call measured after others in a long-lived process can read low; a fresh
    process reads what the call needs."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return status_mb("VmRSS")
    except OSError:
        return None


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none): benchmark records state it at their start
    and end, since other processes share the cores."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def timing_record(script: str, argv: list[str], load_start: float | None, **fields: Any) -> dict[str, Any]:
    """A one-process benchmark's record: when it was made, the command that reruns it, the machine, torch's
    version and threads, its own ``fields``, and the load average at its start (``load_start``, taken before
    the first measurement) and now, at its end."""
    import torch

    from canonical_network.utils.runs import environment

    return {"created": datetime.now(UTC).isoformat(timespec="seconds"), "command": command_line(script, argv),
            "machine": environment()["machine"], "torch": torch.__version__, "threads": torch.get_num_threads(),
            **fields, "load_start": load_start, "load_end": load_average()}


def write_record(path: Path, record: dict[str, Any]) -> Path:
    """Write a benchmark's ``record`` as indented JSON to ``path`` (its folder made first), whole or not at all."""
    from canonical_network.utils.files import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the median of the population ``values`` were drawn from
    (independent draws): the order statistics ``(x_(j), x_(n+1-j))`` with the largest ``j`` whose coverage
    ``1 - 2 P(Bin(n, 1/2) < j)`` is at least ``confidence``. ``None`` when ``n`` is too small for any ``j``
    (fewer than 6 values at 95 %). Timing repeats are not quite independent (a machine drifts), which is why
    the benchmarks pair each model's time with the baseline's of the same repeat before taking it."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    ordered = sorted(values)
    n = len(ordered)
    best = None
    below = 0.0  # P(Bin(n, 1/2) < j), j = 1, 2, ...
    for j in range(1, n // 2 + 1):
        below += math.comb(n, j - 1) / 2**n
        if 1 - 2 * below < confidence:
            break
        best = j
    return None if best is None else (ordered[best - 1], ordered[n - best])


def display_path(path: str | Path) -> str:
    """A path as the report may show it: relative to the repository when inside it, else its name alone."""
    from canonical_network.utils.config import PROJECT_ROOT

    path = Path(path)
    if not path.is_absolute():
        return path.as_posix()
    try:
        return path.resolve().relative_to(PROJECT_ROOT.resolve()).as_posix()
    except ValueError:
        return path.name


def command_line(script: str, argv: list[str]) -> str:
    """The command that reruns a benchmark: ``OMP_NUM_THREADS`` when set, ``python <script>`` and its
    arguments, absolute paths shown by :func:`display_path`."""
    words = []
    for word in argv:
        key, eq, value = word.partition("=")
        if eq and key.startswith("--") and value.startswith("/"):
            word = f"{key}={display_path(value)}"
        elif word.startswith("/"):
            word = display_path(word)
        words.append(word)
    prefix = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} " if os.environ.get("OMP_NUM_THREADS") else ""
    return prefix + shlex.join(["python", script, *words])


def check_record(record: dict[str, Any], name: str = "record") -> None:
    """Raise ValueError naming what a benchmark record lacks of what :func:`render_inference` reads."""
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        raise ValueError(f"{name}: not an inference benchmark record, missing {missing}")
    if record["schema"] != SCHEMA:
        raise ValueError(f"{name}: schema {record['schema']!r}, expected {SCHEMA!r}")
    if record["unit"] not in _TO_MS:
        raise ValueError(f"{name}: unit {record['unit']!r} is not one of {sorted(_TO_MS)}")
    keys = {row.get("key") for row in record["rows"]}
    for row in record["rows"]:
        lacking = [key for key in ROW_KEYS if key not in row]
        if lacking:
            raise ValueError(f"{name}: row {row.get('key')!r} lacks {lacking}")
        if row["baseline"] not in keys:
            raise ValueError(f"{name}: row {row['key']!r} has baseline {row['baseline']!r}, not a row of the file")


def _number(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def _setting(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _paper_value(entry: dict[str, Any], key: str | None) -> float | None:
    """The paper's number for ``key`` (``"PointNet/vn"`` → ``seconds.PointNet.vn``), None where it gives none."""
    if key is None:
        return None
    node: Any = entry.get("seconds")
    for part in key.split("/"):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, (int, float)) else None


def _paper_cells(entry: dict[str, Any], row: dict[str, Any], rows: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """The paper's number and its ratio to the paper's counterpart of our baseline (or its words)."""
    key = row["paper_key"]
    if key is None:
        return "—", "— (no counterpart in the paper)"
    value = _paper_value(entry, key)
    if value is None:
        return "—", entry.get("rows", {}).get(key, "not given")
    base_row = rows[row["baseline"]]
    base = _paper_value(entry, base_row["paper_key"])
    if base_row["key"] == row["key"]:
        ratio = "1 (baseline)"
    elif base:
        ratio = f"{value / base:.2f} × {base_row['model']}"
    else:
        ratio = "—"
    return f"{value:g}", ratio


def _paper_line(entry: dict[str, Any]) -> str:
    stated = lambda key: entry.get(key) if entry.get(key) is not None else "not stated"  # noqa: E731
    first, last = entry["tex_lines"]
    text = (f"Paper ({entry['name']}, `{entry['label']}`, tex lines {first}-{last}): hardware {stated('hardware')}, "
            f"batch size {stated('batch_size')}")
    if entry.get("unit"):
        text += f", unit {entry['unit']}, timing {entry['timed']}"
    if not entry.get("numbers_in_tex", True):
        text += f"; no inference-time numbers: {entry['plot']}"
    return text + "."


def _render_record(record: dict[str, Any], name: str, paper: dict[str, Any]) -> list[str]:
    entry = paper[record["paper_ref"]]
    env, settings = record["environment"], record["settings"]
    rows = {row["key"]: row for row in record["rows"]}
    with_params = any(row.get("params") is not None for row in record["rows"])
    sample = record["sample_name"]
    threads = f"{env.get('torch_threads')} torch thread(s)"
    if env.get("omp_num_threads"):
        threads += f", OMP_NUM_THREADS={env['omp_num_threads']}"
    load = env.get("load_average_1min")
    lines = [
        f"### {entry['name']}: {record['title']} (`{name}`)",
        "",
        f"Ours: {env.get('machine')}; {threads}; torch {env.get('torch')}, Python {env.get('python')}"
        + (f"; 1-minute load average {load} when it started" if load is not None else "") + ". "
        + "Settings: " + ", ".join(f"{key.replace('_', ' ')} {_setting(value)}" for key, value in settings.items())
        + ". Every ratio is between two times of this one run.",
        "",
        _paper_line(entry),
        "",
    ]
    header = ["Model", *(["Parameters"] if with_params else []), f"Ours: {record['unit']}, {record['time_of']}",
              f"Ours: ms per {sample}", "Ours: ratio (same run)", "Paper: " + (entry.get("unit") or "time"),
              "Paper: ratio"]
    lines += ["| " + " | ".join(header) + " |",
              "| --- | " + ("---: | " if with_params else "") + "---: | ---: | --- | --- | --- |"]
    per_sample = _TO_MS[record["unit"]] / record["samples_per_time"]
    for row in record["rows"]:
        ratio = ("1 (baseline)" if row["baseline"] == row["key"]
                 else f"{row['ratio']:.2f} × {rows[row['baseline']]['model']}")
        paper_value, paper_ratio = _paper_cells(entry, row, rows)
        cells = [row["model"], *([f"{row['params']:,}" if row.get("params") is not None else "—"] if with_params else []),
                 _number(row["time"]), _number(row["time"] * per_sample), ratio, paper_value, paper_ratio]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    words = "; ".join(f"l. {claim['tex_line']}: \"{claim['text']}\"" for claim in entry.get("claims", []))
    lines += [(f"The paper's words on it: {words}. " if words else "")
              + f"Regenerate: `{record['command']}` (both benchmark files: `{STAGE}`).", ""]
    return lines


def render_inference(folder: Path) -> list[str]:
    """Markdown lines of the inference-time section from the benchmark records (``*.json``) in ``folder``
    (e.g. ``docs/reproduction/benchmarks``), one table per record in file-name order; ``[]`` when there is
    none. Deterministic: nothing is read but the records and ``paper_inference.json``."""
    folder = Path(folder)
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    records = []
    for path in files:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not str(record.get("schema", "")).startswith("inference-benchmark/"):
            continue  # not an inference benchmark record (the folder also holds other benchmarks' records)
        check_record(record, path.name)
        records.append((path.name, record))
    if not records:
        return []
    paper = paper_inference()
    lines = [
        SECTION,
        "",
        "Measured by the repository's benchmark scripts. The paper's times come from other hardware (an A100 "
        "for Table 5a; none stated for Fig. 3), so only ratios compare: ours are each taken between two models "
        "timed in the same run, the paper's between two of its own numbers.",
        "",
    ]
    for name, record in records:
        lines += _render_record(record, name, paper)
    return lines
