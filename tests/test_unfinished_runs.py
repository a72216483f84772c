"""Unfinished runs carried to another machine: parked by collect_runs --unfinished, put back by run_protocol.

A 10,000-epoch N-body row outlasts a working session on one CPU core; the next session may have an empty
``outputs/``. These tests train a real (tiny) run, park it, put it back into a folder at another path, and resume
it there: the resumed run must keep the best epoch seen before the move, which Lightning forgets when the
checkpoint folder's path changed unless the paths are moved with it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import open_dict

from canonical_network.train import run
from canonical_network.utils.config import PROJECT_ROOT
from canonical_network.utils.unfinished import park, restore, unfinished_runs
from tests.helpers import compose_config, hold_lock, shrink
from tests.test_nbody_task import TINY, tiny_dir  # noqa: F401  (the module-scoped data fixture)


def _checkpoint_state(path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return next(v for k, v in state["callbacks"].items() if k.startswith("ModelCheckpoint"))


def _train(run_dir, data_dir, max_epochs: int) -> dict:
    counts = [f"data.{k}={v}" for k, v in TINY.items()]
    cfg = shrink(compose_config(["experiment=nbody/gnn", f"data.data_dir={data_dir}", "data.batch_size=8", *counts,
                                 "trainer.check_val_every_n_epoch=1"], run_dir))
    with open_dict(cfg):
        cfg.trainer.max_epochs = max_epochs
    return run(cfg)


def _fake_run(folder, status=None, ckpts=("last.ckpt",), step=10):
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (folder / "checkpoints").mkdir()
    for name in ckpts:
        torch.save({"epoch": 1, "global_step": step, "callbacks": {}}, folder / "checkpoints" / name)
    if status:
        (folder / "results.json").write_text(json.dumps({"status": status}))


def test_park_keeps_what_resumes_and_drops_copies_of_finished_runs(tmp_path, tiny_dir):  # noqa: F811
    src, dest = tmp_path / "out", tmp_path / "parked"
    live = src / "nbody" / "gnn" / "ep10000" / "seed1"
    _train(live, tiny_dir, 3)
    (live / "results.json").unlink()  # as if the run had been stopped after epoch 3 of more
    (live / "checkpoints" / "stale.ckpt").write_bytes(b"not named by last.ckpt")
    (live / "csv").mkdir()
    (live / "csv" / "metrics.csv").write_text("epoch,val/mse\n0,0.5\n")  # as logger=csv writes it
    _fake_run(src / "nbody" / "gnn" / "ep10000" / "seed0", status="completed")  # finished: collected, not parked
    _fake_run(src / "nbody" / "egnn" / "seed0", status="failed")  # a failure record is not final: it resumes
    (src / "nbody" / "gnn" / "ep10000" / "seed1" / "superseded" / "t" / "checkpoints").mkdir(parents=True)
    torch.save({}, src / "nbody" / "gnn" / "ep10000" / "seed1" / "superseded" / "t" / "checkpoints" / "last.ckpt")
    assert unfinished_runs(src) == [src / "nbody" / "egnn" / "seed0", live]

    parked, removed, behind = park(src, dest)
    assert not behind
    assert parked == [dest / "nbody" / "egnn" / "seed0", dest / "nbody" / "gnn" / "ep10000" / "seed1"] and not removed
    copy = dest / "nbody" / "gnn" / "ep10000" / "seed1"
    best = _checkpoint_state(live / "checkpoints" / "last.ckpt")["best_model_path"]
    assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == sorted({"last.ckpt", best.rsplit("/", 1)[1]})
    assert (copy / "csv" / "metrics.csv").read_bytes() == (live / "csv" / "metrics.csv").read_bytes()
    assert not (copy / "superseded").exists()

    # the run finishes where it runs: parking again deletes its copy (its record is collected instead)
    (live / "results.json").write_text(json.dumps({"status": "completed"}))
    parked, removed, _ = park(src, dest)
    assert removed == [copy] and not copy.exists() and parked == [dest / "nbody" / "egnn" / "seed0"]


def test_a_parked_run_resumes_elsewhere_with_its_best_epoch(tmp_path, tiny_dir):  # noqa: F811
    first = tmp_path / "machine_a" / "run"
    _train(first, tiny_dir, 3)
    (first / "results.json").unlink()
    before = _checkpoint_state(first / "checkpoints" / "last.ckpt")
    park(tmp_path / "machine_a", tmp_path / "kept")
    shutil.rmtree(tmp_path / "machine_a")  # the first machine is gone

    second = tmp_path / "machine_b" / "elsewhere" / "run"
    assert restore(tmp_path / "kept" / "run", second)
    after = _checkpoint_state(second / "checkpoints" / "last.ckpt")
    assert after["dirpath"] == str((second / "checkpoints").resolve())
    assert after["best_model_path"] == str((second / "checkpoints").resolve() / before["best_model_path"].rsplit("/", 1)[1])
    assert torch.equal(after["best_model_score"], before["best_model_score"])
    assert list(after["best_k_models"]) == [after["best_model_path"]]
    assert not restore(tmp_path / "kept" / "run", second)  # never over a run that started in the folder
    # why the paths move: Lightning's callback, in the new folder, keeps the best score only from a state that
    # names that folder (from the unmoved one it warns and starts the best-epoch search over)
    with pytest.warns(UserWarning, match="dirpath has changed"):
        (unmoved := ModelCheckpoint(dirpath=second / "checkpoints")).load_state_dict(before)
    moved = ModelCheckpoint(dirpath=(second / "checkpoints").resolve())
    moved.load_state_dict(after)
    assert unmoved.best_model_score is None and torch.equal(moved.best_model_score, before["best_model_score"])

    resumed = _train(second, tiny_dir, 5)
    record = json.loads((second / "results.json").read_text())
    assert record["status"] == "completed" and record["epochs"] == 5
    assert record["resumed_from"].endswith("checkpoints/last.ckpt")
    final = _checkpoint_state(second / "checkpoints" / "last.ckpt")
    # the best over all 5 epochs, epochs 1-3 (trained on the first machine) included
    assert final["best_model_score"] <= before["best_model_score"]
    assert resumed["metrics"]["test/mse"] > 0


def test_run_protocol_puts_a_parked_run_back_before_it_resumes(tmp_path):
    """Given --unfinished, a job with no folder of its own is restored from its parked copy, then started
    (here the command is recorded, not run); a job that started here is not touched."""
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import run_protocol

    kept, out = tmp_path / "kept", tmp_path / "out"
    _fake_run(kept / "nbody" / "gnn" / "ep10000" / "seed1")
    calls = []
    original = run_protocol.subprocess.call
    run_protocol.subprocess.call = lambda cmd, **kw: calls.append(cmd) or 0
    try:
        out.mkdir()
        finished = {("nbody/gnn", 1): threading.Event()}
        message = run_protocol.run_job(out, "nbody/gnn", 1, [], 1, finished, "ep10000", None, kept)
        assert message.startswith("done nbody/gnn seed 1") and len(calls) == 1
        assert (out / "nbody" / "gnn" / "ep10000" / "seed1" / "checkpoints" / "last.ckpt").is_file()
    finally:
        run_protocol.subprocess.call = original
    # the command line that parks: collect_runs.py with --unfinished
    proc = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "collect_runs.py"), str(out),
                           str(tmp_path / "records"), "--unfinished", str(tmp_path / "again")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "parked 1 unfinished runs" in proc.stdout
    assert (tmp_path / "again" / "nbody" / "gnn" / "ep10000" / "seed1" / "checkpoints" / "last.ckpt").is_file()


def test_park_never_replaces_a_copy_that_is_further_along(tmp_path):
    """A run that started over here (its parked copy could not be put back) must not overwrite that copy."""
    src, dest = tmp_path / "out", tmp_path / "parked"
    _fake_run(dest / "nbody" / "cn_gnn" / "seed0", step=52_800)  # parked at epoch ~1,760
    _fake_run(src / "nbody" / "cn_gnn" / "seed0", step=150)  # a fresh start here
    parked, removed, behind = park(src, dest)
    assert parked == [] and removed == [] and behind == [(src / "nbody" / "cn_gnn" / "seed0",
                                                          dest / "nbody" / "cn_gnn" / "seed0")]
    assert torch.load(dest / "nbody" / "cn_gnn" / "seed0" / "checkpoints" / "last.ckpt")["global_step"] == 52_800
    # once the run here is further along, its copy replaces the parked one
    torch.save({"epoch": 2, "global_step": 60_000, "callbacks": {}}, src / "nbody" / "cn_gnn" / "seed0" / "checkpoints"
               / "last.ckpt")
    parked, _, behind = park(src, dest)
    assert parked == [dest / "nbody" / "cn_gnn" / "seed0"] and not behind
    assert torch.load(dest / "nbody" / "cn_gnn" / "seed0" / "checkpoints" / "last.ckpt")["global_step"] == 60_000


def test_restore_replaces_a_first_epoch_cut_short_and_keeps_its_files_aside(tmp_path):
    """A run killed during its first epoch left set-up files, a 2-row metrics.csv and a best checkpoint without
    last.ckpt: the parked run's files win (its history is the one that resumes), the others move to superseded/."""
    kept, run_dir = tmp_path / "kept" / "run", tmp_path / "out" / "run"
    _fake_run(kept, ckpts=("last.ckpt", "epoch_1194.ckpt"))
    (kept / "csv").mkdir()
    (kept / "csv" / "metrics.csv").write_text("epoch,val/mse\n" + "".join(f"{e},0.01\n" for e in range(1195)))
    (run_dir / "csv").mkdir(parents=True)
    (run_dir / "csv" / "metrics.csv").write_text("epoch,val/mse\n0,0.5\n")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "epoch_0.ckpt").write_bytes(b"best of a cut-short first epoch")
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 0\n")  # the same as the parked one: left as it is
    assert restore(kept, run_dir)
    assert (run_dir / "csv" / "metrics.csv").read_bytes() == (kept / "csv" / "metrics.csv").read_bytes()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["epoch_1194.ckpt", "last.ckpt"]
    (aside,) = (run_dir / "superseded").iterdir()
    assert (aside / "csv" / "metrics.csv").read_text() == "epoch,val/mse\n0,0.5\n"
    assert (aside / "checkpoints" / "epoch_0.ckpt").is_file() and not (aside / ".hydra").exists()
    assert not (run_dir / "checkpoints.partial").exists()


def test_an_interrupted_restore_is_done_again(tmp_path, monkeypatch):
    """A restore cut off while copying checkpoints leaves no last.ckpt in checkpoints/: the next one completes it."""
    import canonical_network.utils.unfinished as unfinished

    kept, run_dir = tmp_path / "kept" / "run", tmp_path / "out" / "run"
    _fake_run(kept, ckpts=("last.ckpt", "epoch_5.ckpt"))
    copy2 = shutil.copy2

    def cut_off(source, target):
        if str(target).endswith("last.ckpt"):
            raise KeyboardInterrupt  # the session ended mid-copy
        return copy2(source, target)

    monkeypatch.setattr(unfinished.shutil, "copy2", cut_off)
    with pytest.raises(KeyboardInterrupt):
        restore(kept, run_dir)
    assert not (run_dir / "checkpoints" / "last.ckpt").exists() and not (run_dir / "checkpoints").exists()
    monkeypatch.setattr(unfinished.shutil, "copy2", copy2)
    assert restore(kept, run_dir)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["epoch_5.ckpt", "last.ckpt"]
    assert not (run_dir / "checkpoints.partial").exists()


def test_restore_touches_nothing_while_a_run_holds_the_folder(tmp_path):
    from canonical_network.utils.runs import LOCK_FILE

    kept, run_dir = tmp_path / "kept" / "run", tmp_path / "out" / "run"
    _fake_run(kept)
    run_dir.mkdir(parents=True)
    with hold_lock(run_dir / LOCK_FILE):
        assert not restore(kept, run_dir)
        assert not (run_dir / "checkpoints").exists()
    assert restore(kept, run_dir)


def test_a_refused_command_never_deletes_the_folder_of_a_run_that_holds_it(tmp_path):
    """A second command with a config error and the same hydra.run.dir removes the folder only when unused."""
    from canonical_network.utils.runs import LOCK_FILE, remove_unused_run_folder

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)  # what an admitted run has written before its first epoch
    (run_dir / "train.log").write_text("")
    with hold_lock(run_dir / LOCK_FILE):
        assert not remove_unused_run_folder(run_dir)
        assert (run_dir / ".hydra").is_dir()
    assert remove_unused_run_folder(run_dir) and not run_dir.exists()


def test_a_parked_copy_further_along_replaces_an_older_run_here(tmp_path):
    """A machine that still holds an old start of a job (epoch ~5) whose parked copy carried on elsewhere (epoch
    ~1,760) resumes from the parked copy; the old run's files go to superseded/. A run here that is as far or
    further along is never replaced, and without replace_behind nothing with a last.ckpt is."""
    kept, run_dir = tmp_path / "kept" / "run", tmp_path / "out" / "run"
    _fake_run(kept, step=52_800)
    _fake_run(run_dir, step=150)
    assert not restore(kept, run_dir)  # the default: a run that checkpointed here is left alone
    assert restore(kept, run_dir, replace_behind=True)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 52_800
    (aside,) = (run_dir / "superseded").iterdir()
    assert torch.load(aside / "checkpoints" / "last.ckpt")["global_step"] == 150
    assert not restore(kept, run_dir, replace_behind=True)  # as far along now: nothing to do


def test_run_protocol_reports_an_unreadable_parked_copy_as_that_jobs_failure(tmp_path):
    """A parked last.ckpt cut short (a bad transfer) used to end the whole call with a torch traceback naming no
    folder, and the other jobs' lines were never printed; it is now that job's FAILED line, naming the copy."""
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import run_protocol

    kept, out = tmp_path / "kept", tmp_path / "out"
    _fake_run(kept / "nbody" / "gnn" / "seed0")
    _fake_run(out / "nbody" / "gnn" / "seed0", step=5)
    last = kept / "nbody" / "gnn" / "seed0" / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:100])
    finished = {("nbody/gnn", 0): threading.Event()}
    message = run_protocol.run_job(out, "nbody/gnn", 0, [], 1, finished, "", None, kept)
    assert message.startswith(f"FAILED nbody/gnn seed 0: the parked copy {kept / 'nbody' / 'gnn' / 'seed0'} "
                              "could not be read"), message
    assert finished[("nbody/gnn", 0)].is_set()


def test_collect_refuses_folders_that_overlap(tmp_path):
    """--unfinished pointed at the runs' own folder used to delete every finished run there (each was taken for a
    parked copy "finished since"): overlapping folders are refused before anything is touched."""
    src = tmp_path / "out"
    _fake_run(src / "nbody" / "linear" / "seed0", status="completed")
    _fake_run(src / "nbody" / "gnn" / "seed0")
    script = str(PROJECT_ROOT / "scripts" / "collect_runs.py")
    for dest, unfinished in ((tmp_path / "records", src), (tmp_path / "records", src / "parked"), (src, None),
                             (tmp_path / "records", tmp_path / "records")):
        proc = subprocess.run([sys.executable, script, str(src), str(dest),
                               *(["--unfinished", str(unfinished)] if unfinished else [])],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "must be apart" in proc.stderr, proc.stderr
    assert (src / "nbody" / "linear" / "seed0" / "results.json").is_file()
    assert (src / "nbody" / "gnn" / "seed0" / ".hydra" / "config.yaml").is_file()
    assert not (tmp_path / "records").exists()
