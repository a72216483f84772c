"""Every command block of the README and docs/ is checked or says what it needs.

A ```bash block is preceded by a marker comment:

* ``<!-- commands: checked -->``: each command in it is checked here, without running it: ``make`` targets
  exist; ``python -m canonical_network.<module>`` modules exist, and for ``train`` / ``evaluate`` /
  ``diagnose`` the overrides compose into a config (a wrong group, option or key fails, as it would for a user);
  ``scripts/*.py`` exist and ``scripts/reproduce.sh`` knows the stage; ``cn-*`` entry points are declared.
* ``<!-- commands: needs <what> -->``: it needs what a test machine does not have (a finished run's
  checkpoint, downloaded data, a GPU, a Slurm cluster, hours), and says so to the reader as well.

The generated blocks (config groups, experiments, the paper's rows, the README's example) are checked to be
what their generators write now.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from canonical_network import docs_blocks
from canonical_network.utils.config import PROJECT_ROOT, compose_experiment

DOCUMENTS = docs_blocks.documents()
MARKER = re.compile(r"<!-- commands: (checked|needs [^>]+) -->")
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
CONFIG_OF = {"train": "train", "evaluate": "evaluate", "diagnose": "diagnose"}


def bash_blocks(path: Path) -> list[tuple[str | None, str, int]]:
    """``(marker, body, line)`` of each ```bash block of ``path`` (marker None when missing)."""
    text = path.read_text()
    blocks = []
    for match in BLOCK.finditer(text):
        before = text[:match.start()].rstrip("\n").splitlines()[-2:]
        marker = next((m[1] for line in reversed(before) if (m := MARKER.search(line))), None)
        blocks.append((marker, match[1], text[:match.start()].count("\n") + 1))
    return blocks


def commands(body: str) -> list[list[str]]:
    """The commands of a block: comments dropped, ``\\`` continuations joined, ``&`` and ``;`` split,
    environment assignments in front of a command dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    found = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"\s*(?:&&|;|&)\s*", line):
            words = shlex.split(part) if part else []
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                words = words[1:]
            if words:
                found.append(words)
    return found


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (PROJECT_ROOT / "Makefile").read_text(), re.M))


def _reproduce_stages() -> set[str]:
    text = (PROJECT_ROOT / "scripts" / "reproduce.sh").read_text()
    return set(re.findall(r"^  ([a-z0-9-]+)\)", text, re.M))


def _entry_points() -> set[str]:
    text = (PROJECT_ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, re.M))


def check_command(words: list[str]) -> None:
    head = words[0]
    if head in ("source", "export", "eval", "cd", "wandb", "pip"):
        return
    if head == "make":
        missing = [t for t in words[1:] if "=" not in t and t not in _makefile_targets()]
        assert not missing, f"make target(s) {missing} not in the Makefile"
        return
    if head == "scripts/reproduce.sh":
        assert words[1] in _reproduce_stages(), f"scripts/reproduce.sh has no stage {words[1]!r}"
        return
    if head == "scripts/local_slurm.sh":
        assert (PROJECT_ROOT / head).is_file()
        return
    if head.startswith("cn-"):
        assert head in _entry_points(), f"{head} is not an entry point of pyproject.toml"
        words = ["python", "-m", f"canonical_network.{ {'cn-train': 'train', 'cn-evaluate': 'evaluate', 'cn-diagnose': 'diagnose', 'cn-download': 'data.download'}[head]}", *words[1:]]
    if words[0] == "python" and words[1] == "-m":
        module = words[2]
        assert importlib.util.find_spec(module) is not None, f"no module {module}"
        name = module.removeprefix("canonical_network.")
        if name in CONFIG_OF:
            compose_command(name, words[3:])
        return
    if words[0] == "python" and words[1].startswith("scripts/"):
        assert (PROJECT_ROOT / words[1]).is_file(), f"{words[1]} does not exist"
        return
    raise AssertionError(f"a checked block holds a command this test does not know how to check: {words}")


def _first_of_sweep(value: str) -> str:
    """The first value of a multirun's ``a,b,c`` (a list in brackets is one value)."""
    return value if value.startswith("[") else value.split(",", 1)[0]


def compose_command(name: str, arguments: list[str]) -> None:
    """Compose what ``python -m canonical_network.<name> <arguments>`` would run (a multirun: its first job).
    ``evaluate`` composes over the run config of a checkpoint of the experiment ``ckpt_path``'s run would
    have: ``rotmnist/cnn``'s, registered as ``evaluate`` registers a checkpoint's."""
    overrides = []
    for word in arguments:
        if word in ("-m", "--multirun") or word.lstrip("+~").startswith("hydra."):
            continue
        key, sep, value = word.partition("=")
        overrides.append(f"{key}{sep}{_first_of_sweep(value)}" if sep else word)
    if name == "evaluate":
        from omegaconf import OmegaConf

        from canonical_network.evaluate import register_run_config

        stored = OmegaConf.to_container(compose_experiment(["experiment=rotmnist/cnn"]), resolve=False)
        register_run_config({k: v for k, v in stored.items() if k != "hydra"})
    compose_experiment(overrides, config_name=CONFIG_OF[name])


BLOCKS = [(path, marker, body, line) for path in DOCUMENTS for marker, body, line in bash_blocks(path)]


@pytest.mark.parametrize(("path", "marker", "body", "line"), BLOCKS,
                         ids=[f"{p.relative_to(PROJECT_ROOT)}:{line}" for p, _, _, line in BLOCKS])
def test_every_command_block_is_checked_or_says_what_it_needs(path, marker, body, line):
    assert marker is not None, (f"{path.relative_to(PROJECT_ROOT)}:{line}: a ```bash block without "
                                "<!-- commands: checked --> or <!-- commands: needs <what> --> before it")
    if marker != "checked":
        return
    assert "<" not in body.replace("<<", ""), "a checked block has a placeholder: mark it 'needs' instead"
    for words in commands(body):
        check_command(words)


def test_the_generated_blocks_are_current():
    stale = [p.relative_to(PROJECT_ROOT) for p in DOCUMENTS if docs_blocks.render(p.read_text()) != p.read_text()]
    assert not stale, f"stale generated blocks in {stale}: python -m canonical_network.docs_blocks"


def test_a_wrong_override_in_a_checked_block_fails():
    """The check is real: a misspelt option fails to compose, as it would for a user."""
    with pytest.raises(Exception, match="rotmnist/cn_p5"):
        check_command(["python", "-m", "canonical_network.train", "experiment=rotmnist/cn_p5"])
    with pytest.raises(AssertionError, match="no stage 'tabel1'"):
        check_command(["scripts/reproduce.sh", "tabel1"])
    assert commands("A=1 python -m x a \\\n  b  # c\nmake test & make lint\n") == [
        ["python", "-m", "x", "a", "b"], ["make", "test"], ["make", "lint"]]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("page", ["README.md", "docs/extending.md"])
def test_the_python_examples_run_as_written(page):
    """The README's plain-PyTorch example (docs/api.md's first block) and the worked examples of extending.md."""
    from tests.helpers import run_markdown_python_blocks

    namespace = run_markdown_python_blocks(PROJECT_ROOT / page)
    if page == "README.md":
        assert namespace["result"].passed


def test_the_readme_fits_on_a_few_screens():
    assert len((PROJECT_ROOT / "README.md").read_text().splitlines()) <= 250


def test_run_costs_summarise_a_rows_records_and_leave_out_ablations_and_failures(tmp_path):
    """The ``run-costs`` block: one line per row, setting (rotations together) and device; per-epoch fitting time
    is the median over runs; wall time only from runs never resumed; failed runs and ablation folders left out."""
    import json

    from canonical_network.docs_blocks import run_costs

    def record(folder: str, epochs: int, fit: float, wall: float, status: str = "completed", resumed=None,
               device: str = "CPU") -> None:
        path = tmp_path / folder / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"experiment": "/".join(folder.split("/")[:2]), "status": status,
                                    "epochs": epochs, "fit_time_s": fit, "wall_time_s": wall,
                                    "resumed_from": resumed, "environment": {"device": device}}))

    record("modelnet/dgcnn/pts256_z_z/seed0", 5, 1000.0, 1100.0)
    record("modelnet/dgcnn/pts256_z_so3/seed0", 5, 1500.0, 1600.0)
    record("modelnet/dgcnn/pts256_so3_so3/seed0", 5, 2000.0, 9000.0, resumed="checkpoints/last.ckpt")
    record("modelnet/dgcnn/pts256_z_z/seed1", 5, 50.0, 60.0, device="GPU X")
    record("modelnet/dgcnn/pts256_z_z/seed2", 5, 1.0, 1.0, status="failed")
    record("nbody/gnn/lr5e-4/seed0", 100, 10.0, 20.0)  # an ablation
    record("nbody/gnn/ep10000/seed0", 4000, 3600.0, 3700.0)
    record("modelnet/dgcnn/s40_pts1024_n4000_scale_jitter0.65_z_z_ep10/seed0", 10, 2000.0, 2100.0)  # a budget
    record("modelnet/dgcnn/pts256_z_so3_fro/seed0", 5, 10.0, 20.0)  # an ablation (another feature-transform norm)
    lines = run_costs(tmp_path)
    rows = [line for line in lines if line.startswith("| `")]
    assert rows == [
        "| `modelnet/dgcnn` | pts256 | CPU | 3 | 5 | 300.0 s | 16.7 min – 33.3 min | 18.3 min – 26.7 min |",
        "| `modelnet/dgcnn` | pts256 | GPU X | 1 | 5 | 10.0 s | 50 s | 60 s |",
        "| `modelnet/dgcnn` | s40_pts1024_n4000_scale_jitter0.65_ep10 | CPU | 1 | 10 | 200.0 s | 33.3 min | 35.0 min |",
        "| `nbody/gnn` | ep10000 | CPU | 1 | 4000 | 0.9 s | 60.0 min | 61.7 min |",
    ]


def test_the_authors_nbody_table_reads_the_best_validation_epoch_of_each_log(tmp_path):
    from canonical_network.docs_blocks import _AUTHORS_NBODY_RUNS, authors_nbody

    for k, name in enumerate(_AUTHORS_NBODY_RUNS):  # epoch 1 (0-based) is best in the first log, epoch 2 in the second
        valid = [0.3, 0.1, 0.2] if k == 0 else [0.3, 0.2, 0.1]
        rows = "".join(f"{e},{v},{v / 2},0.001,{e}.0\n" for e, v in enumerate(valid))
        (tmp_path / name).write_text("epoch,valid_loss,test_mse,lr,elapsed_s\n" + rows)
    first, second = [line for line in authors_nbody(tmp_path) if line.startswith("| their") or line.startswith("| GNN")]
    assert first.endswith("| 3 | 2 | 0.10000 | 0.05000 |") and second.endswith("| 3 | 3 | 0.10000 | 0.05000 |")


def test_the_escnn_build_table_shows_median_range_and_failed_builds(tmp_path):
    """The ``escnn-build`` block: one row per build with its median (range) over the builds that finished, the
    intermediate escnn would have formed, and a build that never finished shown as not measured."""
    import json

    from canonical_network.docs_blocks import escnn_build

    def runs(cpu: list[float]) -> list[dict]:
        return [{"build_s": 10 * c, "build_cpu_s": c, "rss_before_mb": 800.0, "peak_rss_mb": 1000.0 + c}
                for c in cpu]

    def stats(values: list[float]) -> dict:
        return {"median": sorted(values)[len(values) // 2], "min": min(values), "max": max(values)}

    record = {"created": "2026-11-30T18:00:00+00:00", "command": "python scripts/benchmark_escnn_build.py",
              "machine": "CPU X, 2 cores, CPU", "torch": "2.x", "escnn": "1.0.11", "threads": 1, "load_start": 5.0,
              "load_end": 6.0, "conditions": "two trainings beside it", "escnn_cache_files_added": 0, "builds": {
                  "cn_p64": {"what": "CN(p64)", "repeats": 3, "finished": 3, "runs": runs([2.0, 3.0, 2.5]),
                             "build_s": stats([20.0, 30.0, 25.0]), "build_cpu_s": stats([2.0, 3.0, 2.5]),
                             "peak_rss_mb": stats([1002.0, 1003.0, 1002.5]), "params": 361706, "buffers_mb": 71.9,
                             "bases": 2, "intermediate_max_mb": 9089.5},
                  "cn_d64": {"what": "CN(d64)", "repeats": 1, "finished": 0, "runs": [{"error": "timed out"}],
                             "errors": ["timed out after 300 s"]}}}
    path = tmp_path / "escnn_build.json"
    path.write_text(json.dumps(record))
    lines = escnn_build(path)
    assert lines[2] == ("| CN(p64) | 361,706 | 2.5 s (2.0–3.0) | 25.0 s (20.0–30.0) | 800 MiB | 1,002 MiB (1,002–1,003) "
                        "| 72 MiB | 9,090 MiB (of 2 bases) | 3 of 3 |")
    assert lines[3].startswith("| CN(d64) | not measured: timed out after 300 s |") and lines[3].endswith("0 of 1 |")
    assert "warm escnn cache" in lines[-1] and "(two trainings beside it)" in lines[-1]


def test_the_nbody_generation_table_says_whether_the_files_matched(tmp_path):
    import json

    from canonical_network.docs_blocks import nbody_generation

    run = {"wall_s": 40.0, "cpu_s": 20.0, "generation_seconds": 40.0, "dot_products": "fused",
           "same_files_as_compare": True, "simulations": {"train": 10000, "valid": 2000, "test": 2000}}
    record = {"created": "2026-11-30T18:00:00+00:00", "command": "python scripts/benchmark_nbody_generation.py",
              "machine": "CPU X, 2 cores, CPU", "torch": "2.x", "threads": 1, "omp_num_threads": "1",
              "load_start": 5.0, "load_end": 6.0, "conditions": "", "dataset": "nbody_small", "repeats": 2,
              "wall_s": {"median": 41.0, "min": 40.0, "max": 42.0}, "cpu_s": {"median": 20.0, "min": 20.0, "max": 20.0},
              "runs": [run, {**run, "same_files_as_compare": None}]}
    path = tmp_path / "nbody_generation.json"
    path.write_text(json.dumps(record))
    row = nbody_generation(path)[2]
    assert row == ("| `nbody_small` | 10,000 / 2,000 / 2,000 | 41.0 s (40.0–42.0) | 20.0 s | fused "
                   "| not checked (no manifest there) | 2 |")
    record["runs"] = [run, run]
    path.write_text(json.dumps(record))
    assert "| yes, every run |" in nbody_generation(path)[2]
