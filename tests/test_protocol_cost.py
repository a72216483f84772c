"""scripts/protocol_cost.py: the paper protocol's device-hours from measured step times."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest

from canonical_network.utils.config import PROJECT_ROOT, known_experiments


def _script():
    spec = importlib.util.spec_from_file_location("protocol_cost", PROJECT_ROOT / "scripts" / "protocol_cost.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_row_is_an_experiment_and_the_hours_follow_the_protocol():
    cost = _script()
    experiments = set(known_experiments())
    for protocol in cost.PROTOCOLS.values():
        named = {row.split()[0] for row in protocol.rows}
        assert named <= experiments, named - experiments
    nbody = cost.PROTOCOLS["nbody"]
    timing = {"batch_size": 100, "val_interval": 5, "train_step_s": 0.01, "eval_batch_s": 0.004}
    # 30 training steps an epoch, 20 evaluation batches every 5 epochs, 20 test batches once
    expected = (10_000 * (30 * 0.01 + 20 * 0.004 / 5) + 20 * 0.004) / 3600
    assert cost.row_hours(nbody, timing) == pytest.approx(expected, rel=1e-12)
    modelnet = cost.PROTOCOLS["modelnet"]
    timing = {"batch_size": 32, "val_interval": 1, "train_step_s": 1.0, "eval_batch_s": 0.0}
    assert cost.row_hours(modelnet, timing) == pytest.approx(200 * math.ceil(9843 / 32) / 3600)


def test_the_ablation_tables_time_the_cells_their_sweeps_run():
    """Tables 2 and 6 (paper-slurm submits them): Table 6's rows are the layers x orders of its sweep, each row's
    settings reach the config it is timed with, and Table 2 has the sweep's rows plus CN(pretrained) (timed as
    CN(p64) with its canonicalizer frozen: the same networks)."""
    from omegaconf import OmegaConf

    from canonical_network.utils.config import CONFIG_DIR, compose_experiment

    cost = _script()
    sweep = OmegaConf.load(CONFIG_DIR / "sweep" / "rotmnist_table6.yaml").hydra.sweeper.params
    cells = {(int(layers), int(order)) for layers in str(sweep["canonicalization.num_layers"]).split(",")
             for order in str(sweep["canonicalization.num_rotations"]).split(",")}
    timed = set()
    for row in cost.PROTOCOLS["rotmnist_table6"].rows:
        cfg = compose_experiment(cost.row_overrides(row, cost.PROTOCOLS["rotmnist_table6"].overrides))
        timed.add((cfg.canonicalization.num_layers, cfg.canonicalization.num_rotations))
    assert timed == cells and len(cells) == 15
    table2 = OmegaConf.load(CONFIG_DIR / "sweep" / "rotmnist_table2.yaml").hydra.sweeper.params["experiment"]
    rows = cost.PROTOCOLS["rotmnist_table2"].rows
    assert set(str(table2).split(",")) | {"rotmnist/cn_p64 canonicalization.freeze=true"} == set(rows)
    assert compose_experiment(cost.row_overrides(rows[-1])).canonicalization.freeze is True


@pytest.mark.usefixtures("one_thread")
def test_a_measured_row_gives_positive_times_and_its_hours(tmp_path, capsys):
    cost = _script()
    out = tmp_path / "cost.json"
    assert cost.main(["--tables", "rotmnist", "--rows", "rotmnist/cnn", "--train-steps", "1", "--val-steps", "1",
                      "--output", str(out), "--markdown"]) == 0
    record = json.loads(out.read_text())
    row = record["tables"]["rotmnist"]["rows"]["rotmnist/cnn"]
    assert row["train_step_s"] > 0 and row["eval_batch_s"] > 0 and row["batch_size"] == 128
    assert row["hours_per_run"] == pytest.approx(cost.row_hours(cost.PROTOCOLS["rotmnist"], row))
    assert record["tables"]["rotmnist"]["total_hours"] == pytest.approx(row["hours_per_run"] * 5)
    assert "| Table 1 (Rotated MNIST) | `rotmnist/cnn` | 128 |" in capsys.readouterr().out
    assert record["tables"]["rotmnist"]["epochs"] == 100 and record["tables"]["rotmnist"]["train"] == 10_000


def test_bad_arguments_name_the_value_and_the_choices(capsys):
    cost = _script()
    with pytest.raises(SystemExit):
        cost.main(["--tables", "nbody", "--rows", "nbody/gnnn"])
    err = capsys.readouterr().err
    assert "--rows nbody/gnnn: not a row of nbody" in err and "nbody/gnn," in err
    with pytest.raises(SystemExit):
        cost.main(["--train-steps", "0"])
    assert "--train-steps must be at least 1, got 0" in capsys.readouterr().err


def test_a_killed_row_is_recorded_and_the_rest_resumes(tmp_path, monkeypatch):
    """Each row runs in a process of its own: one the system kills (out of memory) is recorded as not measured
    and the others still are; the record is written after every row, and --resume keeps the rows it holds."""
    import subprocess
    import types

    cost = _script()
    timed = []
    real_run = subprocess.run

    def fake_run(command, **kwargs):
        if "--one-row" not in command:  # anything else (platform.processor) runs for real
            return real_run(command, **kwargs)
        row = command[command.index("--one-row") + 2]
        batch = int(command[command.index("--batch-size") + 1]) if "--batch-size" in command else 100
        timed.append((row, batch))
        # egnn fits at no batch; linear only at half its batch or less
        if row == "nbody/egnn" or (row == "nbody/linear" and batch > 50):
            return types.SimpleNamespace(returncode=-9, stdout="", stderr="")
        timing = {"batch_size": batch, "val_interval": 5, "train_step_s": 0.0001 * batch,
                  "eval_batch_s": 0.00004 * batch}
        return types.SimpleNamespace(returncode=0, stdout="lightning noise\n" + json.dumps(timing) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    out = tmp_path / "cost.json"
    args = ["--tables", "nbody", "--rows", "nbody/linear", "nbody/gnn", "nbody/egnn", "--output", str(out)]
    assert cost.main(args) == 0
    rows = json.loads(out.read_text())["tables"]["nbody"]["rows"]
    assert "killed by signal 9" in rows["nbody/egnn"]["error"] and "out of memory" in rows["nbody/egnn"]["error"]
    # killed at every batch: retried at half the protocol's batch of 100 each time, down to 4 (50, 25, 12, 6)
    assert [b for r, b in timed if r == "nbody/egnn"] == [100, 50, 25, 12, 6]
    assert rows["nbody/gnn"]["hours_per_run"] == pytest.approx(cost.row_hours(cost.PROTOCOLS["nbody"], rows["nbody/gnn"]))
    # killed at its batch, timed at half: its hours count twice as many half-size steps (the same total here,
    # where a step's time is proportional to its batch), and the record says which batch was timed and why
    assert rows["nbody/linear"]["batch_size"] == 50 and rows["nbody/linear"]["protocol_batch_size"] == 100
    assert "protocol_batch_size" not in rows["nbody/gnn"]
    assert rows["nbody/linear"]["hours_per_run"] == pytest.approx(rows["nbody/gnn"]["hours_per_run"], rel=0.02)
    from canonical_network.docs_blocks import protocol_cost_table

    table = "\n".join(protocol_cost_table(json.loads(out.read_text())))
    assert "| `nbody/linear` | 50 (100 did not fit in memory) |" in table
    timed.clear()
    assert cost.main([*args, "--resume"]) == 0
    assert {r for r, _ in timed} == {"nbody/egnn"}  # the measured rows are kept, the failed one timed again
    assert json.loads(out.read_text())["complete"] is True
    with pytest.raises(SystemExit, match="other settings"):  # never mixes rows measured at other settings
        cost.main([*args, "--resume", "--train-steps", "5"])


def test_a_resumed_run_stopped_again_keeps_the_rows_it_had_not_reached(tmp_path, monkeypatch):
    """--resume re-times the failed rows in table order; stopped while timing one, the record still holds the
    rows an earlier run measured that come after it."""
    import subprocess
    import types

    cost = _script()
    real_run = subprocess.run
    state = {"fail": {"nbody/linear", "nbody/gnn"}, "stop_at": None}

    def fake_run(command, **kwargs):
        if "--one-row" not in command:
            return real_run(command, **kwargs)
        row = command[command.index("--one-row") + 2]
        if row == state["stop_at"]:
            raise KeyboardInterrupt  # the run stopped while timing this row
        if row in state["fail"]:
            return types.SimpleNamespace(returncode=1, stdout="", stderr="RuntimeError: not this time")
        timing = {"batch_size": 100, "val_interval": 5, "train_step_s": 0.01, "eval_batch_s": 0.004}
        return types.SimpleNamespace(returncode=0, stdout=json.dumps(timing) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    out = tmp_path / "cost.json"
    args = ["--tables", "nbody", "--rows", "nbody/linear", "nbody/gnn", "nbody/egnn", "--output", str(out)]
    assert cost.main(args) == 0  # linear and gnn failed, egnn measured
    state.update(fail=set(), stop_at="nbody/gnn")
    with pytest.raises(KeyboardInterrupt):
        cost.main([*args, "--resume"])  # linear measured now, stopped while timing gnn
    rows = json.loads(out.read_text())["tables"]["nbody"]["rows"]
    assert list(rows) == ["nbody/linear", "nbody/egnn"]  # egnn, measured by the first run, is still there
    assert all("hours_per_run" in timing for timing in rows.values())
    # the record names the days its rows were measured on: an earlier day is kept when resumed on another, and a
    # day it already names is not dropped when resumed on it again
    today = json.loads(out.read_text())["date"]
    state.update(stop_at=None)
    for earlier, expected in (("2026-01-02", f"2026-01-02 and {today}"),
                              (f"2026-01-02 and {today}", f"2026-01-02 and {today}")):
        record = json.loads(out.read_text())
        record["date"] = earlier
        out.write_text(json.dumps(record))
        assert cost.main([*args, "--resume"]) == 0
        assert json.loads(out.read_text())["date"] == expected


def test_a_row_two_tables_share_is_timed_once(tmp_path, monkeypatch):
    """Table 2 repeats three of Table 1's rows: they are timed for Table 1 alone, and Table 2 counts its own hours
    from that timing and says so in the docs table; its frozen CN(p64) row, a row of its own, is timed."""
    import subprocess
    import types

    cost = _script()
    timed = []
    real_run = subprocess.run

    def fake_run(command, **kwargs):
        if "--one-row" not in command:
            return real_run(command, **kwargs)
        timed.append((command[command.index("--one-row") + 1], command[command.index("--one-row") + 2]))
        timing = {"batch_size": 128, "val_interval": 1, "train_step_s": 0.5 + 0.01 * len(timed), "eval_batch_s": 0.1}
        return types.SimpleNamespace(returncode=0, stdout=json.dumps(timing) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    out = tmp_path / "cost.json"
    frozen = "rotmnist/cn_p64 canonicalization.freeze=true"
    assert cost.main(["--tables", "rotmnist", "rotmnist_table2", "--rows", "rotmnist/cnn", frozen,
                      "--output", str(out)]) == 0
    assert timed == [("rotmnist", "rotmnist/cnn"), ("rotmnist_table2", frozen)]
    tables = json.loads(out.read_text())["tables"]
    shared, own = tables["rotmnist_table2"]["rows"]["rotmnist/cnn"], tables["rotmnist"]["rows"]["rotmnist/cnn"]
    assert shared["train_step_s"] == own["train_step_s"] and shared["timed_in"] == "rotmnist"
    assert shared["hours_per_run"] == pytest.approx(cost.row_hours(cost.PROTOCOLS["rotmnist_table2"], own))
    from canonical_network.docs_blocks import protocol_cost_table

    table = "\n".join(protocol_cost_table(json.loads(out.read_text())))
    assert "| Table 2 (Rotated MNIST, augmentation) | `rotmnist/cnn` (timed for Table 1) | 128 |" in table
    assert f"| `{frozen}` | 128 |" in table
    # each timed row says when and where: a record whose rows all come from this run needs no list of them, one
    # holding rows of an earlier run (--resume) or of unknown origin lists the origins
    record = json.loads(out.read_text())
    assert own["measured"] == shared["measured"] == {"date": record["date"], "device": record["device_name"]}
    assert "Rows timed" not in table
    del record["tables"]["rotmnist"]["rows"]["rotmnist/cnn"]["measured"]
    footer = protocol_cost_table(record)[-1]
    origins = footer.split(" Rows timed: ")[1].rstrip(".").split("; ")
    assert sorted(origins) == sorted([f"1 {record['date']} on {record['device_name']}", "1 day and device not recorded"])
