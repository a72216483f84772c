"""N-body simulator, dataset files and NBodyDataModule.

The fixture tests/fixtures/nbody_reference.npz holds numbers produced once by EGNN's own generator
(n_body_system/dataset/synthetic_sim.py, global seed 43, as generate_dataset.py does for nbody_small):
positions and velocities at frames 30 and 40 and the charges of 8 simulations: training simulations 0-2,
the first validation and test simulations (global indices 10000 and 12000), and training simulations 163,
236 and 760. The last three are chaotic: a last-bit change in one dot product (e.g. a multiply-add that is
not fused) moves them by O(1) by frame 30, so they pin down the reference's arithmetic order, not just
its physics.

Which machines can reproduce them: the chaotic check needs this machine's x_i·x_j (NumPy's BLAS, whose
kernel depends on the CPU and on OPENBLAS_CORETYPE) and ``np.power(d², 1.5)`` (NumPy's SIMD dispatch: SVML
on AVX-512 CPUs, libm's ``pow`` elsewhere) to give the bits they gave for the fixture. The sidecar
tests/fixtures/nbody_reference_arithmetic.json holds a fingerprint of both on probe inputs; the chaotic
check runs where this machine's fingerprint equals it and is skipped, with the reason, elsewhere. The
non-chaotic simulations are checked on every machine, to a tolerance derived from their measured
sensitivity to last-bit changes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from canonical_network.data.nbody import (
    NBODY_DATASETS,
    NBodyDataError,
    NBodyDataModule,
    generate_nbody_dataset,
    get_dataset_spec,
)
from canonical_network.data.nbody_sim import (
    ChargedSimConfig,
    InitialConditions,
    draw_initial_conditions,
    fused_dot_matches_blas,
    simulate,
    simulate_one_at_a_time,
)
from tests.helpers import EPS64

FIXTURE = Path(__file__).parent / "fixtures" / "nbody_reference.npz"
#: fingerprint of the arithmetic that made FIXTURE (see :func:`arithmetic_fingerprint`)
FINGERPRINT = Path(__file__).parent / "fixtures" / "nbody_reference_arithmetic.json"
TINY = {"num_train": 3, "num_valid": 2, "num_test": 2}  # nbody_small's stream, fewer simulations


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(FIXTURE))


# ------------------------------------------------------------------------------- arithmetic fingerprint
def _probe_positions() -> np.ndarray:
    """512 configurations of 5 particles (S, N, 3) at the simulation's magnitudes (positions of a few units)."""
    return np.random.RandomState(0).randn(512, 5, 3) * 3.0


def _pairs(gram: np.ndarray) -> np.ndarray:
    """The entries i < j of a stack of (N, N) matrices, (S, N(N-1)/2), as the simulator uses them."""
    i, j = np.triu_indices(gram.shape[-1], k=1)
    return np.ascontiguousarray(gram[:, i, j])


def _probe_squared_distances() -> np.ndarray:
    """4096 squared distances spanning the simulation's range (d² of particles a few units apart)."""
    return np.random.RandomState(1).uniform(0.0, 50.0, 4096)


def _sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype=np.float64).tobytes()).hexdigest()


def arithmetic_fingerprint() -> dict[str, str]:
    """SHA-256 of the bits of the two machine-dependent operations of the simulation, on probe inputs.

    * ``pair_dots``: x_i·x_j from NumPy's BLAS, the call the simulator makes (``np.matmul`` of each
      configuration's (N, 3) matrix with its transpose, the reference's ``A.dot(A.T)``; the simulator's fast
      fused path is used only where it equals this bit for bit). Kernels differ in whether and where they
      fuse multiply-adds: without FMA a third of these products change in the last bit.
    * ``power``: ``np.power(d², 1.5)``, which NumPy computes with SVML on AVX-512 CPUs and with libm's
      ``pow`` elsewhere; the two differ in the last bit of some results.

    Every other operation of the simulator is a single IEEE operation (+, −, ×, /, √, comparisons) in a
    fixed order, correctly rounded on every machine.
    """
    x = _probe_positions()
    return {
        "pair_dots": _sha256(_pairs(np.matmul(x, x.transpose(0, 2, 1)))),
        "power": _sha256(np.power(_probe_squared_distances(), 1.5)),
    }


def fused_chain_pair_dots() -> np.ndarray:
    """x_i·x_j of the probe as ``fma(x_i2, x_j2, fma(x_i1, x_j1, x_i0·x_j0))``, each step correctly rounded
    (exact rational arithmetic, then one rounding to float64): machine-independent."""
    x = _probe_positions()

    def fma(a: float, b: float, c: float) -> float:
        return float(Fraction(a) * Fraction(b) + Fraction(c))  # int / int division rounds correctly

    i, j = np.triu_indices(x.shape[1], k=1)
    return np.array(
        [
            [fma(a[2], b[2], fma(a[1], b[1], a[0] * b[0])) for a, b in zip(xs[i], xs[j], strict=True)]
            for xs in x
        ]
    )


@pytest.fixture(scope="module")
def fixture_arithmetic() -> dict:
    return json.loads(FINGERPRINT.read_text())


def test_fixture_dot_products_are_the_fused_chain(fixture_arithmetic):
    """Machine-independent: the fixture's BLAS computed x_i·x_j as the FMA chain the simulator's docstring
    describes (checked in exact arithmetic, so this holds on every machine and documents the sidecar)."""
    assert _sha256(fused_chain_pair_dots()) == fixture_arithmetic["pair_dots"]["sha256"]


def _blas_architecture() -> str:
    """OpenBLAS's kernel as threadpoolctl reports it (for the skip message only)."""
    try:
        from threadpoolctl import threadpool_info

        return (
            ", ".join(
                f"{Path(i.get('filepath', '?')).parent.name}: {i.get('internal_api')} {i.get('version')}"
                f" {i.get('architecture')}"
                for i in threadpool_info()
                if i.get("user_api") == "blas"
            )
            or "no BLAS found by threadpoolctl"
        )
    except ImportError:
        return "threadpoolctl not installed"


# --------------------------------------------------------------------------------- reference trajectories


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """nbody_small parameters and seed with 3/2/2 simulations, generated once for the module."""
    out = tmp_path_factory.mktemp("nbody_tiny")
    generate_nbody_dataset(out, get_dataset_spec("nbody_small", **TINY), progress=False)
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def ours_at_reference(reference):
    """Our generator's trajectories for the fixture's simulations."""
    spec = NBODY_DATASETS["nbody_small"]
    index = reference["global_index"]
    # Drawing all initial conditions up to the last index is cheap; only the fixture's sims are integrated.
    init = draw_initial_conditions(
        np.random.RandomState(int(reference["seed"])), int(index.max()) + 1, spec.sim
    )
    return simulate(init.select(index), spec.sim)


#: bound on the relative rounding error one leapfrog step adds to the state: the force on a particle is a
#: sum over 4 partners of a term built from a 3-term dot product, two 3-term squared norms, a power, a
#: division and a product (≤ ~12 roundings along its longest chain), then v += Δt·F and x += Δt·v (2 each);
#: 16 covers them.
ROUNDINGS_PER_STEP = 16


@pytest.fixture(scope="module")
def non_chaotic_tolerance(reference) -> float:
    """Absolute tolerance for frames 30/40 of the fixture's non-chaotic simulations on *any* machine.

    Another machine's arithmetic (another BLAS kernel, libm's pow instead of SVML's) changes the last bit of
    some intermediate results: at most ``ROUNDINGS_PER_STEP · eps`` relative per step, each such change then
    grows with the trajectory's sensitivity ``G`` to a last-bit perturbation. ``G`` is measured here: every
    initial coordinate moved up by one ulp, the largest change at the checked frames divided by
    ``eps · scale``. Summing the worst case over all steps up to the last checked frame gives
    ``steps · ROUNDINGS_PER_STEP · G · eps · scale``: for these simulations G ≈ 4e3 and the bound ≈ 4e-7,
    while the differences seen with other arithmetic (OpenBLAS without FMA, libm's pow) are ≤ 1e-11. The
    chaotic simulations, with G ~ 1e15, get no useful bound and are checked apart.
    """
    spec = NBODY_DATASETS["nbody_small"]
    rows = ~reference["chaotic"]
    init = draw_initial_conditions(
        np.random.RandomState(int(reference["seed"])), int(reference["global_index"].max()) + 1, spec.sim
    ).select(reference["global_index"][rows])
    nudged = InitialConditions(init.charges, np.nextafter(init.loc, np.inf), np.nextafter(init.vel, np.inf))
    frames = reference["frames"]
    base, moved = simulate(init, spec.sim), simulate(nudged, spec.sim)
    scale = max(np.abs(reference[name][rows]).max() for name in ("loc", "vel"))
    change = max(
        np.abs(getattr(moved, n)[:, frames] - getattr(base, n)[:, frames]).max() for n in ("loc", "vel")
    )
    growth = max(change / (EPS64 * scale), 1.0)
    steps = (int(frames.max()) + 1) * spec.sim.sample_every  # frame t is the state after step (t + 1)·100
    tolerance = steps * ROUNDINGS_PER_STEP * growth * EPS64 * scale
    # The check keeps its power: a different stream or different physics moves frame 30 by O(1).
    assert tolerance < 1e-6 * scale, f"non-chaotic simulations too sensitive to check: {tolerance:.3g}"
    return tolerance


def _assert_matches_reference(ours, reference, rows, atol, why=""):
    frames = reference["frames"]
    np.testing.assert_array_equal(ours.charges[rows], reference["charges"][rows])
    for name in ("loc", "vel"):
        np.testing.assert_allclose(
            getattr(ours, name)[rows][:, frames], reference[name][rows], rtol=0, atol=atol, err_msg=name + why
        )


def test_reproduces_reference_generator(reference, ours_at_reference, non_chaotic_tolerance):
    """Frames 30/40 match EGNN's generator, including sims deep into the valid and test stream (any machine)."""
    _assert_matches_reference(ours_at_reference, reference, ~reference["chaotic"], non_chaotic_tolerance)


def test_reproduces_reference_arithmetic_on_chaotic_sims(reference, ours_at_reference, fixture_arithmetic):
    """Chaotic sims match bit for bit where this machine's arithmetic is the fixture's: the forces are
    evaluated with the reference's exact operations. Elsewhere no generator, the reference's included,
    can reproduce them, and the test is skipped with the reason."""
    here = arithmetic_fingerprint()
    differing = [name for name in ("pair_dots", "power") if here[name] != fixture_arithmetic[name]["sha256"]]
    if differing:
        pytest.skip(
            f"this machine's results of {' and '.join(differing)} differ in the last bit from those of the arithmetic that made"
            f" {FIXTURE.name} ({FINGERPRINT.name}; BLAS here: {_blas_architecture()}); the chaotic simulations"
            " cannot be reproduced bit for bit here, by the reference's generator either"
        )
    why = (
        " (chaotic simulations: this machine's fingerprinted arithmetic equals the fixture's, so a difference"
        " is an operation of the simulator that does not follow the reference's order)"
    )
    # Bit for bit: the same operations on the same inputs give the same bits.
    _assert_matches_reference(ours_at_reference, reference, reference["chaotic"], 0.0, why)


@pytest.mark.parametrize("dot", ["blas", "fused"])
def test_vectorised_equals_one_at_a_time(dot):
    """Batching (an uneven last chunk of one included) does not change a single number."""
    if dot == "fused" and not fused_dot_matches_blas():
        pytest.skip("fused dot products do not reproduce BLAS on this machine; 'auto' uses BLAS")
    config = ChargedSimConfig(n_steps=1000, sample_every=50)
    init = draw_initial_conditions(np.random.RandomState(0), 4, config)
    before = {name: getattr(init, name).copy() for name in ("charges", "loc", "vel")}
    batched = simulate(init, config, chunk_size=3, dot=dot)
    single = simulate_one_at_a_time(init, config)  # BLAS dot products, one simulation per batch
    for name in ("loc", "vel", "charges", "edges"):
        np.testing.assert_array_equal(getattr(batched, name), getattr(single, name), err_msg=name)
    assert batched.loc.shape == (4, 19, 3, 5)
    for name, value in before.items():  # the initial conditions are not integrated in place
        np.testing.assert_array_equal(getattr(init, name), value, err_msg=name)


def test_initial_conditions_follow_the_stream():
    """Drawing in pieces continues the same stream; speeds are vel_norm; charges ±1; positions in the box."""
    config = ChargedSimConfig()
    rng = np.random.RandomState(43)
    whole = draw_initial_conditions(np.random.RandomState(43), 7, config)
    parts = [draw_initial_conditions(rng, k, config) for k in (4, 3)]
    for name in ("charges", "loc", "vel"):
        np.testing.assert_array_equal(np.concatenate([getattr(p, name) for p in parts]), getattr(whole, name))
    # Rescaling (3 squares summed, √, ×, ÷) and np.linalg.norm (3 squares summed, √) round ≤ 12 times in
    # all, each by ≤ eps/2 relative: 8 eps bounds the difference (a wrong rescaling is off by O(1)).
    np.testing.assert_allclose(np.linalg.norm(whole.vel, axis=1), config.vel_norm, rtol=8 * EPS64)
    assert set(np.unique(whole.charges)) <= {-1.0, 1.0}
    assert np.all(np.abs(whole.loc) <= config.box_size)


def test_generated_files(tiny_dir, reference, non_chaotic_tolerance):
    """EGNN's file names and layout, a manifest with checksums, and the reference's numbers."""
    spec = get_dataset_spec("nbody_small", **TINY)
    manifest = json.loads((tiny_dir / "manifest_charged5_initvel1small.json").read_text())
    assert manifest["seed"] == 43 and manifest["num_train"] == 3
    assert sorted(manifest["files"]) == sorted(spec.file_names())
    loc = np.load(tiny_dir / "loc_train_charged5_initvel1small.npy")
    assert loc.shape == (3, 49, 3, 5) and loc.dtype == np.float64
    assert np.load(tiny_dir / "vel_valid_charged5_initvel1small.npy").shape == (2, 49, 3, 5)
    edges = np.load(tiny_dir / "edges_test_charged5_initvel1small.npy")
    charges = np.load(tiny_dir / "charges_test_charged5_initvel1small.npy")
    assert charges.shape == (2, 5, 1)
    np.testing.assert_array_equal(edges, charges * charges.transpose(0, 2, 1))
    # The first training simulations of any count are nbody_small's first simulations.
    assert not reference["chaotic"][:3].any()  # so the tolerance derived for those applies
    np.testing.assert_allclose(
        loc[:, reference["frames"]], reference["loc"][:3], rtol=0, atol=non_chaotic_tolerance
    )
    assert list(reference["global_index"][:3]) == [0, 1, 2]


def test_datamodule_batches(tiny_dir):
    dm = NBodyDataModule(data_dir=str(tiny_dir), max_train_samples=2, batch_size=2, **TINY)
    dm.setup("fit")
    loc_file = np.load(tiny_dir / "loc_valid_charged5_initvel1small.npy")
    vel_file = np.load(tiny_dir / "vel_valid_charged5_initvel1small.npy")
    charges_file = np.load(tiny_dir / "charges_valid_charged5_initvel1small.npy")

    batch = next(iter(dm.val_dataloader()))  # not shuffled: simulations 0 and 1 in order
    loc, vel, charges, target = batch
    assert [tuple(t.shape) for t in batch] == [(2, 5, 3), (2, 5, 3), (2, 5, 1), (2, 5, 3)]
    assert all(t.dtype == torch.float32 for t in batch)
    # Files are (S, T, 3, N): the sample is frame 30 transposed to (N, 3); the target is frame 40.
    np.testing.assert_array_equal(loc.numpy(), loc_file[:2, 30].transpose(0, 2, 1).astype(np.float32))
    np.testing.assert_array_equal(vel.numpy(), vel_file[:2, 30].transpose(0, 2, 1).astype(np.float32))
    np.testing.assert_array_equal(target.numpy(), loc_file[:2, 40].transpose(0, 2, 1).astype(np.float32))
    np.testing.assert_array_equal(charges.numpy(), charges_file[:2].astype(np.float32))

    assert len(dm.train_dataloader().dataset) == 2  # max_train_samples
    assert len(dm.test_dataloader().dataset) == 2

    other = NBodyDataModule(data_dir=str(tiny_dir), frame_in=5, frame_out=48, batch_size=4, **TINY)
    loc, _, _, target = next(iter(other.test_dataloader()))
    loc_test = np.load(tiny_dir / "loc_test_charged5_initvel1small.npy")
    np.testing.assert_array_equal(loc.numpy(), loc_test[:, 5].transpose(0, 2, 1).astype(np.float32))
    np.testing.assert_array_equal(target.numpy(), loc_test[:, 48].transpose(0, 2, 1).astype(np.float32))
    assert len(other.train_dataloader().dataset) == 3  # max_train_samples=3000 > 3 available


def test_generates_when_missing(tmp_path, caplog):
    with caplog.at_level("INFO", logger="canonical_network.data.nbody"):
        dm = NBodyDataModule(
            data_dir=str(tmp_path / "new"), num_train=2, num_valid=1, num_test=1, batch_size=8
        )
        dm.prepare_data()
    assert "generating" in caplog.text
    assert (tmp_path / "new" / "manifest_charged5_initvel1small.json").exists()
    dm.setup()
    assert len(next(iter(dm.train_dataloader()))[0]) == 2


def test_missing_files_error(tmp_path):
    dm = NBodyDataModule(data_dir=str(tmp_path), generate_if_missing=False)
    with pytest.raises(NBodyDataError) as err:
        dm.setup()
    msg = str(err.value)
    assert "loc_train_charged5_initvel1small.npy" in msg and "charges_test_charged5_initvel1small.npy" in msg
    assert f"python -m canonical_network.data.generate_nbody --out {tmp_path}" in msg
    assert not any(tmp_path.iterdir())  # nothing was generated


def test_corrupted_file_error(tiny_dir, tmp_path):
    data = _copy(tiny_dir, tmp_path / "data")
    path = data / "vel_valid_charged5_initvel1small.npy"
    raw = bytearray(path.read_bytes())
    raw[-8] ^= 0xFF  # flip bits in the last number: same size and shape, different content
    path.write_bytes(bytes(raw))
    with pytest.raises(NBodyDataError) as err:
        NBodyDataModule(data_dir=str(data), **TINY).setup()
    msg = str(err.value)
    assert str(path) in msg and "sha256" in msg
    assert "Delete" in msg and "-m canonical_network.data.generate_nbody" in msg
    assert "--num-train 3" in msg  # the command regenerates this very dataset


def test_truncated_file_error(tiny_dir, tmp_path):
    data = _copy(tiny_dir, tmp_path / "data")
    path = data / "loc_test_charged5_initvel1small.npy"
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(NBodyDataError, match="loc_test_charged5_initvel1small.npy: unreadable"):
        NBodyDataModule(data_dir=str(data), **TINY).setup()


def test_dropped_in_files_without_manifest(tiny_dir, tmp_path):
    """EGNN's own files come without a manifest: shapes are checked, contents accepted."""
    data = _copy(tiny_dir, tmp_path / "data")
    (data / "manifest_charged5_initvel1small.json").unlink()
    dm = NBodyDataModule(data_dir=str(data), batch_size=3, **TINY)
    dm.setup()
    assert next(iter(dm.train_dataloader()))[0].shape == (3, 5, 3)

    bad = data / "charges_train_charged5_initvel1small.npy"
    np.save(bad, np.ones((3, 5)))
    with pytest.raises(NBodyDataError) as err:
        NBodyDataModule(data_dir=str(data), **TINY).setup()
    assert f"{bad}: shape (3, 5), expected (3, 5, 1)" in str(err.value)


def test_parameter_mismatch_error(tiny_dir):
    with pytest.raises(NBodyDataError, match="other parameters.*num_train"):
        NBodyDataModule(data_dir=str(tiny_dir), num_train=4, num_valid=2, num_test=2).setup()


def test_invalid_arguments():
    with pytest.raises(ValueError, match=r"data.dataset must be one of \['nbody', 'nbody_small'\]; got 'nbody_large'"):
        NBodyDataModule(dataset="nbody_large")
    with pytest.raises(ValueError, match="data.frame_out=49 is out of range"):
        NBodyDataModule(frame_out=49)
    with pytest.raises(ValueError, match="EGNN uses frame_in=6, frame_out=8"):
        NBodyDataModule(dataset="nbody")  # 9 frames: EGNN's 30 -> 40 does not exist there


def test_o3_augmentation_turns_each_training_system_rigidly_and_leaves_evaluation_alone(tiny_dir):
    dm = NBodyDataModule(data_dir=str(tiny_dir), batch_size=3, augmentation="o3", **TINY)
    dm.setup("fit")
    batch = tuple(t.double() for t in dm.splits["train"][:3])
    torch.manual_seed(0)
    loc, vel, charges, target = dm.augment_train_batch(batch)
    assert torch.equal(charges, batch[2])
    # one orthogonal Q per system, the same for loc, vel and target: recover it from loc by least squares
    # (5 particles span 3-D) and check it maps vel and target too; float64, conditioning of a 5 x 3 solve
    q = torch.linalg.lstsq(batch[0], loc).solution  # loc_aug = loc Qᵀ
    tol = 1e3 * torch.finfo(torch.float64).eps
    eye = torch.eye(3, dtype=torch.float64).expand(3, 3, 3)
    assert torch.allclose(q @ q.transpose(1, 2), eye, atol=tol)
    assert torch.allclose(batch[1] @ q, vel, atol=tol) and torch.allclose(batch[3] @ q, target, atol=tol)
    assert not torch.allclose(q[0], q[1])  # each system its own element
    assert (torch.linalg.det(q).abs() - 1).abs().max() < tol
    # none (the default) returns the batch untouched; a bad value names the key and the choices
    assert NBodyDataModule(data_dir=str(tiny_dir), **TINY).augment_train_batch(batch) is batch
    with pytest.raises(ValueError, match="data.augmentation.*none.*o3.*so3"):
        NBodyDataModule(data_dir=str(tiny_dir), augmentation="so3", **TINY)


def test_an_interrupted_regeneration_leaves_files_missing_never_a_mix_of_two_seeds(tiny_dir, tmp_path, monkeypatch):
    """Regenerating a folder with another seed, cut off after the training split, used to leave seed-44 training
    files beside seed-43 validation and test files, with no manifest: accepted by shape alone. Every file of the
    dataset now goes with the manifest, so what is left is incomplete and is generated again."""
    import canonical_network.data.nbody as nbody

    folder = _copy(tiny_dir, tmp_path / "mixed")
    simulate, calls = nbody.simulate, []

    def cut_off(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("interrupted while simulating the validation split")
        return simulate(*args, **kwargs)

    monkeypatch.setattr(nbody, "simulate", cut_off)
    with pytest.raises(KeyboardInterrupt):
        generate_nbody_dataset(folder, get_dataset_spec("nbody_small", seed=44, **TINY), progress=False)
    spec = get_dataset_spec("nbody_small", **TINY)
    left = sorted(p.name for p in folder.iterdir() if p.suffix == ".npy")
    assert left and all("train" in name for name in left)  # the interrupted split's files: none of the old ones
    assert not (folder / spec.manifest_name).exists()


def test_the_generator_the_errors_name_is_part_of_the_package(tmp_path):
    """The command a missing or corrupted dataset's error gives runs from an installed wheel too (it named
    scripts/generate_nbody.py, which only a checkout has)."""
    from canonical_network.data.generate_nbody import main

    assert main(["--out", str(tmp_path), "--num-train", "3", "--num-valid", "2", "--num-test", "2",
                 "--n-steps", "400", "--no-progress"]) == 0
    assert list(tmp_path.glob("manifest_*.json"))
