"""scripts/diagnose_runs.py and the diagnosis a run keeps: the command it builds from a run's record, the copy
``collect_runs`` keeps, and the ``diagnose/*`` metrics the report reads from it (issue 38)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from canonical_network.records import DIAGNOSIS_FILE, diagnosed_metrics, load_runs, metric_info
from canonical_network.utils.config import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))

DIAGNOSIS = {
    "continuity": {"max_rel": 0.9, "mean_rel": 0.03, "jump": 0.1, "jump_rate": 0.035,
                   "by_perturbation": {"rotation": {"max_rel": 0.9, "mean_rel": 0.03, "jump_rate": 0.035,
                                                    "element_change_rate": 0.03125},
                                       "jitter": {"max_rel": 0.05, "mean_rel": 0.009, "jump_rate": 0.0,
                                                  "element_change_rate": 0.03}}},
    "equivariance": {"exact": {"max_rel": 2e-15}},
}


def _run(folder, status="completed", diagnosis=DIAGNOSIS):
    folder.mkdir(parents=True)
    record = {"experiment": "rotmnist/cn_p16", "status": status, "seed": 2, "metrics": {"test/error": 5.0},
              "checkpoint": "checkpoints/epoch_028.ckpt",
              "overrides": ["experiment=rotmnist/cn_p16", "seed=2", "logger=csv", "~callbacks.rich_progress_bar",
                            "trainer.max_epochs=30", "canonicalization.symmetrization=weighted_frame",
                            "hydra.run.dir=outputs/x"]}
    (folder / "results.json").write_text(json.dumps(record))
    if diagnosis is not None:
        (folder / "diagnose").mkdir()
        (folder / DIAGNOSIS_FILE).write_text(json.dumps(diagnosis) if isinstance(diagnosis, dict) else diagnosis)
    return record


def test_the_command_keeps_the_model_and_drops_how_the_run_was_logged(tmp_path):
    from diagnose_runs import diagnose_command

    run = tmp_path / "rotmnist" / "cn_p16" / "sym_weighted_frame_ep30" / "seed2"
    record = _run(run, diagnosis=None)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "epoch_028.ckpt").write_bytes(b"")
    command = diagnose_command(run, record, 64, python="python")
    assert command[:3] == ["python", "-m", "canonical_network.diagnose"]
    assert "experiment=rotmnist/cn_p16" in command and "canonicalization.symmetrization=weighted_frame" in command
    assert f"ckpt_path={run / 'checkpoints' / 'epoch_028.ckpt'}" in command
    assert f"hydra.run.dir={run / 'diagnose'}" in command and "seed=2" in command
    assert "diagnose.num_samples=64" in command and "logger=none" in command
    # the training run's logging, budget and folder are not the diagnosis's
    assert not any(c.startswith(("logger=csv", "trainer.", "~callbacks", "hydra.run.dir=outputs")) for c in command)


def test_the_report_reads_a_runs_diagnosis_as_its_metrics(tmp_path):
    _run(tmp_path / "a" / "seed0")
    _run(tmp_path / "b" / "seed0", diagnosis=None)
    _run(tmp_path / "c" / "seed0", diagnosis="{not json")
    runs = {r["path"].split("/")[-3]: r for r in load_runs(tmp_path)}
    assert runs["a"]["metrics"]["diagnose/rotation/jump_rate"] == 0.035
    assert runs["a"]["metrics"]["diagnose/jitter/mean_rel"] == 0.009
    assert runs["a"]["metrics"]["diagnose/equivariance_max_rel"] == 2e-15
    assert runs["a"]["metrics"]["test/error"] == 5.0
    assert not any(k.startswith("diagnose/") for k in runs["b"]["metrics"])  # no diagnosis: no figures
    assert not any(k.startswith("diagnose/") for k in runs["c"]["metrics"])  # unreadable: skipped, not fatal
    assert diagnosed_metrics(tmp_path / "missing") == {}
    assert metric_info("diagnose/rotation/jump_rate").unit == "fraction"
    assert metric_info("diagnose/jitter/mean_rel").lower_is_better


def test_collect_keeps_the_diagnosis_with_the_record(tmp_path):
    from collect_runs import collect

    _run(tmp_path / "src" / "rotmnist" / "cn_p16" / "v" / "seed0")
    collect(tmp_path / "src", tmp_path / "dst")
    kept = tmp_path / "dst" / "rotmnist" / "cn_p16" / "v" / "seed0"
    assert json.loads((kept / DIAGNOSIS_FILE).read_text()) == DIAGNOSIS
    assert diagnosed_metrics(kept)["diagnose/rotation/element_change_rate"] == 0.03125


def _fake_diagnose(calls, figures):
    """A stand-in for the diagnose subprocess: records the call, writes a current-format diagnosis into the
    command's ``hydra.run.dir``."""

    def call(command, **_):
        from canonical_network.records import DIAGNOSIS_FORMAT

        calls.append(command)
        into = next(c.split("=", 1)[1] for c in command if c.startswith("hydra.run.dir="))
        (Path(into)).mkdir(parents=True, exist_ok=True)
        (Path(into) / "diagnostics.json").write_text(json.dumps({"format": DIAGNOSIS_FORMAT, **figures}))
        return 0

    return call


def test_upgrade_diagnoses_an_older_format_again_into_a_folder_of_its_own(tmp_path, monkeypatch):
    import diagnose_runs

    from canonical_network.records import diagnosis_files

    src = tmp_path / "src"
    run = src / "rotmnist" / "cn_p16" / "sym_canonical_ep30" / "seed2"
    _run(run)  # its diagnosis predates the format field: format 1
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "epoch_028.ckpt").write_bytes(b"")
    first = (run / DIAGNOSIS_FILE).read_text()
    newer = {"continuity": {"by_perturbation": {"rotation": {
        "jump_rate": 0.05, "element_change_rate": 0.04, "jump_with_element_change_rate": 0.01,
        "jump_without_element_change_rate": 0.04, "mean_rel": 0.02, "max_rel": 0.5}}}}
    calls = []
    monkeypatch.setattr(diagnose_runs.subprocess, "call", _fake_diagnose(calls, newer))
    assert diagnose_runs.main([str(src), "--match", "*/*/*/seed*"]) == 0
    assert calls == []  # diagnosed already: without --upgrade nothing runs
    assert diagnose_runs.main([str(src), "--match", "*/*/*/seed*", "--upgrade"]) == 0
    assert len(calls) == 1 and f"hydra.run.dir={run / 'diagnose-2'}" in calls[0]
    assert (run / DIAGNOSIS_FILE).read_text() == first  # the earlier diagnosis is kept as it was
    assert [p.parent.name for p in diagnosis_files(run)] == ["diagnose", "diagnose-2"]
    assert diagnose_runs.main([str(src), "--match", "*/*/*/seed*", "--upgrade"]) == 0
    assert len(calls) == 1  # the newest diagnosis is current: resumed, not repeated
    # the report reads the newest diagnosis, with the jump rate split by element change
    metrics = diagnosed_metrics(run)
    assert metrics["diagnose/rotation/jump_rate"] == 0.05
    assert metrics["diagnose/rotation/jump_without_element_change_rate"] == 0.04
    assert "diagnose/jitter/jump_rate" not in metrics  # the older diagnosis's figures are not mixed in
    # and collect keeps both
    from collect_runs import collect

    collect(src, tmp_path / "kept")
    kept = tmp_path / "kept" / run.relative_to(src)
    assert (kept / DIAGNOSIS_FILE).read_text() == first
    assert diagnosed_metrics(kept) == metrics


def test_a_run_another_process_diagnoses_is_left_to_it(tmp_path, monkeypatch):
    """Two symmetrization lanes walk the same runs: both used to start the same diagnosis into the same folder.
    A run whose claim is held is skipped as busy; once free, a diagnosis finished meanwhile is seen under the
    claim and not repeated."""
    import diagnose_runs

    from canonical_network.records import DIAGNOSIS_FORMAT
    from tests.helpers import hold_lock

    src = tmp_path / "src"
    run = src / "rotmnist" / "cn_p16" / "sym_canonical_ep30" / "seed2"
    _run(run, diagnosis=None)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "epoch_028.ckpt").write_bytes(b"")
    calls = []
    monkeypatch.setattr(diagnose_runs.subprocess, "call", _fake_diagnose(calls, {"format": DIAGNOSIS_FORMAT}))
    claim = diagnose_runs.claim_path(src, run)
    claim.parent.mkdir(parents=True)
    with hold_lock(claim):
        assert diagnose_runs.main([str(src), "--match", "*/*/*/seed*"]) == 0
    assert calls == []
    assert diagnose_runs.main([str(src), "--match", "*/*/*/seed*"]) == 0
    assert len(calls) == 1 and (run / DIAGNOSIS_FILE).is_file()
