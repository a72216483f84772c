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


# ------------------------------------------------------------------------- code version and paths (issue 34)

def _git_head() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_record_carries_its_code_version_and_paths_relative_to_the_project_root(tmp_path, monkeypatch):
    """results.json names the commit that ran it, and its folder and checkpoint relative to the project root
    (here a stand-in root, so that nothing is written into the repository), which readers resolve back."""
    from canonical_network import records
    from canonical_network.utils.runs import code_version

    code_version.cache_clear()  # as in a fresh process: read when the run sets up
    monkeypatch.setattr(records, "PROJECT_ROOT", tmp_path)
    before = _git_head()
    results = run(shrink(compose_config(ROW, tmp_path / "outputs" / "row")))
    after = _git_head()  # another commit may land while it trains: the run's HEAD is one of the two
    written = json.loads((tmp_path / "outputs" / "row" / RESULTS_FILE).read_text())
    assert written == results
    version = written["code_version"]
    assert set(version) == {"commit", "dirty", "package"}
    assert version["commit"] in {before, after} and len(version["commit"]) == 40
    assert isinstance(version["dirty"], bool) and version["package"]
    assert written["run_dir"] == "outputs/row"
    # a file inside the run folder is relative to it (the record means the same file wherever it is copied)
    assert written["checkpoint"].startswith("checkpoints/epoch_")
    run_dir = records.path_from_record(written["run_dir"])
    assert records.path_from_record(written["checkpoint"], run_dir) == run_dir / written["checkpoint"]
    assert (run_dir / written["checkpoint"]).is_file()
    assert records.path_from_record(written["run_dir"]) == tmp_path / "outputs" / "row"
    (flat,) = load_runs(tmp_path)  # tables and report read it as code_version.<key>, as environment.<key>
    assert flat["code_version.commit"] == version["commit"] and flat["code_version.dirty"] == version["dirty"]


def test_paths_below_the_project_root_are_relative_and_others_absolute(tmp_path):
    from canonical_network.records import path_for_record, path_from_record

    assert path_for_record(PROJECT_ROOT / "outputs" / "runs" / "x") == "outputs/runs/x"
    assert path_from_record("outputs/runs/x") == PROJECT_ROOT / "outputs" / "runs" / "x"
    assert path_for_record(tmp_path / "x") == str(tmp_path / "x")  # tmp_path lies outside the repository
    assert path_from_record(str(tmp_path / "x")) == tmp_path / "x"
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert path_for_record(run / "checkpoints" / "last.ckpt", run) == "checkpoints/last.ckpt"
    assert path_from_record("checkpoints/last.ckpt", run) == run / "checkpoints" / "last.ckpt"
    # a file outside the run folder keeps the project-relative (or absolute) form
    assert path_for_record(PROJECT_ROOT / "outputs" / "a.ckpt", run) == "outputs/a.ckpt"
    assert path_from_record("outputs/a.ckpt", run) == PROJECT_ROOT / "outputs" / "a.ckpt"


@pytest.mark.parametrize("why", ["no git", "another repository", "installed wheel"])
def test_without_git_the_code_version_is_null_but_the_package_version(tmp_path, monkeypatch, why):
    """No git on the machine, a source tree inside someone else's repository (an unpacked sdist), or an
    installed wheel (no checkout: the working directory may be another repository): commit and dirty are null,
    not another repository's; the package version is there. A failed run's record carries it too."""
    from importlib.metadata import version

    from canonical_network.utils import runs

    if why == "no git":
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    else:  # someone else's repository, with a commit that must not be reported as ours
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
        subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-q", "--allow-empty", "-m",
                        "theirs"], cwd=tmp_path, check=True)
    if why == "another repository":
        monkeypatch.setattr(runs, "CHECKOUT_ROOT", tmp_path / "sdist")
        (tmp_path / "sdist").mkdir(parents=True)
    elif why == "installed wheel":  # run from the top of the user's own repository
        monkeypatch.setattr(runs, "CHECKOUT_ROOT", None)
        monkeypatch.chdir(tmp_path)
    runs.code_version.cache_clear()
    try:
        expected = {"commit": None, "dirty": None, "package": version("canonical_network")}
        assert runs.code_version() == expected
        write_failure(compose_config(ROW, tmp_path / "run"), RuntimeError("stopped"))
        assert json.loads((tmp_path / "run" / RESULTS_FILE).read_text())["code_version"] == expected
    finally:
        runs.code_version.cache_clear()  # the next test reads the real one again


def test_skip_finished_leaves_a_finished_folder_alone_and_returns_its_record(finished, tmp_path):
    """``skip_finished=true`` (resubmitting a whole sweep): a finished job's folder is read, never written."""
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(finished, folder)
    before = snapshot(folder)
    cfg = shrink(compose_config(ROW, folder))
    with pytest.raises(RunFolderFinished):  # the default: refused
        run(cfg)
    cfg.skip_finished = True
    record = run(cfg)
    assert record == json.loads((folder / RESULTS_FILE).read_text()) and record["status"] == "completed"
    assert snapshot(folder) == before


def test_a_job_slurm_requeued_after_its_run_finished_returns_the_record(finished, tmp_path, monkeypatch):
    """Slurm's pre-timeout signal can requeue a job after its results.json is written: the requeued job
    (SLURM_RESTART_COUNT >= 1) returns that record instead of failing, and writes nothing."""
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(finished, folder)
    before = snapshot(folder)
    cfg = shrink(compose_config(ROW, folder))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")  # the first submission: a finished folder is refused
    with pytest.raises(RunFolderFinished):
        run(cfg)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert run(cfg)["status"] == "completed"
    assert snapshot(folder) == before


def test_a_non_finite_training_loss_is_a_final_diverged_record(tmp_path):
    """The task raises FloatingPointError when the training loss is not finite: a rerun of the seed repeats it, so
    the record is final (a stage skips it) and the report lists it as diverged, not as a missing result."""
    from canonical_network.records import DIVERGED, final_status

    cfg = compose_config(ROW, tmp_path)
    write_failure(cfg, FloatingPointError("training loss is inf at epoch 0, step 15: the run diverged."))
    record = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert record["status"] == DIVERGED and "step 15" in record["divergence"]
    assert final_status(tmp_path) == DIVERGED
    assert [r["status"] for r in load_runs(tmp_path)] == [DIVERGED]
    write_failure(cfg, RuntimeError("later crash"))  # a later failure never replaces the final record
    assert json.loads((tmp_path / RESULTS_FILE).read_text())["status"] == DIVERGED


def test_two_set_asides_in_one_second_keep_both(tmp_path, monkeypatch):
    """Folders named by the UTC second: a second set-aside within the same second gets a folder of its own
    (before, it moved its files into the first one's, and failed on a name both had)."""
    import time

    from canonical_network.train import set_aside_previous_run

    monkeypatch.setattr(time, "gmtime", lambda *args: time.struct_time((2026, 11, 30, 8, 0, 0, 0, 334, 0)))
    folders = []
    for attempt in ("first", "second"):
        (tmp_path / "checkpoints").mkdir()
        (tmp_path / "checkpoints" / "last.ckpt").write_text(attempt)
        folders.append(set_aside_previous_run(tmp_path))
    assert [f.name for f in folders] == ["2026-11-30T08-00-00Z", "2026-11-30T08-00-00Z-2"]
    assert [(f / "checkpoints" / "last.ckpt").read_text() for f in folders] == ["first", "second"]


@pytest.fixture()
def unfinished(finished, tmp_path):
    """A copy of a run stopped before its test: checkpoints, no results.json (resuming it trains on)."""
    import shutil

    folder = tmp_path / "unfinished"
    shutil.copytree(finished, folder)
    (folder / RESULTS_FILE).unlink()
    return folder


@pytest.mark.parametrize("change", ["model.optimizer.lr=0.01", "seed=4", "data.batch_size=32",
                                    "trainer.gradient_clip_val=1.0", "trainer.devices=2"])
def test_resuming_under_another_config_is_refused_untouched(unfinished, change):
    """A resumed run continues one record: resuming the folder's own checkpoint with another learning rate,
    seed, batch, gradient clipping or world size is refused before anything is written, naming the key and both
    values."""
    from canonical_network.utils.checks import ConfigError

    before = snapshot(unfinished)
    with pytest.raises(ConfigError, match="written under another config") as refused:
        run(shrink(compose_config([*ROW, change], unfinished)))
    key = change.split("=")[0]
    assert key in str(refused.value) and "resume_with_changes=true" in str(refused.value)
    assert snapshot(unfinished) == before


def test_a_resume_may_move_the_folder_and_extend_the_budget(unfinished, tmp_path):
    """What differs between machines and continuations is no change of the run: the folder moved (every
    stored path differs), a longer epoch budget, no early stopping, another loader worker count."""
    import shutil

    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(unfinished, moved)
    cfg = shrink(compose_config([*ROW, "callbacks.early_stopping=null", "data.num_workers=1"], moved))
    cfg.trainer.max_epochs = 2
    record = run(cfg)
    assert record["status"] == "completed" and record["resumed_from"] == "checkpoints/last.ckpt"
    assert record["epochs"] == 2


def test_resume_with_changes_resumes_and_names_each_change(unfinished, caplog):
    from canonical_network.utils.checks import ConfigError

    cfg = shrink(compose_config([*ROW, "model.optimizer.lr=0.01", "resume_with_changes=yes"], unfinished))
    with pytest.raises(ConfigError, match="resume_with_changes"):  # a string is no switch
        run(cfg)
    cfg.resume_with_changes = True
    with caplog.at_level("WARNING", logger="canonical_network.train"):
        record = run(cfg)
    assert record["resumed_from"] == "checkpoints/last.ckpt" and record["status"] == "completed"
    assert "model.optimizer.lr was 0.001" in caplog.text


def test_a_run_started_from_another_folders_checkpoint_may_change_its_config(finished, tmp_path):
    """``ckpt_path`` into a new folder starts a new run (fine-tuning with another learning rate is one): not
    checked against the checkpoint's config; rerun after an interruption, the new folder's own config holds."""
    folder = tmp_path / "continued"
    cfg = shrink(compose_config([*ROW, "model.optimizer.lr=0.01",
                                 f"ckpt_path={finished / 'checkpoints' / 'last.ckpt'}"], folder))
    cfg.trainer.max_epochs = 2
    assert run(cfg)["status"] == "completed"


def test_a_non_finite_loss_in_a_ddp_worker_is_a_divergence(tmp_path):
    """Under trainer=ddp_cpu the task's FloatingPointError reaches the command as torch's
    ProcessRaisedException, the worker's traceback as text: still a final "diverged" record, whose reason is the
    worker's message (the slow test_fault_tolerance.py runs it for real)."""
    from torch.multiprocessing import ProcessRaisedException

    from canonical_network.train import is_divergence

    trace = ('Traceback (most recent call last):\n  File "x.py", line 1, in step\n'
             "FloatingPointError: training loss is nan at epoch 0, step 1: the run diverged.\n")
    worker = ProcessRaisedException("\n\n-- Process 0 terminated with the following error:\n" + trace, 0, 1)
    assert is_divergence(worker) and is_divergence(FloatingPointError("nan"))
    other = ProcessRaisedException("\n\n-- Process 0 terminated with the following error:\nValueError: no\n", 0, 1)
    assert not is_divergence(other) and not is_divergence(ValueError("FloatingPointError: in a message"))
    cfg = compose_config(ROW, tmp_path)
    write_failure(cfg, worker)
    record = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert record["status"] == "diverged"
    assert record["divergence"] == "training loss is nan at epoch 0, step 1: the run diverged."


HOLD_LOCK = """
import sys, time
from pathlib import Path
from canonical_network.utils.files import exclusive_lock
with exclusive_lock(Path(sys.argv[1]) / '.run.lock') as holder:
    assert holder is None
    print('held', flush=True)
    sys.stdin.readline()
"""


def test_a_failure_is_not_recorded_in_a_folder_another_process_trains_in(tmp_path, caplog):
    """A job refused before it took the lock (its config differs from the checkpoint's, say) used to write its
    failure record into the folder of the run training there; it is now logged only."""
    cfg = compose_config(ROW, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path)], cwd=PROJECT_ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "held"
        with caplog.at_level("ERROR", logger="canonical_network.train"):
            write_failure(cfg, RuntimeError("refused"))
        assert not (tmp_path / RESULTS_FILE).exists() and not (tmp_path / ATTEMPTS_DIR).exists()
        assert "which process" in caplog.text and "RuntimeError: refused" in caplog.text
    finally:
        holder.communicate("\n", timeout=60)
    write_failure(cfg, RuntimeError("refused"))  # the folder free again: recorded
    assert json.loads((tmp_path / RESULTS_FILE).read_text())["error"] == "RuntimeError: refused"


def test_a_long_error_keeps_its_last_lines(tmp_path):
    """A worker's error carries its whole traceback, the cause at the end: the record keeps both ends."""
    cfg = compose_config(ROW, tmp_path)
    write_failure(cfg, RuntimeError("Traceback (most recent call last):\n" + "  a frame\n" * 500 + "KeyError: 'x'"))
    error = json.loads((tmp_path / RESULTS_FILE).read_text())["error"]
    assert error.startswith("RuntimeError: Traceback") and error.endswith("KeyError: 'x'")
    assert "characters left out" in error and len(error) < 2100


def test_other_ranks_train_only_once_rank_zero_holds_the_lock_for_their_job(tmp_path, monkeypatch):
    """Every task of a multi-task Slurm job runs the command; rank 0 alone checks the folder. The other ranks
    wait until the lock names their job, and give up with a clear error when rank 0 never takes it (it was
    refused: the folder is busy), instead of blocking in the process group's set-up for 30 minutes."""
    from canonical_network.train import RunFolderBusy, job_identity, run_folder_lock, wait_for_rank_zero
    from canonical_network.utils.files import add_lock_note

    for key in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    wait_for_rank_zero(tmp_path, 1, timeout=0)  # not a multi-process job: nothing to wait for
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    with pytest.raises(RunFolderBusy, match=r"rank 1 of Slurm job 1 step 0 attempt 0: rank 0 did not take the lock.*"
                                            r"the lock file says: nothing"):
        wait_for_rank_zero(tmp_path, 1, timeout=0)
    lock = tmp_path / ".run.lock"
    with run_folder_lock(tmp_path):
        with pytest.raises(RunFolderBusy, match="the lock file says: process"):  # held, not yet admitted
            wait_for_rank_zero(tmp_path, 1, timeout=0)
        add_lock_note(lock, f" ({job_identity()})")  # what run() adds once rank 0 passed its checks
        assert lock.read_text().strip().endswith("(Slurm job 1 step 0 attempt 0)")
        wait_for_rank_zero(tmp_path, 1, timeout=0)  # rank 1 goes on
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a requeued attempt is another job
        with pytest.raises(RunFolderBusy, match=r"attempt 1: .*the lock file says: process .*attempt 0\)"):
            wait_for_rank_zero(tmp_path, 1, timeout=0)
        monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    # released (rank 0 refused after taking it, or ended): what the file said is gone with the lock
    assert lock.read_text() == ""
    with pytest.raises(RunFolderBusy, match="the lock file says: nothing"):
        wait_for_rank_zero(tmp_path, 1, timeout=0)


def test_run_admits_the_other_ranks_only_after_its_own_checks(tmp_path, monkeypatch):
    """Rank 0 names its job in the lock only once it is admitted: a rank 0 refused inside the lock (the folder
    finished while it waited) never lets the other ranks start."""
    from canonical_network.train import RunFolderFinished

    monkeypatch.setenv("SLURM_JOB_ID", "5")
    seen = {}
    import canonical_network.train as train_module

    def record_lock(cfg):  # instead of training: what the lock file says when rank 0 starts fitting
        seen["lock"] = (tmp_path / "run" / ".run.lock").read_text()
        raise RuntimeError("stop here")

    monkeypatch.setattr(train_module, "_run", record_lock)
    with pytest.raises(RuntimeError, match="stop here"):
        run(compose_config(ROW, tmp_path / "run"))
    assert seen["lock"].strip().endswith("(Slurm job 5 step - attempt 0)")
    assert (tmp_path / "run" / ".run.lock").read_text() == ""  # emptied with the lock
    monkeypatch.setattr(train_module, "refuse_finished", lambda folder: (_ for _ in ()).throw(
        RunFolderFinished("finished meanwhile")) if (folder / ".run.lock").read_text() else None)
    with pytest.raises(RunFolderFinished):  # refused inside the lock, as if the folder finished while it waited
        run(compose_config(ROW, tmp_path / "run"))
    assert "Slurm job" not in (tmp_path / "run" / ".run.lock").read_text()
