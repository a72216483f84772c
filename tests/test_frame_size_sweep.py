"""scripts/frame_size_sweep.py (issue 38): the commands it builds for each test-time setting, the record it
rebuilds from what finished, and the report's table of it. The subprocesses are stand-ins that write what
``evaluate`` and ``diagnose`` write; the real commands are the ones ``scripts/diagnose_runs.py`` and
``tests/test_symmetrization.py`` exercise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from canonical_network.utils.config import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))

#: test error and ±1° jump rate per (setting, seed) of the stand-in: the larger frame jumps less, errs a little more
ERRORS = {("canonical", 0): 4.0, ("canonical", 1): 5.0, ("weighted_frame_k2", 0): 3.5, ("weighted_frame_k2", 1): 4.3,
          ("weighted_frame_k4", 0): 3.8, ("weighted_frame_k4", 1): 4.7}
JUMPS = {"canonical": (0.06, 0.06), "weighted_frame_k2": (0.04, 0.005), "weighted_frame_k4": (0.008, 0.0)}


def _run(folder: Path, seed: int) -> None:
    folder.mkdir(parents=True)
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "epoch_016.ckpt").write_bytes(b"")
    record = {"experiment": "rotmnist/cn_p4", "status": "completed", "seed": seed, "metrics": {"test/error": 3.5},
              "checkpoint": "checkpoints/epoch_016.ckpt",
              "config": {"canonicalization": {"symmetrization": "weighted_frame", "frame_size": 2,
                                              "frame_weights": "gap", "num_rotations": 8}},
              "overrides": ["experiment=rotmnist/cn_p4", f"seed={seed}", "logger=csv", "trainer.max_epochs=30",
                            "canonicalization.num_rotations=8", "canonicalization.symmetrization=weighted_frame",
                            "canonicalization.frame_size=2"]}
    (folder / "results.json").write_text(json.dumps(record))


def _stand_in(calls: list[list[str]]):
    def call(command, **_):
        calls.append(command)
        value = dict(c.split("=", 1) for c in command if "=" in c and not c.startswith("-"))
        into = Path(value["hydra.run.dir"])
        mode = value["canonicalization.symmetrization"]
        size = int(value.get("canonicalization.frame_size", 0))
        setting = f"{mode}_k{size}" if mode == "weighted_frame" else mode
        seed = int(value["seed"])
        into.mkdir(parents=True, exist_ok=True)
        if "canonical_network.evaluate" in command:
            config = {"canonicalization": {"symmetrization": mode, "frame_size": size or 2, "num_rotations": 8}}
            (into / "results.json").write_text(json.dumps({
                "experiment": "rotmnist/cn_p4", "status": "evaluated", "checkpoint": value["ckpt_path"],
                "metrics": {"test/error": ERRORS[(setting, seed)]}, "config": config}))
        else:
            jumps, with_change = JUMPS[setting]
            (into / "diagnostics.json").write_text(json.dumps({"inputs": {"num_samples": 128}, "continuity": {
                "by_perturbation": {"rotation": {"jump_rate": jumps, "jump_with_element_change_rate": with_change,
                                                 "jump_without_element_change_rate": jumps - with_change,
                                                 "element_change_rate": 0.06, "mean_rel": 0.03}}}}))
        return 0

    return call


def test_the_settings_and_their_commands():
    from frame_size_sweep import evaluate_command, settings

    assert settings([1, 2, 4], full=True) == [("canonical", None), ("weighted_frame", 2), ("weighted_frame", 4),
                                               ("full", None)]
    command = evaluate_command(Path("ck.ckpt"), 1, "weighted_frame", 3, Path("out/x"), python="python")
    assert command[:3] == ["python", "-m", "canonical_network.evaluate"]
    assert {"ckpt_path=ck.ckpt", "canonicalization.symmetrization=weighted_frame", "canonicalization.frame_size=3",
            "seed=1", "hydra.run.dir=out/x"} <= set(command)
    assert not any("frame_size" in c for c in evaluate_command(Path("c"), 0, "canonical", None, Path("o")))


def test_the_diagnosis_keeps_the_run_and_takes_the_setting(tmp_path):
    from frame_size_sweep import sweep_diagnose_command

    run = tmp_path / "rotmnist" / "cn_p4" / "c8_sym_weighted_frame_ep30" / "seed0"
    _run(run, 0)
    record = json.loads((run / "results.json").read_text())
    command = sweep_diagnose_command(run, record, 64, "weighted_frame", 4, tmp_path / "d", python="python")
    assert "canonicalization.num_rotations=8" in command  # the run's own model
    assert [c for c in command if c.startswith("canonicalization.frame_size=")] == ["canonicalization.frame_size=4"]
    assert [c for c in command if c.startswith("hydra.run.dir=")] == [f"hydra.run.dir={tmp_path / 'd'}"]
    canonical = sweep_diagnose_command(run, record, 64, "canonical", None, tmp_path / "c")
    assert "canonicalization.symmetrization=canonical" in canonical
    assert not any(c.startswith("canonicalization.frame_size=") for c in canonical)


def test_the_sweep_resumes_writes_nothing_into_the_runs_and_the_report_shows_it(tmp_path, monkeypatch):
    import frame_size_sweep

    from canonical_network.report_symmetrization import SWEEP_FILE, render_frame_size_sweep

    root = tmp_path / "runs"
    for seed in (0, 1):
        _run(root / "rotmnist" / "cn_p4" / "c8_sym_weighted_frame_ep30" / f"seed{seed}", seed)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    calls: list[list[str]] = []
    monkeypatch.setattr(frame_size_sweep.subprocess, "call", _stand_in(calls))
    out, record_file = tmp_path / "sweep", tmp_path / "bench" / SWEEP_FILE
    args = [str(root), "--sizes", "1", "2", "4", "--out", str(out), "--record", str(record_file)]
    assert frame_size_sweep.main(args) == 0
    assert len(calls) == 2 * 3 * 2  # seeds × settings × (evaluate, diagnose)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # the run folders are untouched
    assert frame_size_sweep.main(args) == 0 and len(calls) == 12  # finished steps are skipped
    record = json.loads(record_file.read_text())
    assert record["command"] == (f"python scripts/frame_size_sweep.py {root} --sizes 1 2 4 --out {out} "
                                 f"--record {record_file}")
    row = record["rows"]["rotmnist/cn_p4/c8_sym_weighted_frame_ep30"]
    assert row["trained"]["frame_size"] == 2 and set(row["settings"]) == {"canonical", "weighted_frame_k2",
                                                                           "weighted_frame_k4"}
    assert row["settings"]["weighted_frame_k4"]["passes"] == 4 and row["settings"]["canonical"]["passes"] == 1
    assert row["settings"]["canonical"]["seeds"]["1"]["test"]["test/error"] == 5.0
    lines = render_frame_size_sweep(record_file.parent)
    table = {line.split(" | ")[0]: line.split(" | ") for line in lines if line.startswith("| ") and "---" not in line}
    assert table["| weighted frame, k = 2 *(as trained)*"][3] == "–"
    # canonical − trained per seed: +0.5, +0.7: mean +0.60, paired half-width 12.71 · 0.1414 / √2 = 1.27
    assert table["| canonical (one element)"][2] == "4.50 ± 6.4 (2)"
    assert table["| canonical (one element)"][3] == "+0.60 ± 1.27 (not resolved)"
    assert table["| weighted frame, k = 4"][4:7] == ["0.8 ± 0 (2)", "0.0 ± 0 (2)", "0.8 ± 0 (2)"]
    assert render_frame_size_sweep(tmp_path / "nothing") == []


def test_bad_sizes_are_refused(tmp_path, capsys):
    import frame_size_sweep

    with pytest.raises(SystemExit):
        frame_size_sweep.main([str(tmp_path), "--sizes", "0", "2"])
    assert "--sizes must be >= 1" in capsys.readouterr().err
