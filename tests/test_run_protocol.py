"""scripts/run_protocol.py: fixed job folders, a bounded number of jobs at once, finished jobs skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from canonical_network.utils.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "run_protocol.py"


def run_script(out, *extra):
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--jobs", "2", "--seeds", "0", "1",
           "--experiments", "rotmnist/cnn", *extra, "--", "debug=fast", "logger=none"]
    return subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)


def test_runs_each_job_once_into_its_folder(tmp_path):
    out = tmp_path / "runs"
    first = run_script(out)
    assert first.returncode == 0, first.stdout + first.stderr
    for seed in (0, 1):
        record = json.loads((out / "rotmnist" / "cnn" / f"seed{seed}" / "results.json").read_text())
        assert record["status"] == "completed" and record["seed"] == seed
        assert record["environment"]["torch_threads"] == max(1, (os.cpu_count() or 1) // 2)  # cores / jobs
    commands = (out / "commands.log").read_text().splitlines()
    assert len(commands) == 2 and all("hydra.run.dir=" in c and "debug=fast" in c for c in commands)

    again = run_script(out)
    assert again.returncode == 0 and again.stdout.count("skip rotmnist/cnn") == 2
    assert len((out / "commands.log").read_text().splitlines()) == 2


def test_dependent_row_needs_its_source(tmp_path):
    # CN(pretrained) reads the tested checkpoint of CN(p64) of the same seed; without that run it refuses.
    cmd = [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--seeds", "0", "--experiments",
           "rotmnist/cn_pretrained", "--", "debug=fast"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "rotmnist/cn_p64 seed 0 has not completed" in proc.stdout


def test_collect_copies_only_the_records_of_completed_runs(tmp_path):
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    from collect_runs import collect

    for name, status in (("a/seed0", "completed"), ("b/seed0", "failed")):
        run = tmp_path / "src" / name
        (run / "csv").mkdir(parents=True)
        (run / "checkpoints").mkdir()
        (run / "results.json").write_text(json.dumps({"status": status}))
        (run / "csv" / "metrics.csv").write_text("epoch\n0\n")
        (run / "checkpoints" / "last.ckpt").write_bytes(b"x" * 10)
    copied = collect(tmp_path / "src", tmp_path / "dst")
    assert copied == [tmp_path / "dst" / "a" / "seed0"]
    assert sorted(str(p.relative_to(tmp_path / "dst")) for p in (tmp_path / "dst").rglob("*") if p.is_file()) == [
        "a/seed0/csv/metrics.csv", "a/seed0/results.json"]


def test_collect_never_leaves_another_runs_diagnosis_beside_a_new_record(tmp_path):
    """A run started again here replaces the committed record of its job: the old run's diagnosis goes with it
    (else the report would read run A's figures as run B's); the same record collected twice keeps its own."""
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    from collect_runs import collect

    from canonical_network.records import diagnosis_files

    kept = tmp_path / "dst" / "nbody" / "gnn" / "seed0"
    (kept / "diagnose").mkdir(parents=True)
    (kept / "results.json").write_text(json.dumps({"status": "completed", "run": "A"}))
    (kept / "diagnose" / "diagnostics.json").write_text("{}")
    run = tmp_path / "src" / "nbody" / "gnn" / "seed0"
    (run / "csv").mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"status": "completed", "run": "B"}))
    (run / "csv" / "metrics.csv").write_text("epoch\n0\n")
    (tmp_path / "src" / "nbody" / "gnn" / "seed1").mkdir()
    (tmp_path / "src" / "nbody" / "gnn" / "seed1" / "results.json").write_text("{\"status\": \"compl")  # cut short
    assert collect(tmp_path / "src", tmp_path / "dst") == [kept]
    assert json.loads((kept / "results.json").read_text())["run"] == "B"
    assert diagnosis_files(kept) == [] and (kept / "csv" / "metrics.csv").read_text() == "epoch\n0\n"
    # B's own diagnosis, once made, is kept by every later collect of the same record
    (run / "diagnose").mkdir()
    (run / "diagnose" / "diagnostics.json").write_text('{"b": 1}')
    collect(tmp_path / "src", tmp_path / "dst")
    collect(tmp_path / "src", tmp_path / "dst")
    assert (kept / "diagnose" / "diagnostics.json").read_text() == '{"b": 1}'
    assert not list(kept.rglob(".*.tmp"))
    # a replacing run without metrics, over a record without them either: nothing to remove, no error
    (run / "csv" / "metrics.csv").unlink()
    (kept / "csv" / "metrics.csv").unlink()
    (run / "results.json").write_text(json.dumps({"status": "completed", "run": "C"}))
    assert collect(tmp_path / "src", tmp_path / "dst") == [kept]
    assert json.loads((kept / "results.json").read_text())["run"] == "C"


def test_run_protocol_takes_an_unreadable_record_for_an_unfinished_run(tmp_path):
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import run_protocol

    (tmp_path / "results.json").write_text("{\"status\": \"compl")
    assert run_protocol.completed(tmp_path) is None
    (tmp_path / "results.json").write_text(json.dumps({"status": "completed"}))
    assert run_protocol.completed(tmp_path)["status"] == "completed"


def test_collect_names_a_legacy_cpu_folder_after_its_protocol(tmp_path):
    """A point-cloud budget folder named cpu_<rotation> before issue 34 (GPU runs too) is copied as
    pts<points>_<rotation>: the committed copy says the protocol, and no second copy appears beside it."""
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    from collect_runs import collect

    for name, config in (("modelnet/dgcnn/cpu_z_so3/seed0", {"data": {"num_points": 256}}),
                         ("shapenet/vn_dgcnn/cpu_so3_so3_ep12/seed1", {"data": {"num_points": 256}}),
                         ("nbody/gnn/cpu_like/seed0", {"data": {}})):  # no point count: the name stays
        (tmp_path / "src" / name).mkdir(parents=True)
        (tmp_path / "src" / name / "results.json").write_text(json.dumps({"status": "completed", "config": config}))
    copied = collect(tmp_path / "src", tmp_path / "dst")
    assert sorted(str(p.relative_to(tmp_path / "dst")) for p in copied) == [
        "modelnet/dgcnn/pts256_z_so3/seed0", "nbody/gnn/cpu_like/seed0", "shapenet/vn_dgcnn/pts256_so3_so3_ep12/seed1"]


def test_variants_get_their_own_folders(tmp_path):
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import run_protocol

    assert run_protocol.job_dir(tmp_path, "rotmnist/cn_p64", 2) == tmp_path / "rotmnist" / "cn_p64" / "seed2"
    assert run_protocol.job_dir(tmp_path, "rotmnist/cn_p64", 2, "h16") == tmp_path / "rotmnist" / "cn_p64" / "h16" / "seed2"
    # the command line's --variant reaches the job folders: a finished variant job is found there and skipped
    done = tmp_path / "rotmnist" / "cnn" / "h16" / "seed0"
    done.mkdir(parents=True)
    (done / "results.json").write_text(json.dumps({"status": "completed"}))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--variant", "h16", "--seeds", "0",
                           "--experiments", "rotmnist/cnn"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "skip rotmnist/cnn seed 0 (completed)" in proc.stdout
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--variant", "../x",
                           "--experiments", "rotmnist/cnn"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--variant must be a plain folder name" in proc.stderr


def test_a_committed_record_counts_as_finished_unless_a_run_started_here(tmp_path):
    """A fresh machine has no run folders: with --committed, a job whose final record is kept in the repository
    is skipped; a failed kept record does not count, and a job with a started folder under --out resumes there."""
    kept, out = tmp_path / "kept", tmp_path / "out"
    for seed, status in ((0, "completed"), (1, "failed")):
        (kept / "rotmnist" / "cnn" / f"seed{seed}").mkdir(parents=True)
        (kept / "rotmnist" / "cnn" / f"seed{seed}" / "results.json").write_text(json.dumps({"status": status}))
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import threading

    import run_protocol

    calls = []
    original = run_protocol.subprocess.call
    run_protocol.subprocess.call = lambda cmd, **kw: calls.append(cmd) or 0
    try:
        out.mkdir()
        finished = {("rotmnist/cnn", s): threading.Event() for s in (0, 1)}
        first = [run_protocol.run_job(out, "rotmnist/cnn", s, [], 1, finished, "", kept) for s in (0, 1)]
        assert first[0] == f"skip rotmnist/cnn seed 0 (completed, committed in {kept})"
        assert first[1].startswith("done rotmnist/cnn seed 1") and len(calls) == 1
        (out / "rotmnist" / "cnn" / "seed0" / "checkpoints").mkdir(parents=True)  # a run of seed 0 started here
        again = run_protocol.run_job(out, "rotmnist/cnn", 0, [], 1, finished, "", kept)
        assert again.startswith("done rotmnist/cnn seed 0") and len(calls) == 2
        assert run_protocol.run_job(out, "rotmnist/cnn", 0, [], 1, finished, "", None).startswith("done")
    finally:
        run_protocol.subprocess.call = original


def test_two_processes_share_a_stage_each_job_run_once(tmp_path):
    """The same stage in two processes (two lanes): a job another process has claimed is left to it, not run
    twice and not counted as a failure; the claim ends with the process that held it."""
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import run_protocol

    out, kept = tmp_path / "out", tmp_path / "kept"
    (kept / "rotmnist" / "cnn" / "seed1").mkdir(parents=True)
    (kept / "rotmnist" / "cnn" / "seed1" / "results.json").write_text(json.dumps({"status": "completed"}))
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--seeds", "0", "1", "--committed", str(kept),
           "--experiments", "rotmnist/cnn", "--", "debug=fast", "logger=none"]
    # a POSIX lock is per process, so the other lane is this test process holding seed 0's claim
    with run_protocol.job_claim(out, "rotmnist/cnn", 0) as holder:
        assert holder is None
        proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"busy rotmnist/cnn seed 0 (run by process {os.getpid()}" in proc.stdout
    assert "skip rotmnist/cnn seed 1 (completed, committed in" in proc.stdout
    assert not (out / "rotmnist" / "cnn" / "seed0").exists() and not (out / "commands.log").exists()
    # released: a third process may claim it now
    claim = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import run_protocol, "
                            "pathlib; c = run_protocol.job_claim(pathlib.Path(sys.argv[2]), 'rotmnist/cnn', 0); "
                            "print(c.__enter__())", str(PROJECT_ROOT / "scripts"), str(out)],
                           capture_output=True, text=True, timeout=60)
    assert claim.stdout.strip() == "None", claim.stdout + claim.stderr


def test_a_dependent_job_waits_for_its_source_run_by_another_lane(tmp_path, monkeypatch):
    """Two lanes: lane A runs rotmnist/cn_p64, lane B skips it as busy (which marks it finished in B) and reaches
    rotmnist/cn_pretrained. B used to report it FAILED at once ("has not completed"); it now waits for A's claim
    and starts once A's record is there."""
    import threading
    import time

    from tests.helpers import hold_lock

    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import run_protocol

    out = tmp_path / "out"
    source = run_protocol.job_dir(out, "rotmnist/cn_p64", 0)
    claim = out / ".claims" / "rotmnist" / "cn_p64" / "seed0.lock"
    claim.parent.mkdir(parents=True)
    monkeypatch.setattr(run_protocol, "CLAIM_POLL_S", 0.1)
    calls = []
    monkeypatch.setattr(run_protocol.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    holding = threading.Event()

    def lane_a():  # holds the source's claim, and writes its record a second after lane B reached the dependent
        with hold_lock(claim):
            holding.set()
            time.sleep(1.0)
            (source / "checkpoints").mkdir(parents=True)
            (source / "results.json").write_text(json.dumps({"status": "completed",
                                                             "checkpoint": "checkpoints/epoch_001.ckpt"}))

    finished = {("rotmnist/cn_p64", 0): threading.Event(), ("rotmnist/cn_pretrained", 0): threading.Event()}
    finished[("rotmnist/cn_p64", 0)].set()  # lane B skipped it as busy
    thread = threading.Thread(target=lane_a)
    thread.start()
    try:
        assert holding.wait(timeout=60)
        message = run_protocol.run_job(out, "rotmnist/cn_pretrained", 0, [], 1, finished)
    finally:
        thread.join()
    assert message.startswith("done rotmnist/cn_pretrained seed 0"), message
    assert any(arg.startswith("canonicalization.checkpoint=") for arg in calls[0])
