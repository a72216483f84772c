"""scripts/benchmark_symmetrization.py: one small setup, one round, the record's structure and its fixed points."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from canonical_network import docs_blocks
from canonical_network.utils.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "benchmark_symmetrization.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmark_symmetrization", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture(scope="module")
def record(bench, tmp_path_factory):
    output = tmp_path_factory.mktemp("symmetrization") / "cost.json"
    assert bench.main(["--families", "rotmnist_c8", "--rounds", "1", "--output", str(output)]) == 0
    return json.loads(output.read_text())


def test_the_record_describes_its_run(record):
    assert record["rounds"] == 1
    assert record["threads"] == 1
    assert record["frame_size"] == 2
    assert "--families rotmnist_c8" in record["command"]
    assert record["machine"] and record["date"].count("-") == 2
    assert isinstance(record["load_start"], float) and isinstance(record["load_end"], float)
    assert list(record["setups"]) == ["rotmnist/cn_p4 (C8)"]  # only the setup asked for


def test_each_mode_is_timed_against_canonical_of_the_same_round(record):
    setup = record["setups"]["rotmnist/cn_p4 (C8)"]
    assert setup["canonicalizer"] == "GCNNCanonicalizer"
    assert setup["batch_size"] == 128 and setup["input_shapes"] == [[128, 1, 28, 28]]  # the config's batch
    modes = setup["modes"]
    assert list(modes) == ["canonical", "weighted_frame", "sampled", "full"]
    assert modes["canonical"]["ratio"] == 1.0
    assert modes["canonical"]["ratio_q1"] == modes["canonical"]["ratio_q3"] == 1.0
    for mode in modes.values():
        assert len(mode["times_s"]) == 1 and mode["seconds_per_batch"] > 0
        assert mode["seconds_per_input"] == pytest.approx(mode["seconds_per_batch"] / 128)
        # one round: the ratio is that round's own quotient
        assert mode["ratio"] == pytest.approx(mode["times_s"][0] / modes["canonical"]["times_s"][0])
    # the predictor passes, read off the frames built: 1, frame_size, |G| = 8
    assert setup["group_order"] == 8
    assert [modes[m]["k"] for m in ("canonical", "weighted_frame", "sampled", "full")] == [1, 2, 2, 8]
    # eight predictor passes cost more than one (a loose bound: the machine may be shared)
    assert modes["full"]["ratio"] > 2


def test_the_docs_block_renders_the_record(record):
    lines = docs_blocks.symmetrization_cost_table(record)
    rows = [line for line in lines if line.startswith("| ")][1:]
    assert len(rows) == 4
    assert rows[0].startswith("| `rotmnist/cn_p4` (C8) | `canonical` | 1 |") and "1.00× [1.00, 1.00]" in rows[0]
    assert rows[3].startswith("|  | `full` | 8 |")
    assert record["command"] in lines[-1]


def test_quartiles(bench):
    assert bench.quartiles([2.0]) == [2.0, 2.0, 2.0]
    assert bench.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == [2.0, 3.0, 4.0]


def test_rounds_must_be_positive(bench, tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0", "--output", str(tmp_path / "x.json")])
