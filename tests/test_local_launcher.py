"""hydra/launcher=local runs a sweep's jobs at most max_jobs at a time, each as a submitit local job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest

from canonical_network.utils.config import PROJECT_ROOT
from hydra_plugins.canonical_network_launcher import BoundedLocalLauncher


def _interval(train_log):
    stamps = [line[1:24] for line in train_log.read_text().splitlines() if line.startswith("[20")]
    return datetime.fromisoformat(stamps[0].replace(",", ".")), datetime.fromisoformat(stamps[-1].replace(",", "."))


def _max_overlap(intervals):
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def test_six_job_sweep_runs_at_most_max_jobs_at_once(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "canonical_network.train", "-m", "hydra/launcher=local", "hydra.launcher.max_jobs=2",
           "experiment=rotmnist/cnn", "seed=0,1,2,3,4,5", "debug=fast", "logger=none", "model.orbit_rotations=0",
           f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(sweep.glob("*/results.json"))
    assert len(results) == 6
    assert sorted(json.loads(p.read_text())["seed"] for p in results) == [0, 1, 2, 3, 4, 5]
    intervals = [_interval(p.parent / "train.log") for p in results]
    # Never more than 2 at once; and the pool does run 2 together (the jobs overlap).
    assert _max_overlap(intervals) == 2


def test_max_jobs_is_checked():
    with pytest.raises(ValueError, match=r"hydra.launcher.max_jobs must be null or an integer >= 1; got 0"):
        BoundedLocalLauncher(max_jobs=0)


def test_importing_train_patches_nothing():
    code = (
        "import canonical_network.train\n"
        "from submitit.slurm.slurm import SlurmInfoWatcher\n"
        "print(getattr(SlurmInfoWatcher._make_command, '_cn_sacct_fallback', False))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_the_slurm_launcher_installs_the_sacct_fallback():
    from canonical_network.utils import slurm
    from hydra_plugins.canonical_network_launcher import SacctFallbackSlurmLauncher

    if slurm.shutil.which("scontrol") is None:
        pytest.skip("no scontrol on PATH: the fallback has nothing to patch here")
    try:
        SacctFallbackSlurmLauncher(submitit_folder=".", timeout_min=1)
        from submitit.slurm.slurm import SlurmInfoWatcher

        assert getattr(SlurmInfoWatcher._make_command, "_cn_sacct_fallback", False)
    finally:
        slurm.uninstall_sacct_fallback()


# SIGTERM takes the same path as SIGINT (a KeyboardInterrupt raised by the handler): `make test-full` only.
# SIGINT timed out inside the full `make test` in three runs of three on 2026-11-28 while it passed alone. The likely
# cause: a test before it in the same worker left SIGINT ignored, which the launcher subprocess inherits across
# exec (then Python installs no KeyboardInterrupt handler and a SIGINT does nothing). conftest.py's autouse fixture now restores SIGINT after every
# test and names the test that changed it.
@pytest.mark.parametrize("sig", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow)])
def test_stopping_the_launcher_stops_its_jobs(tmp_path, sig):
    """Ctrl-C (or SIGTERM) sent to a local multirun's launcher process alone: its running jobs stop with it
    (none is left training), and no further job starts."""
    import signal
    import time

    from hydra_plugins.canonical_network_launcher import terminate_children

    assert terminate_children(0) == []  # signal 0: this test process has no child yet
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "canonical_network.train", "-m", "hydra/launcher=local", "hydra.launcher.max_jobs=1",
           "experiment=rotmnist/cnn", "seed=0,1", "logger=none", "trainer.max_epochs=50",
           "trainer.limit_train_batches=4", "trainer.limit_val_batches=1", f"hydra.sweep.dir={sweep}"]
    launcher = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not list(sweep.glob("*/checkpoints/last.ckpt")) and time.time() < deadline:
        time.sleep(0.2)
    assert list(sweep.glob("*/checkpoints/last.ckpt")), "the first job should be training"
    from pathlib import Path

    # the jobs are started from the pool's threads: each thread lists its own children
    jobs = [int(pid) for task in Path(f"/proc/{launcher.pid}/task").iterdir()
            for pid in (task / "children").read_text().split()]
    assert jobs, "the launcher should have a job process"
    launcher.send_signal(getattr(signal, sig))
    try:
        launcher.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        launcher.kill()
        _, err = launcher.communicate()
        pytest.fail(f"the launcher still ran 120 s after {sig}; its stderr ends:\n{err[-4000:]}")
    assert launcher.returncode != 0
    time.sleep(1)
    for pid in jobs:  # gone (or a zombie reaped by init): never still training
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z"
    assert not list(sweep.glob("*/results.json"))  # neither job finished; the second never started
    assert len([p for p in sweep.iterdir() if not p.name.startswith(".") and p.is_dir()]) <= 1


STRESS_APP = '''
import os
import time
from pathlib import Path

import hydra

delay = float(os.environ.get("STRESS_DELAY_S", "0"))
if delay:  # the launcher's process busy elsewhere (another thread submitting) between starting a job and filing it
    from submitit.local import local

    original = local.start_controller

    def slow_start(*args, **kwargs):
        process = original(*args, **kwargs)
        time.sleep(delay)
        return process

    local.start_controller = slow_start


@hydra.main(version_base="1.3", config_path=".", config_name="app")
def main(cfg):
    Path(os.environ["STRESS_OUT"], f"done_{cfg.x}").write_text("")
    return cfg.x


main()
'''
STRESS_CONFIG = """
defaults:
  - override hydra/launcher: local
  - _self_
x: 0
hydra:
  sweep:
    dir: ${oc.env:STRESS_OUT}/sweep
    subdir: ${hydra.job.num}
  launcher:
    max_jobs: 4
    timeout_min: 5
"""


def _stress(tmp_path, name: str, jobs: int, *overrides: str, delay_s: float = 1.0
            ) -> tuple[subprocess.CompletedProcess, set[int]]:
    """A sweep of ``jobs`` jobs that do nothing but write a marker, more than the pool, through the local launcher,
    with the launcher's process made slow (``delay_s``) right after it starts each job."""
    app = tmp_path / "app"
    app.mkdir(exist_ok=True)
    (app / "app.py").write_text(STRESS_APP)
    (app / "app.yaml").write_text(STRESS_CONFIG)
    out = tmp_path / name
    out.mkdir()
    from canonical_network.utils.config import CONFIG_DIR

    result = subprocess.run([sys.executable, "app.py", "-m", f"x=range(0,{jobs})", f"hydra.searchpath=[file://{CONFIG_DIR}]",
                             *overrides], cwd=app, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "STRESS_OUT": str(out), "STRESS_DELAY_S": str(delay_s)})
    return result, {int(p.name.removeprefix("done_")) for p in out.glob("done_*")}


def test_a_local_multirun_never_loses_a_job(tmp_path):
    """Each job is submitted from a thread of the pool while other threads submit theirs. With a folder per job
    (``.submitit/%j``) the launcher made a job's folder only after starting its controller, which opened its log
    file there first when the launcher was slow: the job died with no output ("No output/error stream produced")
    and the multirun failed. Twelve jobs, three times the pool, twice."""
    for attempt in range(2):
        result, done = _stress(tmp_path, f"run{attempt}", 12)
        assert result.returncode == 0, result.stderr[-3000:]
        assert done == set(range(12))


def test_the_stress_loses_jobs_with_a_folder_per_job(tmp_path):
    """The control: the same sweep with the former ``.submitit/%j`` folder loses its jobs (the launcher slowed long
    enough for a job's controller to start, even on a loaded machine)."""
    result, done = _stress(tmp_path, "per_job", 4, "hydra.launcher.submitit_folder=${hydra.sweep.dir}/.submitit/%j",
                           delay_s=8.0)
    assert result.returncode != 0 and "No such file or directory" in result.stderr + result.stdout
    assert len(done) < 4
