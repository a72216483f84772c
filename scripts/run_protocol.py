"""Run a table's rows x seeds at a fixed protocol, a bounded number of jobs at a time, resumably.

Each job trains into its own fixed folder ``<out>/<experiment>/seed<k>`` (``hydra.run.dir``), so rerunning
the same command resumes unfinished jobs from their ``last.ckpt`` and skips finished ones (a
``results.json`` with ``"status": "completed"``), and, given ``--committed DIR`` (``scripts/reproduce.sh`` passes
``docs/reproduction/runs``, where ``scripts/collect_runs.py`` keeps the records), skips a job whose final
record is kept there, so a stage restarted on a fresh machine does not spend hours redoing finished runs; given
``--unfinished DIR`` (where ``scripts/collect_runs.py --unfinished`` parks runs that have not finished), a job with
no run folder of its own is first put back from DIR and resumes there. Unlike ``hydra/launcher=local``, which starts every job
of a sweep at once, at most ``--jobs`` processes run together, each limited to ``--threads`` threads.

    python scripts/run_protocol.py --out outputs/reproduction/rotmnist --jobs 2 --seeds 0 1 2 \\
        --experiments rotmnist/cnn rotmnist/cn_p64 rotmnist/cn_pretrained -- trainer.max_epochs=100 logger=csv

Ablations: ``--variant NAME`` puts the jobs in ``<out>/<experiment>/NAME/seed<k>``, so variants of a row
(``-- canonicalization.hidden_channels=16``) never share a folder with the row itself.

``rotmnist/cn_pretrained`` is given the tested checkpoint of the ``rotmnist/cn_p64`` job of the same seed
(which therefore runs first). The command of every job is appended to ``<out>/commands.log``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from canonical_network.records import FINAL_STATUSES, RESULTS_FILE, RunResults, path_from_record, read_results
from canonical_network.utils.files import exclusive_lock
from canonical_network.utils.unfinished import LAST, restore

# Rows that need another row's finished run: (experiment) -> (source experiment, override key).
DEPENDS_ON = {"rotmnist/cn_pretrained": ("rotmnist/cn_p64", "canonicalization.checkpoint")}


def job_dir(out: Path, experiment: str, seed: int, variant: str = "") -> Path:
    """``<out>/<experiment>[/<variant>]/seed<k>``."""
    return out / experiment / variant / f"seed{seed}" if variant else out / experiment / f"seed{seed}"


def completed(run_dir: Path) -> RunResults | None:
    """The job's record when it is final: completed, or diverged (rerunning it would only repeat that)."""
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        return None
    try:
        record = read_results(path)
    except ValueError:  # unreadable (cut short while written): not a final record; the run resumes
        return None
    return record if isinstance(record, dict) and record.get("status") in FINAL_STATUSES else None


def run_job(out: Path, experiment: str, seed: int, overrides: list[str], threads: int,
            finished: dict[tuple[str, int], threading.Event], variant: str = "",
            committed: Path | None = None, unfinished: Path | None = None) -> str:
    """Run one job; returns its line (done / skip / busy / resume / FAILED ...). An error of this script's own
    (an unreadable parked copy, a full disk) is that job's FAILED line: the other jobs go on and are reported."""
    try:
        return _run_job(out, experiment, seed, overrides, threads, finished, variant, committed, unfinished)
    except Exception as error:  # noqa: BLE001 - reported as this job's failure, never aborting the others
        return f"FAILED {experiment} seed {seed}: {type(error).__name__}: {error}"
    finally:
        finished[(experiment, seed)].set()


#: Keys a finished record answers the job for whatever their value, beyond those a run may change when it resumes
#: (``RESUME_NEUTRAL_KEYS``: where files live, logging, the accelerator, compile=...): how the matmuls round, and
#: the checkpoint a CN(pretrained) row reads (a path of this machine).
EXECUTION_ONLY = ("matmul_precision", "canonicalization.checkpoint")
#: Resume-neutral keys that are nevertheless the protocol a finished record was made at: a run resumes to a longer
#: budget, but a record of 200 epochs does not answer a call for 1,000.
PROTOCOL_KEYS = ("trainer.max_epochs", "trainer.min_epochs", "callbacks.early_stopping", "callbacks.early_stopping.*",
                 "test", "test_ckpt")


def _compared(key: str) -> bool:
    import fnmatch

    from canonical_network.utils.checkpoints import RESUME_NEUTRAL_KEYS

    def matches(patterns) -> bool:
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)

    return not matches(EXECUTION_ONLY) and (matches(PROTOCOL_KEYS) or not matches(RESUME_NEUTRAL_KEYS))


def _same(requested, recorded) -> bool:
    if requested == recorded:
        return True
    numbers = [v for v in (requested, recorded) if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    if len(numbers) == 2:
        try:
            return float(requested) == float(recorded)
        except ValueError:
            pass
    return str(requested) == str(recorded)


def protocol_differences(record: dict, overrides: list[str]) -> list[tuple[str, str, object]]:
    """``(key, requested value, recorded value)`` for each plain ``key=value`` override of this call that the
    record's resolved config contradicts (a key the record does not hold, a whole config group, or an override of
    another form, is not judged; nor is a key that says only how or where the run executes, :func:`_compared`),
    and each synthetic-shapes difficulty knob the call leaves at today's default that the record holds at another
    value (``records.shapes_difficulty_changes``). A finished record of another protocol in the job's
    folder -- a stage rerun with a budget set by an environment variable, FA_EPOCHS=1000 over the 200-epoch
    records -- must not be taken for the run this call asks for."""
    import yaml

    config = record.get("config")
    if not isinstance(config, dict):
        return []
    found = []
    for override in overrides:
        # ++key=value sets the key whether or not the config has it: judged as key=value (+key appends a key the
        # config lacks, which Hydra refuses for one it has)
        override = override.removeprefix("++")
        if override.startswith(("+", "~")) or "=" not in override:
            continue
        key, _, text = override.partition("=")
        if not _compared(key):
            continue
        node, missing = config, False
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                missing = True
                break
            node = node[part]
        if missing:
            continue
        try:
            requested = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            requested = text
        if isinstance(requested, dict) or isinstance(node, dict):
            continue  # a whole group (data=..., a mapping): not judged here
        if not _same(requested, node):
            found.append((key, text, node))
    # a synthetic-shapes run made before a difficulty default moved is other data, though no override says so
    from canonical_network.records import shapes_difficulty_changes

    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    given = {override.partition("=")[0].removeprefix("++") for override in overrides}
    for knob, default, recorded in shapes_difficulty_changes({f"config.data.{k}": v for k, v in data.items()}):
        if f"data.{knob}" not in given:
            found.append((f"data.{knob}", f"{default} (today's default)", recorded))
    return found


def _finished_elsewhere(experiment: str, seed: int, record: dict, where: Path, overrides: list[str]) -> str | None:
    """The FAILED line for a finished record that another protocol made, else None (the job is skipped)."""
    differences = protocol_differences(record, overrides)
    if not differences:
        return None
    said = "; ".join(f"{key}={text} asked, {recorded!r} in the record" for key, text, recorded in differences)
    return (f"FAILED {experiment} seed {seed}: its finished record in {where} was made with other settings ({said}). "
            "Give this protocol folders of its own (--variant; scripts/reproduce.sh names them by the setting), or "
            "remove that record to redo it")


def _run_job(out: Path, experiment: str, seed: int, overrides: list[str], threads: int,
             finished: dict[tuple[str, int], threading.Event], variant: str,
             committed: Path | None = None, unfinished: Path | None = None) -> str:
    with job_claim(out, experiment, seed, variant) as holder:
        if holder is not None:
            return f"busy {experiment} seed {seed} (run by {holder}: left to it)"
        return _claimed_job(out, experiment, seed, overrides, threads, finished, variant, committed, unfinished)


@contextmanager
def job_claim(out: Path, experiment: str, seed: int, variant: str = ""):
    """Claim a job for this process while it runs: yields None when claimed, else who holds it.

    Several ``run_protocol.py`` processes may work through the same jobs (the same stage started in two shells,
    ``JOBS=1`` each, is two lanes that never leave a core idle while the other still has jobs): each job is run
    by the first process to claim it, and skipped by the others. The claim is a POSIX lock on
    ``<out>/.claims/<job>.lock``, outside the run folder, released by the kernel however the process ends."""
    path = out / ".claims" / job_dir(Path(), experiment, seed, variant).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(path) as holder:
        yield holder


#: how often a job waiting on a source that another process runs checks whether it has finished (seconds)
CLAIM_POLL_S = 30.0


def wait_while_claimed(out: Path, experiment: str, seed: int, variant: str = "") -> None:
    """Return once no process holds the job's claim: a source job run by another lane (this process skipped it
    as busy, which marks it finished here) is waited for instead of being taken for one that never ran."""
    while True:
        with job_claim(out, experiment, seed, variant) as holder:
            if holder is None:
                return
        time.sleep(CLAIM_POLL_S)


def _claimed_job(out: Path, experiment: str, seed: int, overrides: list[str], threads: int,
                 finished: dict[tuple[str, int], threading.Event], variant: str,
                 committed: Path | None, unfinished: Path | None) -> str:
    run_dir = job_dir(out, experiment, seed, variant)
    if record := completed(run_dir):
        return (_finished_elsewhere(experiment, seed, record, run_dir, overrides)
                or f"skip {experiment} seed {seed} ({record['status']})")
    # a record kept in the repository is the job's result: the job is skipped, and an unfinished run of it left
    # here (a machine that started it before it finished elsewhere) is not resumed, only named -- its record
    # would replace the kept one when collected
    if committed is not None and (record := completed(job_dir(committed, experiment, seed, variant))):
        kept = job_dir(committed, experiment, seed, variant)
        if failure := _finished_elsewhere(experiment, seed, record, kept, overrides):
            return failure
        left = (f"; the unfinished run in {run_dir} is left as it is (remove it, or pass COMMITTED= / no "
                "--committed to resume it)") if (run_dir / "checkpoints").exists() else ""
        return f"skip {experiment} seed {seed} ({record['status']}, committed in {committed}{left})"
    # a run parked on another machine (scripts/collect_runs.py --unfinished) resumes here from its last.ckpt; one
    # further along than the run here replaces it (set aside in the run folder's superseded/)
    if unfinished is not None:
        parked = job_dir(unfinished, experiment, seed, variant)
        had_run = (run_dir / LAST).is_file()  # restored over it only when it was behind the parked copy
        try:
            restored = restore(parked, run_dir, replace_behind=True)
        except Exception as error:  # noqa: BLE001 - a bad copy is this job's failure, named
            return (f"FAILED {experiment} seed {seed}: the parked copy {parked} could not be read ({type(error).__name__}:"
                    f" {error}); remove it, or pass UNFINISHED= / no --unfinished to run without it")
        if restored:
            aside = " (further along than the run here, which is set aside in its superseded/)" if had_run else ""
            print(f"resume {experiment} seed {seed} from {parked}{aside}", flush=True)
    extra = []
    if experiment in DEPENDS_ON:
        source, key = DEPENDS_ON[experiment]
        if (source, seed) in finished:  # queued before this job, so it is running or done: wait for it
            finished[(source, seed)].wait()
        wait_while_claimed(out, source, seed, variant)  # another lane (process) may be running it: wait for it too
        record = completed(job_dir(out, source, seed, variant))
        if record is None and committed is not None and completed(job_dir(committed, source, seed, variant)):
            return (f"FAILED {experiment} seed {seed}: it needs the checkpoint of {source} seed {seed}, which "
                    f"finished elsewhere: only its record is kept (in {committed}), not its checkpoints. Run "
                    f"{source} here again (COMMITTED= / no --committed) or point {key} at its checkpoint")
        if record is None or record["status"] != "completed":
            return f"FAILED {experiment} seed {seed}: {source} seed {seed} has not completed in {out}"
        source_dir = job_dir(out, source, seed, variant)
        extra.append(f"{key}={path_from_record(record['checkpoint'], source_dir)}")  # a record's path: see RunResults
    cmd = [sys.executable, "-m", "canonical_network.train", f"experiment={experiment}", f"seed={seed}",
           f"hydra.run.dir={run_dir}", *extra, *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(out / "commands.log", "a") as log:
        log.write(" ".join(cmd[1:]) + "\n")
    start = time.time()
    with open(run_dir / "stdout.log", "a") as stdout:
        rc = subprocess.call(cmd, stdout=stdout, stderr=subprocess.STDOUT, env=env)
    status = "done" if rc == 0 else f"FAILED (exit {rc}, see {run_dir / 'stdout.log'})"
    return f"{status} {experiment} seed {seed} in {time.time() - start:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder of the job folders")
    parser.add_argument("--experiments", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=1, help="jobs at once (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="threads per job (default: cores / jobs)")
    parser.add_argument("--variant", default="", help="subfolder name for an ablation (see above)")
    parser.add_argument("--committed", default="",
                        help="folder of kept records, laid out as --out: a job with a final record there and no "
                             "run folder of its own under --out is skipped (default: none)")
    parser.add_argument("--unfinished", default="",
                        help="folder of parked unfinished runs, laid out as --out: a job with no run folder of its "
                             "own under --out is put back from there and resumes (default: none)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every job (after --)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1 (or left out: cores / jobs), got {args.threads}")
    for name, values in (("--seeds", args.seeds), ("--experiments", args.experiments)):
        if twice := sorted({str(v) for v in values if values.count(v) > 1}):
            # two threads of one process would both hold the job's claim (a POSIX lock is the process's)
            parser.error(f"{name} lists {', '.join(twice)} more than once")
    if bad := [e for e in args.experiments if e.startswith("/") or ".." in Path(e).parts or "\\" in e]:
        parser.error(f"--experiments takes names of configs/experiment/<family>/<row>.yaml, not paths: {bad}")
    from canonical_network.utils.config import check_experiment_names

    try:  # before any folder is made: a typo would otherwise leave a run folder and a claim per seed
        check_experiment_names([*(f"experiment={e}" for e in args.experiments), *args.overrides],
                               command="run_protocol.py")
    except SystemExit as error:  # the check printed its one line
        if not isinstance(error.code, int):
            print(error, file=sys.stderr)
        return 2
    if args.variant and not args.variant.replace("_", "").replace("-", "").replace(".", "").isalnum():
        parser.error(f"--variant must be a plain folder name (letters, digits, _ - .), got {args.variant!r}")
    committed = Path(args.committed) if args.committed else None
    unfinished = Path(args.unfinished) if args.unfinished else None
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    # Seeds outer, so every row has a first seed before any row has a third; the sources of dependencies
    # first within a seed and their dependents last, so a dependent waits as little as possible.
    sources = {source for source, _ in DEPENDS_ON.values()}
    order = sorted(args.experiments, key=lambda e: (e in DEPENDS_ON) - (e in sources))
    jobs = [(e, s) for s in args.seeds for e in order]
    finished = {job: threading.Event() for job in jobs}
    failures = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for message in pool.map(lambda job: run_job(args.out, *job, args.overrides, threads, finished, args.variant,
                                                 committed, unfinished), jobs):
            print(message, flush=True)
            failures += message.startswith("FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
