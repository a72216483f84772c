"""Jobs on a real Slurm cluster: submitit directly, its failure paths, and a Hydra multirun.

Needs a running cluster: `scripts/local_slurm.sh start` (one node on this machine), then
`pytest -m slurm tests/test_slurm.py`. $SLURM_CONF is taken from $CN_SLURM_DIR/slurm.conf (default
/tmp/cn-slurm) when not set. Skipped, with the reason, when Slurm is not installed or not answering.

The submitted functions are stdlib callables (operator.add, math.sqrt, os._exit, time.sleep): submitit
pickles functions by reference, and the jobs could not import this test module.

The last tests run training jobs of two tasks (one CPU process each, trainer=ddp_cpu_slurm) through
hydra/launcher=slurm: one record, the metrics one process measures (5 minutes on a busy 2-core machine), and,
marked slow, a requeue and a SIGTERM that both resume (15 minutes together, their uninterrupted reference job
included; the node runs one such job at a time).
"""

from __future__ import annotations

import json
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


# ------------------------------------------------------------------ multi-task DDP jobs (issue 37 item 3)
#: Two tasks of one job, one CPU process each: nbody/gnn on a small generated data set whose test split (49
#: systems) is not a multiple of 2, so each sample must be read by exactly one process.
DDP_TASKS = 2
DDP_ARGS = ["experiment=nbody/gnn", "trainer=ddp_cpu_slurm", f"trainer.devices={DDP_TASKS}", "logger=csv", "seed=3",
            "data.num_train=64", "data.num_valid=16", "data.num_test=49", "data.batch_size=8",
            "data.max_train_samples=64", "data.seed=5", "trainer.check_val_every_n_epoch=1",
            "trainer.enable_progress_bar=false", "callbacks.rich_progress_bar=null", "hydra.launcher.timeout_min=10"]
#: A job imports torch and Lightning in every task (about a minute each on a busy 2-core machine); a requeued
#: job waits about 2 minutes (Slurm's begin time after a requeue) before it starts again.
DDP_DEADLINE_S = 900
#: Variables of an enclosing launcher or job that would override the ranks Slurm gives the tasks.
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def _clean_env() -> dict[str, str]:
    """This process's environment without rank variables and without the variables of a Slurm job it may run
    in (SLURM_CONF stays), one intra-op thread per process, W&B offline."""
    env = {k: v for k, v in os.environ.items()
           if k not in _RANK_VARIABLES and not (k.startswith("SLURM_") and k != "SLURM_CONF")}
    return {**env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}


def _ddp_sweep(sweep_dir: Path, data_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "canonical_network.train", "-m", "hydra/launcher=slurm", *DDP_ARGS,
            f"data.data_dir={data_dir}", f"hydra.sweep.dir={sweep_dir}", *extra]


def _submitit_logs(sweep_dir: Path) -> str:
    return "\n".join(f"--- {path}\n{path.read_text()[-3000:]}"
                     for path in sorted(sweep_dir.glob(".submitit/*/*_log.*")))


def _cancel_jobs(sweep_dir: Path) -> None:
    """scancel the jobs of this sweep only (submitit's folder per job is named by its job id)."""
    job_ids = {path.name.split("_")[0] for path in sweep_dir.glob(".submitit/*") if path.name[:1].isdigit()}
    if job_ids:
        subprocess.run(["scancel", *sorted(job_ids)], check=False)


def _records(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.rglob("results.json") if ".submitit" not in p.parts)


def _finish(proc: subprocess.Popen, sweep_dir: Path, deadline_s: float) -> str:
    try:
        out, _ = proc.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _cancel_jobs(sweep_dir)
        pytest.fail(f"sweep did not finish within {deadline_s} s\n{_submitit_logs(sweep_dir)}")
    assert proc.returncode == 0, f"{out[-4000:]}\n{_submitit_logs(sweep_dir)}"
    return out


@pytest.fixture(scope="module")
def nbody_dir(tmp_path_factory) -> Path:
    """Where the jobs generate the small N-body data set (the first job does; the others read it)."""
    return tmp_path_factory.mktemp("nbody")


def test_two_task_ddp_job_writes_one_record_that_one_process_reproduces(slurm_cluster, tmp_path, nbody_dir):
    """One Slurm job of two tasks trains and tests through hydra/launcher=slurm; Lightning takes the ranks from
    Slurm; rank 0 alone writes results.json; evaluating its tested checkpoint in one process gives its metrics.

    Tolerance: as tests/test_ddp_evaluation.py (RTOL = 2¹² · eps32 relative): the two processes' partial sums
    of the test MSE are added in another order than one process's sum. On this machine they agreed exactly.
    """
    from tests.test_ddp_evaluation import RTOL

    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen(_ddp_sweep(sweep_dir, nbody_dir, "trainer.max_epochs=2"), cwd=REPO, env=_clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _finish(proc, sweep_dir, DDP_DEADLINE_S)
    logs = _submitit_logs(sweep_dir)
    records = _records(sweep_dir)
    assert len(records) == 1, f"expected one results.json below {sweep_dir}, found {records}\n{logs}"
    run_dir = records[0].parent
    record = json.loads(records[0].read_text())
    assert record["status"] == "completed" and record["epochs"] == 2
    assert record["config"]["trainer"]["devices"] == DDP_TASKS
    # one submitit log per task; Lightning's line naming each task's rank, from SLURM_PROCID / SLURM_NTASKS
    task_logs = {int(p.name.split("_")[1]): p.read_text() for p in sweep_dir.glob(".submitit/*/*_log.out")}
    assert sorted(task_logs) == list(range(DDP_TASKS)), logs
    for rank, text in task_logs.items():
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/{DDP_TASKS}" in text, logs
    assert "Summary" in task_logs[0] and "Summary" not in task_logs[1]  # the record is rank 0's alone

    checkpoint = run_dir / record["checkpoint"]
    evaluation = subprocess.run(
        [sys.executable, "-m", "canonical_network.evaluate", f"ckpt_path={checkpoint}", "trainer=cpu", "logger=none",
         f"hydra.run.dir={tmp_path / 'evaluate'}"],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert evaluation.returncode == 0, evaluation.stderr[-3000:]
    single = json.loads((tmp_path / "evaluate" / "results.json").read_text())["metrics"]
    assert set(single) == set(record["metrics"]) and "test/mse" in single
    for key, value in single.items():
        assert math.isclose(record["metrics"][key], value, rel_tol=RTOL, abs_tol=0.0), (key, record["metrics"][key],
                                                                                         value)


#: Long enough (about a second an epoch) for a signal to land in the middle of training.
RESUME_EPOCHS = 30


def _start(sweep_dir: Path, data_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(_ddp_sweep(sweep_dir, data_dir, f"trainer.max_epochs={RESUME_EPOCHS}"), cwd=REPO,
                            env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _signal_after_first_checkpoint(proc: subprocess.Popen, sweep_dir: Path, signal_name: str) -> None:
    """Wait for the run's first last.ckpt, then send ``signal_name`` to every task of the sweep's one job."""
    start = time.monotonic()
    while proc.poll() is None and time.monotonic() - start < DDP_DEADLINE_S:
        if list(sweep_dir.glob("*/checkpoints/last.ckpt")):
            break
        time.sleep(0.2)
    else:
        proc.kill()
        _cancel_jobs(sweep_dir)
        pytest.fail(f"the job ended or never checkpointed (launcher exit {proc.poll()})\n{_submitit_logs(sweep_dir)}")
    (job_id,) = {p.name for p in sweep_dir.glob(".submitit/*") if p.name.isdigit()}
    subprocess.run(["scancel", f"--signal={signal_name}", job_id], check=True, timeout=60)


def _assert_resumed(sweep_dir: Path, reference: dict) -> None:
    """One completed record, resumed from last.ckpt, with the test metrics of the uninterrupted job (the
    tolerance of the test above; same processes, same batches: they agreed to the bit here)."""
    from tests.test_ddp_evaluation import RTOL

    logs = _submitit_logs(sweep_dir)
    records = _records(sweep_dir)
    assert len(records) == 1, f"expected one results.json below {sweep_dir}, found {records}\n{logs}"
    record = json.loads(records[0].read_text())
    assert record["status"] == "completed" and record["epochs"] == RESUME_EPOCHS
    assert record["resumed_from"] == "checkpoints/last.ckpt", logs
    assert not (records[0].parent / "attempts").exists(), "a stopped job is not a failed attempt"
    for key, value in reference["metrics"].items():
        assert math.isclose(record["metrics"][key], value, rel_tol=RTOL, abs_tol=0.0), (key, record["metrics"][key],
                                                                                         value)


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster, tmp_path_factory, nbody_dir) -> dict:
    """The record of the two-task job that the resume tests interrupt, run without interruption."""
    sweep_dir = tmp_path_factory.mktemp("uninterrupted") / "sweep"
    _finish(_start(sweep_dir, nbody_dir), sweep_dir, DDP_DEADLINE_S)
    (record,) = [json.loads(p.read_text()) for p in _records(sweep_dir)]
    return record


@pytest.mark.slow
def test_signalled_two_task_job_is_requeued_and_resumes_where_it_stopped(tmp_path, nbody_dir, uninterrupted):
    """USR2 to a running two-task job (what Slurm sends signal_delay_s before the time limit, and on preemption):
    rank 0's submitit handler requeues the job, Slurm ends both tasks (SIGTERM, then SIGKILL), and the requeued
    job resumes every rank from the run's last.ckpt within the same launcher call. Before the data modules kept
    the run's seed for shuffling (tests/test_ddp_evaluation.py), the resumed job dealt other batches: test MSE
    0.0580 against 0.0573."""
    sweep_dir = tmp_path / "sweep"
    proc = _start(sweep_dir, nbody_dir)
    _signal_after_first_checkpoint(proc, sweep_dir, "USR2")
    _finish(proc, sweep_dir, DDP_DEADLINE_S)
    task_logs = "".join(p.read_text() for p in sweep_dir.glob(".submitit/*/*_log.*"))
    assert "Requeued job" in task_logs and task_logs.count("Resuming from") == DDP_TASKS, _submitit_logs(sweep_dir)
    _assert_resumed(sweep_dir, uninterrupted)


@pytest.mark.slow
def test_sigtermed_two_task_job_stops_and_rerunning_the_sweep_resumes_it(tmp_path, nbody_dir, uninterrupted):
    """SIGTERM to every task (scancel --signal=TERM; no requeue): each rank stops at the next step, without a
    record, and the job fails (exit 143); the same sweep command again resumes the run from last.ckpt."""
    sweep_dir = tmp_path / "sweep"
    proc = _start(sweep_dir, nbody_dir)
    _signal_after_first_checkpoint(proc, sweep_dir, "TERM")
    try:
        out, _ = proc.communicate(timeout=DDP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _cancel_jobs(sweep_dir)
        pytest.fail(f"the stopped job was not seen as ended\n{_submitit_logs(sweep_dir)}")
    logs = _submitit_logs(sweep_dir)
    assert proc.returncode != 0, f"a stopped job must not end the sweep as a success\n{out[-3000:]}"
    assert not _records(sweep_dir), "a stopped run must not report results"
    task_logs = [p.read_text() for p in sweep_dir.glob(".submitit/*/*_log.out")]
    assert len(task_logs) == DDP_TASKS and all("Stopped by SIGTERM" in text for text in task_logs), logs

    _finish(_start(sweep_dir, nbody_dir), sweep_dir, DDP_DEADLINE_S)
    _assert_resumed(sweep_dir, uninterrupted)
