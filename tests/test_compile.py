"""``compile=true`` (canonical_network/utils/compile.py): the compiled network computes what the eager one does,
keeps its parameter names, stays equivariant, and Inductor's generated code lives in a fresh directory inside
the run folder that is gone when the run ends (nothing read from an earlier process's cache, nothing written
outside the run folder)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from canonical_network.canonicalization.base import CanonicalizedModel
from canonical_network.canonicalization.identity import IdentityCanonicalizer
from canonical_network.records import read_results
from canonical_network.train import run
from canonical_network.utils.compile import CACHE_VARIABLES, SCRATCH_PREFIX, compiled_network
from tests.helpers import EPS32, compose_config, shrink

WIDTH = 32


class SmallPredictor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, WIDTH), nn.SiLU(), nn.Linear(WIDTH, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def small_network() -> CanonicalizedModel:
    torch.manual_seed(0)
    return CanonicalizedModel(IdentityCanonicalizer(), SmallPredictor())


def test_compiled_network_matches_eager_and_keeps_its_cache_in_the_run_folder(tmp_path):
    network = small_network()
    eager = small_network()
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(1))
    before = {name: os.environ.get(name) for name in CACHE_VARIABLES}
    with compiled_network(network, tmp_path, True) as scratch:
        assert scratch is not None and scratch.parent == tmp_path and scratch.name.startswith(SCRATCH_PREFIX)
        assert all(os.environ[name].startswith(str(scratch)) for name in CACHE_VARIABLES)
        with torch.no_grad():
            # the method a task's step calls (CanonicalizedTask.model_step), not network(...)
            compiled_out, _ = network.forward_with_element(x)
            eager_out, _ = eager.forward_with_element(x)
        generated = [p for p in scratch.rglob("*") if p.is_file()]
        assert generated, "nothing was compiled into the run's own cache directory on the training path"
    # Each output sums 32 products of SiLU outputs; a fused SiLU may round differently from the eager one
    # (a few ulps), which the second Linear sums with its weights: |error| ≤ 32 · 4 eps32 · scale.
    scale = eager_out.abs().max()
    assert (compiled_out - eager_out).abs().max() <= WIDTH * 4 * EPS32 * scale
    assert list(network.state_dict()) == list(eager.state_dict())  # same names: checkpoints interchange
    assert not any(p.name.startswith(SCRATCH_PREFIX) for p in tmp_path.iterdir())  # removed at the end
    assert {name: os.environ.get(name) for name in CACHE_VARIABLES} == before
    assert "forward_with_element" not in network.__dict__  # eager again after the block


def test_compile_off_leaves_the_network_and_environment_alone(tmp_path):
    network = small_network()
    with compiled_network(network, tmp_path, False) as scratch:
        assert scratch is None
        assert network._compiled_call_impl is None and "forward_with_element" not in network.__dict__
    assert list(tmp_path.iterdir()) == []


class LengthlessSpec(tuple):
    """A tuple whose length cannot be read, as e3nn's ``Irreps`` (``__len__`` raises): TorchDynamo's guards
    on it fail, as they do on the tensor-field rows (test_the_tensor_field_rows_get_the_clear_error)."""

    def __len__(self):
        raise NotImplementedError


class UntraceablePredictor(SmallPredictor):
    def __init__(self) -> None:
        super().__init__()
        self.spec = LengthlessSpec((1.0, 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for factor in self.spec:
            x = x * factor
        return self.net(x)


def test_a_network_the_compiler_cannot_trace_gets_one_clear_error(tmp_path):
    network = CanonicalizedModel(IdentityCanonicalizer(), UntraceablePredictor())
    with compiled_network(network, tmp_path, True):
        with pytest.raises(RuntimeError, match=r"compile=true: torch.compile cannot compile .*"
                                               r"predictor=UntraceablePredictor.*compile=false"):
            network.forward_with_element(torch.randn(4, 6))
    assert network.forward_with_element(torch.randn(4, 6))[0].shape == (4, 3)  # eager again: it runs


@pytest.mark.slow
def test_the_tensor_field_rows_get_the_clear_error(tmp_path):
    """TFN's e3nn ``Irreps`` break TorchDynamo's guards: the run must say so and name the way out."""
    from tests.test_nbody_task import build_row

    model = build_row("tfn")
    loc, vel = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    charges = torch.ones(2, 5, 1)
    with compiled_network(model.network, tmp_path, True):
        with pytest.raises(RuntimeError, match=r"compile=true: torch.compile cannot compile .*predictor=.*compile=false"):
            model.network.forward_with_element(loc, vel, charges)


def test_bad_compile_value_fails_before_training(tmp_path):
    cfg = shrink(compose_config(["experiment=nbody/gnn", "compile=yes"], tmp_path))
    with pytest.raises(Exception, match="compile must be true or false; got 'yes'"):
        run(cfg)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_compiled_run_trains_tests_and_stays_equivariant(tmp_path):
    """A CN-GNN run with compile=true end to end, then the compiled model's E(3) equivariance in float64 with
    the tolerance of tests/test_nbody_task.py (the GNN row fails that check: test_plain_gnn_row_is_not_equivariant)."""
    from tests.test_nbody_task import TINY, build_row, equivariance_check

    overrides = ["experiment=nbody/cn_gnn", "compile=true", *(f"data.{k}={v}" for k, v in TINY.items())]
    cfg = shrink(compose_config(overrides, tmp_path / "run"))
    cfg.data.data_dir = str(tmp_path / "nbody")
    record = run(cfg)
    assert record["status"] == "completed" and record["metrics"]["test/mse"] > 0
    assert read_results(tmp_path / "run")["config"]["compile"] is True
    assert not any(p.name.startswith(SCRATCH_PREFIX) for p in (tmp_path / "run").iterdir())

    from canonical_network.data.nbody import NBodyDataModule

    dm = NBodyDataModule(data_dir=str(tmp_path / "nbody"), batch_size=TINY["num_test"], **TINY)
    dm.setup()
    frames = next(iter(dm.test_dataloader()))[:3]
    model = build_row("cn_gnn", torch.float64)
    with compiled_network(model.network, tmp_path, True):
        error, tol, _ = equivariance_check(model, frames, torch.float64)
    assert error < tol


@pytest.mark.slow
def test_a_killed_compiled_run_resumes_to_the_uninterrupted_runs_numbers(tmp_path):
    """SIGTERM mid-training, then the same command: the compiled CN-GNN (vector dropout: random draws through
    torch's generator, whose state the checkpoint restores) ends where an uninterrupted compiled run does."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from canonical_network.utils.config import PROJECT_ROOT
    from tests.test_nbody_task import TINY

    data = tmp_path / "nbody"
    args = ["experiment=nbody/cn_gnn", "compile=true", "logger=csv", "callbacks.rich_progress_bar=null",
            "trainer.enable_progress_bar=false", "trainer.max_epochs=4", "trainer.check_val_every_n_epoch=1",
            f"data.data_dir={data}", *(f"data.{k}={v}" for k, v in TINY.items()), "data.batch_size=4"]

    def command(run_dir):
        return [sys.executable, "-m", "canonical_network.train", *args, f"hydra.run.dir={run_dir}"]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    reference = subprocess.run(command(tmp_path / "ref"), cwd=PROJECT_ROOT, env=env, capture_output=True,
                               text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-3000:]
    run_dir = tmp_path / "killed"
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen(command(run_dir), cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 500
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert last.exists() and proc.poll() is None, "the run should still be training after its first checkpoint"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    resumed = subprocess.run(command(run_dir), cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = json.loads((tmp_path / "ref" / "results.json").read_text())["metrics"]
    got = json.loads((run_dir / "results.json").read_text())["metrics"]
    # the same compiled kernels on the same machine, the same draws: equal to the bit, but for a final float32
    # reduction that may run in another order (8 eps32 of the MSE)
    assert got["test/mse"] == pytest.approx(expected["test/mse"], rel=8 * EPS32)
