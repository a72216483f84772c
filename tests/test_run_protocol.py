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
    """A run started again here replaces the committed record of its job only when asked (``replace``): without
    it the kept record stays and the run is listed; with it the old run's diagnosis goes with it (else the report
    would read run A's figures as run B's); the same record collected twice keeps its own."""
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
    refused = []
    assert collect(tmp_path / "src", tmp_path / "dst", refused=refused) == []
    assert refused == [(run, kept / "results.json")]
    assert json.loads((kept / "results.json").read_text())["run"] == "A" and diagnosis_files(kept)
    assert collect(tmp_path / "src", tmp_path / "dst", replace=True) == [kept]
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
    assert collect(tmp_path / "src", tmp_path / "dst", replace=True) == [kept]
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


def test_a_committed_record_counts_as_finished_even_where_a_run_started_here(tmp_path):
    """A fresh machine has no run folders: with --committed, a job whose final record is kept in the repository
    is skipped; a failed kept record does not count. An unfinished run of the job left here (started before the
    job finished elsewhere) is named and left alone, not resumed: it used to be, hours of training redone, and
    its record then replaced the kept one. Without --committed it resumes."""
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
        assert again.startswith(f"skip rotmnist/cnn seed 0 (completed, committed in {kept}; the unfinished run in ")
        assert "is left as it is" in again and len(calls) == 1
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


def _record(folder, **config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"status": "completed", "config": config}))


def test_a_finished_record_of_another_protocol_is_not_taken_for_the_job(tmp_path):
    """A stage rerun with a budget set by an environment variable (FA_EPOCHS=1000 over the 200-epoch records of the
    same folders) used to print "skip ... (completed)" and never run the protocol asked for. A finished record,
    here or kept, whose config contradicts a plain override of the call is now the job's FAILED line, naming the
    setting; how or where the job runs (compile=, the logger, hydra.*) is not compared, and 1e-3 is 0.001."""
    import threading

    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import run_protocol

    out, kept = tmp_path / "out", tmp_path / "kept"
    _record(out / "nbody" / "fa_gnn" / "seed0", trainer={"max_epochs": 200}, model={"optimizer": {"lr": 0.001}},
            callbacks={"early_stopping": None})
    _record(kept / "nbody" / "fa_gnn" / "seed1", trainer={"max_epochs": 200}, compile=False)
    finished = {("nbody/fa_gnn", s): threading.Event() for s in (0, 1)}
    same = ["trainer.max_epochs=200", "model.optimizer.lr=1e-3", "callbacks.early_stopping=null", "compile=true",
            "logger=csv", "hydra.run.dir=x", "+new.key=1", "data.unknown=3"]
    assert run_protocol.run_job(out, "nbody/fa_gnn", 0, same, 1, finished) == "skip nbody/fa_gnn seed 0 (completed)"
    assert run_protocol.run_job(out, "nbody/fa_gnn", 1, same, 1, finished, "", kept).startswith(
        "skip nbody/fa_gnn seed 1 (completed, committed in")
    for seed, committed in ((0, None), (1, kept)):
        message = run_protocol.run_job(out, "nbody/fa_gnn", seed, ["trainer.max_epochs=1000"], 1, finished, "",
                                       committed)
        assert message.startswith(f"FAILED nbody/fa_gnn seed {seed}: its finished record in ")
        assert "trainer.max_epochs=1000 asked, 200 in the record" in message and "--variant" in message
    assert not (out / "commands.log").exists()  # nothing was run


def test_a_shapes_record_made_at_an_earlier_difficulty_default_is_not_taken_for_the_job(tmp_path):
    """A synthetic-shapes run made before a difficulty default moved (no override said so) is other data: its
    finished record is the job's FAILED line naming the knob, not a skip; the same difficulty given on the command
    line, or a record at today's defaults, is the job's result."""
    import threading

    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import run_protocol

    from canonical_network.records import shapes_difficulty_defaults

    module = "canonical_network.data.synthetic_shapes40.SyntheticShapes40DataModule"
    today = shapes_difficulty_defaults("SyntheticShapes40DataModule")
    earlier = round(today["scale_jitter"] / 2, 3)
    out = tmp_path / "out"
    _record(out / "modelnet" / "dgcnn" / "seed0", data={"_target_": module, **today, "scale_jitter": earlier})
    _record(out / "modelnet" / "dgcnn" / "seed1", data={"_target_": module, **today})
    finished = {("modelnet/dgcnn", s): threading.Event() for s in (0, 1)}
    message = run_protocol.run_job(out, "modelnet/dgcnn", 0, ["data=synthetic_shapes40"], 1, finished)
    assert message.startswith("FAILED modelnet/dgcnn seed 0: its finished record in ")
    assert f"data.scale_jitter={today['scale_jitter']} (today's default) asked, {earlier} in the record" in message
    assert run_protocol.run_job(out, "modelnet/dgcnn", 0, [f"data.scale_jitter={earlier}"], 1, finished) == (
        "skip modelnet/dgcnn seed 0 (completed)")
    forced = run_protocol.run_job(out, "modelnet/dgcnn", 0, [f"++data.scale_jitter={today['scale_jitter']}"], 1,
                                  finished)  # ++key=value is judged as key=value
    assert forced.startswith("FAILED") and f"data.scale_jitter={today['scale_jitter']} asked, {earlier}" in forced
    assert run_protocol.run_job(out, "modelnet/dgcnn", 1, ["data=synthetic_shapes40"], 1, finished) == (
        "skip modelnet/dgcnn seed 1 (completed)")
    assert not (out / "commands.log").exists()  # nothing was run


def test_bad_job_lists_are_refused_before_anything_is_written(tmp_path):
    """Duplicate seeds or experiments (two threads of one process would both hold the job's claim), unknown
    experiment names and paths are refused by the argument check: one line naming the value, exit 2, no folder."""
    out = tmp_path / "out"
    cases = [(["--seeds", "0", "0", "--experiments", "nbody/linear"], "--seeds lists 0 more than once"),
             (["--experiments", "nbody/linear", "nbody/linear"], "--experiments lists nbody/linear more than once"),
             (["--experiments", "../../escape"], "not paths: ['../../escape']"),
             (["--experiments", "nbody/cn_gnm"], "experiment=nbody/cn_gnm does not exist"),
             (["--threads", "0", "--experiments", "nbody/linear"], "--threads must be >= 1")]
    for arguments, message in cases:
        proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *arguments, "--", "trainer.max_epochs=1"],
                              cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, (arguments, proc.stderr[-2000:])
        assert "Did you mean: nbody/cn_gnn" in proc.stderr or "cn_gnm" not in message
    assert not out.exists() and not (tmp_path / "escape").exists()


def test_a_dependent_whose_source_finished_elsewhere_says_so(tmp_path):
    """rotmnist/cn_pretrained reads the checkpoint of the rotmnist/cn_p64 run of its seed; when that run was
    skipped as kept in the repository (its checkpoints are not), the message says so instead of "has not
    completed"."""
    import threading

    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import run_protocol

    out, kept = tmp_path / "out", tmp_path / "kept"
    _record(kept / "rotmnist" / "cn_p64" / "seed0")
    out.mkdir()
    finished = {("rotmnist/cn_pretrained", 0): threading.Event()}
    message = run_protocol.run_job(out, "rotmnist/cn_pretrained", 0, [], 1, finished, "", kept)
    assert message.startswith("FAILED rotmnist/cn_pretrained seed 0: it needs the checkpoint of rotmnist/cn_p64 "
                              "seed 0, which finished elsewhere"), message
