"""Jobs on a real Slurm cluster: submitit directly, its failure paths, and a Hydra multirun.

Needs a running cluster: `scripts/local_slurm.sh start` (one node on this machine), then
`pytest -m slurm tests/test_slurm.py`. $SLURM_CONF is taken from $CN_SLURM_DIR/slurm.conf (default
/tmp/cn-slurm) when not set. Skipped, with the reason, when Slurm is not installed or not answering.

The submitted functions are stdlib callables (operator.add, math.sqrt, os._exit, time.sleep): submitit
pickles functions by reference, and the jobs could not import this test module.
"""

from __future__ import annotations

import math
import operator
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from canonical_network.utils import slurm as cn_slurm

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
# Upper bound for a small job to be seen as ended: submit, start a Python, poll (submitit polls at 2, 4, 8,
# ... s after a job is registered), plus 15 s that submitit waits for a missing result file.
JOB_DEADLINE_S = 120
# A two-job sweep of the smallest experiment; generous, the machine may be shared.
SWEEP_DEADLINE_S = 900


LOCAL_SLURM_DIR = Path(os.environ.get("CN_SLURM_DIR", "/tmp/cn-slurm"))


def _local_slurm_conf() -> str | None:
    conf = LOCAL_SLURM_DIR / "slurm.conf"
    return str(conf) if conf.is_file() else None


def _local_slurmctld_alive() -> bool:
    """From scripts/local_slurm.sh's pid file: answers at once, where sinfo would retry for ~10 s."""
    try:
        os.kill(int((LOCAL_SLURM_DIR / "run" / "slurmctld.pid").read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


@pytest.fixture(scope="module")
def slurm_cluster():
    """Skips unless `sinfo` answers with a usable node; sets SLURM_CONF for this module (and the jobs and
    subprocesses it starts) and installs the sacct fallback, as the Slurm launcher does."""
    if shutil.which("sinfo") is None:
        pytest.skip("sinfo not found: Slurm is not installed (run scripts/local_slurm.sh start)")
    with pytest.MonkeyPatch.context() as mp:
        if "SLURM_CONF" not in os.environ and _local_slurm_conf():
            if not _local_slurmctld_alive():
                pytest.skip(
                    f"local Slurm cluster in {LOCAL_SLURM_DIR} is stopped; run scripts/local_slurm.sh start"
                )
            mp.setenv("SLURM_CONF", _local_slurm_conf())
        try:
            states = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20, check=True
            ).stdout.split()
        except (subprocess.SubprocessError, OSError) as error:
            pytest.skip(f"Slurm cluster not up (sinfo failed: {error}); run scripts/local_slurm.sh start")
        if not {"idle", "mix", "alloc"} & set(states):  # "idle*" etc.: not responding, powered down, ...
            pytest.skip(f"no usable Slurm node (sinfo states: {states}); run scripts/local_slurm.sh start")
        assert cn_slurm.install_sacct_fallback()
        yield
        cn_slurm.uninstall_sacct_fallback()


@pytest.fixture
def executor(slurm_cluster, tmp_path):
    import submitit

    ex = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="slurm")
    # signal_delay_s + 30 < timeout_min * 60, else Slurm signals the job as timed out at once.
    ex.update_parameters(timeout_min=5, cpus_per_task=1, slurm_signal_delay_s=60, name="cn-test")
    return ex


def wait_done(job, deadline_s: float = JOB_DEADLINE_S) -> None:
    """Watchdog: polls job.done() (what job.result() loops on) and fails instead of hanging."""
    start = time.monotonic()
    while not job.done():
        if time.monotonic() - start > deadline_s:
            job.cancel(check=False)
            pytest.fail(f"job {job.job_id} not seen as ended after {deadline_s} s (state: {job.state})")
        time.sleep(1)


def test_scontrol_records_to_sacct_rows():
    rows = cn_slurm.scontrol_records_to_sacct(
        [
            "JobId=7 ArrayJobId=7 ArrayTaskId=2-3,5%2 JobName=a b JobState=PENDING NodeList=(null)",
            "JobId=8 ArrayJobId=7 ArrayTaskId=0 JobName=x JobState=FAILED NodeList=vm",
            "JobId=9 JobName=y JobState=CONFIGURING NodeList=vm",
            "slurm: a warning line",
        ]
    )
    assert rows == [
        ("7_2", "PENDING", ""),
        ("7_3", "PENDING", ""),
        ("7_5", "PENDING", ""),
        ("7_0", "FAILED", "vm"),
        ("9", "PENDING", "vm"),  # CONFIGURING is not final; submitit would take it for final
    ]


def test_submitit_returns_results(executor):
    jobs = [executor.submit(operator.add, 2, 3), executor.submit(math.factorial, 5)]
    for job in jobs:
        wait_done(job)
    assert [job.result() for job in jobs] == [5, 120]


def test_job_that_raises_fails(executor):
    job = executor.submit(math.sqrt, -1.0)
    wait_done(job)
    with pytest.raises(Exception, match="math domain error"):
        job.result()


def test_jobs_dying_without_result_are_seen_ended(executor):
    """os._exit skips submitit's result pickle: only the job state says the job is over. As an array, like
    Hydra's sweeps."""
    import submitit

    jobs = executor.map_array(os._exit, [1, 0])
    for job in jobs:
        job._results_timeout_s = 1  # submitit waits 15 s for a result file that will never come
        wait_done(job)
        with pytest.raises(submitit.core.utils.UncompletedJobError):
            job.result()
    assert [job.state for job in jobs] == ["FAILED", "COMPLETED"]
    if not cn_slurm.sacct_works():
        # Without the fallback the watcher only has sacct, which fails here: the state stays UNKNOWN,
        # which submitit takes for "still running", so job.result() would wait forever.
        bare = submitit.slurm.slurm.SlurmInfoWatcher()
        bare._make_command = submitit.slurm.slurm.SlurmInfoWatcher._make_command.__wrapped__.__get__(bare)
        assert bare.get_state(jobs[0].job_id, mode="force") == "UNKNOWN"


def test_cancelled_job_is_seen_ended(executor):
    import submitit

    job = executor.submit(time.sleep, 600)
    job._results_timeout_s = 1  # submitit waits 15 s for a result file that will never come
    start = time.monotonic()
    while job.watcher.get_state(job.job_id, mode="force") != "RUNNING":
        assert time.monotonic() - start < JOB_DEADLINE_S, f"job {job.job_id} never started ({job.state})"
        time.sleep(1)
    job.cancel()  # scancel
    wait_done(job)
    assert job.state.startswith("CANCELLED")
    with pytest.raises(submitit.core.utils.UncompletedJobError):
        job.result()


def test_hydra_multirun_on_slurm(slurm_cluster, tmp_path):
    if not (REPO / "canonical_network" / "train.py").is_file():
        pytest.skip("canonical_network/train.py does not exist yet")
    sweep_dir = tmp_path / "sweep"
    command = [
        sys.executable,
        "-m",
        "canonical_network.train",
        "-m",
        "hydra/launcher=slurm",
        "experiment=rotmnist/cnn",
        "debug=fast",
        "logger=none",
        "seed=1,2",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    try:
        proc = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=SWEEP_DEADLINE_S, env=os.environ.copy()
        )
    except subprocess.TimeoutExpired:
        # submitit names a folder per array task, <array id>_<task>: cancel those arrays, nothing else.
        array_ids = {path.name.split("_")[0] for path in sweep_dir.glob(".submitit/*_*")}
        if array_ids:
            subprocess.run(["scancel", *sorted(array_ids)], check=False)
        pytest.fail(f"sweep did not finish within {SWEEP_DEADLINE_S} s; job logs: {sweep_dir / '.submitit'}")
    logs = "\n".join(
        f"--- {path}\n{path.read_text()[-3000:]}" for path in sorted(sweep_dir.glob(".submitit/*/*.err"))
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}\n{logs}"
    results = sorted(sweep_dir.rglob("results.json"))
    assert len(results) == 2, f"expected 2 results.json below {sweep_dir}, found {results}\n{logs}"
