"""scripts/shapes40_difficulty.py: its descriptor is invariant to turns about z (and only to those), it learns
the embedded shapes end to end, it finds exactly the DGCNN runs of a setting, and the docs block renders its record."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest

from canonical_network import docs_blocks
from canonical_network.data.synthetic_shapes40 import generate_synthetic_shapes40
from canonical_network.utils.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "shapes40_difficulty.py"


def _module():
    spec = importlib.util.spec_from_file_location("shapes40_difficulty", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rotation(axis: int, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    i, j = [k for k in range(3) if k != axis]
    r = np.eye(3)
    r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
    return r


@pytest.fixture(scope="module")
def clouds() -> np.ndarray:
    return generate_synthetic_shapes40(40, 256, seed=0)["points"].astype(np.float64)


def test_descriptor_is_invariant_to_turns_about_z_and_not_to_tilts(clouds):
    script = _module()
    reference = script.features(clouds)
    rng = np.random.default_rng(0)
    # float64 throughout: each entry is a norm, quantile, mean or eigenvalue of at most P = 256 terms of size <= 4
    # (clouds in the unit sphere up to noise), so rounding moves it by at most ~P * eps * 4 ~ 2.3e-13
    tolerance = clouds.shape[1] * np.finfo(np.float64).eps * 4 * 100  # x100: the quantiles' and eigh's own steps
    for angle in rng.uniform(0, 2 * math.pi, 4):
        turned = clouds @ _rotation(2, angle).T
        assert np.abs(script.features(turned) - reference).max() < tolerance
    # negative controls, the same check: a tilt (a turn about x) moves the descriptor, and so does a turn about z
    # for the raw x-coordinate's quantiles, a feature that is not invariant
    tilted = clouds @ _rotation(0, 0.7).T
    assert np.abs(script.features(tilted) - reference).max() > 1e-2
    turned = clouds @ _rotation(2, 0.7).T
    raw = np.quantile(clouds[..., 0], script.QUANTILES, axis=1)
    assert np.abs(np.quantile(turned[..., 0], script.QUANTILES, axis=1) - raw).max() > 1e-2


def test_descriptor_chunks_agree_and_bad_shapes_are_named(clouds):
    script = _module()
    assert np.array_equal(script.features(clouds, chunk=7), script.features(clouds, chunk=64))
    with pytest.raises(ValueError, match=r"\(N, P, 3\)"):
        script.features(clouds[..., :2])
    with pytest.raises(ValueError, match="at least 8 points"):
        script.features(clouds[:, :4])
    with pytest.raises(ValueError, match="N >= 1"):
        script.features(clouds[:0])


@pytest.fixture(scope="module")
def data_configs() -> dict[str, dict]:
    script = _module()
    return {name: script.data_config(overrides) for name, overrides in script.SETTINGS.items()}


def _record(run_dir, data: dict, experiment="modelnet/dgcnn", status="completed", seed=0, acc=0.5, **changes):
    run_dir.mkdir(parents=True)
    record = {"experiment": experiment, "status": status, "seed": seed, "epochs": 5, "overrides": [str(run_dir.name)],
              "metrics": {"test/acc": acc}, "fit_time_s": 1.0, "environment": {"machine": "test"},
              "config": {"data": {**data, **changes}}}
    (run_dir / "results.json").write_text(json.dumps(record))


def test_finds_exactly_the_settings_dgcnn_runs(tmp_path, data_configs):
    script = _module()
    s40 = data_configs["shapes40_256"]
    _record(tmp_path / "a" / "seed0", s40, acc=0.61)
    _record(tmp_path / "a" / "seed1", s40, seed=1, acc=0.63, batch_size=16)  # a loader setting: the same clouds
    _record(tmp_path / "copy" / "seed0", s40, acc=0.61)  # the committed copy of seed 0: counted once
    (tmp_path / "copy" / "seed0" / "results.json").write_text(
        (tmp_path / "a" / "seed0" / "results.json").read_text())
    _record(tmp_path / "b" / "so3", s40, rotation="so3/so3")
    _record(tmp_path / "b" / "pts1024", s40, num_points=1024)
    _record(tmp_path / "b" / "n4000", s40, num_train=4000)
    _record(tmp_path / "b" / "knob", s40, part_dropout=0.6)  # another difficulty: not the setting's data
    _record(tmp_path / "b" / "data_seed", s40, data_seed=1)
    _record(tmp_path / "b" / "failed", s40, status="failed")
    _record(tmp_path / "b" / "cn", s40, experiment="modelnet/cn_nl_dgcnn")
    _record(tmp_path / "b" / "seven", data_configs["shapes7_256"])
    found = script.dgcnn_runs([tmp_path, tmp_path / "missing"], s40)
    assert [(r["seed"], r["test_acc"]) for r in found] == [(0, 0.61), (1, 0.63)]
    seven = script.dgcnn_runs([tmp_path], data_configs["shapes7_256"])
    assert [r["record"].endswith("seven/results.json") for r in seven] == [True]
    assert script.dgcnn_runs([tmp_path], data_configs["shapes40_1024"]) == []  # 1,024 points *and* 4,000 clouds
    knob = script.data_config((*script.SETTINGS["shapes40_256"], "data.part_dropout=0.6"))
    assert [r["record"].endswith("knob/results.json") for r in script.dgcnn_runs([tmp_path], knob)] == [True]


def test_end_to_end_learns_the_shapes_and_renders(tmp_path, capsys):
    script = _module()
    out = tmp_path / "difficulty.json"
    tiny = ["data.num_train=70", "data.num_val=7", "data.num_test=70", "data.num_points=64"]
    assert script.main(["--settings", "shapes7_256", "--seeds", "0", "1", "--trees", "20", "--extra", *tiny,
                        "--runs", str(tmp_path / "none"), "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    row = record["settings"]["shapes7_256"]
    assert (row["classes"], row["points"], row["train"], row["test"]) == (7, 64, 70, 70)
    assert row["overrides"][-4:] == tiny and row["extra"] == tiny and row["dgcnn_runs"] == []
    # chance is 1/7: 35 of 70 right by chance has probability < 1e-9, so passing needs the descriptor to separate
    assert len(row["accuracy"]) == 2 and min(row["accuracy"]) >= 0.5
    lines = docs_blocks.shapes40_difficulty(out)
    assert lines[2].startswith("| 7 classes") and "none yet" in lines[2] and "n 2" in lines[2]
    assert "scripts/shapes40_difficulty.py" in lines[-1]
    # a kept run with a knob moved is a row of the second table, its override named
    knob = tmp_path / "difficulty_knob_part_dropout_0.5.json"
    record["settings"]["shapes7_256"]["extra"] = ["data.part_dropout=0.5"]
    knob.write_text(json.dumps(record))
    lines = docs_blocks.shapes40_difficulty(out)
    assert "`data.part_dropout=0.5`" in lines[-1] and "n 2" in lines[-1] and "none yet" in lines[-1]
    assert row["data"]["num_points"] == 64 and "batch_size" not in row["data"]  # the clouds' recipe, not the loader's


def _committed_records(script) -> list:
    """The committed difficulty records: the main one and each knob row's."""
    return [script.DEFAULT_OUTPUT, *sorted(script.DEFAULT_OUTPUT.parent.glob("shapes40_difficulty_knob_*.json"))]


def test_committed_records_describe_the_data_of_todays_defaults():
    """Every committed record (the main one and each knob row) was made on the data its overrides compose to
    today: a record made before the generator's defaults moved would show another set's accuracy under a row
    that names today's defaults. Rerun the script's command (docs/measurements.md) when this fails."""
    script = _module()
    records = _committed_records(script)
    assert len(records) > 1
    for path in records:
        for name, row in json.loads(path.read_text())["settings"].items():
            today = {k: v for k, v in script.data_config(row["overrides"]).items() if k not in script.LOADER_KEYS}
            assert row.get("data") == today, f"{path.name}, setting {name}: made on other data than today's {today}"


def test_bad_extra_overrides_are_named(capsys):
    script = _module()
    with pytest.raises(SystemExit):
        script.main(["--extra", "trainer.max_epochs=3"])
    assert "trainer.max_epochs=3" in capsys.readouterr().err


def test_committed_records_list_every_committed_dgcnn_run_of_their_data():
    """A DGCNN run committed after a record was made must not leave the record's DGCNN column behind ("none yet"
    beside a finished run): every row lists exactly the committed runs on its data (runs found under outputs/ on
    the machine that made it may come on top). Rerun the script's command (docs/measurements.md) when this fails."""
    script = _module()
    runs = script.PROJECT_ROOT / "docs" / "reproduction" / "runs"
    records = _committed_records(script)
    for path in records:
        for name, row in json.loads(path.read_text())["settings"].items():
            data = script.data_config(row["overrides"])
            committed = sorted(r["record"] for r in script.dgcnn_runs([runs], data))
            listed = sorted(r["record"] for r in row["dgcnn_runs"] if r["record"].startswith("docs/reproduction/runs"))
            assert listed == committed, f"{path.name}, setting {name}: lists {listed}, committed {committed}"
