"""What computing EdgeConv without its edge features saves on a training step and an evaluation batch of DGCNN
and VN-DGCNN at the paper's sizes.

    OMP_NUM_THREADS=1 python scripts/benchmark_edge_conv.py                 # both networks and heads, 3 rounds
    python scripts/benchmark_edge_conv.py --networks dgcnn --heads classification --rounds 1 --output /tmp/e.json

``canonical_network.prediction.dgcnn.edge_conv`` computes a DGCNN EdgeConv block without its ``(B, 2C, P, k)``
edge features: the first 1×1 convolution as two products over the points, and the last leaky ReLU after the max;
``VNEdgeConv`` applies its first layer's two linear maps before the gather in the same way
(``prediction.vn_dgcnn.edge_linear``). Their docstrings say why that is the same function, and
``tests/test_pointcloud_models.py`` checks it. This script measures each against its plain form
(``edge_mlp(graph_feature(x))``, then the max or the pooling) in one process: per network and head, the network at
the reference widths is built twice from the same seed, one copy per form, each with its own SGD (lr 0.1,
momentum 0.9), on one batch of random clouds at the paper's sizes (classification:
32 clouds × 1,024 points, k 20, ModelNet40; segmentation: 16 × 2,048, k 40, ShapeNet-part, the batch
``scripts/protocol_cost.py`` found to fit). Each round times one training step (forward, backward, optimizer) and
one evaluation batch (``eval()``, no graph) of each copy, the order alternating between rounds so that a shared
machine's drifts hit both alike, with ``time.perf_counter`` (one thread), and the peak resident memory of each
training step above the memory before it (``VmHWM`` after writing 5 to ``/proc/self/clear_refs``; ``None`` where
that is not allowed). Per head: median seconds of each, the median of the ratios paired within a round, the
largest peak of each, and how far the two copies' weights and evaluation logits are apart after the steps (not
bit for bit: the two forms round differently). Then, on ``--gradient-batches`` smaller batches, how far each
form's float32 gradients are from the plain form's float64 ones (``gradient_agreement``): rounding reorders
neighbours in the feature-space graphs, so neither form is within float32 precision of float64, and the check
says whether ``edge_conv`` is further off than the plain form.

The record (``--output``, JSON) is what ``python -m canonical_network.docs_blocks`` renders into the
``edge-conv-step`` block of ``docs/measurements.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = PROJECT_ROOT / "docs" / "benchmarks" / "edge_conv_step.json"
#: head → (batch, points, classes or parts, categories)
SIZES = {"classification": (32, 1024, 40, 0), "segmentation": (16, 2048, 50, 16)}
#: clouds a batch of the float64 gradient check (smaller: float64 and the plain form)
GRADIENT_BATCH = {"classification": 8, "segmentation": 2}
#: the two ways of computing the blocks: the paper's code's, and the package's
FORMS = ("plain", "edge_conv")


def _plain_dgcnn(block, x):
    """DGCNN's EdgeConv as written in the paper's code: the edge features, the edge layers, the max."""
    from canonical_network.nn.knn import graph_feature

    return block.edge_mlp(graph_feature(x, block.k)).amax(dim=-1)


def _plain_vn(block, x):
    """VN EdgeConv as written in Deng et al.'s code: the edge features, the VN layers, the pooling."""
    from canonical_network.nn.knn import graph_feature

    return block.pool(block.edge_mlp(graph_feature(x, block.k)))


NETWORKS = ("dgcnn", "vn_dgcnn")


def _classes(network: str):
    """The network's class and its EdgeConv class."""
    if network == "dgcnn":
        from canonical_network.prediction.dgcnn import DGCNN, EdgeConv

        return DGCNN, EdgeConv
    from canonical_network.prediction.vn_dgcnn import VNDGCNN, VNEdgeConv

    return VNDGCNN, VNEdgeConv


@contextlib.contextmanager
def form(network: str, name: str):
    """Run the network's EdgeConv blocks in their ``plain`` form inside (``edge_conv``: as the package does)."""
    _, block = _classes(network)
    package = block.forward
    if name == "plain":
        block.forward = _plain_dgcnn if network == "dgcnn" else _plain_vn
    try:
        yield
    finally:
        block.forward = package


def build(network: str, head: str, seed: int):
    import torch

    cls, _ = _classes(network)
    _, _, outputs, categories = SIZES[head]
    torch.manual_seed(seed)
    return cls(head, num_classes=outputs, num_parts=outputs, num_categories=max(categories, 1))


def measure(network: str, head: str, rounds: int, seed: int) -> dict:
    import torch

    from canonical_network.report_inference import reset_peak, status_mb

    batch, points, outputs, categories = SIZES[head]
    models = {name: build(network, head, seed) for name in FORMS}
    generator = torch.Generator().manual_seed(seed)
    clouds = torch.randn(batch, points, 3, generator=generator)
    clouds = clouds / clouds.norm(dim=-1).amax(dim=1).view(-1, 1, 1)
    if head == "classification":
        category = None
        target = torch.randint(0, outputs, (batch,), generator=generator)
    else:
        category = torch.randint(0, categories, (batch,), generator=generator)
        target = torch.randint(0, outputs, (batch, points), generator=generator)
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) for name, model in models.items()}

    def call(name: str):
        with form(network, name):
            model = models[name]
            return model(clouds) if category is None else model(clouds, category)

    def train_step(name: str) -> tuple[float, float | None]:
        start_rss = reset_peak()
        begin = time.perf_counter()
        models[name].train()
        optimizers[name].zero_grad()
        with form(network, name):  # backward through the same form
            logits = call(name)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, outputs), target.reshape(-1))
            loss.backward()
        optimizers[name].step()
        seconds = time.perf_counter() - begin
        return seconds, None if start_rss is None else max(0.0, status_mb("VmHWM") - start_rss)

    def eval_batch(name: str) -> float:
        begin = time.perf_counter()
        models[name].eval()
        with torch.no_grad():
            call(name)
        return time.perf_counter() - begin

    for name in models:  # warm-up (allocator, oneDNN's first calls)
        torch.manual_seed(seed)
        train_step(name)
    train = {name: [] for name in models}
    peaks = {name: [] for name in models}
    evaluate = {name: [] for name in models}
    for r in range(rounds):
        for name in (FORMS if r % 2 == 0 else FORMS[::-1]):
            torch.manual_seed(seed + 1 + r)  # the same dropout masks for both copies
            seconds, peak = train_step(name)
            train[name].append(seconds)
            peaks[name].append(peak)
            evaluate[name].append(eval_batch(name))
    weights = max((a - b).abs().max().item() for a, b in zip(models["plain"].parameters(),
                                                           models["edge_conv"].parameters(), strict=True))
    with torch.no_grad():
        logits = {name: call(name) for name in models}
    scale = logits["plain"].abs().max().item()

    def paired(times: dict) -> float:
        return statistics.median(a / b for a, b in zip(times["plain"], times["edge_conv"], strict=True))

    def largest(values: list) -> float | None:
        return None if None in values else max(values)

    return {
        "network": network, "head": head, "batch": batch, "points": points, "k": models["plain"].k,
        "plain_train_s": statistics.median(train["plain"]),
        "edge_conv_train_s": statistics.median(train["edge_conv"]),
        "train_ratio": paired(train),
        "plain_eval_s": statistics.median(evaluate["plain"]),
        "edge_conv_eval_s": statistics.median(evaluate["edge_conv"]),
        "eval_ratio": paired(evaluate),
        "plain_peak_mb": largest(peaks["plain"]), "edge_conv_peak_mb": largest(peaks["edge_conv"]),
        "steps": rounds + 1,
        "largest_weight_difference": weights,
        "largest_logit_difference": (logits["plain"] - logits["edge_conv"]).abs().max().item(),
        "logit_scale": scale,
    }


def gradient_agreement(network: str, head: str, seed: int, batch: int) -> dict:
    """How far float32 gradients of each form are from the plain form's in float64, on one training batch of
    ``batch`` clouds at the head's points: the largest relative error (2-norm) over the parameters whose
    float64 gradient is not of rounding size. Both forms round, and a rounding that reorders two nearly
    equidistant neighbours of a feature-space graph moves a gradient by more than float32's precision; the
    question is whether the package's form is further off than the plain one."""
    import copy

    import torch

    _, points, outputs, categories = SIZES[head]
    model = build(network, head, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    clouds = torch.randn(batch, points, 3, generator=generator)
    clouds = clouds / clouds.norm(dim=-1).amax(dim=1).view(-1, 1, 1)
    category = None if head == "classification" else torch.randint(0, categories, (batch,), generator=generator)
    shape = (batch,) if head == "classification" else (batch, points)
    target = torch.randint(0, outputs, shape, generator=generator)

    def gradients(dtype: torch.dtype, name: str) -> dict:
        copied = copy.deepcopy(model).to(dtype).train()
        with form(network, name):
            torch.manual_seed(seed + 2)  # the same dropout masks
            inputs = clouds.to(dtype)
            logits = copied(inputs) if category is None else copied(inputs, category)
            torch.nn.functional.cross_entropy(logits.reshape(-1, outputs), target.reshape(-1)).backward()
        return {n: p.grad.double() for n, p in copied.named_parameters() if p.grad is not None}

    reference = gradients(torch.float64, "plain")
    scale = max(g.abs().max().item() for g in reference.values())
    names = [name for name, g in reference.items() if g.norm() > 1e-6 * scale]

    def worst(grads: dict) -> float:
        return max(((grads[n] - reference[n]).norm() / reference[n].norm()).item() for n in names)

    return {"batch": batch, "plain_float32": worst(gradients(torch.float32, "plain")),
            "edge_conv_float32": worst(gradients(torch.float32, "edge_conv"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=NETWORKS)
    parser.add_argument("--heads", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=3, help="timed steps of each copy (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gradient-batches", type=int, default=3,
                        help="batches (seeds) of the float64 gradient check per head (default 3; 0 skips it)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1; got {args.rounds}")

    import torch

    from canonical_network.report_inference import load_average, timing_record, write_record

    torch.set_num_threads(1)
    load_start = load_average()
    rows = []
    for network in args.networks:
        for head in args.heads:
            row = measure(network, head, args.rounds, args.seed)
            row["gradients"] = [gradient_agreement(network, head, args.seed + 10 * i, GRADIENT_BATCH[head])
                                for i in range(args.gradient_batches)]
            rows.append(row)
            print(f"{network} {head}: training step {row['plain_train_s']:.2f} s plain, "
                  f"{row['edge_conv_train_s']:.2f} s edge_conv (paired ratio {row['train_ratio']:.2f}); evaluation "
                  f"batch {row['plain_eval_s']:.2f} s / {row['edge_conv_eval_s']:.2f} s ({row['eval_ratio']:.2f}); "
                  f"peak {row['plain_peak_mb']} / {row['edge_conv_peak_mb']} MB; float32 gradients against "
                  "float64, largest relative error: "
                  + ", ".join(f"{g['plain_float32']:.2g} plain / {g['edge_conv_float32']:.2g} edge_conv"
                              for g in row["gradients"]), flush=True)
    record = timing_record("scripts/benchmark_edge_conv.py", list(argv if argv is not None else sys.argv[1:]),
                           load_start, rounds=args.rounds, seed=args.seed, rows=rows)
    write_record(args.output, record)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
