"""A run folder is an append-only record (issue 32 §2): a refused, failed or restarted rerun never rewrites
or replaces what a run left there."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from canonical_network.records import ATTEMPTS_DIR, RESULTS_FILE, load_runs
from canonical_network.train import RunFolderFinished, run, write_failure
from canonical_network.utils.config import PROJECT_ROOT
from tests.helpers import compose_config, shrink

ROW = ["experiment=rotmnist/cnn"]


def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    folder = tmp_path_factory.mktemp("finished")
    run(shrink(compose_config(ROW, folder)))
    return folder


@pytest.mark.parametrize("completed", [True, False])
def test_bad_value_rerun_leaves_the_record_alone(finished, tmp_path, completed):
    """A rerun with a bad value (CLI, so Hydra runs) refuses and rewrites nothing: no .hydra/config.yaml
    with lr=abc, no results.json replaced, in a finished folder or in one whose run was stopped."""
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(finished, folder)
    if not completed:
        (folder / RESULTS_FILE).unlink()
    before = snapshot(folder)
    result = subprocess.run(
        [sys.executable, "-m", "canonical_network.train", *ROW, "model.optimizer.lr=abc", "logger=none",
         f"hydra.run.dir={folder}"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert "model.optimizer.lr must be a number > 0; got 'abc'" in result.stderr
    assert snapshot(folder) == before


def test_a_failed_attempt_never_replaces_a_completed_record(finished, tmp_path):
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(finished, folder)
    completed = (folder / RESULTS_FILE).read_text()
    write_failure(compose_config(ROW, folder), RuntimeError("every checkpoint unreadable"))
    assert (folder / RESULTS_FILE).read_text() == completed  # readers still find the completed run
    (attempt,) = (folder / ATTEMPTS_DIR).iterdir()
    assert json.loads(attempt.read_text())["error"] == "RuntimeError: every checkpoint unreadable"
    assert [r["status"] for r in load_runs(folder)] == ["completed"]  # the attempt is not a second run


def test_every_failed_attempt_is_kept(tmp_path):
    cfg = compose_config(ROW, tmp_path)
    write_failure(cfg, RuntimeError("first"))
    write_failure(cfg, RuntimeError("second"))
    attempts = sorted(json.loads(p.read_text())["error"] for p in (tmp_path / ATTEMPTS_DIR).iterdir())
    assert attempts == ["RuntimeError: first", "RuntimeError: second"]
    assert json.loads((tmp_path / RESULTS_FILE).read_text())["error"] == "RuntimeError: second"  # the latest


def test_rerun_of_a_moved_folder_with_unreadable_checkpoints_is_refused_untouched(finished, tmp_path):
    import shutil

    folder = tmp_path / "moved"
    shutil.copytree(finished, folder)
    for path in (folder / "checkpoints").glob("*.ckpt"):
        path.write_bytes(b"not a checkpoint")
    before = snapshot(folder)
    with pytest.raises(RunFolderFinished, match="holds a completed run"):
        run(shrink(compose_config(ROW, folder)))
    assert snapshot(folder) == before


def test_resume_false_sets_the_old_run_aside(tmp_path):
    """resume=false in a folder an unfinished run used starts clean: the old files move to superseded/, and
    a later plain rerun resumes the new run, not the old one."""
    cfg = shrink(compose_config(ROW, tmp_path))
    run(cfg)
    (tmp_path / RESULTS_FILE).unlink()  # as if it was stopped before its test
    old_last = (tmp_path / "checkpoints" / "last.ckpt").read_bytes()
    fresh = shrink(compose_config([*ROW, "resume=false", "seed=3"], tmp_path))
    results = run(fresh)
    assert results["resumed_from"] is None and results["seed"] == 3
    (aside,) = (tmp_path / "superseded").iterdir()
    assert (aside / "checkpoints" / "last.ckpt").read_bytes() == old_last
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("last")) == ["last.ckpt"]
    assert len(load_runs(tmp_path)) == 1  # the set-aside files hold no second results.json


def test_an_exploded_run_is_recorded_as_diverged_and_never_pooled(tmp_path):
    """lr=1e6 gives a finite but exploded loss: the record says diverged (with why), readers skip it, and the
    folder is final like a completed one. The default learning rate on the same data is not flagged."""
    from canonical_network.records import DIVERGED

    exploded = run(shrink(compose_config([*ROW, "model.optimizer.lr=1e6"], tmp_path / "exploded")))
    assert exploded["status"] == DIVERGED
    assert "untrained model" in exploded["divergence"] or "not finite" in exploded["divergence"]
    assert json.loads((tmp_path / "exploded" / RESULTS_FILE).read_text())["status"] == DIVERGED
    fine = run(shrink(compose_config(ROW, tmp_path / "fine")))
    assert fine["status"] == "completed" and "divergence" not in fine
    assert sorted(r["status"] for r in load_runs(tmp_path)) == ["completed", DIVERGED]  # tables take completed
    with pytest.raises(RunFolderFinished, match="holds a diverged run"):
        run(shrink(compose_config([*ROW, "model.optimizer.lr=1e6"], tmp_path / "exploded")))


def test_divergence_criterion():
    from canonical_network.tasks.callbacks import DivergenceMonitor

    monitor = DivergenceMonitor(factor=10)
    monitor.initial_loss = 2.3
    assert monitor.verdict(0.1, {"test/loss": 0.4}) is None
    assert "not finite at epoch 3" in DivergenceMonitor.verdict(
        type("M", (), {"nonfinite_epoch": 3, "initial_loss": 2.3, "factor": 10.0})(), 0.1, {})
    assert monitor.verdict(2.5, {"test/loss": 2.4}) is None  # learned nothing: a floor, not a divergence
    assert "exceeds 10 x" in monitor.verdict(6e18, {})
    assert monitor.verdict(0.1, {"test/loss": 30.0}) is None  # batch norm after a few batches: not a divergence
    assert "not finite: test/error" in monitor.verdict(0.1, {"test/error": float("nan")})
    with pytest.raises(ValueError, match="callbacks.divergence.factor"):
        DivergenceMonitor(factor=1)
