"""Runs survive being killed (SIGTERM, as on preemption) and DDP writes one result."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from canonical_network.records import record_path
from canonical_network.utils.config import PROJECT_ROOT

# Deterministic, small: 3 epochs of 12 batches of the CNN on the embedded data.
RUN_ARGS = ["experiment=rotmnist/cnn", "logger=csv", "seed=7", "trainer.deterministic=true",
            "trainer.max_epochs=3", "trainer.limit_train_batches=12", "trainer.limit_val_batches=2",
            "trainer.limit_test_batches=4", "trainer.enable_progress_bar=false", "callbacks.rich_progress_bar=null"]


def _cmd(run_dir, *extra):
    return [sys.executable, "-m", "canonical_network.train", *RUN_ARGS, f"hydra.run.dir={run_dir}", *extra]


def _env():
    return {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}


def test_sigterm_mid_training_then_resume_matches_uninterrupted_run(tmp_path):
    reference = subprocess.run(_cmd(tmp_path / "ref"), cwd=PROJECT_ROOT, env=_env(), capture_output=True,
                               text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = json.loads((tmp_path / "ref" / "results.json").read_text())
    # the per-epoch checkpoint states what it saves (the whole training state) instead of leaving Lightning to
    # log its default at every save: one line an epoch, 10,000 in a run at the N-body protocol
    assert "`weights_only` was not set" not in (tmp_path / "ref" / "train.log").read_text()

    run_dir = tmp_path / "killed"
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen(_cmd(run_dir), cwd=PROJECT_ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert last.exists() and proc.poll() is None, "the run should still be training after its first checkpoint"
    proc.send_signal(signal.SIGTERM)  # mid-training: epoch 0 is checkpointed, epoch 1 is under way
    proc.communicate(timeout=120)
    assert proc.returncode == 143, "a stopped run must not exit as a success"
    assert not (run_dir / "results.json").exists(), "a killed run must not report results"

    resumed = subprocess.run(_cmd(run_dir), cwd=PROJECT_ROOT, env=_env(), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert record_path(results, "resumed_from") == last
    assert results["epochs"] == expected["epochs"] == 3
    # Same machine, deterministic mode, same operations: the metrics should agree to the bit. rel 2³ eps32 only
    # lets a final float32 reduction run in another order (a few roundings of the value itself, whatever its
    # size: a loss may exceed 1); it is far below the resolution of the count-based metrics (one test image of
    # 512 is 0.2 %), so those must match exactly.
    for key, value in expected["metrics"].items():
        assert results["metrics"][key] == pytest.approx(value, rel=8 * torch.finfo(torch.float32).eps, abs=0), key
    # The resumed run's CSV keeps the epochs logged before the kill: the same validation curve, row for row.
    curve, reference_curve = _val_curve(run_dir), _val_curve(tmp_path / "ref")
    assert [row[:2] for row in curve] == [row[:2] for row in reference_curve] and len(curve) == 3
    # val/acc is a count over the validation batches: equal counts, equal values (abs 1e-6 < one count)
    assert [row[2] for row in curve] == pytest.approx([row[2] for row in reference_curve], abs=1e-6)


def _val_curve(run_dir):
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("val/acc")]
    return [(int(row["epoch"]), int(row["step"]), float(row["val/acc"])) for row in rows]


@pytest.mark.slow
def test_ddp_cpu_two_processes_write_results_once(tmp_path):
    run_dir = tmp_path / "ddp"
    proc = subprocess.run(_cmd(run_dir, "trainer=ddp_cpu", "trainer.max_epochs=1"), cwd=PROJECT_ROOT,
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = list(tmp_path.rglob("results.json"))
    assert results == [run_dir / "results.json"]
    record = json.loads(results[0].read_text())
    assert record["status"] == "completed" and "test/error" in record["metrics"]
    assert record["config"]["trainer"]["strategy"] == "ddp_fork"
    # fit ran in forked workers: what only rank 0's callbacks and loop know still reaches the record
    assert record["epochs"] == 1 and record["best_val"].get("val/acc") is not None and record["fit_time_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(("lr", "reason"), [("1e30", "training loss is nan"), ("1e6", "exceeds 10 x")])
def test_ddp_cpu_divergence_is_recorded_as_diverged(tmp_path, lr, reason):
    """A run that diverges in the workers is recorded "diverged" (final, never pooled), as in one process: a
    non-finite loss reaches this process as torch's ProcessRaisedException, an exploding one only in rank 0's
    divergence monitor."""
    run_dir = tmp_path / "ddp"
    proc = subprocess.run(_cmd(run_dir, "trainer=ddp_cpu", "trainer.max_epochs=2", f"model.optimizer.lr={lr}"),
                          cwd=PROJECT_ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "diverged", (record.get("error"), proc.stderr[-2000:])
    assert reason in record["divergence"] and "Traceback" not in record["divergence"]


def _ddp_run_after_its_first_checkpoint(run_dir):
    """A long ``trainer=ddp_cpu`` run started in ``run_dir``, once its first ``last.ckpt`` exists: the command's
    process and its workers' pids (in start order, rank 0 first)."""
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen(_cmd(run_dir, "trainer=ddp_cpu", "trainer.max_epochs=200"), cwd=PROJECT_ROOT,
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert last.exists() and proc.poll() is None, "the run should still be training after its first checkpoint"
    workers = sorted(subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split(),
                     key=int)
    assert len(workers) >= 2, workers
    return proc, workers


@pytest.mark.slow
def test_ddp_cpu_sigterm_stops_the_workers_then_resumes(tmp_path):
    """SIGTERM to the command (what kill, a launcher or Slurm sends) stops its forked workers too: it exits 143,
    no worker trains on in the folder, and a rerun resumes from last.ckpt."""
    run_dir = tmp_path / "ddp"
    proc, workers = _ddp_run_after_its_first_checkpoint(run_dir)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=180)
    assert proc.returncode == 143
    for pid in workers:  # none left running (a worker adopted by init would keep writing checkpoints)
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower(), pid
    assert not (run_dir / "results.json").exists()
    resumed = subprocess.run(_cmd(run_dir, "trainer=ddp_cpu", "trainer.max_epochs=3"), cwd=PROJECT_ROOT,
                             env=_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed" and record["resumed_from"] == "checkpoints/last.ckpt"
    assert record["epochs"] == 3


@pytest.mark.slow
def test_ddp_cpu_sigterm_to_one_worker_stops_the_run_as_stopped(tmp_path):
    """SIGTERM to one forked worker alone (an OOM guard, a kill of one pid) stops the whole command as SIGTERM to
    it does: exit 143, no failure record, no worker left, resumable. Before, that worker stopped alone, the
    other's next collective failed, and the run was recorded as failed with a cut-off traceback."""
    run_dir = tmp_path / "ddp"
    proc, workers = _ddp_run_after_its_first_checkpoint(run_dir)
    os.kill(int(workers[-1]), signal.SIGTERM)  # rank 1's process, say
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 143, stderr[-3000:]
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower(), pid
    assert not (run_dir / "results.json").exists() and not (run_dir / "attempts").exists()
    resumed = subprocess.run(_cmd(run_dir, "trainer=ddp_cpu", "trainer.max_epochs=3"), cwd=PROJECT_ROOT,
                             env=_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "results.json").read_text())["status"] == "completed"


def test_truncated_last_checkpoint_falls_back_to_the_newest_readable_one(tmp_path, caplog):
    from canonical_network.train import run
    from tests.helpers import compose_config, shrink

    cfg = shrink(compose_config(["experiment=rotmnist/cnn", "model.orbit_rotations=0"], tmp_path))
    cfg.trainer.max_epochs = 2
    run(cfg)
    last = tmp_path / "checkpoints" / "last.ckpt"
    best = next(p for p in last.parent.glob("epoch_*.ckpt"))
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # cut short, as an interrupted copy leaves it
    (tmp_path / "results.json").unlink()  # as a run stopped before its test (a finished run's folder is final)
    cfg.trainer.max_epochs = 3
    with caplog.at_level("WARNING", logger="canonical_network.train"):
        results = run(cfg)
    assert record_path(results, "resumed_from") == best and results["status"] == "completed"
    assert f"{last} is unreadable" in caplog.text and str(best) in caplog.text

    for path in last.parent.glob("*.ckpt"):
        path.write_bytes(b"not a checkpoint")
    from canonical_network.train import RunFolderFinished

    with pytest.raises(RunFolderFinished):  # a completed run's folder: refused before reading a checkpoint
        run(cfg)
    (tmp_path / "results.json").unlink()
    with pytest.raises(RuntimeError, match="no other checkpoint in .* is readable"):
        run(cfg)


def test_second_run_into_a_busy_folder_refuses_and_the_first_completes(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(_cmd(run_dir, "trainer.max_epochs=4", "seed=1"), cwd=PROJECT_ROOT, env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lock = run_dir / ".run.lock"
    deadline = time.time() + 120
    while not (lock.is_file() and lock.read_text().strip()) and time.time() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, "the first run should still be training"
    second = subprocess.run(_cmd(run_dir, "seed=2"), cwd=PROJECT_ROOT, env=_env(), capture_output=True, text=True,
                            timeout=300)
    assert second.returncode != 0
    assert f"run folder {run_dir} is in use by process {first.pid} on" in second.stderr
    assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "completed" and results["seed"] == 1  # the first run's, untouched
    # the refused run wrote nothing: the folder's config record is the first run's
    assert "seed: 1" in (run_dir / ".hydra" / "config.yaml").read_text()
    assert "seed=1" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "seed=2" not in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert not (run_dir / ".hydra" / "previous").exists()
    # Once the first run has ended, the folder is free again (the lock died with its process).
    from canonical_network.train import run_folder_lock

    with run_folder_lock(run_dir):
        assert str(os.getpid()) in (run_dir / ".run.lock").read_text()


def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    import torch

    from canonical_network.utils import checkpoints

    path = tmp_path / "last.ckpt"
    checkpoints.atomic_torch_save({"epoch": 1}, path)
    before = path.read_bytes()

    def dies_midway(obj, stream):
        stream.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # as a SIGINT/SIGTERM would, in the middle of the write

    monkeypatch.setattr(checkpoints.torch, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.atomic_torch_save({"epoch": 2}, path)
    assert path.read_bytes() == before  # the old checkpoint, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temporary file left behind
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"epoch": 1}


def test_trainer_uses_the_atomic_writer(tmp_path, monkeypatch):
    from canonical_network.train import run
    from canonical_network.utils import checkpoints
    from tests.helpers import compose_config, shrink

    saved = []
    original = checkpoints.atomic_torch_save
    monkeypatch.setattr(checkpoints, "atomic_torch_save", lambda obj, path: (saved.append(str(path)), original(obj, path)))
    results = run(shrink(compose_config(["experiment=rotmnist/cnn", "model.orbit_rotations=0"], tmp_path)))
    assert results["status"] == "completed"
    assert str(tmp_path / "checkpoints" / "last.ckpt") in saved  # every checkpoint of the run went through it
    assert all(p.startswith(str(tmp_path / "checkpoints")) for p in saved)


def test_a_full_disk_says_so_and_where(tmp_path, monkeypatch):
    """torch's zip writer reports a full disk as "[enforce fail at inline_container.cc:...]": the error says
    "no space left on device" and names the file instead; another failure keeps its own message."""
    import errno
    import shutil
    from collections import namedtuple

    import torch

    from canonical_network.utils import checkpoints

    def full_write(obj, stream):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full_write)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(OSError, match=r"no space left on device: could not write the checkpoint .*last\.ckpt") as info:
        checkpoints.atomic_torch_save({"x": 1}, tmp_path / "last.ckpt")
    assert info.value.errno == errno.ENOSPC
    assert not list(tmp_path.iterdir())  # no partial file left
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 0, 10**9))
    with pytest.raises(RuntimeError, match="enforce fail"):  # plenty of space: not called a full disk
        checkpoints.atomic_torch_save({"x": 1}, tmp_path / "last.ckpt")


def test_the_metrics_are_on_disk_before_the_checkpoint_that_resumes_past_them(tmp_path):
    """The CSV logger buffers rows (it writes every 100 steps): each epoch's ``last.ckpt`` is written only after
    the loggers flushed, so a run killed after it and resumed from it never loses the rows of the epochs it
    skips. Checked on a real CSV logger and the callback's own epoch-end hook."""
    from types import SimpleNamespace

    from canonical_network.tasks.callbacks import EpochCheckpoint
    from canonical_network.utils.loggers import ResumableCSVLogger

    logger = ResumableCSVLogger(save_dir=str(tmp_path), name="csv", version="", keep_previous=True)
    logger.log_metrics({"val/mse": 0.5}, step=29)  # buffered: nothing on disk yet
    assert not (tmp_path / "csv" / "metrics.csv").is_file()
    seen = []

    def save_checkpoint(path, weights_only=False):
        seen.append((path, (tmp_path / "csv" / "metrics.csv").read_text()))

    trainer = SimpleNamespace(sanity_checking=False, fast_dev_run=False, current_epoch=0, loggers=[logger],
                              save_checkpoint=save_checkpoint)
    EpochCheckpoint(dirpath=str(tmp_path / "checkpoints")).on_train_epoch_end(trainer, None)
    ((path, metrics),) = seen
    assert path == tmp_path / "checkpoints" / "last.ckpt" and "0.5" in metrics and "29" in metrics


# One rank of a two-process gloo job (processes started here, as Slurm or torchrun starts them: Lightning reads
# LOCAL_RANK and starts none itself); the rank SIGNALLED sends itself SIGTERM in the middle of training step 3.
_RANK_SCRIPT = r"""
import os, signal, sys
import torch
import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from canonical_network.utils.runs import stop_ranks_together

SIGNALLED = int(sys.argv[1])

class Line(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx == 3 and self.global_rank == SIGNALLED:
            os.kill(os.getpid(), signal.SIGTERM)  # after this step's start: the rank finishes the step noted
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        torch.manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
        return torch.utils.data.DataLoader(data, batch_size=8)

trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
                     max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
stop_ranks_together(trainer)
try:
    trainer.fit(Line())
except SIGTERMException:
    print(f"stopped after {trainer.global_step} steps", flush=True)
    sys.exit(143)
print(f"finished after {trainer.global_step} steps", flush=True)
"""


@pytest.mark.parametrize("signalled", [0, 1])
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(tmp_path, signalled):
    """A SIGTERM that reaches one rank during a training step (Slurm signals a job's tasks one by one; under load
    they were 2 s apart) stops every rank at the start of the next step. Lightning's handler set a flag that
    each rank checks alone at the end of a step: the signalled rank left there while the other trained on into
    a collective with no partner and crashed, which is how tests/test_slurm.py's SIGTERM test failed under load.
    """
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
               "NODE_RANK": "0", "LOCAL_RANK": str(rank), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        for name in [n for n in env if n.startswith("SLURM_")]:
            del env[name]
        procs.append(subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, str(signalled)], cwd=PROJECT_ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=180)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail("a rank hung: " + "\n---\n".join(p.communicate()[0][-2000:] for p in procs))
    for rank, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        # steps 0-3 done, every rank stops at the start of step 4 (256 samples / 2 ranks / 8 = 16 steps an epoch)
        assert proc.returncode == 143 and "stopped after 4 steps" in out, f"rank {rank}:\n{out[-3000:]}"
