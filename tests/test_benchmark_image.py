"""scripts/benchmark_image_inference.py: runs end to end on the real configs and reports what it claims."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from canonical_network.utils.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "benchmark_image_inference.py"


def _module():
    spec = importlib.util.spec_from_file_location("benchmark_image_inference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # ~55 s on a busy 2-core machine: `make test-full`
def test_benchmark_p4_writes_json_and_png(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--orders", "4", "--repeats", "2", "--warmup", "1",
                           "--batch-size", "8", "--device", "cpu", "--output", str(out)],
                          capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 1000
    cn, gcnn = result["models"]["cn_p4"], result["models"]["gcnn_p4"]
    # The G-CNN's fields are matched to the CN model's parameter count (Table 1 asks for 5 %).
    assert abs(gcnn["params"] - cn["params"]) <= 0.05 * cn["params"]
    for entry in (cn, gcnn):
        assert len(entry["times_ms"]) == 2 and entry["median_ms"] > 0
        assert entry["build"]["peak_rss_mb"] >= entry["build"]["rss_before_mb"] > 0
        assert entry["build"]["params"] == entry["params"]  # the child built the same model
    assert result["ratios"]["gcnn_p4_over_cn_p4"] == pytest.approx(gcnn["median_ms"] / cn["median_ms"])
    assert result["verdicts"]["cn_p64_over_cn_p4 <= 1.3"].startswith("n/a")
    assert "G-CNN/CN" in proc.stdout


def test_ratios_and_verdicts_from_medians():
    bench = _module()
    medians = {"cn_p4": 10.0, "cn_p64": 12.0, "gcnn_p4": 15.0, "gcnn_p64": 30.0}
    ratio = bench.ratios(medians, [4, 64])
    assert ratio["cn_p64_over_cn_p4"] == pytest.approx(1.2)
    assert ratio["gcnn_p64_over_cn_p64"] == pytest.approx(2.5)
    verdict = bench.verdicts(ratio)
    assert verdict["cn_p64_over_cn_p4 <= 1.3"] == "met"
    assert verdict["gcnn_p64_over_cn_p64 >= 3"] == "NOT met"


@pytest.mark.parametrize("orders", ["4,x", "0,4"])
def test_bad_orders_are_refused_by_name(orders):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--orders", orders], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, timeout=120)
    assert proc.returncode == 2
    assert "--orders" in proc.stderr and orders in proc.stderr
