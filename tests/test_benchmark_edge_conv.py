"""scripts/benchmark_edge_conv.py at toy sizes: it times both forms of both networks, restores the package's
form, and its record renders into the ``edge-conv-step`` block of docs/measurements.md."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from canonical_network import docs_blocks
from canonical_network.prediction.dgcnn import EdgeConv
from canonical_network.prediction.vn_dgcnn import VNEdgeConv
from canonical_network.utils.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "benchmark_edge_conv.py"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmark_edge_conv", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def record(bench, tmp_path_factory):
    output = tmp_path_factory.mktemp("edge_conv") / "edge.json"
    sizes, batches = bench.SIZES, bench.GRADIENT_BATCH
    # toy clouds (64 points: at least the segmentation head's k = 40 neighbours)
    bench.SIZES = {"classification": (3, 64, 40, 0), "segmentation": (2, 64, 50, 16)}
    bench.GRADIENT_BATCH = {"classification": 2, "segmentation": 2}
    try:
        assert bench.main(["--rounds", "1", "--gradient-batches", "1", "--output", str(output)]) == 0
    finally:
        bench.SIZES, bench.GRADIENT_BATCH = sizes, batches
    return json.loads(output.read_text())


def test_every_network_and_head_is_timed_in_both_forms(record):
    assert [(row["network"], row["head"]) for row in record["rows"]] == [
        ("dgcnn", "classification"), ("dgcnn", "segmentation"),
        ("vn_dgcnn", "classification"), ("vn_dgcnn", "segmentation")]
    assert record["rounds"] == 1 and record["threads"] == 1 and "--rounds 1" in record["command"]
    for row in record["rows"]:
        assert row["steps"] == 2 and row["points"] == 64
        assert row["k"] == (20 if row["head"] == "classification" else 40)
        for key in ("plain_train_s", "edge_conv_train_s", "plain_eval_s", "edge_conv_eval_s"):
            assert row[key] > 0
        assert row["train_ratio"] == pytest.approx(row["plain_train_s"] / row["edge_conv_train_s"])
        # (how far apart the copies end up is reported, not bounded: at toy sizes two SGD steps at lr 0.1
        # already blow the logits up, and rounding with them)
        assert all(math.isfinite(row[key]) for key in ("largest_weight_difference", "largest_logit_difference"))
        [gradients] = row["gradients"]
        assert gradients["batch"] == 2
        assert all(0 <= gradients[key] < math.inf for key in ("plain_float32", "edge_conv_float32"))


def test_the_plain_form_is_the_paper_codes_and_the_package_form_comes_back(bench):
    """Inside ``form(..., "plain")`` the blocks build edge features (a different code path, the same values in
    float64); afterwards, and after an error inside, the package's forward is back."""
    package = EdgeConv.forward, VNEdgeConv.forward
    for network in bench.NETWORKS:
        model = bench.build(network, "classification", seed=0).double().eval()
        clouds = torch.randn(2, 64, 3, generator=torch.Generator().manual_seed(1)).double()
        with torch.no_grad():
            ours = model(clouds)
            with bench.form(network, "plain"):
                assert (EdgeConv.forward, VNEdgeConv.forward) != package
                plain = model(clouds)
        assert (EdgeConv.forward, VNEdgeConv.forward) == package
        assert torch.allclose(ours, plain, rtol=0, atol=1e-9 * ours.abs().max().item())
        with pytest.raises(RuntimeError, match="inside"), bench.form(network, "plain"):
            raise RuntimeError("inside")
        assert (EdgeConv.forward, VNEdgeConv.forward) == package


def test_the_record_renders_into_the_docs_block(record, tmp_path):
    path = tmp_path / "edge.json"
    path.write_text(json.dumps(record))
    lines = docs_blocks.edge_conv_step(path)
    rows = [line for line in lines if line.startswith("| DGCNN") or line.startswith("| VN-DGCNN")]
    assert len(rows) == 4
    assert all(f"{row['train_ratio']:.2f}×" in line for row, line in zip(record["rows"], rows, strict=True))
    assert record["command"] in lines[-1]
