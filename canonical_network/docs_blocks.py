"""Generated blocks of the README and docs: text that comes from the repository, never typed.

    python -m canonical_network.docs_blocks            # rewrite every generated block in place
    python -m canonical_network.docs_blocks --check    # exit 1 and name the stale blocks (what the tests run)

A block sits between ``<!-- generated:<name> -->`` and ``<!-- /generated:<name> -->`` in a Markdown file;
:data:`GENERATORS` says what fills it:

* ``config-groups``: the config groups of ``configs/`` and their options, one row per group;
* ``experiments``: every experiment file, by family;
* ``paper-rows``: each row of the paper's tables and the experiment that runs it;
* ``api-example``: the README's plain-PyTorch example, the first Python block of ``docs/api.md``;
* ``scorecard``: the reproduction report's scorecard (the README's headline, written by ``report --readme``);
* ``permutation-cost``: the S_n canonicalizer's cost against n (``docs/measurements.md``), from the record
  ``scripts/benchmark_permutation.py`` wrote to ``docs/reproduction/benchmarks/permutation.json``;
* ``protocol-cost``: device-hours of each paper table at the paper's protocol (``docs/measurements.md``), from the
  record ``scripts/protocol_cost.py`` wrote to ``docs/reproduction/benchmarks/protocol_cost_cpu.json``;
* ``dress-rehearsal``: generated files at the real archives' sizes read by the real loaders (``docs/measurements.md``),
  from the record ``scripts/dress_rehearsal.py`` wrote to ``docs/benchmarks/dress_rehearsal.json``;
* ``pointcloud-overhead``: the point-cloud canonicalizers' inference time against PointNet's at 1,024 points
  (``docs/measurements.md``), from the record ``scripts/benchmark_pointcloud_inference.py`` wrote to
  ``docs/benchmarks/pointcloud_inference_1024.json``;
* ``symmetrization-cost``: the inference cost per input of each ``canonicalization.symmetrization`` mode against
  ``canonical`` (``docs/symmetrization.md``), from the record ``scripts/benchmark_symmetrization.py`` wrote to
  ``docs/reproduction/benchmarks/symmetrization_cost.json``;
* ``compile-nbody``: what ``compile=true`` saves on an N-body training epoch, and how far it moves the numbers
  (``docs/measurements.md``), from the record ``scripts/benchmark_compile.py`` wrote to
  ``docs/benchmarks/compile_nbody.json``;
* ``shapes40-difficulty``: how hard the embedded point-cloud sets are for a non-learned z-invariant descriptor,
  beside DGCNN's runs (``docs/measurements.md``), from the record ``scripts/shapes40_difficulty.py`` wrote to
  ``docs/benchmarks/shapes40_difficulty.json``;
* ``authors-nbody``: the authors' N-body code run on our data (``docs/nbody.md``), from its per-epoch logs in
  ``docs/reproduction/reference/authors-nbody/``;
* ``escnn-build``: time and peak memory of building the C64 escnn models (``docs/measurements.md``), from the
  record ``scripts/benchmark_escnn_build.py`` wrote to ``docs/benchmarks/escnn_build.json``;
* ``nbody-generation``: how long generating the N-body data takes (``docs/measurements.md``), from the record
  ``scripts/benchmark_nbody_generation.py`` wrote to ``docs/benchmarks/nbody_generation.json``;
* ``run-costs``: what the committed runs of each table row cost (``docs/measurements.md``), from their records in
  ``docs/reproduction/runs/`` (``scripts/collect_runs.py`` puts them there).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from canonical_network.utils.config import CONFIG_DIR, PROJECT_ROOT

#: what each config group picks (a new group fails :func:`config_groups` until it is described here)
GROUP_PURPOSE = {
    "experiment": "a row of a paper table: `configs/experiment/<family>/<row>.yaml` (only what differs from "
                  "`train.yaml`)",
    "data": "the LightningDataModule (`data`) and the data's facts (`data_info`: task, `num_classes`, "
            "`image_size`, ...) that the other groups read as `${data_info.<key>}`",
    "canonicalization": "h, the canonicalizer; `canonicalization.freeze=true` freezes any of them at "
                        "initialisation, `canonicalization.prior_weight=<w>` adds the canonicalization prior",
    "prediction": "f, the backbone (any `nn.Module` taking the task's inputs)",
    "model": "the LightningModule: loss, metrics, optimiser (`model/recipe`: optimiser and schedule presets)",
    "trainer": "the Lightning Trainer (`default` picks the device)",
    "logger": "loggers (`wandb` writes CSV beside it)",
    "callbacks": "checkpointing, early stopping, divergence monitor, canonicalized-image figures",
    "debug": "small budgets for smoke tests",
    "sweep": "a Hydra multirun over the rows (and seeds) of one table",
    "paths": "where data and outputs go",
    "hydra": "Hydra's run folders and launchers (`hydra/launcher`: local, bounded local, Slurm)",
    "local": "your own machine's overrides (git-ignored yaml files)",
}


def _options(group: Path) -> list[str]:
    return sorted(str(p.relative_to(group).with_suffix("")) for p in group.rglob("*.yaml"))


def config_groups(config_dir: Path = CONFIG_DIR) -> list[str]:
    groups = sorted(p for p in config_dir.iterdir() if p.is_dir())
    undescribed = [g.name for g in groups if g.name not in GROUP_PURPOSE]
    if undescribed:
        raise ValueError(f"config group(s) {', '.join(undescribed)} have no entry in GROUP_PURPOSE "
                         f"({__name__}): say what each picks")
    lines = ["| group | options | what it picks |", "|---|---|---|"]
    for group in groups:
        options = _options(group)
        if group.name == "experiment":
            families = sorted({o.split("/")[0] for o in options})
            shown = ", ".join(f"`{f}/…` ({sum(o.startswith(f + '/') for o in options)})" for f in families)
        else:
            shown = ", ".join(f"`{o}`" for o in options) or "(none committed)"
        lines.append(f"| `{group.name}` | {shown} | {GROUP_PURPOSE[group.name]} |")
    return lines


def experiments(config_dir: Path = CONFIG_DIR) -> list[str]:
    options = _options(config_dir / "experiment")
    lines = ["| family | experiments |", "|---|---|"]
    for family in sorted({o.split("/")[0] for o in options}):
        rows = [o.split("/", 1)[1] for o in options if o.startswith(family + "/")]
        lines.append(f"| `{family}` | " + ", ".join(f"`{r}`" for r in rows) + " |")
    return lines


def paper_rows() -> list[str]:
    """Each row of the paper's tables (``paper_results.json``) and the experiment that runs it."""
    from canonical_network.tables import paper_tables

    lines = ["| table | row | experiment |", "|---|---|---|"]
    seen = set()
    for spec in paper_tables().values():
        title = spec["title"].split(":")[0]
        key = (title, tuple(row["name"] for row in spec["rows"]))
        if key in seen:  # one table's rows under several metrics (the adapt tables)
            continue
        seen.add(key)
        for i, row in enumerate(spec["rows"]):
            runs = row.get("experiment") or " ".join(f"{k.removeprefix('config.')}={v}"
                                                     for k, v in (row.get("match") or {}).items())
            lines.append(f"| {title if i == 0 else ''} | {row['name']} | `{runs}` |")
    return lines


def api_example() -> list[str]:
    """The first Python block of ``docs/api.md`` (the README shows it; the tests run both)."""
    text = (PROJECT_ROOT / "docs" / "api.md").read_text()
    match = re.search(r"```python\n.*?```", text, re.S)
    if match is None:
        raise ValueError("docs/api.md has no ```python block for the README's example")
    return match[0].splitlines()


#: the record the ``permutation-cost`` block renders
PERMUTATION_BENCHMARK = PROJECT_ROOT / "docs" / "reproduction" / "benchmarks" / "permutation.json"


def _ms(row: dict, key: str, ratio: str | None = None) -> str:
    """``"12.3 ms (0.45×)"``: a time of the record and, when given, its ratio to the backbone."""
    value = row[key]
    text = f"{value:,.1f} ms" if value >= 1 else f"{value:.2f} ms"
    return text + (f" ({row[ratio]:.3g}×)" if ratio else "")


def permutation_cost(path: Path = PERMUTATION_BENCHMARK) -> list[str]:
    """The S_n canonicalizer's time and memory against n beside PointNet's, and how the record was made."""
    record = json.loads(path.read_text())
    env, settings = record["environment"], record["settings"]
    lines = [
        "| n | eval, sort only: forward | ste training, sort + Sinkhorn: forward | ste: forward + backward "
        "| soft: forward + backward | PointNet eval / training forward / forward + backward "
        "| saved for backward, ste / PointNet | peak, ste / PointNet |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, rows in record["results"].items():
        ev, ste, soft, base_eval, base = (rows[k] for k in ("eval", "ste", "soft", "backbone_eval", "backbone"))
        peak = ("–" if ste["peak_mb"] is None or base["peak_mb"] is None
                else f"{ste['peak_mb']:,.1f} / {base['peak_mb']:,.1f} MB")
        lines.append(
            f"| {int(n):,} | {_ms(ev, 'forward_ms', 'ratio_forward')} | {_ms(ste, 'forward_ms', 'ratio_forward')} "
            f"| {_ms(ste, 'forward_backward_ms', 'ratio_forward_backward')} "
            f"| {_ms(soft, 'forward_backward_ms', 'ratio_forward_backward')} "
            f"| {_ms(base_eval, 'forward_ms')} / {_ms(base, 'forward_ms')} / {_ms(base, 'forward_backward_ms')} "
            f"| {ste['saved_mb']:,.1f} / {base['saved_mb']:,.1f} MB ({ste['ratio_saved']:.3g}×) | {peak} |")
    growth = record.get("growth_exponent")
    lines.append("")
    if growth:
        a, b = growth["between"]
        lines.append(
            f"Growth between n = {a:,} and {b:,} (time ∝ n^k): sort only k = {growth['eval_forward_ms']:.2f}, "
            f"ste forward {growth['ste_forward_ms']:.2f}, ste forward + backward "
            f"{growth['ste_forward_backward_ms']:.2f}, soft forward + backward {growth['soft_forward_backward_ms']:.2f}, "
            f"PointNet forward + backward {growth['backbone_forward_backward_ms']:.2f}.")
        lines.append("")
    lines += [
        f"Ratios (×) are to PointNet at the same n, measured in the same run: eval to PointNet eval, ste and soft "
        f"to PointNet training. Made {record['created'][:10]} by `{record['command']}` on {env['machine']}, "
        f"{settings['threads']} torch thread(s), load average {env['load_average_1min']} at the start "
        f"({record['conditions']}); batch {settings['batch_size']} clouds of n points; {settings['canonicalizer']}; "
        f"{settings['backbone']}. Time: {record['time']} (slow_s = {settings['slow_s']:g} s, "
        f"{settings['repeats']} calls otherwise). Memory: saved = {record['memory']['saved_mb']}; "
        f"peak = {record['memory']['peak_mb']}.",
    ]
    return lines


#: the record the ``protocol-cost`` block renders (``scripts/protocol_cost.py --output``)
PROTOCOL_COST = PROJECT_ROOT / "docs" / "reproduction" / "benchmarks" / "protocol_cost_cpu.json"


def protocol_cost_table(record: dict) -> list[str]:
    """Device-hours per row and per paper table at the paper's protocol, from a ``scripts/protocol_cost.py``
    record, and how it was measured."""
    unit = "GPU-hours" if record["device"] == "cuda" else "CPU-hours"
    lines = [f"| table | row | batch | s / training step | s / eval batch | {unit} a run | runs | {unit} |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for table in record["tables"].values():
        runs = table["seeds"] * table["protocols"]
        for row, timing in table["rows"].items():
            if "error" in timing:
                lines.append(f"| {table['title']} | `{row}` | | | | not measured: {timing['error']} | | |")
                continue
            batch = str(timing["batch_size"])
            label = f"`{row}`"
            if timing.get("timed_in") in record["tables"]:  # the same row as another table's: its timing
                label += f" (timed for {record['tables'][timing['timed_in']]['title'].split(' (')[0]})"
            if "protocol_batch_size" in timing:  # timed at a smaller batch: the protocol's did not fit in memory
                batch += f" ({timing['protocol_batch_size']} did not fit in memory)"
            lines.append(f"| {table['title']} | {label} | {batch} | {timing['train_step_s']:.3f} | "
                         f"{timing['eval_batch_s']:.3f} | {timing['hours_per_run']:,.2f} | {runs} | "
                         f"{timing['hours_per_run'] * runs:,.1f} |")
        protocols = f" × {table['protocols']} rotation protocols" if table["protocols"] > 1 else ""
        lines.append(f"| **{table['title']}** | all rows: {table['epochs']:,} epochs of {table['train']:,} training "
                     f"samples, {table['seeds']} seeds{protocols} | | | | | | **{table['total_hours']:,.0f}** |")
    lines += ["", f"Measured {record['date']} by `{record['command']}` on {record['device_name']}, "
                  f"{record['threads']} torch thread(s), load average {record['load_start']:.1f} at the start and "
                  f"{record['load_end']:.1f} at the end; medians of {record['train_steps']} training steps and "
                  f"{record['val_steps']} evaluation batch(es) a row, after a warm-up step; "
                  + ("wall time between CUDA synchronisations" if record["device"] == "cuda" else
                     "the process's CPU time (one thread: the wall time of a quiet machine)")
                  + ". One device, one process, data in memory; no early stopping (an upper bound where the paper "
                  "stops early)."]
    origins: dict[str, int] = {}
    for table in record["tables"].values():
        for timing in table["rows"].values():
            if "error" not in timing and "timed_in" not in timing:
                measured = timing.get("measured")
                key = f"{measured['date']} on {measured['device']}" if measured else "day and device not recorded"
                origins[key] = origins.get(key, 0) + 1
    if len(origins) > 1 or "day and device not recorded" in origins:  # rows kept by --resume from other runs
        lines[-1] += " Rows timed: " + "; ".join(f"{n} {when}" for when, n in origins.items()) + "."
    return lines


def protocol_cost(path: Path = PROTOCOL_COST) -> list[str]:
    return protocol_cost_table(json.loads(path.read_text()))


#: the record the ``dress-rehearsal`` block renders (``scripts/dress_rehearsal.py``)
DRESS_REHEARSAL = PROJECT_ROOT / "docs" / "benchmarks" / "dress_rehearsal.json"
_FAMILY_NAMES = {"modelnet": "ModelNet40 (HDF5 shards)", "shapenet": "ShapeNet-part (text files)",
                 "rotmnist": "MNIST-rot (.amat)"}


def dress_rehearsal(path: Path = DRESS_REHEARSAL) -> list[str]:
    """Generated files at the real archives' sizes read by the real loaders, and a CN row's training speed."""
    record = json.loads(path.read_text())
    env = record["environment"]
    lines = ["| data (generated) | clouds / rows per split | on disk | written in | read: cold (parse, caches) / warm "
             "| peak memory after reading | CN row trained | batches | samples/s | peak memory training |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for family, entry in record["results"].items():
        sizes = " / ".join(f"{n:,} {split}" for split, n in entry["files"].items())
        written = f"{entry['write_s']:,.0f} s" if "write_s" in entry else "(reused)"
        points = f", {entry['num_points']:,} points" if "num_points" in entry else ""
        speed = f"{entry['samples_per_s']:,.1f}" if "samples_per_s" in entry else "–"
        if "training_error" in entry:
            speed = f"failed: {entry['training_error']}"
        lines.append(
            f"| {_FAMILY_NAMES.get(family, family)} | {sizes} | {entry['bytes'] / 1e6:,.0f} MB | {written} "
            f"| {entry['cold_load_s']:,.1f} s / {entry['load_s']:,.1f} s | {entry['cold_peak_rss_mb']:,.0f} MB "
            f"| `{entry['row']}`{points}, batch {entry['batch_size']} | {entry.get('batches', 0)} | {speed} "
            f"| {entry.get('peak_rss_mb', float('nan')):,.0f} MB |")
    unique = record.get("unique")
    lines += [
        "",
        f"Made {record['created'][:10]} by `{record['command']}` on {env['machine']}, {record['threads']} torch "
        f"thread(s), load average {env['load_average_1min']} at the start"
        + (f" ({record['conditions']})" if record.get("conditions") else "") + ". "
        + (f"{unique:,} point clouds generated per split, the others copies of a generated cloud of their class "
           "with the points reordered. " if unique else "")
        + "Samples/s: the training batches after the first, data loading included; peak memory: the measuring "
        + ("process's peak resident set (`VmHWM`). " if record.get("peak_memory") == "VmHWM" else
           "process's `ru_maxrss`, which Linux carries over from the parent process that wrote the files: a figure "
           "at or below that writer's own peak (MNIST-rot's, likely ModelNet40's after reading) is an upper bound, "
           "not the loader's; the script now reads `VmHWM`. ")
        + "Generated files, never the paper's data.",
    ]
    return lines


#: the record the ``pointcloud-overhead`` block renders (``scripts/benchmark_pointcloud_inference.py --json``)
POINTCLOUD_OVERHEAD = PROJECT_ROOT / "docs" / "benchmarks" / "pointcloud_inference_1024.json"


def _overhead_run_row(name: str, record: dict) -> str:
    """One run of the overhead benchmark in a line: when, where, its paired ratio and canonicalizer share of
    the variant issue 37 bounds (with their 95 % intervals) and the verdict."""
    key, bound = next(iter(record.get("cpu_overhead", {}).items()), (None, None))
    cells = [f"`{name}`", record["created"][:16].replace("T", " "), record["environment"]["machine"],
             str(record["environment"]["load_average_1min"]), str(record["settings"]["repeats"])]
    if key is None:
        return "| " + " | ".join(cells + ["–"] * 4) + " |"
    backbone, variant = key.split("/")
    ratio, ratio_interval = record["paired_cpu_ratios"][backbone][variant], record["paired_cpu_intervals"][backbone][variant]
    parts = record["components"]
    share, share_interval = parts[f"{key}/canonicalizer"]["share_of_vanilla"], parts[f"{key}/canonicalizer"]["share_interval"]
    knn_share = parts[f"{key}/knn"]["share_of_vanilla"] if f"{key}/knn" in parts else None
    cells += [f"{ratio:.3f} ({ratio_interval[0]:.3f}–{ratio_interval[1]:.3f})",
              f"{1 + share:.3f} ({1 + share_interval[0]:.3f}–{1 + share_interval[1]:.3f})",
              "–" if knn_share is None else f"{knn_share:.3f}",
              f"≤ {bound['max']:.2f} {'met' if bound['met'] else 'not shown'}"]
    return "| " + " | ".join(cells) + " |"


def pointcloud_overhead(path: Path = POINTCLOUD_OVERHEAD, reruns: list[Path] | None = None) -> list[str]:
    """Each timed model's median time and its ratio to the vanilla network of the same run, and how the
    record was made; then one line per kept run of the same benchmark (``reruns``, by default the files
    ``<stem>_rerun*.json`` beside ``path``), since runs on one machine differ by more than one run's intervals."""
    record = json.loads(path.read_text())
    reruns = sorted(path.parent.glob(f"{path.stem}_rerun*.json")) if reruns is None else reruns
    env, settings = record["environment"], record["settings"]
    cpu = all("cpu_time" in row for row in record["rows"])  # CPU time: records made since it is measured
    header = f"| model | median time ({record['time_of']}) | ratio to its vanilla network, same run |"
    lines = [header + " median CPU time | CPU-time ratio, same run |" if cpu else header,
             "|---|---:|---:|" + ("---:|---:|" if cpu else "")]
    for row in record["rows"]:
        line = f"| {row['model']} | {row['time']:,.1f} {record['unit']} | {row['ratio']:.3f}× |"
        if cpu:
            line += f" {row['cpu_time']:,.1f} {record['unit']} | {row['cpu_ratio']:.3f}× |"
        lines.append(line)
    def interval(pair: list[float] | None) -> str:  # records made since the 95 % intervals are kept
        return "" if not pair else f" (95 % interval {pair[0]:.3f}–{pair[1]:.3f})"

    paired = record.get("paired_cpu_ratios", {})
    intervals = record.get("paired_cpu_intervals", {})
    has_intervals = any(pair for per in intervals.values() for pair in per.values())
    if paired:  # records made with the paired ratios: per repeat, then the median
        lines += ["", "CPU-time ratio paired within each repeat (the model's CPU time over the vanilla network's in "
                  "the same repeat, median over repeats" + (", with a distribution-free 95 % interval for the "
                                                            "median: order statistics" if has_intervals else "") + "): "
                  + "; ".join(
                      f"{row['model']} {paired[backbone][variant]:.3f}×"
                      + interval(intervals.get(backbone, {}).get(variant))
                      for row in record["rows"] if row["key"] != row["baseline"]
                      for backbone, variant in [row["key"].split("/")]) + "."]
    components = record.get("components", {})
    if components:  # --components: where a canonicalized model's extra time goes
        lines += ["", "| part, timed alone in the same repeats | median CPU time | share of the vanilla pass, paired |",
                  "|---|---:|---:|"]
        for key, part in components.items():
            backbone, variant, what = key.split("/")
            model = next(row["model"] for row in record["rows"] if row["key"] == f"{backbone}/{variant}")
            label = "its canonicalizer (frame and canonical cloud)" if what == "canonicalizer" else "its kNN graph"
            lines.append(f"| {model}: {label} | {part['median_cpu_seconds']:,.2f} {record['unit']} "
                         f"| {part['share_of_vanilla']:.3f}{interval(part.get('share_interval'))} |")
    for key, bound in record.get("cpu_overhead", {}).items():  # issue 37's CPU bound
        model = next(row["model"] for row in record["rows"] if row["key"] == key)
        lines += ["", f"{model} against its vanilla network on this CPU, bound ≤ {bound['max']:.2f}: "
                  + ("**met**" if bound["met"] else "**not shown**")
                  + f" (the larger upper end of the two 95 % intervals, the paired ratio's and 1 + the "
                  f"canonicalizer's share, is {bound['upper']:.3f})."]
    lines += [
        "",
        f"Made {record['created'][:10]} by `{record['command']}` on {env['machine']}, {settings['threads']} torch "
        f"thread(s), load average {env['load_average_1min']} at the start; {settings['clouds']:,} "
        f"{settings['source']} clouds × {settings['points']:,} points, batch {settings['batch_size']}, "
        f"{settings['repeats']} repeats of every model in turn (interleaved), {settings['warmup']} of warm-up.",
    ]
    if reruns:
        lines += ["", "Every kept run of this benchmark (the first is the one above; the same command, "
                  "`--json` aside), for the bounded variant: its CPU-time ratio paired within each repeat, 1 + its "
                  "canonicalizer's share and its kNN graph's share of the vanilla pass (medians, 95 % intervals):",
                  "", "| record | made (UTC) | machine | load at start | repeats | paired ratio | 1 + canonicalizer "
                  "share | kNN share | bound |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
        lines += [_overhead_run_row(p.name, json.loads(p.read_text())) for p in [path, *reruns]]
    return lines


#: the record the ``symmetrization-cost`` block renders (``scripts/benchmark_symmetrization.py --output``)
SYMMETRIZATION_COST = PROJECT_ROOT / "docs" / "reproduction" / "benchmarks" / "symmetrization_cost.json"


def symmetrization_cost_table(record: dict) -> list[str]:
    """Per setup and mode: the predictor passes ``k``, the median CPU time per batch and per input, and the
    ratio to ``canonical`` paired within a round (median and quartiles), and how the record was made."""
    lines = ["| model | mode | k (predictor passes) | CPU s / batch | CPU ms / input "
             "| × canonical, same round: median [q1, q3] |",
             "|---|---|---:|---:|---:|---|"]
    for name, setup in record["setups"].items():
        for i, (mode, m) in enumerate(setup["modes"].items()):
            label = f"`{setup['experiment']}` {name.removeprefix(setup['experiment']).strip()}".strip() if i == 0 else ""
            lines.append(f"| {label} | `{mode}` | {m['k']} | {m['seconds_per_batch']:.3f} "
                         f"| {m['seconds_per_input'] * 1e3:.3f} "
                         f"| {m['ratio']:.2f}× [{m['ratio_q1']:.2f}, {m['ratio_q3']:.2f}] |")
    batches = ", ".join(f"{setup['experiment']} {setup['batch_size']}" for setup in record["setups"].values())
    load_end = "–" if record.get("load_end") is None else f"{record['load_end']:.1f}"
    lines += ["", f"Measured {record['date']} by `{record['command']}` on {record['machine']}, {record['threads']} "
                  f"torch thread(s), load average {record['load_start']:.1f} at the start and {load_end} at the end; "
                  f"{record['rounds']} rounds, each one forward pass of every mode on the same fixed synthetic batch "
                  f"(the config's `data.batch_size`: {batches}), in an order rotated every round, after an untimed "
                  f"warm-up pass; `frame_size={record['frame_size']}`; time: the process's CPU time, eval mode, "
                  "`torch.inference_mode`. Medians over the rounds; the ratio is to `canonical` in the same round. "
                  "k is read off the frame the canonicalizer builds (`Frame.size`)."]
    return lines


def symmetrization_cost(path: Path = SYMMETRIZATION_COST) -> list[str]:
    return symmetrization_cost_table(json.loads(path.read_text()))


#: the record the ``compile-nbody`` block renders (``scripts/benchmark_compile.py --output``)
COMPILE_NBODY = PROJECT_ROOT / "docs" / "benchmarks" / "compile_nbody.json"


def compile_nbody(path: Path = COMPILE_NBODY) -> list[str]:
    """Per experiment: eager and compiled CPU seconds per epoch, their ratio, the compilation's cost, and the
    two runs' last metrics and largest weight difference; how the record was made."""
    record = json.loads(path.read_text())
    lines = ["| experiment | eager, CPU s / epoch | compiled | eager / compiled | compiling, CPU s "
             "| last val MSE, eager / compiled | largest weight difference |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for name, row in record["experiments"].items():
        eager, compiled = row["eager_metrics"].get("val/mse"), row["compiled_metrics"].get("val/mse")
        mse = "–" if eager is None else f"{eager:.6f} / {compiled:.6f}"
        lines.append(f"| `{name}` | {row['eager_seconds_per_epoch']:.3f} | {row['compiled_seconds_per_epoch']:.3f} "
                     f"| {row['ratio']:.2f}× | {row['compile_seconds']:.0f} | {mse} "
                     f"| {row['largest_weight_difference']:.2g} |")
    lines += ["", f"Measured {record['created'][:10]} by `{record['command']}` on {record['machine']}, torch "
                  f"{record['torch']}, {record['threads']} thread(s), load average {record['load_start']:.1f} at "
                  f"the start and {record['load_end']:.1f} at the end: each experiment trained {record['epochs']} "
                  f"epochs eagerly, then compiled, from seed {record['seed']} (same initial weights, same "
                  "batches), validation every `trainer.check_val_every_n_epoch` epochs included; CPU time of the "
                  f"process (`time.process_time`), means over the epochs after the first {record['warmup']} (the "
                  "compiled run compiles in its first epoch and first validation); compiling: the compiled run's "
                  "first epoch minus its mean (the compiler's own subprocesses not counted)."]
    return lines


TENSOR_FIELD_STEP = PROJECT_ROOT / "docs" / "benchmarks" / "tensor_field_step.json"


def tensor_field_step(path: Path = TENSOR_FIELD_STEP) -> list[str]:
    """Per tensor-field row: CPU seconds of a training step with its edge kernels evaluated by paths and through
    the fully connected product, their paired ratio and whether the two trained alike; how it was made."""
    record = json.loads(path.read_text())
    lines = ["| row | parameters | every kernel by paths, CPU s / step | every kernel through the product "
             "| paths / product, paired | parameters equal after the steps | kernels the rule splits |",
             "|---|---:|---:|---:|---:|---|---|"]
    for name, row in record["rows"].items():
        lines.append(f"| `nbody/{name}` | {row['parameters']:,} | {row['paths_seconds_per_step']:.3f} "
                     f"| {row['product_seconds_per_step']:.3f} | {row['paired_ratio']:.2f}× "
                     f"| {'yes, bit for bit' if row['parameters_identical'] else 'no'} ({row['steps']} steps) "
                     f"| {row['kernels_split_by_the_rule']} of {row['kernels_with_several_paths']} |")
    lines += ["", f"Measured {record['created'][:10]} by `{record['command']}` on {record['machine']}, torch "
                  f"{record['torch']}, {record['threads']} thread(s), load average {record['load_start']:.1f} at "
                  f"the start and {record['load_end']:.1f} at the end: one Adam step on 100 random five-particle "
                  f"systems per copy and round, {record['rounds']} rounds after one warm-up step, the order "
                  "alternating; CPU time of the process (`time.process_time`), medians over the rounds; the "
                  "ratio is paired within each round."]
    return lines


#: the record the ``edge-conv-step`` block renders (``scripts/benchmark_edge_conv.py --output``)
EDGE_CONV_STEP = PROJECT_ROOT / "docs" / "benchmarks" / "edge_conv_step.json"


def edge_conv_step(path: Path = EDGE_CONV_STEP) -> list[str]:
    """Per network and head: seconds of a training step and an evaluation batch with EdgeConv's plain form and
    the package's (``edge_conv``, ``edge_linear``), their paired ratios, the steps' peak memory, how far the copies drifted apart, and how far
    each form's float32 gradients are from float64; how the record was made."""
    record = json.loads(path.read_text())

    def peak(value: float | None) -> str:
        return "–" if value is None else f"{value / 1024:.1f} GB"

    lines = ["| network | head | clouds × points, k | training step, plain / package | paired ratio "
             "| evaluation batch, plain / package | paired ratio | peak memory of a step, plain / package "
             "| float32 gradients off float64, plain / package |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    names = {"dgcnn": "DGCNN", "vn_dgcnn": "VN-DGCNN"}
    for row in record["rows"]:
        gradients = "; ".join(f"{g['plain_float32']:.1e} / {g['edge_conv_float32']:.1e}" for g in row["gradients"])
        lines.append(f"| {names[row['network']]} | {row['head']} | {row['batch']} × {row['points']:,}, {row['k']} "
                     f"| {row['plain_train_s']:.1f} s / {row['edge_conv_train_s']:.1f} s | {row['train_ratio']:.2f}× "
                     f"| {row['plain_eval_s']:.1f} s / {row['edge_conv_eval_s']:.1f} s | {row['eval_ratio']:.2f}× "
                     f"| {peak(row['plain_peak_mb'])} / {peak(row['edge_conv_peak_mb'])} | {gradients or '–'} |")
    lines += ["", f"Measured {record['created'][:10]} by `{record['command']}` on {record['machine']}, torch "
                  f"{record['torch']}, {record['threads']} thread(s), load average {record['load_start']:.1f} at "
                  f"the start and {record['load_end']:.1f} at the end: the reference widths built twice from one "
                  f"seed, one SGD step of each per round on one batch of random clouds, {record['rounds']} rounds "
                  "after one warm-up step, the order alternating; wall time (`time.perf_counter`), medians over the "
                  "rounds, ratios paired within a round; peak: resident memory above the step's start (`VmHWM`). "
                  "After the steps the copies' weights were at most "
                  + ", ".join(f"{row['largest_weight_difference']:.1g}" for row in record["rows"])
                  + " apart (the two forms round differently; the gradients' column says by how much that is "
                  "float32's own noise): the largest relative 2-norm error of a parameter's float32 gradient "
                  "against the plain form in float64, one batch per seed (`gradient_agreement`)."]
    for head in dict.fromkeys(row["head"] for row in record["rows"]):
        checks = [g for row in record["rows"] if row["head"] == head for g in row["gradients"]]
        further = sum(g["edge_conv_float32"] > g["plain_float32"] for g in checks)
        if checks:
            lines[-1] += (f" {head.capitalize()}: the package's form was the further off in {further} of "
                          f"{len(checks)} batches.")
    return lines


#: the record the ``shapes40-difficulty`` block renders (``scripts/shapes40_difficulty.py --json``)
SHAPES40_DIFFICULTY = PROJECT_ROOT / "docs" / "benchmarks" / "shapes40_difficulty.json"

#: what each setting of ``scripts/shapes40_difficulty.py`` is, in words
_SETTING_NAMES = {"shapes7_256": "7 classes (`synthetic_shapes`), the `pointclouds-cpu` budget",
                  "shapes40_256": "40 classes (`synthetic_shapes40`), the `pointclouds-cpu` budget",
                  "shapes40_1024": "40 classes (`synthetic_shapes40`), its defaults: the band's setting"}


def _accuracy_cell(accuracy: list[float]) -> str:
    """``"0.937 (0.931-0.940, n 3)"``: the mean test accuracy over forest seeds and its range."""
    mean = f"{sum(accuracy) / len(accuracy):.3f}"
    return mean + (f" ({min(accuracy):.3f}-{max(accuracy):.3f}, n {len(accuracy)})" if len(accuracy) > 1 else " (n 1)")


def _dgcnn_runs_cell(runs: list[dict]) -> str:
    """``"0.969 (seed 0, 10 epochs); ..."``: the DGCNN runs a setting's record found, or ``"none yet"``."""
    return "; ".join(f"{run['test_acc']:.3f} (seed {run['seed']}, {run['epochs']} epochs)" for run in runs) or "none yet"


def shapes40_difficulty(path: Path = SHAPES40_DIFFICULTY, knobs: list[Path] | None = None) -> list[str]:
    """Per data setting: the z-invariant descriptor's test accuracy with extremely randomised trees (mean and
    range over forest seeds) beside the DGCNN runs under z/z found on the same data; how it was made; then one
    row per kept run of the script with a difficulty knob moved (``shapes40_difficulty_knob_*.json`` beside the
    record, ``knobs``)."""
    record = json.loads(path.read_text())
    if knobs is None:
        knobs = sorted(path.parent.glob(path.stem + "_knob_*.json"))
    lines = ["| data | points, training / test clouds | descriptor + extra trees, test acc. (seeds) "
             "| DGCNN under z/z, test acc. (runs) |", "|---|---|---|---|"]
    for name, row in record["settings"].items():
        floor = _accuracy_cell(row["accuracy"])
        extra = row["extra"]
        lines.append(f"| {_SETTING_NAMES.get(name, name)}" + (f", `{' '.join(extra)}`" if extra else "")
                     + f" | {row['points']:,}, {row['train']:,} / {row['test']:,} | {floor} "
                       f"| {_dgcnn_runs_cell(row['dgcnn_runs'])} |")
    lines += ["", f"Made {record['created'][:10]} by `{record['command']}` on {record['machine']}, "
                  f"{record['threads']} thread(s): {record['trees']} trees a forest, one forest per seed on fixed "
                  f"data (`data.data_seed=0`, test split turned about z); "
                  f"{next(iter(record['settings'].values()))['features']} features a cloud (quantiles, covariance "
                  f"eigenvalues, {record['slabs']} height slabs). DGCNN runs: the records under "
                  "`docs/reproduction/runs` and `outputs/` whose data config is the setting's (all but the loader's keys)."]
    if knobs:
        lines += ["", "One knob moved from the defaults (each a run of the script with `--extra <override>`, kept as "
                      f"`{path.stem}_knob_*.json` beside the record):", "",
                  "| setting | override | descriptor + extra trees, test acc. (seeds) "
                  "| DGCNN under z/z, test acc. (runs) | made |", "|---|---|---|---|---|"]
        for knob in knobs:
            other = json.loads(knob.read_text())
            for name, row in other["settings"].items():
                lines.append(f"| {_SETTING_NAMES.get(name, name)} | `{' '.join(row['extra'])}` | "
                             f"{_accuracy_cell(row['accuracy'])} | {_dgcnn_runs_cell(row['dgcnn_runs'])} "
                             f"| {other['created'][:10]}, {other['machine']} |")
    return lines


#: the committed run records the ``run-costs`` block summarises (``scripts/collect_runs.py`` copies them there)
RUN_RECORDS = PROJECT_ROOT / "docs" / "reproduction" / "runs"
#: the record folders that hold a table's own rows (``<family>/<row>/<setting>/seed<k>`` or ``<family>/<row>/seed<k>``),
#: not its ablations: the epoch budgets of N-body; the point-cloud budgets (points, training clouds, epochs; all three
#: rotation settings together) and, on the 40-class set, its difficulty (scripts/reproduce.sh shapes40 names the
#: scale jitter in every folder since its default moved)
_TABLE_SETTINGS = re.compile(r"^(|ep\d+|no_early_stop|(s40_)?pts\d+(_n\d+)?"
                             r"(_(noise_std|part_dropout|sampling_bias|scale_jitter)\d+(\.\d+)?)*(_ep\d+)?)$")
#: a point-cloud folder's rotation protocol, before its epoch budget if it names one
_ROTATIONS = re.compile(r"_(z|so3)_(z|so3)(?=(_ep\d+)?$)")


def _duration(seconds: float) -> str:
    """``"45 s"``, ``"12.5 min"`` or ``"2.4 h"``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _span(values: list[float]) -> str:
    """``"12.5 min"`` or ``"12.5 min – 14.0 min"``: the range of some durations."""
    low, high = _duration(min(values)), _duration(max(values))
    return low if low == high else f"{low} – {high}"


def run_costs(root: Path = RUN_RECORDS) -> list[str]:
    """What the committed runs of each table row cost, by device: runs, epochs, fitting time per epoch and in all,
    and wall time, from every completed ``results.json`` under ``root`` (ablations left out)."""
    groups: dict[tuple, list[dict]] = {}
    for path in sorted(root.glob("**/results.json")):
        parts = path.relative_to(root).parts  # family, row, [setting,] seed<k>, results.json
        setting = parts[2] if len(parts) == 5 else ""
        setting = _ROTATIONS.sub("", setting)  # pts256_z_so3 -> pts256: the rotations together
        record = json.loads(path.read_text())
        if record.get("status") != "completed" or not _TABLE_SETTINGS.match(setting) or not record.get("epochs"):
            continue
        device = (record.get("environment") or {}).get("device", "?")
        groups.setdefault((record["experiment"], setting, device), []).append(record)
    lines = ["| experiment | setting | device | runs | epochs run | fitting, per epoch (median) | fitting, whole run "
             "| wall time, whole run (runs never resumed) |",
             "|---|---|---|---:|---|---:|---|---|"]
    for (experiment, setting, device), records in sorted(groups.items()):
        epochs = [r["epochs"] for r in records]
        timed = [r for r in records if r.get("fit_time_s")]  # the oldest records have no fitting time
        fits = [r["fit_time_s"] for r in timed]
        per_epoch = sorted(r["fit_time_s"] / r["epochs"] for r in timed)
        median = (per_epoch[(len(per_epoch) - 1) // 2] + per_epoch[len(per_epoch) // 2]) / 2 if timed else None
        walls = [r["wall_time_s"] for r in records if not r.get("resumed_from")]
        epoch_span = str(min(epochs)) if min(epochs) == max(epochs) else f"{min(epochs)}–{max(epochs)}"
        fit_cells = (f"{median:.1f} s | {_span(fits)}" + ("" if len(timed) == len(records) else f" ({len(timed)} "
                     "of the runs)")) if timed else "– | –"
        lines.append(f"| `{experiment}` | {setting or '–'} | {device} | {len(records)} | {epoch_span} "
                     f"| {fit_cells} | {_span(walls) if walls else '–'} |")
    lines += ["", "From every completed record under `docs/reproduction/runs/` whose folder is a table's own setting "
                  "(`<family>/<row>/[<setting>/]seed<k>`: no setting, `ep<N>`, `no_early_stop` or a point-cloud "
                  "budget `[s40_]pts<N>[_n<clouds>][_<difficulty>][_ep<N>]` with its three rotation settings "
                  "together; ablation folders left out): `fit_time_s` (fitting, summed "
                  "over a run's resumes; per epoch: over the epochs it ran, Lightning's sanity validation "
                  "included) and `wall_time_s` (the whole command: building, fitting and testing; only runs that "
                  "never resumed, since a resumed run's wall time is its last part's). The machines and how many "
                  "runs shared them differ between records (each record's `environment`; the CPU runs used one "
                  "thread, mostly two at once on 2 cores): ranges, not benchmarks."]
    return lines


#: the record the ``escnn-build`` block renders (``scripts/benchmark_escnn_build.py``)
ESCNN_BUILD = PROJECT_ROOT / "docs" / "benchmarks" / "escnn_build.json"


def _spread(stats: dict, unit: str, digits: int = 1) -> str:
    """``"2.4 s (2.3–2.6)"``: a median and its range over a benchmark's repeats (the median alone when they agree)."""
    low, mid, high = (f"{stats[k]:,.{digits}f}" for k in ("min", "median", "max"))
    return f"{mid} {unit}" + ("" if low == high else f" ({low}–{high})")


def escnn_build(path: Path = ESCNN_BUILD) -> list[str]:
    """Per escnn build of the C64 models: its time and peak memory in a fresh process (median and range over the
    repeats), the checkpoint buffers it carries, and the largest intermediate escnn's own basis normalisation
    would have formed; how the record was made."""
    record = json.loads(path.read_text())
    lines = ["| build | parameters | CPU time of building | wall time | resident before building "
             "| peak resident memory (imports included) | state-dict buffers (sampled bases) "
             "| escnn's (B, O, O, P) intermediate, largest (computed, not formed) | builds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in record["builds"].values():
        if not row.get("finished"):
            lines.append(f"| {row['what']} | not measured: {'; '.join(row.get('errors', []))} | | | | | | | "
                         f"0 of {row['repeats']} |")
            continue
        before = sorted(run["rss_before_mb"] for run in row["runs"] if "error" not in run)
        params = "–" if row["params"] is None else f"{row['params']:,}"
        buffers = "–" if row["buffers_mb"] is None else f"{row['buffers_mb']:,.0f} MiB"
        lines.append(f"| {row['what']} | {params} | {_spread(row['build_cpu_s'], 's')} | "
                     f"{_spread(row['build_s'], 's')} | {before[(len(before) - 1) // 2]:,.0f} MiB | "
                     f"{_spread(row['peak_rss_mb'], 'MiB', 0)} | {buffers} | "
                     f"{row['intermediate_max_mb']:,.0f} MiB (of {row['bases']} bases) | "
                     f"{row['finished']} of {row['repeats']} |")
    added = record["escnn_cache_files_added"]
    cache = ("every build on a warm escnn cache (the run added no file to it)" if added == 0 else
             f"the run added {added:,} files to escnn's cache: its first builds include filling it")
    lines += ["", f"Measured {record['created'][:10]} by `{record['command']}` on {record['machine']}, torch "
                  f"{record['torch']}, escnn {record['escnn']}, load average {record['load_start']:.1f} at the start "
                  f"and {record['load_end']:.1f} at the end" + (f" ({record['conditions']})" if record["conditions"]
                                                                 else "")
                  + f": each build in a fresh process, the builds taking turns; median (range) over its builds; "
                  f"{cache}. Times: `hydra.utils.instantiate(cfg.model)` (or the one call), after the imports; on a "
                  "loaded machine the wall time is mostly waiting, the CPU time is the process's own. Memory: "
                  "`VmHWM` of the process and its resident memory before building; buffers: the bytes of the "
                  "state dict that are not parameters, which every checkpoint carries; intermediate: B·O·O·P "
                  "elements of the largest basis the build normalised, at its dtype, which "
                  "`canonical_network/utils/escnn_compat.py` (fix 2) never forms."]
    return lines


#: the record the ``nbody-generation`` block renders (``scripts/benchmark_nbody_generation.py``)
NBODY_GENERATION = PROJECT_ROOT / "docs" / "benchmarks" / "nbody_generation.json"


def nbody_generation(path: Path = NBODY_GENERATION) -> list[str]:
    """How long generating the N-body data took from scratch (median and range over the runs); how it was made."""
    record = json.loads(path.read_text())
    first = record["runs"][0]
    sims = " / ".join(f"{n:,}" for n in first["simulations"].values())
    same = {run["same_files_as_compare"] for run in record["runs"]}
    check = ("yes, every run" if same == {True} else "no" if False in same else "not checked (no manifest there)")
    lines = ["| data | simulations, training / validation / test | wall time | CPU time of the process "
             "| pair dot products | same files as `data/nbody`'s manifest | runs |", "|---|---|---:|---:|---|---|---:|",
             f"| `{record['dataset']}` | {sims} | {_spread(record['wall_s'], 's')} | {_spread(record['cpu_s'], 's')} "
             f"| {first['dot_products']} | {check} | {record['repeats']} |",
             "", f"Measured {record['created'][:10]} by `{record['command']}` on {record['machine']}, torch "
                 f"{record['torch']}, {record['threads']} torch thread(s), `OMP_NUM_THREADS` "
                 f"{record['omp_num_threads'] or 'unset'}, load average {record['load_start']:.1f} at the start and "
                 f"{record['load_end']:.1f} at the end" + (f" ({record['conditions']})" if record["conditions"] else "")
                 + ": each run generates the whole dataset into a fresh temporary folder with the function the "
                 "data module calls on first use; median (range) over the runs. On a loaded machine the wall time "
                 "includes waiting for the cores; the CPU time is the process's own."]
    return lines


#: per-epoch logs of the authors' N-body code run on our data (``docs/reproduction/reference/authors-nbody/``)
AUTHORS_NBODY = PROJECT_ROOT / "docs" / "reproduction" / "reference" / "authors-nbody"
#: what each of those logs ran, in words
_AUTHORS_NBODY_RUNS = {"authors_defaults_gnn32_seed0.csv": "their committed defaults (GNN hidden 32), seed 0",
                       "authors_gnn64_seed0.csv": "GNN hidden 64 (our predictor's size), seed 0"}


def authors_nbody(folder: Path = AUTHORS_NBODY) -> list[str]:
    """The authors' N-body code on our data: per logged run, its epochs, best validation epoch and MSE, and the
    test MSE at that epoch (their code never tests; the run logged the test split every epoch)."""
    import csv

    lines = ["| run of the authors' code | epochs | best validation epoch (1-based) | validation MSE there "
             "| test MSE there |", "|---|---:|---:|---:|---:|"]
    for name, what in _AUTHORS_NBODY_RUNS.items():
        with open(folder / name, newline="") as stream:
            rows = list(csv.DictReader(stream))
        best = min(rows, key=lambda row: float(row["valid_loss"]))  # the first of equal minima
        lines.append(f"| {what} (`{name}`) | {len(rows):,} | {int(best['epoch']) + 1:,} "
                     f"| {float(best['valid_loss']):.5f} | {float(best['test_mse']):.5f} |")
    lines += ["", "From the per-epoch logs in `docs/reproduction/reference/authors-nbody/` (columns `epoch`, 0-based, "
                  "`valid_loss`, `test_mse`, `lr`, `elapsed_s`; how they were made: that folder's README.md). One "
                  "seed each: a reference level, not a distribution."]
    return lines


GENERATORS: dict[str, Callable[[], list[str]]] = {"config-groups": config_groups, "experiments": experiments,
                                                   "paper-rows": paper_rows, "api-example": api_example,
                                                   "permutation-cost": permutation_cost, "protocol-cost": protocol_cost,
                                                   "dress-rehearsal": dress_rehearsal,
                                                   "pointcloud-overhead": pointcloud_overhead,
                                                   "symmetrization-cost": symmetrization_cost,
                                                   "compile-nbody": compile_nbody,
                                                   "tensor-field-step": tensor_field_step,
                                                   "edge-conv-step": edge_conv_step,
                                                   "shapes40-difficulty": shapes40_difficulty,
                                                   "run-costs": run_costs, "authors-nbody": authors_nbody,
                                                   "escnn-build": escnn_build, "nbody-generation": nbody_generation}

BLOCK = re.compile(r"(<!-- generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /generated:(?P=name) -->)", re.S)


def render(text: str) -> str:
    """``text`` with every generated block refilled (blocks whose generator this module does not own, such as
    the README's scorecard, are left as they are)."""
    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in GENERATORS:
            return match[0]
        return match[1] + "\n".join(GENERATORS[name]()) + "\n" + match[4]

    return BLOCK.sub(fill, text)


def documents(root: Path = PROJECT_ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only say which blocks are stale (exit 1 if any)")
    args = parser.parse_args(argv)
    stale = []
    for path in documents():
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print("stale generated blocks in " + ", ".join(str(p.relative_to(PROJECT_ROOT)) for p in stale)
              + ": run python -m canonical_network.docs_blocks", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
