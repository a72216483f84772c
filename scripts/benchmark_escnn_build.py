"""Building the C64 escnn models: time, peak resident memory, checkpoint buffers, and escnn's intermediate.

    OMP_NUM_THREADS=1 python scripts/benchmark_escnn_build.py      # writes docs/benchmarks/escnn_build.json
    python -m canonical_network.docs_blocks                        # renders the escnn-build block from it

Each build runs ``--repeats`` times, every time in a fresh child process (escnn caches sampled bases per process,
so a second build in one process would measure the cache), the builds taking turns so that a drift of a shared
machine hits them alike. A child reports:

* ``build_s`` and ``build_cpu_s``: the wall time and the process's CPU time of building
  (``hydra.utils.instantiate(cfg.model)``, or the one call of ``basis_dimensions``), after the imports;
* ``peak_rss_mb``: the child's peak resident memory (``VmHWM`` of ``/proc/self/status``), imports included, and
  ``rss_before_mb`` its resident memory before building;
* ``buffers_mb``: the bytes of the model's state dict that are not parameters (escnn's sampled bases: what
  every checkpoint carries besides the weights);
* ``intermediate_max_mb``: the size of the largest ``(B, O, O, P)`` tensor escnn's own ``normalize_basis`` would
  have formed for a basis the build normalised (``canonical_network/utils/escnn_compat.py``, fix 2, forms none),
  computed from the basis' shape and dtype; ``bases`` counts the bases normalised.

The default builds are the experiments of the report's Table 1 at N = 64 and the basis sample that
``prediction.gcnn.basis_dimensions(64)`` needs; ``--builds cn_d64`` adds a D64 canonicalizer, which on a cold
escnn cache computes Clebsch–Gordan coefficients for minutes and writes them into the installed escnn package.
A build slower than ``--timeout`` seconds is recorded as timed out. The record says how many files the run added
to escnn's cache (0: every build ran on a warm cache).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_OUTPUT = Path("docs/benchmarks/escnn_build.json")

#: name -> (what it is, the Hydra overrides of the experiment; None: ``basis_dimensions(64)``)
BUILDS: dict[str, tuple[str, list[str] | None]] = {
    "cn_p64": ("CN(p64)-CNN (`experiment=rotmnist/cn_p64`)", ["experiment=rotmnist/cn_p64"]),
    "gcnn_p64_eqparams": ("G-CNN (p64 & = params) (`experiment=rotmnist/gcnn_p64_eqparams`)",
                          ["experiment=rotmnist/gcnn_p64_eqparams"]),
    "cn_d64": ("CN(d64)-CNN: a D64 canonicalizer (`experiment=rotmnist/cn_p64 canonicalization.reflection=true`)",
               ["experiment=rotmnist/cn_p64", "canonicalization.reflection=true"]),
    "basis_dimensions_64": ("`prediction.gcnn.basis_dimensions(64)`: the basis of one pair of C64 regular fields",
                            None),
}
#: the builds run by default: ``cn_d64`` on a cold escnn cache computes (and writes into the installed escnn
#: package) Clebsch–Gordan coefficients for minutes, so it runs only when asked for
DEFAULT_BUILDS = ("cn_p64", "gcnn_p64_eqparams", "basis_dimensions_64")


def _cache_files() -> int:
    """Files in escnn's own disk cache (inside the package): a build that adds some ran on a cold cache."""
    from escnn.group import __cache_path__

    return sum(1 for p in Path(__cache_path__).rglob("*") if p.is_file())


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def build_child(name: str) -> None:
    """Child-process mode: build ``name`` once and print one JSON line."""
    import torch

    import canonical_network.canonicalization.image  # noqa: F401  (torch, kornia and escnn imported first)
    from canonical_network.utils import escnn_compat

    escnn_compat.patch_escnn()
    from escnn.nn.modules.basismanager import basisexpansion_singleblock

    lean = basisexpansion_singleblock.normalize_basis
    intermediates: list[int] = []

    def recording(basis: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        b, o, _, *grid = basis.shape
        intermediates.append(b * o * o * int(torch.Size(grid).numel()) * basis.element_size())
        return lean(basis, sizes)

    basisexpansion_singleblock.normalize_basis = recording
    overrides = BUILDS[name][1]
    before = _status_mb("VmRSS")
    start, cpu_start = time.perf_counter(), time.process_time()
    if overrides is None:
        from canonical_network.prediction.gcnn import basis_dimensions

        basis_dimensions(64)
        params = buffers = None
    else:
        from canonical_network.utils.config import compose_experiment
        from canonical_network.utils.trust import build

        model = build(compose_experiment(overrides).model)
        names = {n for n, _ in model.named_parameters()}
        params = sum(p.numel() for p in model.parameters())
        buffers = sum(t.numel() * t.element_size() for n, t in model.state_dict().items() if n not in names)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    print(json.dumps({"build_s": seconds, "build_cpu_s": cpu_seconds, "rss_before_mb": before, "peak_rss_mb": _status_mb("VmHWM"),
                      "params": params, "buffers_mb": None if buffers is None else buffers / 2**20,
                      "bases": len(intermediates),
                      "intermediate_max_mb": max(intermediates, default=0) / 2**20}))


def measure(name: str, timeout: float) -> dict:
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    """Median, smallest and largest of each measured figure over the builds that finished."""
    done = [r for r in runs if "error" not in r]
    out: dict = {"repeats": len(runs), "finished": len(done)}
    for key in ("build_s", "build_cpu_s", "peak_rss_mb"):
        values = [r[key] for r in done]
        if values:
            out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    for key in ("params", "buffers_mb", "bases", "intermediate_max_mb"):  # the same in every build
        if done:
            out[key] = done[0][key]
    errors = sorted({r["error"] for r in runs if "error" in r})
    if errors:
        out["errors"] = errors
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--builds", nargs="+", default=list(DEFAULT_BUILDS), choices=list(BUILDS),
                        help=f"default {' '.join(DEFAULT_BUILDS)}; cn_d64 fills escnn's cache on first use")
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process builds of each (default 3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a build is given up")
    parser.add_argument("--conditions", default="", help="what else ran on the machine, for the record")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        build_child(args.child)
        return 0
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1; got {args.repeats}")

    import torch

    from canonical_network.report_inference import load_average, timing_record, write_record

    cache_before = _cache_files()
    load_start = load_average()
    runs: dict[str, list[dict]] = {name: [] for name in args.builds}
    for repeat in range(args.repeats):
        for name in args.builds:
            if repeat and runs[name][-1].get("error", "").startswith("timed out"):
                continue  # a build that timed out once would time out again
            runs[name].append(result := measure(name, args.timeout))
            print(f"{name} #{repeat}: {result}", flush=True)
    builds = {name: {"what": BUILDS[name][0], "overrides": BUILDS[name][1], **summary(rows), "runs": rows}
              for name, rows in runs.items()}
    argv = list(argv if argv is not None else sys.argv[1:])
    record = timing_record("scripts/benchmark_escnn_build.py", argv, load_start, conditions=args.conditions,
                           escnn=_version("escnn"), escnn_cache_files_added=_cache_files() - cache_before,
                           builds=builds)
    record["torch"] = torch.__version__
    write_record(args.output, record)
    print(f"wrote {args.output}")
    return 0


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
