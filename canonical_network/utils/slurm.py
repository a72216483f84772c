"""Job states for submitit on Slurm clusters without accounting.

submitit learns whether a Slurm job ended only from ``sacct``. On clusters with accounting disabled
(``AccountingStorageType=accounting_storage/none``, e.g. ``scripts/local_slurm.sh``) ``sacct`` exits with an
error, submitit logs "Bypassing sacct error" and the job state stays UNKNOWN forever. A job that writes its
result pickle is still collected (submitit checks the file first), but one that dies without it (killed,
``scancel``-ed, out of memory, ``os._exit``) leaves ``job.result()`` -- and a Hydra multirun -- waiting
forever.

:func:`install_sacct_fallback` patches one hook, ``SlurmInfoWatcher._make_command`` (the command the watcher
runs to poll states): while ``sacct`` is missing or failing, it returns a command that asks
``scontrol show job`` instead and prints the answer in ``sacct --parsable2`` format, so submitit's own
``read_info`` parses it unchanged. Healthy clusters keep using ``sacct``.

``scontrol`` only knows jobs until ``MinJobAge`` seconds after they end (default 300; the local cluster sets
600). A job it no longer knows has ended, so it is reported as :data:`PURGED_STATE`, a state submitit treats
as final: a job with a result pickle returns it, one without raises ``UncompletedJobError``.

Inside a job, :func:`check_trainer_for_slurm_tasks` refuses a trainer config whose processes do not match the
job's tasks (devices against tasks per node, nodes, strategies that start processes of their own).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

#: State reported for a job that ``scontrol`` no longer knows (it ended more than MinJobAge seconds ago).
PURGED_STATE = "PURGED"

# Non-final scontrol states that submitit's InfoWatcher.is_done would take for final (it lists only READY,
# PENDING, RUNNING, UNKNOWN, REQUEUED, COMPLETING, PREEMPTED); mapped to the nearest state it knows.
_STILL_ACTIVE = {
    "CONFIGURING": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "SPECIAL_EXIT": "PENDING",
    "RESIZING": "RUNNING",
    "SIGNALING": "RUNNING",
    "STAGE_OUT": "RUNNING",
    "STOPPED": "RUNNING",
    "SUSPENDED": "RUNNING",
}

# How long a verdict on sacct is trusted before asking again (it may come back, e.g. a restarted slurmdbd).
_SACCT_PROBE_TTL_S = 300.0
_SACCT_PROBE_TIMEOUT_S = 15.0
_SCONTROL_TIMEOUT_S = 30.0
_sacct_verdict: tuple[float, bool] | None = None  # (time of the probe, sacct works)

_MARK = "_cn_sacct_fallback"


def sacct_works() -> bool:
    """Whether ``sacct`` exists and answers (it exits non-zero when accounting is disabled). Cached."""
    global _sacct_verdict
    now = time.monotonic()
    if _sacct_verdict is not None and now - _sacct_verdict[0] < _SACCT_PROBE_TTL_S:
        return _sacct_verdict[1]
    works = False
    if shutil.which("sacct") is not None:
        try:
            # Any job id does; only the exit status matters (0 even for an unknown id when accounting works).
            probe = subprocess.run(
                ["sacct", "--noheader", "--parsable2", "-X", "-o", "JobID", "-j", "1"],
                capture_output=True,
                timeout=_SACCT_PROBE_TIMEOUT_S,
            )
            works = probe.returncode == 0
        except (OSError, subprocess.SubprocessError):
            works = False
    _sacct_verdict = (now, works)
    return works


def scontrol_command(job_ids: Iterable[str]) -> list[str]:
    """The command that prints the states of ``job_ids`` (submitit ids: ``123`` or ``123_4``) from
    ``scontrol`` in ``sacct -o JobID,State,NodeList --parsable2`` format. Runs this file with the current
    interpreter in isolated mode (``-I``: stdlib only, no site-packages or project imports)."""
    return [sys.executable, "-I", __file__, *sorted(set(job_ids))]


def _fields(record: str) -> dict[str, str]:
    """Key=value pairs of one ``scontrol show job --oneliner`` record (values that hold spaces, like
    JobName or Command, are cut at the first space; only JobId, ArrayJobId, ArrayTaskId, JobState and
    NodeList are read, and those never hold spaces)."""
    out: dict[str, str] = {}
    for token in record.split():
        key, sep, value = token.partition("=")
        if sep and key not in out:  # the first occurrence wins over look-alikes inside later values
            out[key] = value
    return out


def _expand_tasks(array_job: str, spec: str) -> list[str]:
    """Array-task ids ``123_4`` for scontrol's ArrayTaskId of a pending remainder (``5-9``, ``1,3,5-7:2``,
    maybe followed by ``%2``, the throttle)."""
    out = []
    for part in filter(None, spec.split("%")[0].split(",")):
        bounds, _, step = part.partition(":")
        low, _, high = bounds.partition("-")
        out.extend(f"{array_job}_{i}" for i in range(int(low), int(high or low) + 1, int(step or 1)))
    return out


def scontrol_records_to_sacct(records: Sequence[str]) -> list[tuple[str, str, str]]:
    """(JobID, State, NodeList) rows in sacct's id format for ``scontrol show job --oneliner`` records.

    A plain job is ``123``, an array task ``123_4``. An array's still-pending remainder, which scontrol shows
    as one record with e.g. ``ArrayTaskId=5-9``, becomes one row per task.
    """
    rows = []
    for record in records:
        fields = _fields(record)
        if "JobId" not in fields or "JobState" not in fields:
            continue  # not a job record (e.g. a warning line)
        state = _STILL_ACTIVE.get(fields["JobState"], fields["JobState"])
        nodes = fields.get("NodeList", "")
        nodes = "" if nodes == "(null)" else nodes
        array_job, array_task = fields.get("ArrayJobId"), fields.get("ArrayTaskId")
        if array_job and array_task:
            try:
                job_ids = _expand_tasks(array_job, array_task)
            except ValueError:
                continue  # a task list we cannot read: leave those states as they were
        else:
            job_ids = [fields["JobId"]]
        rows.extend((job_id, state, nodes) for job_id in job_ids)
    return rows


def query_scontrol(job_ids: Sequence[str]) -> str:
    """States of submitit ``job_ids`` from ``scontrol``, as ``sacct --parsable2`` text.

    ``scontrol show job`` takes one id, so each main id is asked once (that answers for all its array
    tasks). A job id the controller does not know any more is reported as :data:`PURGED_STATE`, and so is a
    registered array task missing from its array's answer. Any other scontrol failure (e.g. no controller)
    raises, so that submitit keeps the last known states and tries again later.
    """
    lines = ["JobID|State|NodeList"]
    wanted: dict[str, list[str]] = {}
    for job_id in job_ids:
        wanted.setdefault(job_id.split("_")[0], []).append(job_id)
    for main_id, ids in sorted(wanted.items()):
        proc = subprocess.run(
            ["scontrol", "show", "job", "--oneliner", main_id],
            capture_output=True,
            text=True,
            timeout=_SCONTROL_TIMEOUT_S,
        )
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr + proc.stdout:
                lines.extend(f"{job_id}|{PURGED_STATE}|" for job_id in ids)
                continue
            raise RuntimeError(f"scontrol show job {main_id} failed: {proc.stderr.strip() or proc.stdout}")
        rows = scontrol_records_to_sacct(proc.stdout.splitlines())
        seen = {job_id for job_id, _, _ in rows}
        lines.extend("|".join(row) for row in rows)
        lines.extend(f"{job_id}|{PURGED_STATE}|" for job_id in ids if job_id not in seen)
    return "\n".join(lines) + "\n"


#: Lightning strategies that start their own processes: inside a Slurm job, srun has started them already.
_SELF_LAUNCHING = ("spawn", "fork", "notebook")


def check_trainer_for_slurm_tasks(trainer_cfg, environ=None) -> None:
    """Refuse a trainer config that does not match the Slurm job it runs in, naming both sides.

    Inside ``srun`` (Lightning's ``SLURMEnvironment.detect()``; ``hydra/launcher=slurm`` runs every job
    that way) Lightning takes its ranks from Slurm: one task per process, ``SLURM_NTASKS_PER_NODE`` tasks on
    each of ``SLURM_NNODES`` nodes. So ``trainer.devices`` must equal the tasks per node
    (``hydra.launcher.tasks_per_node``), ``trainer.num_nodes`` the nodes (``hydra.launcher.nodes``), and a
    multi-task job needs a strategy that starts no processes of its own (``ddp``: ``trainer=ddp`` on GPUs,
    ``trainer=ddp_cpu_slurm`` on CPUs; ``ddp_fork``/``ddp_spawn`` would start ``devices`` processes in
    every task). Outside Slurm, or in an interactive allocation, nothing is checked. ``environ`` defaults to
    ``os.environ``.
    """
    import os

    env = os.environ if environ is None else environ
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return  # Lightning's own test for "srun started this process" (SLURMEnvironment.detect)
    ntasks = int(env["SLURM_NTASKS"])
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    nodes = int(env.get("SLURM_NNODES", "1"))
    job = f"Slurm job {env.get('SLURM_JOB_ID', '?')}"
    devices = trainer_cfg.get("devices", 1)
    num_nodes = trainer_cfg.get("num_nodes", 1) or 1
    strategy = str(trainer_cfg.get("strategy", "auto"))
    if ntasks > 1 and per_node is None:
        raise ValueError(
            f"{job} runs SLURM_NTASKS={ntasks} tasks without --ntasks-per-node, which Lightning needs to "
            "place its ranks: submit with hydra/launcher=slurm (tasks_per_node follows trainer.devices) or "
            "sbatch --ntasks-per-node"
        )
    if per_node is not None and (isinstance(devices, bool) or not isinstance(devices, int)
                                 or devices != int(per_node)):
        raise ValueError(
            f"trainer.devices={devices!r} but {job} runs {per_node} task(s) per node "
            f"(hydra.launcher.tasks_per_node, SLURM_NTASKS_PER_NODE={per_node}): under Slurm each task is one "
            "process of the run, so they must be the same integer; hydra/launcher=slurm sets tasks_per_node "
            "from trainer.devices unless hydra.launcher.tasks_per_node is overridden"
        )
    if num_nodes != nodes:
        raise ValueError(
            f"trainer.num_nodes={num_nodes!r} but {job} runs on {nodes} node(s) (hydra.launcher.nodes, "
            f"SLURM_NNODES={nodes}): they must be equal; hydra/launcher=slurm sets nodes from trainer.num_nodes "
            "unless hydra.launcher.nodes is overridden"
        )
    if ntasks > 1 and any(word in strategy for word in _SELF_LAUNCHING):
        raise ValueError(
            f"trainer.strategy={strategy!r} starts its own processes, but srun already started the {ntasks} "
            f"tasks of {job} (one per process): use trainer.strategy=ddp (trainer=ddp on GPUs, "
            "trainer=ddp_cpu_slurm on CPUs)"
        )


def install_sacct_fallback() -> bool:
    """Make submitit's Slurm job watcher ask ``scontrol`` while ``sacct`` does not work. Idempotent.

    Cheap and harmless where it does not apply: without ``scontrol`` on PATH it returns False without
    importing submitit; without submitit it returns False. Returns True once the patch is in place.
    Call it in the process that launches jobs (and waits for them), before launching.
    """
    if shutil.which("scontrol") is None:
        return False
    try:
        from submitit.slurm.slurm import SlurmInfoWatcher
    except ImportError:
        return False
    original = SlurmInfoWatcher._make_command
    if getattr(original, _MARK, False):
        return True

    def _make_command(self):  # type: ignore[no-untyped-def]
        command = original(self)
        if command is None or sacct_works():
            return command
        return scontrol_command(self._registered - self._finished)

    setattr(_make_command, _MARK, True)
    _make_command.__wrapped__ = original  # type: ignore[attr-defined]
    _make_command.__doc__ = original.__doc__
    SlurmInfoWatcher._make_command = _make_command  # type: ignore[method-assign]
    return True


def uninstall_sacct_fallback() -> None:
    """Undo :func:`install_sacct_fallback` (for tests)."""
    try:
        from submitit.slurm.slurm import SlurmInfoWatcher
    except ImportError:
        return
    current = SlurmInfoWatcher._make_command
    if getattr(current, _MARK, False):
        SlurmInfoWatcher._make_command = current.__wrapped__  # type: ignore[attr-defined,method-assign]


if __name__ == "__main__":
    # Run by the watcher (see scontrol_command): argv holds submitit job ids; prints sacct-style states.
    try:
        sys.stdout.write(query_scontrol(sys.argv[1:]))
    except Exception as error:  # noqa: BLE001 -- any failure: report it, let submitit keep old states
        print(f"canonical_network.utils.slurm: {error}", file=sys.stderr)
        sys.exit(1)
