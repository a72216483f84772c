"""Cost of the S_n canonicalizer against n: the hard sort, the Sinkhorn relaxation, and a backbone beside them.

    OMP_NUM_THREADS=1 python scripts/benchmark_permutation.py
    OMP_NUM_THREADS=1 python scripts/benchmark_permutation.py --sizes 5 16 64 --batch-size 32 --output /tmp/p.json

For each set size n (default 5, 16, 64, 256, 1,024 elements; clouds of n 3-D points, ``--batch-size`` clouds
per batch, one torch thread) it times, interleaved within one run so that the load of a shared machine hits
every variant alike:

* ``eval``: ``PermutationCanonicalizer(selection="ste")`` in eval mode under ``torch.no_grad()``: the fast
  path, scores and the sort alone, O(n log n) (``canonicalization/permutation.py``);
* ``ste``: the same canonicalizer in training mode with gradients: the sort for the forward pass plus the
  Sinkhorn soft sort (``sinkhorn_iterations`` row/column normalisations of an ``(n, n)`` matrix) that
  carries the straight-through gradient, O(n² · iterations); forward, and forward + backward;
* ``soft``: ``selection="soft"``, the doubly stochastic matrix applied (``S x``): forward, forward + backward;
* ``backbone``: the repository's PointNet (``prediction/pointnet.py``, ModelNet40 classification head,
  reference widths, input and feature transforms), the predictor the canonicalizer sits in front of: eval
  forward under ``no_grad``, and training forward, forward + backward, at the same n and batch.

The canonicalizer is the one of ``configs/canonicalization/permutation.yaml`` (Deep Sets scorer, 2 layers of
32, temperature 1, 20 Sinkhorn iterations) reading each point's 3 coordinates. Its backward pass starts from
``(P x · w).sum()`` for fixed random weights ``w`` (the straight-through term then reaches the scorer); the
backbone's from the sum of its logits times fixed weights.

Time: the median of ``--repeats`` calls after one untimed warm-up, except for calls slower than
``--slow-s`` seconds, which are measured once without warm-up (a few minutes in all on a loaded machine:
at batch 32, one ``ste`` forward + backward at n = 1,024 alone took 126 s and 6.6 GB on the 2 shared cores).
Forward and backward are timed within the same call: ``forward + backward`` is their sum.

Memory, two figures per call, both said in the record:

* ``saved_mb``: the bytes of the tensors autograd saves for the backward pass (``torch.autograd.graph.
  saved_tensors_hooks``, each storage counted once): exact, what training holds between the forward and the
  backward pass; 0 without a graph;
* ``peak_mb``: the peak resident memory of the call above the resident memory before it (``VmHWM`` of
  ``/proc/self/status`` after resetting it by writing ``5`` to ``/proc/self/clear_refs``): everything the
  call touched, transient buffers included, at page granularity (so ~0 for small n); ``None`` where the
  kernel does not allow the reset.

Writes ``--output`` (JSON: machine, settings, per-n times and memory, ratios to the backbone measured in the
same run, and the growth exponent between the two largest n); ``docs/measurements.md`` renders
``docs/reproduction/benchmarks/permutation.json`` as a generated block (``python -m
canonical_network.docs_blocks``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

from canonical_network.canonicalization.permutation import PermutationCanonicalizer
from canonical_network.prediction.pointnet import PointNet
from canonical_network.report_inference import benchmark_environment, command_line, reset_peak, status_mb

SIZES = (5, 16, 64, 256, 1024)
#: the rows of the record, in the order each n times them
VARIANTS = ("eval", "ste", "soft", "backbone_eval", "backbone")
LABELS = {"eval": "S_n canonicalizer, eval (sort only)", "ste": "S_n canonicalizer, ste training (sort + Sinkhorn)",
          "soft": "S_n canonicalizer, soft (Sinkhorn applied)", "backbone_eval": "PointNet, eval",
          "backbone": "PointNet, training"}
#: each canonicalizer variant and the backbone variant its ratio is taken to (same mode: eval to eval)
BASELINE = {"eval": "backbone_eval", "ste": "backbone", "soft": "backbone"}
MB = 2.0**20


class SavedBytes:
    """Context manager: the bytes of the tensors autograd saves for backward inside it, each storage once."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def __enter__(self) -> SavedBytes:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    @property
    def megabytes(self) -> float:
        return sum(self.storages.values()) / MB


def measure(step: Callable[[], tuple[torch.Tensor, bool]]) -> dict[str, float | None]:
    """One call of ``step`` (returns its output and whether to run backward): seconds forward and forward +
    backward, saved-tensor MB and peak resident MB above the start."""
    start_rss = reset_peak()
    with SavedBytes() as saved:
        begin = time.perf_counter()
        loss, backward = step()
        forward_s = time.perf_counter() - begin
    if backward:
        loss.backward()
    total_s = time.perf_counter() - begin
    peak = None if start_rss is None else max(0.0, status_mb("VmHWM") - start_rss)
    return {"forward_s": forward_s, "forward_backward_s": total_s if backward else None,
            "saved_mb": saved.megabytes, "peak_mb": peak}


def steps(n: int, batch_size: int, seed: int) -> dict[str, Callable[[], tuple[torch.Tensor, bool]]]:
    """The timed call of each variant at set size ``n`` (models and inputs built here, outside the timing)."""
    gen = torch.Generator().manual_seed(seed)
    points = torch.randn(batch_size, n, 3, generator=gen)
    weights = torch.randn(batch_size, n, 3, generator=gen)
    torch.manual_seed(seed)
    ste = PermutationCanonicalizer(in_features=3, selection="ste")
    soft = PermutationCanonicalizer(in_features=3, selection="soft")
    backbone = PointNet(head="classification")
    logit_weights = torch.randn(batch_size, backbone.num_classes, generator=gen)

    def canonicalizer(h: PermutationCanonicalizer, train: bool) -> Callable[[], tuple[torch.Tensor, bool]]:
        def call():
            h.train(train)
            with torch.set_grad_enabled(train):
                (canonical,), _ = h.canonicalize(points)
                return (canonical * weights).sum(), train
        return call

    def pointnet(train: bool) -> Callable[[], tuple[torch.Tensor, bool]]:
        def call():
            backbone.train(train)
            backbone.zero_grad(set_to_none=True)
            with torch.set_grad_enabled(train):
                return (backbone(points) * logit_weights).sum(), train
        return call

    return {"eval": canonicalizer(ste, False), "ste": canonicalizer(ste, True), "soft": canonicalizer(soft, True),
            "backbone_eval": pointnet(False), "backbone": pointnet(True)}


def exponent(small: float, large: float, n_small: int, n_large: int) -> float:
    """``log(t_large / t_small) / log(n_large / n_small)``: the empirical power of n between two sizes."""
    return math.log(large / small) / math.log(n_large / n_small)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="set sizes n")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per variant (median)")
    parser.add_argument("--slow-s", type=float, default=2.0, help="calls slower than this: measured once")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path("outputs/benchmarks/permutation.json"))
    args = parser.parse_args(argv)
    if min(args.sizes) < 2 or args.batch_size < 2 or args.repeats < 1 or args.threads < 1:
        parser.error("--sizes must be >= 2, --batch-size >= 2 (PointNet's batch norm), --repeats and --threads >= 1")
    torch.set_num_threads(args.threads)
    environment = benchmark_environment()  # the load average before anything runs
    started = time.perf_counter()
    print(f"batch {args.batch_size} clouds of n 3-D points, {torch.get_num_threads()} thread(s), load average "
          f"{environment['load_average_1min']}")

    results: dict[str, dict[str, dict]] = {}
    for n in sorted(args.sizes):
        calls = steps(n, args.batch_size, args.seed)
        first = {name: measure(call) for name, call in calls.items()}  # warm-up, and the measure of slow calls
        slow = {name: (m["forward_backward_s"] or m["forward_s"]) >= args.slow_s for name, m in first.items()}
        runs = {name: [] for name in calls}
        for _ in range(args.repeats):
            for name, call in calls.items():
                if not slow[name]:
                    runs[name].append(measure(call))
        results[str(n)] = {}
        for name in calls:
            timed = runs[name] or [first[name]]
            row = {"calls": len(timed), "forward_ms": 1e3 * statistics.median(r["forward_s"] for r in timed)}
            backward = [r["forward_backward_s"] for r in timed if r["forward_backward_s"] is not None]
            row["forward_backward_ms"] = 1e3 * statistics.median(backward) if backward else None
            row["saved_mb"] = max(r["saved_mb"] for r in [first[name], *timed])
            peaks = [r["peak_mb"] for r in [first[name], *timed] if r["peak_mb"] is not None]
            row["peak_mb"] = max(peaks) if peaks else None
            results[str(n)][name] = row
        for name, base in BASELINE.items():
            row, ref = results[str(n)][name], results[str(n)][base]
            row["ratio_forward"] = row["forward_ms"] / ref["forward_ms"]
            if row["forward_backward_ms"] is not None:
                row["ratio_forward_backward"] = row["forward_backward_ms"] / ref["forward_backward_ms"]
                row["ratio_saved"] = row["saved_mb"] / ref["saved_mb"]
        r = results[str(n)]
        print(f"n={n:5d}  eval {r['eval']['forward_ms']:9.2f} ms ({r['eval']['ratio_forward']:.3f}x)  "
              f"ste fwd+bwd {r['ste']['forward_backward_ms']:10.1f} ms ({r['ste']['ratio_forward_backward']:.3f}x)  "
              f"soft fwd+bwd {r['soft']['forward_backward_ms']:10.1f} ms  "
              f"PointNet fwd+bwd {r['backbone']['forward_backward_ms']:9.1f} ms  "
              f"saved ste {r['ste']['saved_mb']:.1f} MB / PointNet {r['backbone']['saved_mb']:.1f} MB", flush=True)

    sizes = sorted(args.sizes)
    growth = None
    if len(sizes) >= 2:
        a, b = sizes[-2], sizes[-1]
        growth = {"between": [a, b], **{
            f"{name}_{key}": exponent(results[str(a)][name][key], results[str(b)][name][key], a, b)
            for name, key in (("eval", "forward_ms"), ("ste", "forward_ms"), ("ste", "forward_backward_ms"),
                              ("soft", "forward_backward_ms"), ("backbone", "forward_backward_ms"))}}
    record = {
        "benchmark": "permutation",
        "title": "S_n canonicalizer: sort vs Sinkhorn against n, beside PointNet",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command_line("scripts/benchmark_permutation.py", list(argv if argv is not None else sys.argv[1:])),
        "environment": environment,
        "conditions": "the 2 shared cores also ran 3 background training jobs (canonical_network.train) throughout",
        "settings": {"sizes": sizes, "batch_size": args.batch_size, "points": "3-D, standard normal",
                     "threads": torch.get_num_threads(), "repeats": args.repeats, "slow_s": args.slow_s,
                     "canonicalizer": "configs/canonicalization/permutation.yaml, in_features=3 (hidden 32, "
                                      "2 layers, temperature 1, 20 Sinkhorn iterations)",
                     "backbone": "prediction.pointnet.PointNet(head='classification'), reference widths",
                     "seed": args.seed},
        "time": "median over calls after one warm-up; calls slower than slow_s measured once, without warm-up",
        "memory": {"saved_mb": "bytes of the tensors autograd saves for backward (saved_tensors_hooks, each "
                               "storage once); 0 without a graph",
                   "peak_mb": "peak resident memory of the call above the resident memory before it (VmHWM after "
                              "writing 5 to /proc/self/clear_refs), page granularity"},
        "ratios": "canonicalizer / backbone, same n, same run: eval to PointNet eval (forward), ste and soft to "
                  "PointNet training (forward, forward + backward, saved memory)",
        "labels": LABELS,
        "results": results,
        "growth_exponent": growth,
        "wall_s": time.perf_counter() - started,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.output} ({record['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
